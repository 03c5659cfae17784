"""Where the marlin kernel's time goes on small weights.

Timings under CUDA-graph replay (the benchmark's method) of
  - a trivial kernel per call (the hand-over floor between back-to-back kernels in a graph),
  - the same 16 MiB of weights in shapes with different split-K (4096x4096: each column split over
    4 blocks; 16384x1024: none; 1024x16384: 16 blocks per column),
  - the ring depth and resident blocks per multiprocessor on the shapes that miss their targets;
and, with --trace and a library built with the kernel's timeline trace
(csrc_cuda/marlin/build_standalone.sh OUT -DQB_MARLIN_TRACE), each block's life in one launch:
when it starts, when each of its tiles is ready, when its loop ends, when it sums a split column
as the last contributor, and when it exits. --ab times several such builds' automatic choice
against each other in one process (alternating), --check runs the work-split and ring-depth GPU
tests on a build the tests themselves cannot load.

    python bench/probe_marlin.py [--lib OUT/libqbackend_marlin_test.so] [--variant 80]
    python bench/probe_marlin.py --lib OUT/libqbackend_marlin_test.so --skip-timing --trace 1:4096:4096,...
    python bench/probe_marlin.py --ab A/libqbackend_marlin_test.so,B/libqbackend_marlin_test.so
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys

import torch

from qbackend.benchmark import graph_time
from qbackend_providers import marlin_native as mn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_marlin import random_e4m3, weight_copies  # noqa: E402

dev = "cuda"
TRACE_TILES = 32  # kTraceTiles in marlin_kernel.cuh
SLOT_LOOP_END, SLOT_REDUCE, SLOT_END, SLOT_INFO = TRACE_TILES + 1, TRACE_TILES + 2, TRACE_TILES + 3, TRACE_TILES + 4
SLOT_CLK_ENTRY, SLOT_CLK_FINISH, SLOT_CLK_END = TRACE_TILES + 5, TRACE_TILES + 6, TRACE_TILES + 12
FINISH_STEPS = ["warps met", "k groups summed", "partials stored", "counter returned", "reduced + epilogue"]


def use_library(path: str):
    """Serve marlin from a standalone test library instead of libqbackend_cuda."""
    lib = ctypes.CDLL(path)
    mn._bind(lib)
    mn._lib = lib
    return lib


def problem(M: int, N: int, K: int):
    """Rotated packed weights (see weight_copies), per-channel scales, workspace, activations, output."""
    packed = [mn.prepare(random_e4m3(N, K), torch.bfloat16) for _ in range(weight_copies(N, K))]
    scale = torch.rand(N, device=dev) + 0.5
    ws = mn.new_workspace(N, K, dev)
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    return packed, scale, ws, a, out


def marlin_timer(M: int, N: int, K: int, variant: int):
    packed, scale, ws, a, out = problem(M, N, K)

    def t(**kw) -> float:
        return graph_time([lambda p=p: mn.mm(a, p, scale, None, out, N, K, variant=variant, workspace=ws, **kw)
                           for p in packed], 5.0)
    t()  # warm-up
    return t


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def spread(name: str, xs_ns) -> str:
    if not xs_ns:
        return f"{name}: -"
    return f"{name} {pct(xs_ns, 0) / 1e3:5.2f}/{pct(xs_ns, 0.5) / 1e3:5.2f}/{pct(xs_ns, 1) / 1e3:5.2f}"


def trace_point(lib, M: int, N: int, K: int, variant: int) -> None:
    """One launch of a (M, N, K) GEMM from HBM (other weights read in between), its blocks' timelines."""
    n_values = 1024 * 64
    buf = (ctypes.c_ulonglong * n_values)()
    lib.qb_marlin_trace_read.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.qb_marlin_trace_read.restype = ctypes.c_int
    packed, scale, ws, a, out = problem(M, N, K)
    for p in packed:  # warm-up; the last weight read stays out of L2 until it is used again below
        mn.mm(a, p, scale, None, out, N, K, variant=variant, workspace=ws)
    for rep in range(3):
        torch.cuda.synchronize()
        lib.qb_marlin_trace_read(buf, n_values)  # clear
        mn.mm(a, packed[rep % len(packed)], scale, None, out, N, K, variant=variant, workspace=ws)
        slots = lib.qb_marlin_trace_read(buf, n_values)
        if slots < 0:
            raise RuntimeError("qb_marlin_trace_read failed")
        blocks = []
        for b in range(1024):
            row = buf[b * slots:(b + 1) * slots]
            if row[0] == 0:
                continue
            ready = [row[1 + i] for i in range(TRACE_TILES) if row[1 + i]]
            blocks.append((row[0], ready, row[SLOT_LOOP_END], row[SLOT_REDUCE], row[SLOT_END], row[SLOT_INFO],
                           row[SLOT_CLK_ENTRY:SLOT_CLK_END + 1]))
        t0 = min(b[0] for b in blocks)
        t_end = max(b[4] for b in blocks)
        starts = [b[0] - t0 for b in blocks]
        first = [b[1][0] - b[0] for b in blocks if b[1]]
        steps = [y - x for b in blocks for x, y in zip(b[1], b[1][1:])]
        loop = [b[2] - b[0] for b in blocks]
        after_loop = [b[4] - b[2] for b in blocks if not b[3]]
        reduce_wait = [b[3] - b[2] for b in blocks if b[3]]
        reduce_len = [b[4] - b[3] for b in blocks if b[3]]
        ends = [b[4] - t0 for b in blocks]
        diffs = sorted({abs(y - x) for b in blocks for x, y in zip(b[1], b[1][1:]) if y != x})
        sms = len({b[5] & 0xFFFF for b in blocks})
        tiles = statistics.median(len(b[1]) for b in blocks)
        print(f"M={M} {N}x{K} launch {rep}: {len(blocks)} blocks on {sms} SMs, {tiles:.0f} tiles each, span "
              f"{(t_end - t0) / 1e3:5.2f} us (min/median/max in us) | {spread('start', starts)} | "
              f"{spread('first tile ready', first)} | {spread('tile to tile', steps)} | "
              f"{spread('loop', loop)} | {spread('no-reduce exit after loop', after_loop)} | "
              f"{len(reduce_len)} reducers: {spread('loop to reduce', reduce_wait)} {spread('reduce', reduce_len)} | "
              f"{spread('end', ends)} | timer step {diffs[0] if diffs else 0} ns", flush=True)
        # the steps of the last finish_segment, from clock64 (cycles -> ns by each block's own clock)
        for label, pick in (("non-reducers", lambda b: not b[3]), ("reducers", lambda b: b[3])):
            sel = [b for b in blocks if pick(b) and b[6][-1] > b[6][0] and b[4] > b[0]]
            if not sel:
                continue
            ghz = statistics.median((b[6][-1] - b[6][0]) / (b[4] - b[0]) for b in sel)
            steps_ns = []
            for k, name in enumerate(FINISH_STEPS):
                d = [(b[6][2 + k] - b[6][1 + k]) / ghz for b in sel if b[6][2 + k] and b[6][1 + k]]
                if d:
                    steps_ns.append(f"{name} +{statistics.median(d):5.0f}")
            tail = [(b[6][-1] - max(c for c in b[6][1:-1] if c)) / ghz for b in sel]
            print(f"   {label} ({len(sel)}, clock {ghz:.2f} GHz), finish_segment steps in ns (median): "
                  + ", ".join(steps_ns) + f", then exit +{statistics.median(tail):5.0f}", flush=True)
        edges = [0.5 * i for i in range(int((t_end - t0) / 500) + 2)]
        hist = [sum(1 for e in ends if lo * 1e3 <= e < (lo + 0.5) * 1e3) for lo in edges]
        print("   exits per 0.5 us: " + " ".join(str(h) for h in hist), flush=True)


def check_splits(variant: int) -> None:
    """tests/gpu/test_native_marlin.py's work-split and ring-depth tests against the loaded library
    (for a development build, which the tests themselves cannot load)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
    import test_native_marlin as t

    g = torch.Generator(device=dev)
    g.manual_seed(1)
    for shape in [(4096, 4096), (6144, 4096), (1000, 1000), (4160, 3080), (28672, 4096)]:
        t.test_every_work_split(variant, shape, g)
    if variant == 80:
        t.test_every_ring_depth(g)
    print(f"check sm{variant}: passed", flush=True)


def ab_libraries(paths, shapes, ms, rounds: int = 3) -> None:
    """The automatic configuration of several builds, timed in alternation in one process."""
    libs = []
    for path in paths:
        lib = ctypes.CDLL(path)
        mn._bind(lib)
        libs.append(lib)
    for (N, K) in shapes:
        for M in ms:
            mn._lib = libs[0]
            t = marlin_timer(M, N, K, 80)
            res = [[] for _ in libs]
            for r in range(rounds):
                order = list(range(len(libs))) if r % 2 == 0 else list(reversed(range(len(libs))))
                for i in order:
                    mn._lib = libs[i]
                    res[i].append(t())
            med = [statistics.median(x) for x in res]
            print(f"A/B M={M:2d} {N}x{K}: " + " | ".join(f"{os.path.basename(os.path.dirname(p))} {m:7.2f}"
                                                        for p, m in zip(paths, med)), flush=True)
            del t
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", type=int, default=80)
    ap.add_argument("--lib", default="", help="a standalone marlin test library to use instead")
    ap.add_argument("--trace", default="", help="M:N:K,... points to trace (needs a traced --lib)")
    ap.add_argument("--sweep", default="4096x4096,6144x4096,10240x8192")
    ap.add_argument("--sweep-ms", default="1,16", help="rows of the sweep's points")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--check", action="store_true", help="check results under many work splits first")
    ap.add_argument("--ab", default="", help="comma-separated library paths to time against each other")
    ap.add_argument("--ab-ms", default="1,16", help="rows of the --ab points")
    ap.add_argument("--ab-rounds", type=int, default=3, help="alternating rounds per --ab point (median)")
    ap.add_argument("--ab-shapes", default="4096x4096,6144x4096,4096x14336,8192x8192,10240x8192,28672x4096,"
                    "8192x28672,57344x8192")
    args = ap.parse_args()
    if args.ab:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.ab_shapes.split(",")]
        ab_libraries(args.ab.split(","), shapes, [int(m) for m in args.ab_ms.split(",")], args.ab_rounds)
        return
    lib = use_library(args.lib) if args.lib else None
    if args.check:
        check_splits(args.variant)
    if args.trace:
        for pt in args.trace.split(","):
            M, N, K = (int(v) for v in pt.split(":"))
            trace_point(lib, M, N, K, args.variant)
            torch.cuda.empty_cache()
    if args.skip_timing:
        return
    x = torch.zeros(16, device=dev)
    floor = graph_time([lambda: x.add_(1.0) for _ in range(64)], 5.0)
    print(f"trivial kernel per call in a graph: {floor:6.2f} us", flush=True)

    for (N, K) in [(4096, 4096), (16384, 1024), (1024, 16384), (8192, 2048), (2048, 8192)]:
        t = marlin_timer(1, N, K, args.variant)
        us = t()
        print(f"split shape M=1 N={N:5d} K={K:5d}: {us:7.2f} us ({N * K / us / 1e6:4.2f} TB/s)", flush=True)
        del t
        torch.cuda.empty_cache()

    for s in args.sweep.split(","):
        N, K = map(int, s.split("x"))
        for M in (int(m) for m in args.sweep_ms.split(",")):
            t = marlin_timer(M, N, K, args.variant)
            line = [f"M={M:2d} {N}x{K} auto {t():7.2f}"]
            for bps, stages in [(1, 2), (1, 3), (1, 4), (1, 6), (1, 8), (1, 10), (1, 12), (2, 2), (2, 3), (2, 4)]:
                line.append(f"b{bps}s{stages} {t(stages=stages, blocks_per_sm=bps):7.2f}")
            print(" | ".join(line), flush=True)
            del t
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
