"""Marlin W8A16 launches to run under Nsight Compute, one per point after a warm-up, with bf16
torch.mm on the same shape for comparison.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats -k regex:"marlin|gemm|nvjet" \
        python bench/profile_marlin.py --points 1:4096:4096,1:28672:4096 [--variant 80]

ncu flushes the caches before each kernel by default, so each weight is read from HBM, as in a model.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from qbackend_providers import marlin_native as mn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_marlin import random_e4m3  # noqa: E402  (the benchmark's weights)
from profile_small_m import run_for_profiler  # noqa: E402  (one way to hand launches to a profiler)

POINTS = [(1, 4096, 4096), (1, 28672, 4096), (16, 8192, 8192)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="", help="M:N:K,... (default: the list above)")
    ap.add_argument("--variant", type=int, default=80)
    ap.add_argument("--impls", default="marlin,bf16")
    ap.add_argument("--lib", default="", help="a standalone marlin test library to use instead")
    args = ap.parse_args()
    if args.lib:
        from probe_marlin import use_library
        use_library(args.lib)
    points = [tuple(int(v) for v in p.split(":")) for p in args.points.split(",")] if args.points else POINTS
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    for M, N, K in points:
        w8 = random_e4m3(N, K, g)
        packed = mn.prepare(w8, torch.bfloat16)
        wb = w8.to(torch.bfloat16)
        scale = torch.rand(N, device="cuda", generator=g) + 0.5
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ws = mn.new_workspace(N, K, "cuda")
        calls = [("marlin", lambda: mn.mm(a, packed, scale, None, out, N, K, variant=args.variant, workspace=ws)),
                 ("bf16", lambda: torch.mm(a, wb.t()))]
        run_for_profiler(f"M={M} N={N} K={K}", calls, args.impls.split(","))


if __name__ == "__main__":
    main()
