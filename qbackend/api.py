"""The public functions. Model and engine code calls these and nothing vendor-specific.

In eager mode they call the implementation directly (saving the op dispatcher's overhead on the
hot path); under torch.compile they call the registered ops, which the compiler sees as opaque
nodes with fake implementations.
"""
from __future__ import annotations

import torch

from . import dtypes as qd
from . import ops
from .scales import expand
from .validate import _check_tensor, check_out_dtype
from .weights import PreparedWeight, linear_impl

_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def _check_op_args(fn: str, required: dict, optional: dict) -> None:
    """Under torch.compile the op's schema would reject a non-tensor argument before validation
    could name it; in eager mode the implementation's validation does these checks itself."""
    for name, t in required.items():
        _check_tensor(fn, name, t)
    for name, t in optional.items():
        _check_tensor(fn, name, t, allow_none=True)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor | None = None,
              scale_b: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
              bias: torch.Tensor | None = None, group_size: int = 128, accumulate: str = "fast") -> torch.Tensor:
    """(scale_a * scale_b) * (a @ b) + bias, accumulated in fp32 (int32 for int8).

    a: [..., M, K] row-major (any row stride), float8 / int8, or bfloat16 / float16 for
       weight-only (W8A16) calls with scale_a=None.
    b: [K, N] column-major (`w.t()` of a row-major [N, K] weight), float8 or int8.
    scale_a: float32; [] or [1] per-tensor, [..., M, 1] per-token, [..., M, ceil(K/group_size)]
       per-group along K.
    scale_b: float32; [] or [1] per-tensor, [N] or [1, N] per-channel (`w_scale.t()`),
       [ceil(K/group_size), ceil(N/group_size)] blocks (`w_scale_inv.t()` of a DeepSeek-style
       [ceil(N/128), ceil(K/128)] block scale) or [ceil(K/group_size), N].
    group_size: the extent of one scale group along K (and N for block scales); 128 by default.
    out_dtype: bfloat16 (default for W8A8), float16 or float32; W8A16 defaults to a's dtype.
    bias: [N] in out_dtype.
    accumulate: "fast" (default) lets FP8 kernels sum products with the tensor cores' reduced-precision
       accumulator (as cuBLASLt's use_fast_accum and vLLM's kernels do on Hopper and Ada); "precise"
       keeps fp32 accumulation throughout, served by the providers whose kernels promote partial
       sums (docs/api.md, "Accumulation"). INT8, W8A16 and block-scaled calls are precise either way.
    """
    if _compiling():
        _check_op_args("scaled_mm", {"a": a, "b": b}, {"scale_a": scale_a, "scale_b": scale_b, "bias": bias})
        if out_dtype is not None:
            check_out_dtype("scaled_mm", out_dtype, torch.bfloat16)
        return ops.scaled_mm_op(a, b, scale_a, scale_b, out_dtype, bias, group_size, accumulate)
    return ops.scaled_mm_impl(a, b, scale_a, scale_b, out_dtype, bias, group_size, accumulate)


def grouped_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      offsets: torch.Tensor, out_dtype: torch.dtype | None = None,
                      bias: torch.Tensor | None = None, group_size: int = 128) -> torch.Tensor:
    """scaled_mm per group of rows (the experts of a mixture of experts), in one call.

    Group g is rows offsets[g-1]:offsets[g] of `a` (from row 0 for g = 0); its output rows are
    (scale_a * scale_b[g]) * (a_rows @ b[g]) + bias[g], accumulated in fp32 (int32 for int8), as
    scaled_mm computes them.
    a: [total_tokens, K] float8 / int8, row-major (any row stride), rows sorted by group.
    b: [G, K, N] float8 / int8, column-major per group (`w.transpose(-2, -1)` of a [G, N, K] weight).
    scale_a: float32; [] or [1] per-tensor, [total_tokens, 1] per-token, [total_tokens,
       ceil(K/group_size)] per-group along K (1 x 128 blocks).
    scale_b: float32; [] (one for all groups) or [G] per group, [G, N] per group and channel,
       [G, ceil(K/group_size), ceil(N/group_size)] blocks (`w_scale_inv.transpose(-2, -1)` of a
       DeepSeek-style [G, ceil(N/128), ceil(K/128)] scale).
    offsets: int32 [G] on a's device: cumulative row ends, non-decreasing, the last equal to
       total_tokens (as torch._scaled_grouped_mm takes them). Empty groups are allowed. Its values are
       not read on the host except by the reference provider (see docs/api.md).
    out_dtype: bfloat16 (default), float16 or float32. bias: [G, N] in out_dtype, or None.
    """
    if _compiling():
        _check_op_args("grouped_scaled_mm", {"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b,
                                             "offsets": offsets}, {"bias": bias})
        if out_dtype is not None:
            check_out_dtype("grouped_scaled_mm", out_dtype, torch.bfloat16)
        return ops.grouped_scaled_mm_op(a, b, scale_a, scale_b, offsets, out_dtype, bias, group_size)
    return ops.grouped_scaled_mm_impl(a, b, scale_a, scale_b, offsets, out_dtype, bias, group_size)


def quantize(x: torch.Tensor, dtype: torch.dtype = qd.E4M3, granularity: str = "tensor",
             scale: torch.Tensor | None = None, scale_ub: torch.Tensor | None = None,
             group_size: int = 128, block_size: tuple = (128, 128)):
    """Quantize x to `dtype`; returns (q, scale) with float32 scale.

    Static when `scale` is given, dynamic otherwise: scale = max(min(amax, scale_ub) / qmax,
    1 / (qmax * 512)) over each granule, q = saturate(x / scale) (fp8: round to nearest even;
    int8: round half to even, saturate to [-128, 127]).
    granularity: "tensor" (scale []), "token" ([..., 1], one per row), "channel" (a 2-D [N, K]
    weight, [N, 1]), "group" ([..., ceil(K / group_size)]: groups of group_size along the last
    dimension, the last one shorter when group_size does not divide it), "block" (2-D [N, K],
    [ceil(N/bn), ceil(K/bk)]).
    """
    block = tuple(block_size) if isinstance(block_size, (tuple, list)) else block_size
    if _compiling():
        _check_op_args("quantize", {"x": x}, {"scale": scale, "scale_ub": scale_ub})
        if not (isinstance(block, tuple) and len(block) == 2):
            raise ValueError(f"qbackend.quantize: block_size: must be two positive ints; got {block!r}")
        if scale is not None:
            return ops.quantize_static_op(x, dtype, granularity, scale, group_size, *block), scale
        return ops.quantize_op(x, dtype, granularity, scale_ub, group_size, *block)
    return ops.quantize_impl(x, dtype, granularity, scale, scale_ub, group_size, block)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
               group_size: int = 128, block_size: tuple = (128, 128)) -> torch.Tensor:
    """q * scale in `dtype`, the granularity read off the scale's shape (see `quantize`); per-group
    and block scales need the group_size / block_size they were made with (128 by default)."""
    _check_tensor("dequantize", "q", q)
    _check_tensor("dequantize", "scale", scale)
    if q.dtype not in qd.QUANT_DTYPES:
        raise TypeError(f"qbackend.dequantize: q: dtype must be float8 or int8; got {qd.dtype_name(q.dtype)}")
    size = (1, group_size)
    if q.dim() == 0:
        return (q.float() * scale.float().reshape(())).to(dtype)
    rows = q.numel() // max(q.shape[-1], 1)
    q2 = q.reshape(rows, q.shape[-1])
    if scale.numel() == 1:
        s2 = scale.float().reshape(1, 1)
    elif scale.dim() == q.dim() and scale.shape[:-1] == q.shape[:-1]:
        s2 = scale.reshape(rows, scale.shape[-1])
    elif q.dim() == 2 and scale.dim() == 2:
        s2, size = scale, tuple(block_size)
    else:
        raise ValueError(f"qbackend.dequantize: scale: shape {list(scale.shape)} fits no granularity "
                         f"of q with shape {list(q.shape)}; got that shape")
    try:
        full = expand(s2, q2.shape[0], q2.shape[1], size)
    except ValueError:
        raise ValueError(f"qbackend.dequantize: scale: shape must split q's shape {list(q.shape)} into "
                         f"groups of {size[-1]} (group_size) or blocks of {tuple(block_size)} "
                         f"(block_size); got {list(scale.shape)}") from None
    return (q2.float() * full).to(dtype).reshape(q.shape)


def linear(a: torch.Tensor, weight, scale_a: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """scaled_mm(a, weight) with a weight from `qbackend.prepare_weight` (the provider's own
    layout, prepared once). Arguments as in scaled_mm; the weight carries b, scale_b and the
    accumulate mode it was prepared for."""
    if not isinstance(weight, PreparedWeight):
        raise TypeError(f"qbackend.linear: weight: must be a PreparedWeight from "
                        f"qbackend.prepare_weight; got {type(weight).__name__}")
    args = (a, weight.data, weight.scale, weight.aux, scale_a, bias, weight.provider,
            weight.layout, weight.N, weight.K, weight.dtype, out_dtype, weight.problem.group or 128,
            weight.problem.accumulate)
    if _compiling():
        _check_op_args("linear", {"a": a}, {"scale_a": scale_a, "bias": bias})
        return ops.linear_op(*args)
    return linear_impl(*args)
