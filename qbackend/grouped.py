"""What the providers of grouped_scaled_mm share: one group's arguments in scaled_mm's form, and
the group each row belongs to, found on the device.

A grouped call is `scaled_mm` once per group g, on rows offsets[g-1]:offsets[g] of `a` (row 0 for
g = 0) with b[g], its scale and its bias. The row ranges are data (offsets lives on a's device), so
code that must not synchronise with the host works from `row_groups` instead of slicing.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .problem import Granularity as G
from .problem import Op
from .provider import Declined


def per_group_problem(problem):
    """The scaled_mm Problem each group's call amounts to."""
    return replace(problem, op=Op.SCALED_MM)


def group_scale_b(scale_b: torch.Tensor, problem, g: int) -> torch.Tensor:
    """Group g's scale_b in scaled_mm's form: one value, [1, N] or [Kb, Nb]."""
    if problem.scale_b is G.TENSOR:
        return scale_b.reshape(()) if scale_b.numel() == 1 else scale_b.reshape(-1)[g].reshape(())
    if problem.scale_b is G.CHANNEL:
        return scale_b[g].reshape(1, -1)
    return scale_b[g]


def group_scale_a(scale_a: torch.Tensor, problem, start: int, end: int) -> torch.Tensor:
    """The rows start:end of a per-token or per-group scale_a (a per-tensor one as it is)."""
    return scale_a if problem.scale_a is G.TENSOR else scale_a[start:end]


def row_groups(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """int64 [rows]: the group of each row of `a`, on offsets' device, without reading offsets on
    the host. Rows at or past the last offset (none in a valid call) count as the last group."""
    ids = torch.arange(rows, device=offsets.device, dtype=torch.int32)
    found = torch.searchsorted(offsets, ids, right=True)
    return found.clamp_(max=offsets.shape[0] - 1)


def check_offsets(offsets: torch.Tensor, rows: int) -> list:
    """Offsets read on the host (by the providers that loop there) as a list, checked: non-decreasing,
    non-negative, the last one equal to a's row count. Under CUDA graph capture, where that read
    cannot happen, the provider declines (Declined), so that a device-side one can serve the call."""
    if offsets.is_cuda and torch.cuda.is_current_stream_capturing():
        raise Declined("reads offsets on the host (a device sync), which a CUDA graph capture cannot do")
    ends = offsets.tolist()
    prev = 0
    for g, end in enumerate(ends):
        if end < prev:
            raise ValueError(f"qbackend.grouped_scaled_mm: offsets: must be non-decreasing cumulative row "
                             f"ends starting at >= 0; got offsets[{g}] = {end} after {prev}")
        prev = end
    if prev != rows:
        raise ValueError(f"qbackend.grouped_scaled_mm: offsets: the last row end must equal a's row count "
                         f"({rows}); got {prev}")
    return ends
