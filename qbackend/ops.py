"""torch.library ops: what torch.compile and CUDA graphs see.

`qbackend::scaled_mm`, `qbackend::grouped_scaled_mm`, `qbackend::quantize` (dynamic: returns q and
its new scale), `qbackend::quantize_static` (returns q), `qbackend::gather_quantize` (a MoE layer's
routed rows) and `qbackend::silu_mul_quantize` (its gated activation). Each real implementation
validates, picks the provider for the tensors' device (a cached lookup) and calls it; each fake
implementation validates and returns empty tensors of the right shape, so errors surface at trace
time too.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.library import custom_op

from . import dtypes as qd
from . import probe, registry
from .validate import WeightSpec, quantize_scale_shape, validate_quantize, validate_scaled_mm
from .validate_grouped import validate_gather_quantize, validate_grouped_scaled_mm, validate_silu_mul_quantize
from .weights import linear_impl


def _flatten_a(a: torch.Tensor, scale_a: Optional[torch.Tensor]):
    """View batched `a` [..., M, K] as [M', K] and its per-token/group scale as [M', G]."""
    if a.dim() == 2:
        return a, scale_a
    a2 = a.reshape(-1, a.shape[-1])
    if scale_a is not None and scale_a.dim() == a.dim():
        scale_a = scale_a.reshape(-1, scale_a.shape[-1])
    return a2, scale_a


def scaled_mm_impl(a, b, scale_a, scale_b, out_dtype, bias, group_size=128, accumulate="fast"):
    problem = validate_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, group_size, accumulate)
    lead = a.shape[:-1]
    N = b.shape[1]
    if a.numel() == 0:
        return a.new_empty(tuple(lead) + (N,), dtype=problem.out_dtype)
    a2, scale_a2 = _flatten_a(a, scale_a)
    out = registry.get().run(probe.device_info(a.device), problem,
                             lambda p: p.scaled_mm(a2, b, scale_a2, scale_b, problem.out_dtype, bias, problem))
    return out.reshape(tuple(lead) + (N,))


def grouped_scaled_mm_impl(a, b, scale_a, scale_b, offsets, out_dtype, bias, group_size=128):
    problem = validate_grouped_scaled_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, group_size)
    if a.shape[0] == 0:
        return a.new_empty((0, b.shape[2]), dtype=problem.out_dtype)
    return registry.get().run(probe.device_info(a.device), problem,
                              lambda p: p.grouped_scaled_mm(a, b, scale_a, scale_b, offsets, problem.out_dtype,
                                                            bias, problem))


def quantize_impl(x, dtype, granularity, scale, scale_ub, group_size, block_size):
    problem = validate_quantize(x, dtype, granularity, scale, scale_ub, group_size, block_size)
    if x.numel() == 0:
        shape = quantize_scale_shape(x, granularity, group_size, block_size)
        # An empty tensor's amax is 0: its dynamic scale is the minimum scale.
        return (torch.empty_like(x, dtype=dtype),
                scale if scale is not None else x.new_full(shape, qd.min_scale(dtype), dtype=torch.float32))
    return registry.get().run(probe.device_info(x.device), problem,
                              lambda p: p.quantize(x, dtype, granularity, scale, scale_ub, group_size, block_size,
                                                   problem))


def _gather_then_quantize(provider, x, index, dtype, granularity, group_size, problem):
    """x[index] then the provider's quantize, for a provider without a fused gather. An index outside
    [0, rows) must not fault the device: its row reads row 0 and gets NaN scales, as the fused kernel's do."""
    safe = index.clamp(0, x.shape[0] - 1)
    q, scale = provider.quantize(x.index_select(0, safe), dtype, granularity, None, None, group_size, (128, 128),
                                 problem)
    bad = (index != safe).unsqueeze(-1)
    return q, torch.where(bad, torch.full_like(scale, float("nan")), scale)


def gather_quantize_impl(x, index, dtype, granularity, group_size):
    problem = validate_gather_quantize(x, index, dtype, granularity, group_size)
    index = index.long()
    rows, K = index.numel(), x.shape[1]
    if rows == 0 or K == 0:
        shape = quantize_scale_shape((rows, K), granularity, group_size, (128, 128))
        return (x.new_empty((rows, K), dtype=dtype),
                x.new_full(shape, qd.min_scale(dtype), dtype=torch.float32))

    def call(p):
        fused = getattr(p, "quantize_gather", None)
        out = fused(x, index, dtype, granularity, group_size, problem) if fused is not None else None
        return out if out is not None else _gather_then_quantize(p, x, index, dtype, granularity, group_size,
                                                                  problem)
    return registry.get().run(probe.device_info(x.device), problem, call)


@custom_op("qbackend::gather_quantize", mutates_args=())
def gather_quantize_op(x: torch.Tensor, index: torch.Tensor, dtype: torch.dtype, granularity: str,
                       group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return gather_quantize_impl(x, index, dtype, granularity, group_size)


@gather_quantize_op.register_fake
def _gather_quantize_fake(x, index, dtype, granularity, group_size):
    validate_gather_quantize(x, index, dtype, granularity, group_size)
    rows, K = index.shape[0], x.shape[1]
    shape = quantize_scale_shape((rows, K), granularity, group_size, (128, 128))
    return x.new_empty((rows, K), dtype=dtype), x.new_empty(shape, dtype=torch.float32)


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """SiLU(h[:, :I]) * h[:, I:] in fp32, rounded once to h's dtype: the activation that
    silu_mul_quantize quantizes (and what the fused kernel computes)."""
    i = h.shape[1] // 2
    return (torch.nn.functional.silu(h[:, :i].float()) * h[:, i:].float()).to(h.dtype)


def silu_mul_quantize_impl(h, dtype, granularity, group_size):
    problem = validate_silu_mul_quantize(h, dtype, granularity, group_size)
    rows, cols = h.shape[0], h.shape[1] // 2
    if rows == 0:
        shape = quantize_scale_shape((rows, cols), granularity, group_size, (128, 128))
        return (h.new_empty((rows, cols), dtype=dtype), h.new_full(shape, qd.min_scale(dtype), dtype=torch.float32))

    def call(p):
        fused = getattr(p, "quantize_silu_mul", None)
        out = fused(h, dtype, granularity, group_size, problem) if fused is not None else None
        if out is not None:
            return out
        return p.quantize(silu_mul(h), dtype, granularity, None, None, group_size, (128, 128), problem)
    return registry.get().run(probe.device_info(h.device), problem, call)


@custom_op("qbackend::silu_mul_quantize", mutates_args=())
def silu_mul_quantize_op(h: torch.Tensor, dtype: torch.dtype, granularity: str,
                         group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return silu_mul_quantize_impl(h, dtype, granularity, group_size)


@silu_mul_quantize_op.register_fake
def _silu_mul_quantize_fake(h, dtype, granularity, group_size):
    validate_silu_mul_quantize(h, dtype, granularity, group_size)
    rows, cols = h.shape[0], h.shape[1] // 2
    shape = quantize_scale_shape((rows, cols), granularity, group_size, (128, 128))
    return h.new_empty((rows, cols), dtype=dtype), h.new_empty(shape, dtype=torch.float32)


@custom_op("qbackend::scaled_mm", mutates_args=())
def scaled_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: Optional[torch.Tensor],
                 scale_b: Optional[torch.Tensor], out_dtype: Optional[torch.dtype],
                 bias: Optional[torch.Tensor], group_size: int = 128, accumulate: str = "fast") -> torch.Tensor:
    return scaled_mm_impl(a, b, scale_a, scale_b, out_dtype, bias, group_size, accumulate)


@scaled_mm_op.register_fake
def _scaled_mm_fake(a, b, scale_a, scale_b, out_dtype, bias, group_size=128, accumulate="fast"):
    problem = validate_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, group_size, accumulate)
    return a.new_empty(tuple(a.shape[:-1]) + (b.shape[1],), dtype=problem.out_dtype)


@custom_op("qbackend::grouped_scaled_mm", mutates_args=())
def grouped_scaled_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                         offsets: torch.Tensor, out_dtype: Optional[torch.dtype], bias: Optional[torch.Tensor],
                         group_size: int = 128) -> torch.Tensor:
    return grouped_scaled_mm_impl(a, b, scale_a, scale_b, offsets, out_dtype, bias, group_size)


@grouped_scaled_mm_op.register_fake
def _grouped_scaled_mm_fake(a, b, scale_a, scale_b, offsets, out_dtype, bias, group_size=128):
    problem = validate_grouped_scaled_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, group_size)
    return a.new_empty((a.shape[0], b.shape[2]), dtype=problem.out_dtype)


@custom_op("qbackend::quantize", mutates_args=())
def quantize_op(x: torch.Tensor, dtype: torch.dtype, granularity: str,
                scale_ub: Optional[torch.Tensor], group_size: int, block_rows: int,
                block_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_impl(x, dtype, granularity, None, scale_ub, group_size, (block_rows, block_cols))


@quantize_op.register_fake
def _quantize_fake(x, dtype, granularity, scale_ub, group_size, block_rows, block_cols):
    block = (block_rows, block_cols)
    validate_quantize(x, dtype, granularity, None, scale_ub, group_size, block)
    shape = quantize_scale_shape(x, granularity, group_size, block)
    return torch.empty_like(x, dtype=dtype), x.new_empty(shape, dtype=torch.float32)


@custom_op("qbackend::quantize_static", mutates_args=())
def quantize_static_op(x: torch.Tensor, dtype: torch.dtype, granularity: str, scale: torch.Tensor,
                       group_size: int, block_rows: int, block_cols: int) -> torch.Tensor:
    return quantize_impl(x, dtype, granularity, scale, None, group_size, (block_rows, block_cols))[0]


@quantize_static_op.register_fake
def _quantize_static_fake(x, dtype, granularity, scale, group_size, block_rows, block_cols):
    validate_quantize(x, dtype, granularity, scale, None, group_size, (block_rows, block_cols))
    return torch.empty_like(x, dtype=dtype)


@custom_op("qbackend::linear", mutates_args=())
def linear_op(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_aux: Optional[torch.Tensor],
              scale_a: Optional[torch.Tensor], bias: Optional[torch.Tensor], provider: str,
              layout: str, N: int, K: int, w_dtype: torch.dtype,
              out_dtype: Optional[torch.dtype], group_size: int, accumulate: str) -> torch.Tensor:
    return linear_impl(a, w, w_scale, w_aux, scale_a, bias, provider, layout, N, K, w_dtype,
                       out_dtype, group_size, accumulate)


@linear_op.register_fake
def _linear_fake(a, w, w_scale, w_aux, scale_a, bias, provider, layout, N, K, w_dtype, out_dtype,
                 group_size, accumulate):
    problem = validate_scaled_mm(a, WeightSpec(K, N, w_dtype, a.device), scale_a, w_scale,
                                 out_dtype, bias, group_size, accumulate)
    return a.new_empty(tuple(a.shape[:-1]) + (N,), dtype=problem.out_dtype)
