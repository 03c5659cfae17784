"""W8A8 FP8 scaled_mm on an AMD Instinct GPU (MI300X gfx942; MI350 gfx950 too): hipBLASLt through
qbackend against torch._scaled_mm (ROCm torch, hipBLASLt inside) and bf16 torch.mm, under graph
replay.

    python bench/bench_scaled_mm_mi300x.py                 # writes bench/results/scaled_mm_mi300x.json
    python bench/bench_scaled_mm_mi300x.py --quick --out /tmp/quick.json

Not run yet: no AMD GPU was reachable when it was written (docs/selection.md, ROCm status).

Implementations, timed in the same process on the same inputs (bf16 output everywhere):
  qbackend.hipblaslt.tensorwise   qbackend.scaled_mm with the hipblaslt provider forced, per-tensor scales
  qbackend.hipblaslt.rowwise      the same with per-token x per-channel scales (ROCm 6.3+)
  torch._scaled_mm.tensorwise     per-tensor scales
  torch._scaled_mm.rowwise        per-token x per-channel scales, where this torch build takes them
  torch.mm.bf16                   hipBLASLt / rocBLAS bf16 GEMM (what a user without FP8 runs)
Method (qbackend.benchmark): each measurement is a graph of R calls over R different weight copies
totalling >= 1 GiB when memory allows (MI300X has 256 MB of Infinity Cache in front of HBM, so
weights then come from HBM as a model's layers do), replayed for ~8 ms; the median of 5 such
measurements divided by R is one call. Every point is timed in interleaved rounds in a balanced
order (clock drift under load hits every implementation alike); each implementation's median round
is reported. An implementation that fails at its first (eager) call is recorded with its error.

JSON: {"device", "arch", "torch", "hip", "rocm", "hipblaslt", "hbm_copy_gbs", "rows": [{"M", "N", "K",
"impl", "us", "tflops", "weight_gbs"} or {"M", "N", "K", "impl", "error"}]}. weight_gbs (weight bytes
read per second) over hbm_copy_gbs (a measured device-to-device copy, read + write) is the fraction
of HBM bandwidth a weight-bound (small M) call reaches.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import qbackend
from qbackend import registry
from qbackend.benchmark import graph_time, interleaved

_HERE = os.path.dirname(os.path.abspath(__file__))
BF16 = torch.bfloat16
# (N, K) of Llama-3-8B / 70B projections
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192),
          (57344, 8192), (8192, 28672)]
MS = [1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
QUICK_SHAPES, QUICK_MS = [(4096, 4096), (28672, 4096)], [1, 64, 1024, 8192]
ROTATE_BYTES = 2**30
OUT_BYTES_CAP = 3 * 2**30
TARGET_MS = 8.0


def fp8_dtype() -> torch.dtype:
    return qbackend.native_fp8_dtype("cuda")


class Shape:
    """R rotating weight copies (fp8 and bf16) of one (N, K); activations made per M."""

    def __init__(self, N: int, K: int):
        self.N, self.K = N, K
        self.R = max(2, min(16, ROTATE_BYTES // (N * K)))
        g = torch.Generator(device="cuda")
        g.manual_seed(N * 131 + K)
        f8 = fp8_dtype()
        top = torch.finfo(f8).max / 4
        self.wb = [torch.randn(N, K, device="cuda", dtype=BF16, generator=g) for _ in range(self.R)]
        self.wf = [(torch.randn(N, K, device="cuda", generator=g) * top).clamp(-4 * top, 4 * top).to(f8)
                   for _ in range(self.R)]
        self.sb_channel = torch.rand(1, N, device="cuda", generator=g) + 0.5
        self.sb_tensor = torch.rand((), device="cuda", generator=g) + 0.5

    def calls(self, impl: str, M: int) -> list:
        """R closures, one call each, on weight copy i."""
        g = torch.Generator(device="cuda")
        g.manual_seed(M)
        ab = torch.randn(M, self.K, device="cuda", dtype=BF16, generator=g)
        af = (ab.float() * 4).to(fp8_dtype())
        sa_token = torch.rand(M, 1, device="cuda", generator=g) + 0.5
        sa_tensor = torch.rand((), device="cuda", generator=g) + 0.5
        reps = max(1, min(self.R, OUT_BYTES_CAP // (M * self.N * 2)))
        ws, wbs = self.wf[:reps], self.wb[:reps]
        if impl == "qbackend.hipblaslt.tensorwise":
            return [lambda w=w: qbackend.scaled_mm(af, w.t(), sa_tensor, self.sb_tensor, out_dtype=BF16) for w in ws]
        if impl == "qbackend.hipblaslt.rowwise":
            return [lambda w=w: qbackend.scaled_mm(af, w.t(), sa_token, self.sb_channel, out_dtype=BF16) for w in ws]
        if impl == "torch._scaled_mm.tensorwise":
            return [lambda w=w: torch._scaled_mm(af, w.t(), scale_a=sa_tensor, scale_b=self.sb_tensor, out_dtype=BF16)
                    for w in ws]
        if impl == "torch._scaled_mm.rowwise":
            return [lambda w=w: torch._scaled_mm(af, w.t(), scale_a=sa_token, scale_b=self.sb_channel, out_dtype=BF16)
                    for w in ws]
        if impl == "torch.mm.bf16":
            return [lambda w=w: torch.mm(ab, w.t()) for w in wbs]
        raise ValueError(f"unknown implementation {impl!r}")


def hbm_copy_gbs() -> float:
    """Device-to-device copy bandwidth, bytes read + written per second / 1e9, of a 2 GiB buffer."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_time([lambda: dst.copy_(src)], target_ms=20.0)
    return 2 * src.numel() / us / 1e3


def versions() -> dict:
    from qbackend_providers import hipblaslt_lib as hl

    lib = hl.load()
    return {"rocm": hl.dotted(lib.rocm_version) if lib.rocm_version else None,
            "hipblaslt": hl.dotted(lib.version) if lib.version else None,
            "hipblaslt_reason": lib.reason}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(_HERE, "results", "scaled_mm_mi300x.json"))
    parser.add_argument("--quick", action="store_true", help="2 shapes x 4 values of M")
    args = parser.parse_args()
    if not (torch.version.hip and torch.cuda.is_available()):
        print("bench_scaled_mm_mi300x: needs a ROCm build of torch and an AMD GPU", file=sys.stderr)
        return 2
    os.environ["QBACKEND_PROVIDER"] = "hipblaslt"      # a decline would then fall back loudly, not silently
    registry.reload()
    info = qbackend.device_info("cuda")
    report = {"device": info.name, "arch": info.arch, "torch": torch.__version__, "hip": torch.version.hip,
              **versions(), "hbm_copy_gbs": hbm_copy_gbs(), "rows": []}
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
    impls = ["qbackend.hipblaslt.tensorwise", "qbackend.hipblaslt.rowwise", "torch._scaled_mm.tensorwise",
             "torch._scaled_mm.rowwise", "torch.mm.bf16"]
    shapes, ms = (QUICK_SHAPES, QUICK_MS) if args.quick else (SHAPES, MS)
    for N, K in shapes:
        shape = Shape(N, K)
        for M in ms:
            timers = {}
            for impl in impls:
                try:
                    fns = shape.calls(impl, M)
                    fns[0]()                                      # eager first: an error is recorded, not timed
                    torch.cuda.synchronize()
                    timers[impl] = lambda fns=fns: graph_time(fns, target_ms=TARGET_MS)
                except Exception as exc:                          # e.g. rowwise scales this build lacks
                    report["rows"].append({"M": M, "N": N, "K": K, "impl": impl,
                                           "error": f"{type(exc).__name__}: {exc}"[:300]})
            for impl, us in interleaved(timers).items():
                w_bytes = N * K * (2 if impl == "torch.mm.bf16" else 1)
                row = {"M": M, "N": N, "K": K, "impl": impl, "us": us, "tflops": 2 * M * N * K / us / 1e6,
                       "weight_gbs": w_bytes / us / 1e3}
                report["rows"].append(row)
                print(json.dumps(row))
        del shape
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
