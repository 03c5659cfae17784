"""The grouped FP8 kernel families on this GPU, config by config, on the expert layers of bench_moe.py's
models: where the sm90 family's swapped (token-narrow) configs give way to its 128 x 128 ones
(fp8_grouped_sm90_dispatch.cu), what the sm89 family (mma.sync, through its PTX on Hopper) does at the
same points, and, for per-token x per-channel scales, torch._scaled_grouped_mm (fast accumulation).
bench_moe.py's routing and weights, CUDA-graph replay, bf16 out.

    python bench/probe_grouped_sm90.py [--models deepseek,qwen3,mixtral] [--tokens 1,16,64,256,1024,4096,16384]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_moe import gpu_time, layers_of, make_weights, route  # noqa: E402

from qbackend_providers import native  # noqa: E402

TRIAL_MS = 5.0


def kernels(block: bool) -> list:
    """(label, variant, config): each sm90 config for these scales forced, then the sm89 family's
    automatic choice, then (per-token x per-channel) torch's grouped GEMM."""
    out = [(name, 90, i) for i, name in enumerate(native.grouped_config_names(90))
           if ("_block_" in name) == block]
    out.append(("sm89 auto", 89, -1))
    return out if block else out + [("torch._scaled_grouped_mm", None, -1)]


def probe_layer(layer, tokens: list) -> None:
    w = make_weights(layer, 1, "cuda", seed=layer.N)[0]
    b, sb = w.b, w.sb.contiguous()
    for t in tokens:
        rt = route(layer, t, 0, "cuda")
        rows = rt.a.shape[0]
        sa = rt.sa.reshape(rows, -1).contiguous() if layer.block else rt.sa.reshape(-1).contiguous()
        out = torch.empty(rows, layer.N, dtype=torch.bfloat16, device="cuda")
        line = [f"{layer.shape:<22} T={t:>5} rows={rows:>6}"]
        for label, variant, config in kernels(layer.block):
            native.grouped_override(config)
            if variant is None:
                def call():
                    return torch._scaled_grouped_mm(rt.a, b, rt.sa_torch, sb, offs=rt.offsets,
                                                    out_dtype=torch.bfloat16, use_fast_accum=True)
            else:
                def call(variant=variant):
                    return native.grouped_scaled_mm(rt.a, b, sa, sb, rt.offsets, None, out, block=layer.block,
                                                    variant=variant)
            us = gpu_time([call], TRIAL_MS)
            line.append(f"{label} {us:9.1f} us {2 * rows * layer.N * layer.K / us / 1e6:7.1f} TF/s")
        native.grouped_override(-1)
        print("  |  ".join(line), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="deepseek,qwen3,mixtral")
    ap.add_argument("--tokens", default="1,16,64,256,1024,4096,16384")
    args = ap.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    for layer in layers_of(args.models.split(","), tiny=False):
        probe_layer(layer, tokens)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
