"""Small-M FP8 GEMMs to run under Nsight Compute: qbackend's SM90 kernel and cuBLASLt's (torch._scaled_mm,
tensorwise and rowwise), one launch each per shape, after a warm-up.

    ncu --clock-control none --csv --page raw --metrics gpu__time_duration.sum,\
dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,\
sm__throughput.avg.pct_of_peak_sustained_elapsed -k regex:"gemm|device_kernel|nvjet|small_m" \
        python bench/profile_small_m.py > ncu_raw.csv
    python bench/profile_small_m.py --summarize ncu_raw.csv > ncu_small_m.csv

ncu flushes the caches before each kernel by default, so each weight is read from HBM, as in a model.
Each call runs twice (a warm-up, then the one to read), so each kernel appears twice in a row, in the
order printed here (qbackend, tensorwise, rowwise per shape). --summarize pairs the kernels read
with those labels: one row per call, `M,N,K,impl,kernel,us,dram_read_MB,dram_pct_of_peak,grid,
sm_pct_of_peak`.
"""
from __future__ import annotations

import argparse
import csv
import sys

import torch

from qbackend_providers import native

F8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
POINTS = [(1, 4096, 4096), (1, 6144, 4096), (16, 10240, 8192), (1, 28672, 4096), (64, 57344, 8192),
          (128, 28672, 4096)]


def run_for_profiler(label, calls, wanted) -> None:
    """Each (name, fn) of calls whose name is in wanted: a warm-up call (lazy initialisation, not
    the launch to read), then the call to read, each followed by a synchronize."""
    for name, fn in [c for c in calls if c[0] in wanted]:
        fn()
        torch.cuda.synchronize()
        print(f"{label} {name}", flush=True)
        fn()
        torch.cuda.synchronize()


_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,  # to us
          "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}  # to MB


def summarize(raw_path: str) -> None:
    """The CSV described above, from ncu's raw CSV mixed with this script's labels (one file)."""
    with open(raw_path) as f:
        lines = f.read().splitlines()
    labels = [ln.split() for ln in lines if ln.startswith("M=")]
    table = list(csv.reader(ln for ln in lines if ln.startswith('"')))
    head, units = table[0], table[1]
    col = {name: i for i, name in enumerate(head)}
    measured = [r for r in table[2:] if r and r[0].isdigit()][1::2]  # each call ran twice: warm-up, read
    if len(measured) != len(labels):
        sys.exit(f"{len(labels)} labelled calls but {len(measured)} measured kernels: is -k too wide?")

    def num(r, metric):
        unit = units[col[metric]]
        if unit and unit != "%" and unit not in _SCALE:
            sys.exit(f"{metric}: unit {unit!r} not known to --summarize")
        return float(r[col[metric]].replace(",", "")) * _SCALE.get(unit, 1.0)

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["M", "N", "K", "impl", "kernel", "us", "dram_read_MB", "dram_pct_of_peak", "grid",
                     "sm_pct_of_peak"])
    for (m, n, k, impl), r in zip(labels, measured):
        writer.writerow([m[2:], n[2:], k[2:], impl, r[col["Kernel Name"]][:60],
                         f"{num(r, 'gpu__time_duration.sum'):.2f}", f"{num(r, 'dram__bytes_read.sum'):.1f}",
                         f"{num(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):.2f}",
                         int(num(r, "launch__grid_size")),
                         f"{num(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):.2f}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="", help="M:N:K,... (default: the list above)")
    ap.add_argument("--impls", default="qbackend,tensorwise,rowwise")
    ap.add_argument("--config", type=int, default=-1, help="force this SM90 config for qbackend (data-parallel)")
    ap.add_argument("--splits", type=int, default=-1, help="with --config: split-K factor (for the small-M "
                                                            "kernel, its cluster split)")
    ap.add_argument("--summarize", metavar="RAW_CSV", help="print the summary of a finished ncu run instead")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    points = [tuple(int(v) for v in p.split(":")) for p in args.points.split(",")] if args.points else POINTS
    if args.config >= 0:
        native.override(args.config, 1 if args.splits > 0 else 0, args.splits, -1)
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    one = torch.ones((), device="cuda")
    for M, N, K in points:
        a = (torch.randn(M, K, device="cuda", generator=g) * 2).to(F8)
        w = (torch.randn(N, K, device="cuda", generator=g) * 2).to(F8)
        sa = torch.rand(M, 1, device="cuda", generator=g) + 0.5
        sb = torch.rand(1, N, device="cuda", generator=g) + 0.5
        out = torch.empty(M, N, device="cuda", dtype=BF16)
        calls = [("qbackend", lambda: native.scaled_mm(a, w.t(), sa, sb, None, out)),
                 ("tensorwise", lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=BF16,
                                                         use_fast_accum=True)),
                 ("rowwise", lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=BF16,
                                                      use_fast_accum=True))]
        run_for_profiler(f"M={M} N={N} K={K}", calls, args.impls.split(","))


if __name__ == "__main__":
    main()
