"""W8A8 FP8 scaled_mm on the GPU: qbackend's CUTLASS kernels against torch, under CUDA-graph replay.

    python bench/bench_scaled_mm.py --out bench/results/scaled_mm_h200.json      # the issue-3 grid
    python bench/bench_scaled_mm.py --tune --out /tmp/tune.json                  # config sweep

Implementations, timed in the same process on the same inputs (bf16 output everywhere):
  qbackend.cutlass             providers/native.py -> libqbackend_cuda, per-token x per-channel scales
  torch._scaled_mm.rowwise     cuBLASLt, per-token x per-channel scales, fast accumulation
  torch._scaled_mm.tensorwise  cuBLASLt, per-tensor scales, fast accumulation
  torch.mm.bf16                cuBLAS bf16 GEMM (what a user without FP8 runs)
Method (shared/anchors/anchor_graphs.py): each measurement is a CUDA graph of R calls over R
different weight copies (R copies total >= 512 MB when memory allows, so weights stream from HBM
rather than the 60 MB L2), replayed enough times for ~8 ms of GPU time; the median of 5 such
measurements, divided by R, is the time of one call in one round. Under this load the H200 runs at
its 700 W power limit and its SM clock drifts (1.2 to 1.75 GHz within a minute), so a point is
timed in 4 rounds, every implementation once per round, in a balanced order (benchmark.interleaved:
each implementation first once, and right after each other one once), and each implementation's
median round is reported: drift then hits all of them alike.

JSON: {"device", "torch", "rows": [{"M", "N", "K", "impl", "us"}]}; a PNG plot (speed-up of
qbackend.cutlass over the faster torch._scaled_mm mode, per shape, against M) is written next to it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from functools import partial

import torch

from qbackend.benchmark import graph_time, interleaved
from qbackend_providers import native

_HERE = os.path.dirname(os.path.abspath(__file__))

F8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192),
          (57344, 8192), (8192, 28672)]
MS = [1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
IMPLS = ["qbackend.cutlass", "torch._scaled_mm.rowwise", "torch._scaled_mm.tensorwise", "torch.mm.bf16"]
ROTATE_BYTES = 512 * 2 ** 20
OUT_BYTES_CAP = 3 * 2 ** 30   # at most this much output held by one graph's R calls
GRID_TARGET_MS = 8.0   # per trial in the grid's rounds


class Problem:
    """Weights (R rotating copies, fp8 and bf16) for one (N, K); activations made per M."""

    def __init__(self, N: int, K: int, want_bf16: bool = True):
        self.N, self.K = N, K
        self.n_w = max(2, min(16, ROTATE_BYTES // (N * K)))
        g = torch.Generator(device="cuda")
        g.manual_seed(N * 131 + K)
        self.wb = [torch.randn(N, K, device="cuda", dtype=BF16, generator=g) for _ in range(self.n_w)] \
            if want_bf16 else []
        self.wf = [(torch.randn(N, K, device="cuda", generator=g) * 2).to(F8) for _ in range(self.n_w)]
        self.sb = torch.rand(1, N, device="cuda", generator=g) + 0.5
        self.one = torch.ones((), device="cuda")

    def inputs(self, M: int):
        g = torch.Generator(device="cuda")
        g.manual_seed(M)
        ab = torch.randn(M, self.K, device="cuda", dtype=BF16, generator=g)
        af = (ab.float() * 2).to(F8)
        sa = torch.rand(M, 1, device="cuda", generator=g) + 0.5
        return ab, af, sa

    def reps(self, M: int) -> int:
        return max(1, min(self.n_w, OUT_BYTES_CAP // (M * self.N * 2)))

    def fns(self, impl: str, M: int, ab, af, sa, out=None):
        R = self.reps(M)
        if impl == "qbackend.cutlass":
            out = out if out is not None else torch.empty(M, self.N, device="cuda", dtype=BF16)
            return [lambda w=w: native.scaled_mm(af, w.t(), sa, self.sb, None, out) for w in self.wf[:R]]
        if impl == "torch._scaled_mm.rowwise":
            return [lambda w=w: torch._scaled_mm(af, w.t(), scale_a=sa, scale_b=self.sb, out_dtype=BF16,
                                                 use_fast_accum=True) for w in self.wf[:R]]
        if impl == "torch._scaled_mm.tensorwise":
            return [lambda w=w: torch._scaled_mm(af, w.t(), scale_a=self.one, scale_b=self.one,
                                                 out_dtype=BF16, use_fast_accum=True) for w in self.wf[:R]]
        if impl == "torch.mm.bf16":
            return [lambda w=w: torch.mm(ab, w.t()) for w in self.wb[:R]]
        raise ValueError(impl)


def shapes_arg(text: str) -> list:
    """(N, K) pairs from "N:K,N:K,..."; the issue-3 list when empty."""
    return [tuple(int(v) for v in s.split(":")) for s in text.split(",")] if text else SHAPES


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(rows: list) -> str:
    t = {(r["M"], r["N"], r["K"], r["impl"]): r["us"] for r in rows}
    pts = sorted({(r["M"], r["N"], r["K"]) for r in rows})
    small, large, lines, worst = [], [], [], []
    for (M, N, K) in pts:
        q = t.get((M, N, K, "qbackend.cutlass"))
        keys = ((M, N, K, "torch._scaled_mm.rowwise"), (M, N, K, "torch._scaled_mm.tensorwise"))
        best = min([t[k] for k in keys if k in t] or [float("nan")])
        if q is None or math.isnan(best):
            continue
        ratio = best / q
        (small if M <= 64 else large).append(ratio)
        worst.append((ratio, M, N, K))
        tflops = 2 * M * N * K / q / 1e6
        wbw = (N * K + M * K + 2 * M * N) / q / 1e6
        bf16 = t.get((M, N, K, "torch.mm.bf16"))
        lines.append(f"M={M:5d} N={N:5d} K={K:5d}  cutlass {q:9.1f}us  best_torch_fp8 {best:9.1f}us  "
                     f"x{ratio:5.2f}  {tflops:7.1f} TFLOP/s  {wbw:5.2f} TB/s"
                     + (f"  bf16 {bf16:9.1f}us" if bf16 is not None else ""))
    worst.sort()
    lines.append(f"geomean speed-up vs best torch fp8: M<=64 x{gmean(small):.3f} ({len(small)} pts), "
                 f"M>=128 x{gmean(large):.3f} ({len(large)} pts)")
    lines.append("lowest ratios: " + ", ".join(f"x{r:.2f}@M{M}N{N}K{K}" for r, M, N, K in worst[:6]))
    lines.append(f"points M<=64 below 1.0: {sum(1 for r, M, *_ in worst if M <= 64 and r < 1.0)}; "
                 f"any below 0.95: {sum(1 for r, *_ in worst if r < 0.95)}")
    return "\n".join(lines)


def plot(rows: list, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    t = {(r["M"], r["N"], r["K"], r["impl"]): r["us"] for r in rows}
    fig, ax = plt.subplots(1, 2, figsize=(14, 5))
    for (N, K) in sorted({(r["N"], r["K"]) for r in rows}):
        ms, sp, sp16 = [], [], []
        for M in sorted({r["M"] for r in rows if r["N"] == N and r["K"] == K}):
            q = t.get((M, N, K, "qbackend.cutlass"))
            keys = ((M, N, K, "torch._scaled_mm.rowwise"), (M, N, K, "torch._scaled_mm.tensorwise"))
            fp8 = [t[k] for k in keys if k in t]
            if q and fp8:
                ms.append(M)
                sp.append(min(fp8) / q)
                sp16.append(t.get((M, N, K, "torch.mm.bf16"), float("nan")) / q)
        ax[0].plot(ms, sp, marker="o", label=f"N={N} K={K}")
        ax[1].plot(ms, sp16, marker="o", label=f"N={N} K={K}")
    for a, title in zip(ax, ("vs faster torch._scaled_mm (rowwise/tensorwise)", "vs torch.mm bf16")):
        a.set_xscale("log", base=2)
        a.axhline(1.0, color="k", lw=0.8)
        a.set_xlabel("M (tokens)")
        a.set_ylabel("speed-up of qbackend.cutlass")
        a.set_title(title)
        a.grid(alpha=0.3)
    ax[0].legend(fontsize=7)
    fig.suptitle(f"FP8 scaled_mm, {torch.cuda.get_device_name()}, CUDA-graph replay, bf16 out")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_grid(shapes, ms, impls) -> list:
    rows = []
    for (N, K) in shapes:
        prob = Problem(N, K, want_bf16="torch.mm.bf16" in impls)
        ab, af, sa = prob.inputs(ms[0])
        graph_time(prob.fns("torch._scaled_mm.tensorwise", ms[0], ab, af, sa), target_ms=50.0)  # clocks up
        for M in ms:
            ab, af, sa = prob.inputs(M)
            med = interleaved({impl: partial(graph_time, prob.fns(impl, M, ab, af, sa), GRID_TARGET_MS)
                               for impl in impls})
            line = []
            for impl in impls:
                rows.append({"M": M, "N": N, "K": K, "impl": impl, "us": med[impl]})
                line.append(f"{impl.split('.')[-1]}={med[impl]:.1f}")
            print(f"M={M} N={N} K={K} " + " ".join(line), flush=True)
            del ab, af, sa
        del prob
        torch.cuda.empty_cache()
    return rows


def run_tune(shapes, ms, configs: tuple = ()) -> list:
    """Every SM90 config x decomposition for qbackend (auto = the dispatcher's own choice; auto_nopdl =
    the same with programmatic launches off); `configs`: only the configs whose names start so."""
    names = native.config_names(F8, 90)
    # (name, decomposition, split-K factor): 0 data-parallel, 1 split-K, 2 stream-K, 3 CUTLASS heuristic
    decomps = [("dp", 0, -1), ("splitk2", 1, 2), ("splitk4", 1, 4), ("streamk", 2, -1), ("heur", 3, -1)]
    rows = []
    for (N, K) in shapes:
        prob = Problem(N, K, want_bf16=False)
        for M in ms:
            ab, af, sa = prob.inputs(M)
            native.override()
            ref = graph_time(prob.fns("torch._scaled_mm.rowwise", M, ab, af, sa))
            ref_t = graph_time(prob.fns("torch._scaled_mm.tensorwise", M, ab, af, sa))
            best = min(ref, ref_t)
            auto = graph_time(prob.fns("qbackend.cutlass", M, ab, af, sa))
            native.set_programmatic_launch(False)
            try:
                auto_nopdl = graph_time(prob.fns("qbackend.cutlass", M, ab, af, sa))
            finally:
                native.set_programmatic_launch(True)
            for impl, us in (("auto", auto), ("auto_nopdl", auto_nopdl)):
                rows.append({"M": M, "N": N, "K": K, "impl": impl, "us": us, "torch_best": best})
            res = []
            for ci, name in enumerate(names):
                if configs and not name.startswith(configs):
                    continue
                swap = name.startswith("swap")
                stream = name.startswith("stream")  # the small-M kernel: its cluster split-K factor
                if stream:
                    if M > 128:
                        continue
                    variants = [(f"s{sp}", 1, sp, -1) for sp in (1, 2, 4)]
                elif (swap and M > 256) or (not swap and M < 64):
                    continue
                else:
                    coop = "coop" in name
                    variants = [(dn, d, sp, 1) for dn, d, sp in decomps] if coop else [("dp", 0, -1, 1)]
                if M >= 1024 and not stream:  # L2-friendly rasterization matters once many tiles share operands
                    last = decomps[-1] if coop else decomps[0]
                    variants = [(dn, d, sp, 1) for dn, d, sp in (decomps[3:] if coop else decomps[:1])] + \
                               [(f"{last[0]}_sw{sw}", last[1], last[2], sw) for sw in (2, 8)]
                for dname, d, sp, sw in variants:
                    native.override(ci, d, sp, sw)
                    try:
                        us = graph_time(prob.fns("qbackend.cutlass", M, ab, af, sa), target_ms=8.0)
                    except RuntimeError as e:
                        print(f"  {name}/{dname}: {e}", flush=True)
                        continue
                    finally:
                        native.override()
                    rows.append({"M": M, "N": N, "K": K, "impl": f"{name}/{dname}", "us": us,
                                 "torch_best": best})
                    res.append((us, f"{name}/{dname}"))
            res.sort()
            print(f"M={M} N={N} K={K} torch_best={best:.1f} auto={auto:.1f} (x{best / auto:.2f}) "
                  f"nopdl={auto_nopdl:.1f} | " + " ".join(f"{n}={u:.1f}" for u, n in res[:4]), flush=True)
        del prob
        torch.cuda.empty_cache()
    return rows


def eager_overhead(M: int = 1, N: int = 4096, K: int = 4096, n: int = 300) -> None:
    """Per-call wall time without graphs (host-bound at small M): Python + ctypes + launch."""
    import time
    prob = Problem(N, K, want_bf16=False)
    ab, af, sa = prob.inputs(M)
    out = torch.empty(M, N, device="cuda", dtype=BF16)
    w = prob.wf[0]
    calls = {"qbackend.cutlass": lambda: native.scaled_mm(af, w.t(), sa, prob.sb, None, out),
             "torch._scaled_mm.rowwise": lambda: torch._scaled_mm(af, w.t(), scale_a=sa, scale_b=prob.sb,
                                                                  out_dtype=BF16, use_fast_accum=True)}
    for name, f in calls.items():
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        print(f"eager M={M} N={N} K={K} {name}: {(time.perf_counter() - t0) / n * 1e6:.1f} us/call")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(_HERE, "results", "scaled_mm_h200.json"))
    ap.add_argument("--shapes", default="", help="N:K,N:K,... (default: the issue-3 list)")
    ap.add_argument("--ms", default="", help="M,M,... (default: the issue-3 list)")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--tune", action="store_true", help="sweep every SM90 config x decomposition instead")
    ap.add_argument("--configs", default="", help="--tune: only configs whose names start with one of these "
                                                  "(comma-separated)")
    args = ap.parse_args()
    if native.load() is None:
        sys.exit(f"native library unavailable: {native.load_error()}")
    shapes = shapes_arg(args.shapes)
    ms = [int(m) for m in args.ms.split(",")] if args.ms else MS
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.tune:
        rows = run_tune(shapes, ms, tuple(c for c in args.configs.split(",") if c))
    else:
        rows = run_grid(shapes, ms, args.impls.split(","))
        eager_overhead()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f,
                  indent=1)
    if not args.tune:
        print(summarize(rows))
        plot(rows, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
