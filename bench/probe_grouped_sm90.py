"""The grouped block-scaled FP8 kernel families on this GPU, config by config, on DeepSeek-V3's expert
layers: where the sm90 family's swapped (token-narrow) config gives way to its 128 x 128 one
(fp8_grouped_sm90_dispatch.cu), and what the sm89 family (mma.sync, through its PTX on Hopper) does
at the same points. bench_moe.py's routing and weights, CUDA-graph replay, bf16 out.

    python bench/probe_grouped_sm90.py [--tokens 1,16,64,256,1024,4096,16384] [--layers gate_up,down]
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


def kernels() -> list:
    """(label, variant, config): each sm90 config forced, then the sm89 family's automatic choice."""
    out = [(f"sm90 {name}", 90, i) for i, name in enumerate(native.grouped_config_names(90))]
    return out + [("sm89 auto", 89, -1)]


def probe_layer(layer, tokens: list) -> None:
    w = make_weights(layer, 1, "cuda", seed=layer.N)[0]
    b, sb = w.b, w.sb.contiguous()
    for t in tokens:
        rt = route(layer, t, 0, "cuda")
        rows = rt.a.shape[0]
        sa = rt.sa.contiguous()
        out = torch.empty(rows, layer.N, dtype=torch.bfloat16, device="cuda")
        line = [f"{layer.shape:<22} T={t:>5} rows={rows:>6}"]
        for label, variant, config in kernels():
            native.grouped_override(config)

            def call(variant=variant):
                return native.grouped_scaled_mm(rt.a, b, sa, sb, rt.offsets, None, out, block=True, variant=variant)
            us = gpu_time([call], TRIAL_MS)
            line.append(f"{label} {us:9.1f} us {2 * rows * layer.N * layer.K / us / 1e6:7.1f} TF/s")
        native.grouped_override(-1)
        print("  |  ".join(line), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,16,64,256,1024,4096,16384")
    ap.add_argument("--layers", default="gate_up,down")
    args = ap.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    wanted = args.layers.split(",")
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    for layer in (la for la in layers_of(["deepseek"], tiny=False) if la.name in wanted):
        probe_layer(layer, tokens)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
