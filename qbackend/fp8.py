"""FP8 format conversions that change bits, not just dtypes.

e4m3fn -> e4m3fnuz: the same bit pattern means half the value in fnuz (its exponent bias is 8, not
7), so re-reading the bits and doubling the scale is exact. One pattern needs care: 0x80 is -0 in
e4m3fn but NaN in e4m3fnuz, so it becomes 0x00. e4m3fn's NaN (0x7F / 0xFF) has no fnuz counterpart
and maps to fnuz NaN (0x80). Values of magnitude 448 (0x7E) stay representable: 0x7E in fnuz is
224, times the doubled scale.
"""
from __future__ import annotations

import torch

from . import dtypes as qd
from .probe import DeviceInfo, device_info


def to_fnuz(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode e4m3fn data as e4m3fnuz; returns (q_fnuz, scale * 2)."""
    if q.dtype != qd.E4M3:
        raise TypeError(f"qbackend.to_fnuz: q: dtype must be float8_e4m3fn; got {qd.dtype_name(q.dtype)}")
    bits = q.view(torch.uint8)
    is_nan = (bits & 0x7F) == 0x7F
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    bits = torch.where(is_nan, torch.full_like(bits, 0x80), bits)
    return bits.view(qd.E4M3_FNUZ), scale * 2.0


def native_fp8_dtype(device=None) -> torch.dtype:
    """The fp8 dtype the device computes natively (e4m3fnuz on MI300, else e4m3fn)."""
    info = device if isinstance(device, DeviceInfo) else device_info(device)
    return info.fp8_dtypes[0] if info.fp8_dtypes else qd.E4M3
