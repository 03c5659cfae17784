"""Which of torch's own matrix ops can take a problem on a device: the torch provider's path table.

One path per (device, problem), decided from data (the device's arch, the installed torch's version,
the problem's dtypes, scale granularities, out dtype and alignment), never by trying a call, so that
`explain` can name it and a first call inside a CUDA-graph capture does nothing different:

  scaled_mm.tensorwise   torch._scaled_mm, one scale per operand (cuBLASLt / hipBLASLt)
  scaled_mm.rowwise      torch._scaled_mm, per-token x per-channel scales
  scaled_mm.blockwise    torch.nn.functional.scaled_mm, 1 x 128 activation and 128 x 128 weight
                         scales (sm_90)
  scaled_mm.unscaled     torch._scaled_mm with unit scales into fp32, the scales and bias applied after
  int_mm                 torch._int_mm (int32 accumulation), the scales and bias applied after
  dequant                both operands dequantized to a 16-bit compute dtype, one GEMM in it

and for grouped_scaled_mm:

  scaled_grouped_mm      torch._scaled_grouped_mm, per-row x per-group-and-column scales (sm_90)
  grouped_mm.dequant     both operands dequantized to the compute dtype, one torch._grouped_mm
  scaled_mm.per_group    this provider's scaled_mm once per group; the row ranges are read on the
                         host (a device sync): the path of last resort
"""
from __future__ import annotations

import re

import torch

from qbackend import dtypes as qd
from qbackend.problem import Granularity as G
from qbackend.problem import Op

TENSORWISE, ROWWISE, BLOCKWISE = "scaled_mm.tensorwise", "scaled_mm.rowwise", "scaled_mm.blockwise"
UNSCALED, INT_MM, DEQUANT = "scaled_mm.unscaled", "int_mm", "dequant"


def _version(text: str) -> tuple:
    """'2.11.0+cu130' -> (2, 11); '13.0' -> (13, 0)."""
    parts = re.findall(r"\d+", text or "")[:2]
    return tuple(int(p) for p in parts) if len(parts) == 2 else (0, 0)


TORCH = _version(torch.__version__)
CUDA_RUNTIME = _version(torch.version.cuda or "")

# fp8 pairs torch._scaled_mm multiplies (e5m2 x e5m2 is refused on CUDA).
_OCP_PAIRS = frozenset({(qd.E4M3, qd.E4M3), (qd.E4M3, qd.E5M2), (qd.E5M2, qd.E4M3)})
_FNUZ_PAIRS = frozenset({(qd.E4M3_FNUZ, qd.E4M3_FNUZ), (qd.E4M3_FNUZ, qd.E5M2_FNUZ),
                         (qd.E5M2_FNUZ, qd.E4M3_FNUZ)})
_HALF = frozenset({torch.bfloat16, torch.float16})
_ALL_OUT = frozenset(qd.OUT_DTYPES)
_BF16 = frozenset({torch.bfloat16})


def _cublaslt_129(device) -> bool:
    """A torch built against CUDA 12.9+ (cuBLASLt's outer-vector and 128-block scale modes). A
    simulated device is answered for a CUDA build of the installed torch version when the installed
    build has no CUDA."""
    return CUDA_RUNTIME >= (12, 9) or (device.simulated and torch.version.cuda is None)


def scaled_mm_pairs(device) -> frozenset:
    """The fp8 (a, b) dtype pairs torch._scaled_mm multiplies on this device, per-tensor scales."""
    if device.backend == "cuda":
        return _OCP_PAIRS if (device.sm or 0) >= 89 else frozenset()
    if device.backend == "hip":
        return {"gfx942": _FNUZ_PAIRS, "gfx950": _OCP_PAIRS}.get(device.arch, frozenset())
    if device.backend == "cpu":
        return _OCP_PAIRS if TORCH >= (2, 8) else frozenset()
    return frozenset()


def rowwise_out_dtypes(device) -> frozenset:
    """Output dtypes of torch._scaled_mm with [M, 1] x [1, N] scales on this device (empty: none).
    On CUDA sm_90+ with cuBLASLt 12.9 torch calls cuBLASLt (any output); otherwise its own CUTLASS
    kernel (sm_90 from 2.5, sm_89 from 2.7: bf16, and fp16 from 2.10); hipBLASLt: bf16."""
    if device.backend == "cuda":
        sm = device.sm or 0
        if sm >= 90 and TORCH >= (2, 9) and _cublaslt_129(device):
            return _ALL_OUT
        if (sm >= 90 and TORCH >= (2, 5)) or (sm == 89 and TORCH >= (2, 7)):
            return _HALF if TORCH >= (2, 10) else _BF16
        return frozenset()
    if device.backend == "hip":
        return _BF16 if TORCH >= (2, 7) and device.arch in ("gfx942", "gfx950") else frozenset()
    return _ALL_OUT if device.backend == "cpu" and TORCH >= (2, 13) else frozenset()


def blockwise_ok(device) -> bool:
    """1 x 128 activation and 128 x 128 weight scales through torch.nn.functional.scaled_mm (torch
    2.10+, cuBLASLt 12.9+, sm_90 only). torch._scaled_mm's own blockwise form (2.9+) is not used:
    in 2.11 it reads 128 x 128 scales with a leading dimension it does not check, and gives wrong
    results when ceil(K / 128) is not a multiple of 4."""
    return (device.backend == "cuda" and device.sm == 90 and TORCH >= (2, 10)
            and hasattr(torch.nn.functional, "scaled_mm") and _cublaslt_129(device))


def int_mm_ok(device) -> bool:
    """torch._int_mm: int8 x int8 -> int32 (cuBLASLt, hipBLASLt, oneDNN on the CPU)."""
    if device.backend == "cuda":
        return (device.sm or 0) >= 75
    return device.backend in ("hip", "cpu")


def compute_dtype(device, problem) -> torch.dtype:
    """The dtype of the dequantized operands and of the one GEMM: the activation dtype for W8A16;
    else bf16, or fp16 on sm_75 (no bf16 tensor cores there), or fp32 on the CPU (where 16-bit
    GEMMs are slow)."""
    if problem.weight_only:
        return problem.a_dtype
    if device.backend == "cpu":
        return torch.float32
    if device.backend == "cuda" and (device.sm or 0) < 80:
        return torch.float16
    return torch.bfloat16


def path(device, problem) -> str:
    """The torch provider's path for a scaled_mm problem on a device (see the module docstring)."""
    if problem.weight_only:
        return DEQUANT
    # torch's scaled and integer GEMMs take K and N in multiples of 16 (8 for int8).
    aligned = problem.k_align >= 16 and problem.n_align >= 16
    if problem.a_dtype == torch.int8:
        return INT_MM if aligned and int_mm_ok(device) else DEQUANT
    if not aligned or (problem.a_dtype, problem.b_dtype) not in scaled_mm_pairs(device):
        return DEQUANT
    if problem.scale_a is G.GROUP or problem.scale_b is G.BLOCK:
        deepseek = (problem.scale_a is G.GROUP and problem.scale_b is G.BLOCK and problem.group == 128
                    and problem.a_dtype == qd.E4M3 and problem.b_dtype == qd.E4M3)
        return BLOCKWISE if deepseek and blockwise_ok(device) else DEQUANT
    if problem.scale_a is G.TENSOR and problem.scale_b is G.TENSOR:
        return TENSORWISE
    if problem.out_dtype in rowwise_out_dtypes(device) and problem.b_dtype in (qd.E4M3, qd.E4M3_FNUZ):
        return ROWWISE
    return UNSCALED


GROUPED_SCALED, GROUPED_DEQUANT, GROUPED_LOOP = "scaled_grouped_mm", "grouped_mm.dequant", "scaled_mm.per_group"


def scaled_grouped_ok(device) -> bool:
    """torch._scaled_grouped_mm: e4m3 x e4m3 with rowwise scales into bf16, CUDA sm_90 (torch 2.8+)."""
    return (device.backend == "cuda" and device.sm == 90 and TORCH >= (2, 8)
            and hasattr(torch, "_scaled_grouped_mm"))


def grouped_mm_ok(device) -> bool:
    """torch._grouped_mm (16-bit and fp32 operands with device-side offsets): CUDA sm_90+ from torch
    2.8, the CPU from 2.9."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.backend == "cuda":
        return (device.sm or 0) >= 90 and TORCH >= (2, 8)
    return device.backend == "cpu" and TORCH >= (2, 9)


# torch's CUDA grouped GEMMs refuse 1024 groups or more ("Can't process more than 1024 groups");
# grouped_scaled_mm takes up to 1024, so calls with more than this go to the per-group loop.
GROUPED_MAX_GROUPS = 1023


def grouped_path(device, problem) -> str:
    """The torch provider's path for a grouped_scaled_mm problem on a device."""
    # Both torch ops need 16-byte aligned strides: K and N multiples of 16 (fp8) / 8 (16-bit).
    aligned = problem.k_align >= 16 and problem.n_align >= 16
    rowwise = problem.scale_a in (G.TENSOR, G.TOKEN) and problem.scale_b in (G.TENSOR, G.CHANNEL)
    if (aligned and rowwise and scaled_grouped_ok(device) and problem.out_dtype == torch.bfloat16
            and problem.a_dtype == qd.E4M3 and problem.b_dtype == qd.E4M3):
        return GROUPED_SCALED
    if aligned and grouped_mm_ok(device):
        return GROUPED_DEQUANT
    return GROUPED_LOOP


DESCRIPTION = {
    TENSORWISE: "torch._scaled_mm with per-tensor scales",
    ROWWISE: "torch._scaled_mm with per-row and per-column scales",
    BLOCKWISE: "torch.nn.functional.scaled_mm with 1x128 and 128x128 block scales",
    UNSCALED: "torch._scaled_mm into fp32, scales and bias applied after it",
    INT_MM: "torch._int_mm (int32 accumulation), scales and bias applied after it",
    DEQUANT: "operands dequantized to {compute}, one {compute} GEMM",
    GROUPED_SCALED: "torch._scaled_grouped_mm with per-row and per-group-and-column scales",
    GROUPED_DEQUANT: "operands dequantized to {compute}, one torch._grouped_mm",
    GROUPED_LOOP: "this provider's scaled_mm once per group (row ranges read on the host: a device sync)",
}


# The paths through torch._scaled_mm whose accumulation follows accumulate= (use_fast_accum).
FAST_ACCUM_PATHS = (TENSORWISE, ROWWISE, UNSCALED)


def describe(device, problem) -> str:
    if problem.op is Op.GROUPED_SCALED_MM:
        return DESCRIPTION[grouped_path(device, problem)].format(
            compute=qd.dtype_name(compute_dtype(device, problem)))
    chosen = path(device, problem)
    compute = qd.dtype_name(compute_dtype(device, problem))
    accum = f", use_fast_accum={problem.accumulate == 'fast'}" if chosen in FAST_ACCUM_PATHS else ""
    return DESCRIPTION[chosen].format(compute=compute) + accum
