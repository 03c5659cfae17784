"""Dynamic per-token and per-token-group FP8 (e4m3) quantization: qbackend's CUDA kernels against torch,
under CUDA-graph replay.

    python bench/bench_quantize.py --out bench/results/quantize_h200.json
    python bench/bench_quantize.py --granularity group --out bench/results/quantize_group_h200.json
    python bench/bench_quantize.py --sweep    # the per-token kernel's vectors per thread, automatic against forced

Per-token-group (--granularity group): 1 x 128 groups, scales [M, K/128], the activation quantize of
block-scaled FP8, at the shapes of DeepSeek-V3's hidden size (K = 7168).

Implementations (same semantics: scale = max(amax_row / 448, 1 / (448 * 512)), q = sat(x / scale)):
  qbackend       providers/native.py -> libqbackend_cuda, one fused pass
  torch.eager    the same formula in plain torch ops
  torch.compile  that function through torch.compile (Inductor/Triton), fullgraph
Inputs are bf16 [M, K], rotated over copies totalling >= 256 MB so they come from HBM; timing as in
qbackend/benchmark.py (graph of R calls, median of 5). bytes = read x + write q + write the scales:
the least traffic any implementation needs, so bytes / us is the effective bandwidth.

JSON: {"device", "torch", "rows": [{"M", "K", "impl", "us", "bytes"}]} plus a PNG bar chart of
effective TB/s next to it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from qbackend.benchmark import graph_time, interleaved
from qbackend_providers import native

_HERE = os.path.dirname(os.path.abspath(__file__))

F8 = torch.float8_e4m3fn
SHAPES = [(16, 4096), (1024, 4096), (8192, 4096), (8192, 14336)]
GROUP_SHAPES = [(16, 7168), (256, 7168), (1024, 7168), (4096, 7168), (8192, 7168), (4096, 2048)]
GROUP = 128
IMPLS = ["qbackend", "torch.eager", "torch.compile"]
ROTATE_BYTES = 256 * 2 ** 20


def torch_quant(x):
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    q = (x.float() / scale).clamp(-448.0, 448.0).to(F8)
    return q, scale


def torch_group_quant(x):
    M, K = x.shape
    xg = x.float().reshape(M, K // GROUP, GROUP)
    amax = xg.abs().amax(dim=-1, keepdim=True)
    scale = (amax / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    q = (xg / scale).clamp(-448.0, 448.0).to(F8).reshape(M, K)
    return q, scale.squeeze(-1)


def group_inputs(M, K, scale):
    """As token_inputs, for qbackend's per-token-group call (scales [M, K / GROUP])."""
    n = max(2, min(32, ROTATE_BYTES // (M * K * 2)))
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * scale for _ in range(n)]
    qs = [torch.empty(M, K, device="cuda", dtype=F8) for _ in range(n)]
    ss = [torch.empty(M, K // GROUP, device="cuda") for _ in range(n)]
    fns = [lambda x=x, q=q, s=s: native.quantize_group(x, q, s, GROUP) for x, q, s in zip(xs, qs, ss)]
    return xs, qs, ss, fns


def token_inputs(M, K, scale):
    """Copies of a bf16 x [M, K] (randn times scale) totalling >= ROTATE_BYTES (2 to 32 of them), each
    with its q and per-row scale outputs, and qbackend's per-token call on each."""
    n = max(2, min(32, ROTATE_BYTES // (M * K * 2)))
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * scale for _ in range(n)]
    qs = [torch.empty(M, K, device="cuda", dtype=F8) for _ in range(n)]
    ss = [torch.empty(M, 1, device="cuda") for _ in range(n)]
    fns = [lambda x=x, q=q, s=s: native.quantize(x, q, s, native.DYNAMIC_TOKEN) for x, q, s in zip(xs, qs, ss)]
    return xs, qs, ss, fns


def forced_time(fns, kernel, vecs):
    """graph_time(fns) with the per-token kernel and its vectors per thread forced (-1, 0: automatic)."""
    native.quantize_override(kernel, vecs)
    try:
        return graph_time(fns)
    finally:
        native.quantize_override()


def sweep_point(M, K):
    """{label: us}: the automatic choice and each forced number of vectors per thread at one shape."""
    fns = token_inputs(M, K, 1.0)[3]
    timers = {"auto": lambda: forced_time(fns, -1, 0)}
    timers.update({f"v{v}": (lambda v=v: forced_time(fns, 0, v)) for v in (1, 2, 4)})
    return interleaved(timers, 4)


def sweep():
    """The block-per-row kernel's automatic vectors per thread (auto) against one, two and four forced
    (v1, v2, v4), interleaved in 4 rounds of a balanced order: the measurements row_vecs in
    csrc_cuda/common/quantize.cu is set from."""
    for K in (4096, 8192, 14336, 28672):
        for M in (1, 16, 128, 256, 384, 512, 768, 1024, 2048):
            med = sweep_point(M, K)
            print(f"M={M} K={K} " + " ".join(f"{k}={v:.2f}" for k, v in med.items()) +
                  f" | fastest {min(med, key=med.get)}", flush=True)
            torch.cuda.empty_cache()


def group_rows(impls, compiled):
    """Per-token-group rows: qbackend checked bit for bit against the reference provider first."""
    from qbackend_providers.reference import reference_quantize

    rows = []
    for (M, K) in GROUP_SHAPES:
        xs, qs, ss, native_fns = group_inputs(M, K, 3.0)
        nbytes = M * K * 2 + M * K + M * (K // GROUP) * 4
        q_ref, s_ref = reference_quantize(xs[0], F8, "group", None, None, GROUP, None)
        native.quantize_group(xs[0], qs[0], ss[0], GROUP)
        assert torch.equal(qs[0].view(torch.uint8), q_ref.view(torch.uint8)), "qbackend != reference (q)"
        assert torch.equal(ss[0], s_ref), "qbackend != reference (scales)"
        times, line = time_impls(impls, xs, native_fns, torch_group_quant, compiled, nbytes, forced_group_kernels)
        rows += [{"M": M, "K": K, "granularity": "group", "impl": i, "us": us, "bytes": nbytes} for i, us in times]
        print(f"group {GROUP}: M={M} K={K} " + " ".join(line), flush=True)
        del xs, qs, ss, native_fns
        torch.cuda.empty_cache()
    return rows


def time_impls(impls, xs, native_fns, eager, compiled, nbytes, after_qbackend=None):
    """[(impl, us)] and the log line's parts: each implementation over the input copies, graph-timed.
    after_qbackend(fns) may add log-only parts after qbackend's."""
    times, line = [], []
    for impl in impls:
        if impl == "qbackend":
            fns = native_fns
        elif impl == "torch.eager":
            fns = [lambda x=x: eager(x) for x in xs]
        else:
            compiled(xs[0])  # compile outside the graph capture
            fns = [lambda x=x: compiled(x) for x in xs]
        us = graph_time(fns)
        times.append((impl, us))
        line.append(f"{impl}={us:.2f}us ({nbytes / us / 1e6:.2f} TB/s)")
        if impl == "qbackend" and after_qbackend is not None:
            line += after_qbackend(fns)
    return times, line


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shapes = sorted({(r["M"], r["K"]) for r in rows})
    fig, ax = plt.subplots(figsize=(9, 4.5))
    w = 0.8 / len(IMPLS)
    for i, impl in enumerate(IMPLS):
        ys = [next((r["bytes"] / r["us"] / 1e6 for r in rows
                    if (r["M"], r["K"]) == s and r["impl"] == impl), 0) for s in shapes]
        ax.bar([j + i * w for j in range(len(shapes))], ys, w, label=impl)
    ax.axhline(4.25, color="k", lw=0.8, ls="--", label="measured copy bandwidth (4.25 TB/s)")
    ax.set_xticks([j + w for j in range(len(shapes))], [f"{M}x{K}" for M, K in shapes])
    ax.set_ylabel("effective TB/s (read x + write q + scales)")
    what = "per-token-group (1 x 128)" if rows and rows[0].get("granularity") == "group" else "per-token"
    ax.set_title(f"dynamic {what} bf16 -> e4m3, {torch.cuda.get_device_name()}, CUDA-graph replay")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(_HERE, "results", "quantize_h200.json"))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (saves its compile time)")
    ap.add_argument("--sweep", action="store_true", help="only the vectors-per-thread sweep, printed")
    ap.add_argument("--granularity", choices=["token", "group"], default="token")
    args = ap.parse_args()
    if native.load() is None:
        sys.exit(f"native library unavailable: {native.load_error()}")
    if args.sweep:
        return sweep()
    impls = [i for i in IMPLS if not (args.no_compile and i == "torch.compile")]
    if args.granularity == "group":
        rows = group_rows(impls, torch.compile(torch_group_quant, fullgraph=True, dynamic=False))
    else:
        rows = token_rows(impls, torch.compile(torch_quant, fullgraph=True, dynamic=False))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f,
                  indent=1)
    plot(rows, os.path.splitext(args.out)[0] + ".png")


def forced_group_kernels(fns):
    """Log only: the per-token-group call with the block-per-row kernel's vectors per thread forced,
    and with the warp-per-group kernel forced."""
    return [f"[{name}={forced_time(fns, kern, vecs):.2f}us]" for kern, vecs, name in
            ((-1, 1, "row/1"), (-1, 2, "row/2"), (-1, 4, "row/4"), (2, 0, "warp"))]


def forced_kernels(fns):
    """Log only: the per-token call timed with each of its kernels forced."""
    return [f"[{name}={forced_time(fns, kern, vecs):.2f}us]" for kern, vecs, name in
            ((0, 1, "block/1"), (0, 2, "block/2"), (0, 4, "block/4"), (1, 0, "pipelined"))]


def token_rows(impls, compiled):
    rows = []
    for (M, K) in SHAPES:
        xs, qs, ss, native_fns = token_inputs(M, K, 3.0)
        nbytes = M * K * 2 + M * K + M * 4
        # qbackend against the exact reference (IEEE divisions by tensors) before timing
        amax = xs[0].float().abs().amax(dim=-1, keepdim=True)
        s_ref = torch.div(amax, torch.full_like(amax, 448.0)).clamp(min=1.0 / (448.0 * 512.0))
        q_ref = torch.div(xs[0].float(), s_ref).clamp(-448.0, 448.0).to(F8)
        native.quantize(xs[0], qs[0], ss[0], native.DYNAMIC_TOKEN)
        assert torch.equal(qs[0].view(torch.uint8), q_ref.view(torch.uint8)), "qbackend != reference"
        times, line = time_impls(impls, xs, native_fns, torch_quant, compiled, nbytes, forced_kernels)
        rows += [{"M": M, "K": K, "impl": i, "us": us, "bytes": nbytes} for i, us in times]
        print(f"M={M} K={K} " + " ".join(line), flush=True)
        del xs, qs, ss, native_fns
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
