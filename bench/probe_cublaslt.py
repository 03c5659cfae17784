"""What cuBLASLt runs where it is ahead, and what a GEMM costs in clock and power under sustained load.

    python bench/probe_cublaslt.py --kernels [--points M:N:K,...]
    python bench/probe_cublaslt.py --power [--points M:N:K,...] [--seconds 2]

--kernels: the kernel names (cuBLASLt's encode its tile, cluster and schedule) that torch._scaled_mm
runs in each mode (rowwise: per-token x per-channel scales; tensorwise), next to the config qbackend's
dispatcher picks, one line per point, from one profiled call each after a warm-up.

--power: each implementation's graph of calls (weights rotated past L2) replayed for --seconds while
NVML samples the SM clock and the board power every 20 ms; one line per implementation with us per
call, TFLOP/s, mean SM clock, mean power and FLOP per SM cycle (the rate with the clock divided out:
equal per-cycle rates with unequal clocks point at energy per operation, under the 700 W limit;
unequal per-cycle rates point at the main loop or the schedule). The implementations run in turn,
twice (ABBA order), so that drift shows as a difference between the two passes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import torch

from qbackend.benchmark import captured
from qbackend_providers import native

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scaled_mm import SHAPES, Problem  # noqa: E402

IMPLS = ("qbackend.cutlass", "torch._scaled_mm.rowwise", "torch._scaled_mm.tensorwise")
DEFAULT_POINTS = [(m, n, k) for m in (128, 512, 4096, 8192) for n, k in SHAPES]


def parse_points(text: str) -> list:
    return [tuple(int(v) for v in p.split(":")) for p in text.split(",")] if text else DEFAULT_POINTS


def kernel_names(fn) -> list:
    """Names of the CUDA kernels one call of fn launches (after a warm-up call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def problems(points: list):
    """(problem, M, inputs) for each point, one Problem (its rotated weights) per (N, K) at a time."""
    for (N, K) in dict.fromkeys((n, k) for _, n, k in points):
        prob = Problem(N, K, want_bf16=False)
        for M in sorted(m for m, n, k in points if (n, k) == (N, K)):
            yield prob, M, prob.inputs(M)
        del prob
        torch.cuda.empty_cache()


def list_kernels(points: list, sms: int) -> None:
    for prob, M, (ab, af, sa) in problems(points):
        ours = native.auto_config(M, prob.N, prob.K, sm_count=sms)
        names = {impl: kernel_names(prob.fns(impl, M, ab, af, sa)[0]) for impl in IMPLS[1:]}
        print(f"M={M} N={prob.N} K={prob.K} qbackend={ours['config']}/d{ours['decomposition']}/sw{ours['swizzle']} "
              + " ".join(f"{impl.split('.')[-1]}={'+'.join(ks)}" for impl, ks in names.items()), flush=True)


class Sampler:
    """NVML samples of SM clock (MHz) and board power (W) every 20 ms on a thread."""

    def __init__(self):
        import pynvml
        pynvml.nvmlInit()
        self.nv = pynvml
        self.h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        self.clock, self.power, self._run = [], [], False

    def _loop(self):
        while self._run:
            self.clock.append(self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM))
            self.power.append(self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000)
            time.sleep(0.02)

    def __enter__(self):
        self.clock, self.power, self._run = [], [], True
        self.t = threading.Thread(target=self._loop)
        self.t.start()
        return self

    def __exit__(self, *exc):
        self._run = False
        self.t.join()


def sustained(fns: list, seconds: float) -> tuple:
    """(us per call, mean SM MHz, mean W) over `seconds` of replaying one graph of fns."""
    g, per_replay_ms = captured(fns)
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = max(1, int(seconds * 1e3 / per_replay_ms))
    with Sampler() as smp:
        st.record()
        for _ in range(reps):
            g.replay()
        en.record()
        torch.cuda.synchronize()
    us = st.elapsed_time(en) * 1e3 / reps / len(fns)
    # the first samples may still see the clock of the idle gap before: drop the first quarter
    q = len(smp.clock) // 4
    return us, statistics.mean(smp.clock[q:]), statistics.mean(smp.power[q:])


def power(points: list, seconds: float, sms: int) -> None:
    for prob, M, (ab, af, sa) in problems(points):
        flop = 2 * M * prob.N * prob.K
        res = {impl: [] for impl in IMPLS}
        for impl in IMPLS + IMPLS[::-1]:
            res[impl].append(sustained(prob.fns(impl, M, ab, af, sa), seconds))
        for impl, runs in res.items():
            cells = []
            for us, mhz, watts in runs:
                tflops = flop / us / 1e6
                per_cycle = tflops * 1e12 / (mhz * 1e6 * sms)
                cells.append(f"{us:8.1f} us {tflops:6.0f} TF/s {mhz:5.0f} MHz {watts:4.0f} W "
                             f"{per_cycle:5.0f} FLOP/SM/cycle")
            print(f"M={M} N={prob.N} K={prob.K} {impl:28s} " + " | ".join(cells), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--power", action="store_true")
    ap.add_argument("--points", default="", help="M:N:K,... (default: M 128, 512, 4096, 8192 on the 8 shapes)")
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    if native.load() is None:
        sys.exit(f"native library unavailable: {native.load_error()}")
    points = parse_points(args.points)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.kernels:
        list_kernels(points, sms)
    if args.power:
        power(points, args.seconds, sms)


if __name__ == "__main__":
    main()
