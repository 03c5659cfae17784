"""Routing for mixtures of experts: from each token's chosen experts to the expert-sorted row order
that grouped_scaled_mm takes, on the device, without reading anything on the host (so that it
captures in a CUDA graph and traces under torch.compile with fixed shapes)."""
from __future__ import annotations

import torch

from . import dtypes as qd
from . import ops
from .validate import _fail, check_index_values


def moe_align(topk_ids: torch.Tensor, num_experts: int):
    """(permutation, offsets, inverse) for topk_ids [tokens, top_k] (or [tokens * top_k]) of
    expert indices in [0, num_experts).

    permutation: int64 [tokens * top_k]; entry r is the flat (token * top_k + slot) index of the
       r-th row in expert order (rows of one expert keep their token order). The token is
       permutation // top_k.
    offsets: int32 [num_experts], cumulative row ends per expert (grouped_scaled_mm's offsets).
    inverse: int64 [tokens * top_k], inverse[permutation[r]] == r: where each (token, slot) row
       landed, to gather the grouped output back into token order.
    Indices outside [0, num_experts) are refused on the CPU in eager mode; on a GPU, where checking them would
    cost a sync, they are not read on the host and give meaningless offsets.
    """
    fn = "moe_align"
    if not isinstance(topk_ids, torch.Tensor):
        _fail(fn, "topk_ids", "must be a torch.Tensor", type(topk_ids).__name__, TypeError)
    if topk_ids.dtype not in (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8):
        _fail(fn, "topk_ids", "dtype must be an integer type", str(topk_ids.dtype).replace("torch.", ""), TypeError)
    if topk_ids.dim() not in (1, 2):
        _fail(fn, "topk_ids", "must have rank 1 or 2 ([tokens, top_k])", f"rank {topk_ids.dim()}")
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts <= 0:
        _fail(fn, "num_experts", "must be a positive int", repr(num_experts))
    flat = topk_ids.reshape(-1).long()
    check_index_values(fn, "topk_ids", flat, num_experts, "num_experts")
    # A stable sort keeps each expert's rows in token order (deterministic, and reads in order).
    permutation = torch.argsort(flat, stable=True)
    # scatter_add into a fixed-size count, not bincount: bincount sizes its output from the data's
    # maximum, which is a host sync on a GPU.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat.clamp(0, num_experts - 1), torch.ones_like(flat))
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    inverse = torch.empty_like(permutation)
    inverse.scatter_(0, permutation, torch.arange(flat.numel(), device=flat.device))
    return permutation, offsets, inverse


def gather_quantize(x: torch.Tensor, index: torch.Tensor, dtype: torch.dtype = qd.E4M3, granularity: str = "token",
                    group_size: int = 128):
    """quantize(x[index], dtype, granularity, group_size=group_size) -> (q, scale), in one pass where
    the provider has a fused kernel (the CUDA library's): a MoE layer's routed rows, quantized once
    in expert order (index = permutation // top_k from moe_align) without materialising x[index].

    x: [tokens, K] bfloat16 / float16 / float32; index: int64 or int32 [rows] on x's device.
    granularity: "token" (scale [rows, 1]) or "group" (scale [rows, ceil(K / group_size)]).
    The results are those of quantize on x[index], bit for bit. Index values outside [0, tokens) are
    refused on the CPU in eager mode; on a GPU, where checking them would cost a sync, such a row's
    scales are NaN (the device is never read out of bounds).
    """
    if torch.compiler.is_compiling():
        return ops.gather_quantize_op(x, index, dtype, granularity, group_size)
    return ops.gather_quantize_impl(x, index, dtype, granularity, group_size)


def silu_mul_quantize(h: torch.Tensor, dtype: torch.dtype = qd.E4M3, granularity: str = "token",
                      group_size: int = 128):
    """quantize(SiLU(h[:, :I]) * h[:, I:], dtype, granularity, group_size=group_size) -> (q, scale),
    I = h.shape[1] // 2: the activation of a gated MLP (a MoE layer's gate/up output, gate columns
    first) quantized for the next GEMM, in one pass where the provider has a fused kernel (the CUDA
    library's, for bf16 / fp16 h).

    The activation is SiLU(gate) * up computed in fp32 (SiLU(g) = g / (1 + exp(-g))) and rounded once
    to h's dtype, then quantized exactly as quantize does it; the fused kernel gives the same bits as
    that composition on the same GPU. h: [rows, 2 * I] bfloat16 / float16 / float32; granularity
    "token" (scale [rows, 1]) or "group" (scale [rows, ceil(I / group_size)]).
    """
    if torch.compiler.is_compiling():
        return ops.silu_mul_quantize_op(h, dtype, granularity, group_size)
    return ops.silu_mul_quantize_impl(h, dtype, granularity, group_size)
