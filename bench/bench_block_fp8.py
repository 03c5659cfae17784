"""Block-scaled FP8 GEMM (1 x 128 activation groups, 128 x 128 weight blocks, bf16 out) on this GPU:
qbackend against torch's cuBLASLt blockwise path, a Triton kernel of the engines' algorithm and bf16
torch.mm, under CUDA-graph replay with weight copies rotated past the L2.

    python bench/bench_block_fp8.py --out bench/results/block_fp8_h200.json [--shapes 2112:7168,...] [--ms 1,16]

impl (each checked against the dequantized fp32 product before it is timed):
  qbackend.block            qbackend.linear on a prepare_weight'ed block weight, activations and their
                            scales as qbackend.quantize(..., "group") made them (the public API a model calls)
  torch._scaled_mm.blockwise torch.nn.functional.scaled_mm with BlockWise1x128 / BlockWise128x128 (cuBLASLt),
                            its scales laid out for it and M padded to a multiple of 4 beforehand; absent
                            (and listed under "skipped" with torch's message) where the installed torch refuses
  triton.block              bench/triton_block_fp8.py, autotuned per (M bucket, N, K) before timing
  torch.mm.bf16             the same GEMM unquantized
JSON: {"device", "torch", "rows": [{"M", "N", "K", "impl", "us"}], "skipped": [...]}, and a PNG of
TFLOP/s next to it.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import qbackend
from qbackend.benchmark import graph_time, weight_copies
from qbackend_providers.torch_fallback import blockwise_scale_b

F8 = torch.float8_e4m3fn
SHAPES = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048),
          (24576, 7168), (7168, 18432)]
MS = [1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
IMPLS = ["qbackend.block", "torch._scaled_mm.blockwise", "triton.block", "torch.mm.bf16"]
TOL = 2e-2   # relative (norm-wise) against the fp32 product of the dequantized operands


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _torch_blockwise(a, b, sa_t, sb_t):
    F = torch.nn.functional
    return F.scaled_mm(a, b, sa_t, F.ScalingType.BlockWise1x128, sb_t, F.ScalingType.BlockWise128x128,
                       output_dtype=torch.bfloat16)


def point(M, N, K, weights, g, triton_mm, skipped):
    """{impl: us} at one (M, N, K); `weights` are (w_q, w_s, prepared, torch scale, bf16 w) copies."""
    x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    qa, sa = qbackend.quantize(x, F8, "group", group_size=128)
    w_q, w_s = weights[0][0], weights[0][1]
    ref = qbackend.dequantize(qa, sa, torch.float32) @ qbackend.dequantize(w_q, w_s, torch.float32).t()
    calls = {
        "qbackend.block": [lambda p=p: qbackend.linear(qa, p, sa, out_dtype=torch.bfloat16)
                           for _, _, p, _, _ in weights],
        "triton.block": [lambda w=w, s=s: triton_mm(qa, w.t(), sa, s.t()) for w, s, _, _, _ in weights],
        "torch.mm.bf16": [lambda wb=wb: torch.mm(x, wb.t()) for *_, wb in weights],
    }
    # cuBLASLt takes the 1 x 128 activation scales M-major with M a multiple of 4: the activations and
    # their scales are padded once here (zero rows, unit scales), as an engine would allocate them.
    rows4 = -(-M // 4) * 4
    qa4 = torch.zeros((rows4, K), dtype=F8, device="cuda")
    qa4[:M] = qa
    sa_t = torch.ones((sa.shape[1], rows4), device="cuda").t()
    sa_t[:M] = sa
    calls["torch._scaled_mm.blockwise"] = [lambda w=w, ts=ts: _torch_blockwise(qa4, w.t(), sa_t, ts)[:M]
                                           for w, _, _, ts, _ in weights]
    out = {}
    for impl in IMPLS:
        if impl not in calls:
            continue
        try:
            got = calls[impl][0]()  # also Triton's autotuning, outside the graph capture
            torch.cuda.synchronize()
        except (RuntimeError, ValueError, NotImplementedError) as e:
            skipped.append({"M": M, "N": N, "K": K, "impl": impl, "why": str(e).splitlines()[0][:200]})
            continue
        if impl != "torch.mm.bf16":
            err = _rel(got, ref)
            if not (err < TOL):
                raise AssertionError(f"{impl} at M={M} N={N} K={K}: relative error {err:.3g} > {TOL}")
        out[impl] = graph_time(calls[impl])
    return out


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shapes = sorted({(r["N"], r["K"]) for r in rows})
    cols = 3
    fig, axes = plt.subplots(-(-len(shapes) // cols), cols, figsize=(15, 3.6 * -(-len(shapes) // cols)),
                             squeeze=False)
    for ax, (N, K) in zip(axes.flat, shapes):
        for impl in IMPLS:
            pts = sorted((r["M"], 2 * r["M"] * N * K / r["us"] / 1e6) for r in rows
                         if (r["N"], r["K"]) == (N, K) and r["impl"] == impl)
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"N={N} K={K}", fontsize=9)
        ax.set_xlabel("M")
        ax.set_ylabel("TFLOP/s")
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"block-scaled FP8, bf16 out, {torch.cuda.get_device_name()}, CUDA-graph replay")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def save(path, rows, skipped):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                   "skipped": skipped}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(f"{n}:{k}" for n, k in SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--cube", type=int, default=8192, help="also M = N = K = this (0: not)")
    args = ap.parse_args()
    from triton_block_fp8 import block_fp8_mm

    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",") if s]
    ms = [int(m) for m in args.ms.split(",") if m]
    points = [(n, k, ms) for n, k in shapes] + ([(args.cube, args.cube, [args.cube])] if args.cube else [])
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, skipped = [], []
    for N, K, m_list in points:
        copies = weight_copies(N * K * 3)  # fp8 + bf16 copies of the weight move per rotation
        weights = []
        for _ in range(copies):
            w = torch.randn(N, K, device="cuda", generator=g, dtype=torch.bfloat16) / K ** 0.5
            w_q, w_s = qbackend.quantize(w, F8, "block", block_size=(128, 128))
            pw = qbackend.prepare_weight(w_q, w_s, F8, "group", out_dtype=torch.bfloat16)
            weights.append((w_q, w_s, pw, blockwise_scale_b(w_s.t().contiguous()), w))
        for M in m_list:
            times = point(M, N, K, weights, g, block_fp8_mm, skipped)
            rows += [{"M": M, "N": N, "K": K, "impl": impl, "us": us} for impl, us in times.items()]
            tf = {impl: 2 * M * N * K / us / 1e6 for impl, us in times.items()}
            best_other = max((tf[i] for i in ("torch._scaled_mm.blockwise", "triton.block") if i in tf),
                             default=float("nan"))
            ours = tf.get("qbackend.block", float("nan"))
            print(f"M={M:5d} N={N:5d} K={K:5d} " + " ".join(f"{i}={times[i]:.2f}us/{tf[i]:.0f}TF" for i in times)
                  + f"  x{ours / best_other:.2f} vs best other", flush=True)
        del weights
        torch.cuda.empty_cache()
        save(args.out, rows, skipped)  # after every shape: a run cut short keeps what it measured
    plot(rows, os.path.splitext(args.out)[0] + ".png")
    for s in skipped[:20]:
        print("skipped:", s)


if __name__ == "__main__":
    main()
