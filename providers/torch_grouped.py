"""The torch provider's grouped_scaled_mm paths (torch_paths.grouped_path picks one):

- torch._scaled_grouped_mm on the quantized operands, the scales expanded to its rowwise form;
- both operands dequantized, then one torch._grouped_mm: offsets stay on the device;
- the provider's own scaled_mm once per group, the row ranges read on the host.

A bias is added after the GEMM, each row's group found on the device (grouped.row_groups), because
neither torch op takes a per-group bias.
"""
from __future__ import annotations

import torch

from qbackend import grouped
from qbackend.problem import Granularity as G


def add_bias(out: torch.Tensor, bias, offsets: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """out [M, N] (any float dtype) plus each row's group bias, summed in fp32, rounded once."""
    if bias is None:
        return out if out.dtype == out_dtype else out.to(out_dtype)
    rows = grouped.row_groups(offsets, out.shape[0])
    return (out.float() + bias.float().index_select(0, rows)).to(out_dtype)


def expand_scale_b(scale_b: torch.Tensor, problem, groups: int, K: int, N: int) -> torch.Tensor:
    """scale_b broadcastable over b [G, K, N]: [G or 1, 1, 1], [G, 1, N] or a full [G, K, N]."""
    s = scale_b.float()
    if problem.scale_b is G.TENSOR:
        return s.reshape(-1, 1, 1)
    if problem.scale_b is G.CHANNEL:
        return s.reshape(groups, 1, N)
    gk, gn = problem.group_extents[1], problem.group_extents[2]
    return s.repeat_interleave(gk, 1)[:, :K].repeat_interleave(gn, 2)[:, :, :N]


# fp32 elements of one chunk of dequantized weights (256 MB): bounds the temporaries of the
# dequantizing path whatever the number of experts.
_DEQUANT_CHUNK = 1 << 26


def dequant_grouped_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, problem, compute):
    """Both operands dequantized to `compute` (each element rounded once), one torch._grouped_mm.
    Every expert's weight is dequantized on every call (offsets are not read): a fallback, not fast."""
    from .torch_fallback import dequantize_rows  # (torch_fallback imports this module)

    groups, K, N = b.shape
    a_dq = dequantize_rows(a, scale_a, problem, compute)
    # fp8 and int8 values are exact in every compute dtype; the product is fp32, rounded once. A few
    # groups at a time, so that the fp32 products and expanded block scales stay small.
    w = torch.empty_like(b, dtype=compute)
    step = max(1, _DEQUANT_CHUNK // (K * N))
    for g0 in range(0, groups, step):
        g1 = min(groups, g0 + step)
        part = scale_b if scale_b.numel() == 1 else scale_b[g0:g1]  # every other form leads with G
        w[g0:g1] = b[g0:g1].float() * expand_scale_b(part, problem, g1 - g0, K, N)
    out = torch._grouped_mm(a_dq, w, offs=offsets)
    return add_bias(out, bias, offsets, out_dtype)


def scaled_grouped_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, problem):
    """torch._scaled_grouped_mm: scale_a as [M] and scale_b as [G, N], both contiguous fp32; fast
    accumulation as scaled_mm's default (accumulate="fast") has it."""
    M = a.shape[0]
    groups, _, N = b.shape
    sa = scale_a.float().reshape(-1).expand(M).contiguous()
    sb = scale_b.float().reshape(-1, 1).expand(groups, N) if problem.scale_b is G.TENSOR else scale_b
    out = torch._scaled_grouped_mm(a, b, sa, sb.float().contiguous(), offs=offsets, out_dtype=torch.bfloat16,
                                   use_fast_accum=problem.accumulate == "fast")
    return add_bias(out, bias, offsets, out_dtype)


def per_group_loop(scaled_mm, a, b, scale_a, scale_b, offsets, out_dtype, bias, problem):
    """scaled_mm(a_rows, b[g], ...) once per non-empty group; reads offsets on the host."""
    ends = grouped.check_offsets(offsets, a.shape[0])
    out = torch.empty((a.shape[0], b.shape[2]), dtype=out_dtype, device=a.device)
    per_group = grouped.per_group_problem(problem)
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            out[start:end] = scaled_mm(a[start:end], b[g], grouped.group_scale_a(scale_a, problem, start, end),
                                       grouped.group_scale_b(scale_b, problem, g), out_dtype,
                                       None if bias is None else bias[g], per_group)
        start = end
    return out
