"""Interleaved A/B of SM90 scaled_mm configs: the dispatcher's choice next to forced candidates.

    python bench/ab_configs.py [--ms 64,128,256,512,1024,2048] [--shapes N:K,...] [--rounds 4] [--only L,...]

Why not --tune: under sustained FP8 GEMM load the H200 sits at its 700 W power limit and its SM
clock wanders (1.2 to 1.75 GHz seen within one minute), so timings taken one after the other drift by
+-10 %. Here every candidate of a point is timed once per round, the rounds' orders taken from a
balanced design (benchmark.interleaved), and each candidate's median over the rounds is reported. With
more candidates than rounds the design is incomplete, so what is left of the drift is still several
per cent: "auto" and the same config forced are timed as two candidates, and their difference shows
how much. Timing as benchmark.graph_time (CUDA-graph replay, weights rotated past L2), ~8 ms per trial.
Prints one line per point; the decisions in fp8_sm90_dispatch.cu cite these lines.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from functools import partial

import torch

from qbackend.benchmark import graph_time, interleaved
from qbackend_providers import native

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scaled_mm import F8, Problem, shapes_arg  # noqa: E402

# label -> (config name, decomposition: 0 data-parallel, 2 stream-K, 3 CUTLASS heuristic[, splits
# [, swizzle]]); "auto" is the dispatcher's own choice. For the small-M kernel ("stream_*") `splits`
# is its cluster size and `swizzle` its tiles per CTA before the cluster's shared one; -1 there
# means the kernel's own choice. Swizzle 1 unless given. Labels streamR/cCwW (R = 64 or 128 rows,
# C CTAs per cluster, W tiles per CTA before the shared one) may be asked for with --only.
# The wave-fit tiles: 128 token rows, so timed from M = 65 on (the 160-wide ones pair two token tiles
# in a cluster, so from M = 129: WAVE_FIT_FROM_M).
WAVE_FIT = {
    "coop128x96/dp": ("128x96x128_coop", 0),
    "coop128x192/dp": ("128x192x128_coop", 0),
    "coop128x224/dp": ("128x224x128_coop", 0),
    "ping128x160/dp": ("128x160x128_ping_c2x1", 0),
}
WAVE_FIT_FROM_M = {label: 129 if label.startswith("ping") else 65 for label in WAVE_FIT}
# Tokens on the tile's 64-row side, 80 channels wide: for 32 < M <= 64.
ONE_TOKEN_TILE = {"ping64x80/dp": ("64x80x128_ping", 0)}
# Tokens on the 64-row side in 2x1 clusters, the pair of token tiles sharing each weight tile: for
# 96 < M <= 128 (below that the second token tile would miss 32 rows or more).
TOKEN_PAIRS = {
    "ping64x96c2/dp": ("64x96x128_ping_c2x1", 0),
    "ping64x160c2/dp": ("64x160x128_ping_c2x1", 0),
    "ping64x224c2/dp": ("64x224x128_ping_c2x1", 0),
}
LARGE_M = {
    "auto": None,
    "ping128x128/dp": ("128x128x128_ping_c2x1", 0),
    "coop128x128/streamk": ("128x128x128_coop", 2),
    "coop128x256/heur": ("128x256x128_coop_c2x1", 3),
    "coop128x256/streamk": ("128x256x128_coop_c2x1", 2),
    **WAVE_FIT,
}
# Above M = 2048 the tile rasterization decides how much of A and B neighbouring CTAs share in L2.
HUGE_M = {
    "ping128x128/dp/sw4": ("128x128x128_ping_c2x1", 0, -1, 4),
    "ping128x128/dp/sw8": ("128x128x128_ping_c2x1", 0, -1, 8),
    "coop128x256/heur/sw8": ("128x256x128_coop_c2x1", 3, -1, 8),
    "coop128x256/streamk/sw8": ("128x256x128_coop_c2x1", 2, -1, 8),
}
SWAPPED = {
    "swap128x64/dp": ("swap_128x64x128_coop", 0),
    "swap64x96/dp": ("swap_64x96x128_ping", 0),
    "swap64x64c2/dp": ("swap_64x64x128_ping_c1x2", 0),
    "swap64x128/dp": ("swap_64x128x128_ping", 0),
}
SMALL_M = {
    "auto": None,
    "swap64x64/dp": ("swap_64x64x128_ping", 0),
    **SWAPPED,
    "swap128x64/streamk": ("swap_128x64x128_coop", 2),
    "swap128x64/heur": ("swap_128x64x128_coop", 3),
    "coop128x128/heur": ("128x128x128_coop", 3),
    "coop128x128/streamk": ("128x128x128_coop", 2),
    **WAVE_FIT,
    **ONE_TOKEN_TILE,
    **TOKEN_PAIRS,
    "stream64/s1": ("stream_64", 0, 1, -1),
    "stream64/s2": ("stream_64", 0, 2, -1),
    "stream128/s1": ("stream_128", 0, 1, -1),
    "stream128/s2": ("stream_128", 0, 2, -1),
    "stream64/auto": ("stream_64", 0, -1, -1),
}
# One token tile for 128 < M <= 192: the swapped 64-row ping-pong config of 192 tokens.
ONE_TILE_MID_M = {"swap64x192/dp": ("swap_64x192x128_ping", 0)}
# Named for --only: the swapped ping-pong configs of the narrower token tiles.
NARROW = {
    "swap64x16/dp": ("swap_64x16x128_ping", 0),
    "swap64x32/dp": ("swap_64x32x128_ping", 0),
}
STREAM_LABEL = re.compile(r"stream(64|128)/c(\d+)w(\d+)")


def candidate(label: str):
    """The candidate a label names: one of the tables above, or a streamR/cCwW plan."""
    for table in (SMALL_M, LARGE_M, HUGE_M, NARROW, ONE_TILE_MID_M):
        if label in table:
            return table[label]
    m = STREAM_LABEL.fullmatch(label)
    if not m:
        sys.exit(f"unknown candidate {label!r}")
    return (f"stream_{m[1]}", 0, int(m[2]), int(m[3]))


def candidates(M: int) -> dict:
    """The configs worth timing at M (the small-M kernel takes at most 64 tokens)."""
    if M <= 128:

        def wanted(label, v):
            if v and v[0].startswith("stream"):
                return M <= 64
            if label in ONE_TOKEN_TILE:
                return 32 < M <= 64
            if label in TOKEN_PAIRS:
                return 96 < M
            if label in WAVE_FIT:
                return M >= WAVE_FIT_FROM_M[label]
            return True

        return {k: v for k, v in SMALL_M.items() if wanted(k, v)}
    if M <= 256:
        return dict(LARGE_M, **SWAPPED, **(ONE_TILE_MID_M if M <= 192 else {}))
    return dict(LARGE_M, **HUGE_M) if M > 2048 else dict(LARGE_M)


def time_candidate(prob: Problem, M: int, inputs, cand) -> float:
    ab, af, sa = inputs
    if cand == "tensorwise":
        return graph_time(prob.fns("torch._scaled_mm.tensorwise", M, ab, af, sa), target_ms=8.0)
    if cand is not None:
        config = native.config_names(F8, 90).index(cand[0])
        native.override(config, cand[1], cand[2] if len(cand) > 2 else -1, cand[3] if len(cand) > 3 else 1)
    try:
        return graph_time(prob.fns("qbackend.cutlass", M, ab, af, sa), target_ms=8.0)
    finally:
        native.override()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="64,128,256,512,1024,2048")
    ap.add_argument("--shapes", default="", help="N:K,N:K,... (default: the issue-3 list)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--only", default="", help="label,label,... to time instead of the default candidates "
                    "(auto and cuBLASLt tensorwise are always timed)")
    args = ap.parse_args()
    if native.load() is None:
        sys.exit(f"native library unavailable: {native.load_error()}")
    shapes = shapes_arg(args.shapes)
    ms = [int(m) for m in args.ms.split(",")]
    for (N, K) in shapes:
        prob = Problem(N, K, want_bf16=False)
        for M in ms:
            inputs = prob.inputs(M)
            if args.only:
                cands = {"auto": None, **{label: candidate(label) for label in args.only.split(",")}}
            else:
                cands = candidates(M)
            cands["tensorwise"] = "tensorwise"
            med = interleaved({label: partial(time_candidate, prob, M, inputs, cand)
                               for label, cand in cands.items()}, args.rounds)
            best = min((us, label) for label, us in med.items() if label != "tensorwise")
            print(f"M={M} N={N} K={K} " + " ".join(f"{label}={us:.1f}" for label, us in med.items()) +
                  f" | fastest {best[1]}; auto at x{med['tensorwise'] / med['auto']:.2f} of tensorwise",
                  flush=True)
        del prob
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
