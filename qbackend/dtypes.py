"""The quantized and floating dtypes qbackend knows, and their numeric limits.

qmax is the largest finite magnitude a dynamic scale maps amax onto. For e4m3fnuz it is 240, the
format's own maximum (vLLM uses 224 for a little accuracy headroom on MI300; we keep the format's
limit so that fn -> fnuz re-encoding with doubled scales stays exact).
"""
from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_FNUZ = torch.float8_e4m3fnuz
E5M2_FNUZ = torch.float8_e5m2fnuz

FP8_OCP = (E4M3, E5M2)
FP8_FNUZ = (E4M3_FNUZ, E5M2_FNUZ)
FP8_DTYPES = FP8_OCP + FP8_FNUZ
QUANT_DTYPES = FP8_DTYPES + (torch.int8,)
# Activation dtypes of weight-only (W8A16) problems.
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
FLOAT_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

QMAX = {E4M3: 448.0, E5M2: 57344.0, E4M3_FNUZ: 240.0, E5M2_FNUZ: 57344.0, torch.int8: 127.0}
INT8_MIN, INT8_MAX = -128, 127


def qmax(dtype: torch.dtype) -> float:
    return QMAX[dtype]


def min_scale(dtype: torch.dtype) -> float:
    """Smallest dynamic scale: keeps an all-zero row from producing a zero (then inf) scale."""
    return 1.0 / (QMAX[dtype] * 512.0)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_family(dtype: torch.dtype) -> str:
    """'ocp' for the IEEE-like formats with -0, 'fnuz' for the MI300 formats without."""
    return "fnuz" if dtype in FP8_FNUZ else "ocp"


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else repr(dtype)


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Accept a torch.dtype or its name ('float8_e4m3fn', 'int8', 'bf16', ...)."""
    if isinstance(name, torch.dtype):
        return name
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
               "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
               "e5m2fnuz": "float8_e5m2fnuz", "fp8": "float8_e4m3fn"}
    attr = aliases.get(name, name)
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype
