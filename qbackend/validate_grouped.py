"""Validation of grouped_scaled_mm calls, in the style of validate.py: shapes, strides and dtypes
only, never tensor data (offsets included), so no check costs a device sync and every one runs on
fake tensors under torch.compile."""
from __future__ import annotations

import torch

from . import dtypes as qd
from .problem import Granularity as G
from .problem import Op, Problem, alignment
from .scales import group_size
from .validate import (
    INT8_MAX_K,
    _check_aligned_ptr,
    _check_same_device,
    _check_tensor,
    _fail,
    _shape,
    check_bias,
    check_index_values,
    check_out_dtype,
    scale_extents,
    validate_quantize,
)

FN = "grouped_scaled_mm"
# Enough for every mixture of experts in use (DeepSeek-V3 has 256 routed experts) with room to spare.
MAX_GROUPS = 1024


def _check_scale(arg: str, s, a: torch.Tensor):
    _check_tensor(FN, arg, s)
    if s.dtype != torch.float32:
        _fail(FN, arg, "must be a float32 tensor", qd.dtype_name(s.dtype), TypeError)
    _check_same_device(FN, arg, s, a, "a")


def _dtypes(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype not in qd.QUANT_DTYPES:
        _fail(FN, "a", "dtype must be float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz) or int8",
              qd.dtype_name(a.dtype), TypeError)
    if b.dtype not in qd.QUANT_DTYPES:
        _fail(FN, "b", "dtype must be float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz) or int8",
              qd.dtype_name(b.dtype), TypeError)
    pair = f"a {qd.dtype_name(a.dtype)} with b {qd.dtype_name(b.dtype)}"
    if (a.dtype == torch.int8) != (b.dtype == torch.int8):
        _fail(FN, "a, b", "int8 pairs only with int8", pair, TypeError)
    if qd.is_fp8(a.dtype) and qd.fp8_family(a.dtype) != qd.fp8_family(b.dtype):
        _fail(FN, "a, b", "float8 formats cannot mix the OCP (fn/e5m2) and MI300 (fnuz) families",
              pair, TypeError)


def _scale_a_granularity(scale_a: torch.Tensor, M: int, K: int, g: int) -> G:
    if scale_a.numel() == 1 and scale_a.dim() <= 2:
        return G.TENSOR
    if scale_a.dim() == 2 and scale_a.shape[0] == M:
        cols = int(scale_a.shape[1])
        if cols == 1:
            return G.TOKEN
        if cols > 1 and group_size(K, cols, g) is not None:
            return G.GROUP
    _fail(FN, "scale_a", f"shape must be [] or [1] (per-tensor), [{M}, 1] (per-token) or "
          f"[{M}, {-(-K // g)}] (per-group: groups of group_size={g} along K={K})", _shape(scale_a))


def _scale_b_granularity(scale_b: torch.Tensor, groups: int, K: int, N: int, g: int) -> G:
    shape = tuple(int(d) for d in scale_b.shape)
    if shape in ((), (1,), (groups,), (groups, 1), (groups, 1, 1)):  # [G, 1, 1]: one block covers K and N
        return G.TENSOR
    if shape == (groups, N):
        return G.CHANNEL
    if len(shape) == 3 and shape[0] == groups:
        kb, nb = shape[1:]
        if (kb > 1 or nb > 1) and group_size(K, kb, g) is not None and group_size(N, nb, g) is not None:
            return G.BLOCK
    _fail(FN, "scale_b", f"shape must be [] or [{groups}] (one per tensor or per group), [{groups}, {N}] "
          f"(per group and channel) or [{groups}, {-(-K // g)}, {-(-N // g)}] (blocks of "
          f"group_size={g}: w_scale_inv.transpose(-2, -1) of [G, ceil(N/{g}), ceil(K/{g})])", _shape(scale_b))


def _layout(a: torch.Tensor, b: torch.Tensor, K: int, N: int) -> None:
    """a row-major with any row stride; each group's b column-major (stride 1 along K)."""
    if K > 1 and a.stride(1) != 1:
        _fail(FN, "a", "must be row-major (stride 1 along K)", f"strides {tuple(a.stride())}")
    if a.shape[0] > 1 and a.stride(0) < K:
        _fail(FN, "a", f"row stride must be >= K ({K})", f"stride {a.stride(0)}")
    if a.shape[0] > 1 and a.stride(0) * a.element_size() % 16:
        _fail(FN, "a", "row stride must be a multiple of 16 bytes (K padded to 16 elements)",
              f"stride {a.stride(0)}")
    if N > 1 and K > 1 and b.stride(1) != 1:
        _fail(FN, "b", "must be column-major per group: b = w.transpose(-2, -1) of a row-major "
              "[G, N, K] weight (stride 1 along K)", f"strides {tuple(b.stride())} for shape {_shape(b)}")
    if N > 1 and (b.stride(2) < K or b.stride(2) * b.element_size() % 16):
        _fail(FN, "b", f"column stride must be >= K ({K}) and a multiple of 16 bytes", f"stride {b.stride(2)}")
    if b.shape[0] > 1 and (b.stride(0) < K * N or b.stride(0) * b.element_size() % 16):
        _fail(FN, "b", "group stride must cover one [K, N] weight and be a multiple of 16 bytes",
              f"stride {b.stride(0)}")
    _check_aligned_ptr(FN, "a", a)
    _check_aligned_ptr(FN, "b", b)


def validate_grouped_scaled_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias,
                               group_size_: int = 128) -> Problem:
    """Check a grouped_scaled_mm call; return its Problem (op GROUPED_SCALED_MM)."""
    _check_tensor(FN, "a", a)
    _check_tensor(FN, "b", b)
    _check_tensor(FN, "offsets", offsets)
    if a.dim() != 2:
        _fail(FN, "a", "must have rank 2 ([total_tokens, K], rows sorted by group)", f"rank {a.dim()}")
    if b.dim() != 3:
        _fail(FN, "b", "must have rank 3 ([G, K, N], column-major per group)", f"rank {b.dim()}")
    _check_same_device(FN, "b", b, a, "a")
    _dtypes(a, b)
    out_dtype = check_out_dtype(FN, out_dtype, torch.bfloat16)
    if not isinstance(group_size_, int) or isinstance(group_size_, bool) or group_size_ <= 0:
        _fail(FN, "group_size", "must be a positive int", repr(group_size_))

    M, K = int(a.shape[0]), int(a.shape[1])
    groups, N = int(b.shape[0]), int(b.shape[2])
    if int(b.shape[1]) != K:
        _fail(FN, "b", f"must be [G, K, N] with K matching a's last dimension ({K})", f"shape {_shape(b)}")
    if K == 0 or N == 0:
        _fail(FN, "a, b", "K and N must be positive", f"K={K}, N={N}")
    if not 1 <= groups <= MAX_GROUPS:
        _fail(FN, "b", f"must hold 1 to {MAX_GROUPS} groups", f"G={groups}")
    if a.dtype == torch.int8 and K > INT8_MAX_K:
        _fail(FN, "a", f"int8 products overflow int32 accumulation beyond K={INT8_MAX_K}", f"K={K}")

    if offsets.dtype != torch.int32:
        _fail(FN, "offsets", "must be an int32 tensor (cumulative row ends, one per group)",
              qd.dtype_name(offsets.dtype), TypeError)
    if offsets.dim() != 1 or int(offsets.shape[0]) != groups:
        _fail(FN, "offsets", f"shape must be [G] = [{groups}] (one row end per group of b)", _shape(offsets))
    _check_same_device(FN, "offsets", offsets, a, "a")
    if groups > 1 and offsets.stride(0) != 1:
        _fail(FN, "offsets", "must be contiguous", f"stride {offsets.stride(0)}")
    _layout(a, b, K, N)

    if scale_a is None:
        _fail(FN, "scale_a", "is required (a is quantized)", "None")
    _check_scale("scale_a", scale_a, a)
    ga = _scale_a_granularity(scale_a, M, K, group_size_)
    if scale_b is None:
        _fail(FN, "scale_b", "is required", "None")
    _check_scale("scale_b", scale_b, a)
    gb = _scale_b_granularity(scale_b, groups, K, N, group_size_)

    if bias is not None:
        check_bias(FN, bias, a, out_dtype, (groups, N), f"[G, N] = [{groups}, {N}] (one bias per group)")
    group, extents = scale_extents(ga, gb, scale_a, scale_b, K, N, group_size_)
    return Problem(Op.GROUPED_SCALED_MM, a.dtype, b.dtype, out_dtype, ga, gb, bias is not None,
                   alignment(K), alignment(N), group=group, group_extents=extents)


def validate_gather_quantize(x, index, dtype, granularity, group_size_) -> Problem:
    """The quantize problem of x[index] (token or group granularity); index's values are checked
    on the CPU in eager mode only (elsewhere that would be a sync: see gather_quantize)."""
    fn = "gather_quantize"
    _check_tensor(fn, "x", x)
    _check_tensor(fn, "index", index)
    if x.dim() != 2:
        _fail(fn, "x", "must be 2-D [tokens, K]", f"rank {x.dim()}")
    if index.dtype not in (torch.int64, torch.int32):
        _fail(fn, "index", "dtype must be int64 or int32", qd.dtype_name(index.dtype), TypeError)
    if index.dim() != 1:
        _fail(fn, "index", "must be 1-D [rows]", f"rank {index.dim()}")
    _check_same_device(fn, "index", index, x, "x")
    if granularity not in ("token", "group"):
        _fail(fn, "granularity", "must be 'token' or 'group'", repr(granularity))
    if index.numel() and x.shape[0] == 0:
        _fail(fn, "x", "must have at least one row when index is not empty", _shape(x))
    check_index_values(fn, "index", index, x.shape[0], "x.shape[0]")
    return validate_quantize(x, dtype, granularity, None, None, group_size_, (128, 128), fn)


def validate_silu_mul_quantize(h, dtype, granularity, group_size_) -> Problem:
    """The quantize problem of a gated MLP's activation SiLU(h[:, :I]) * h[:, I:] (token or group
    granularity), I = h.shape[1] // 2."""
    fn = "silu_mul_quantize"
    _check_tensor(fn, "h", h)
    if h.dim() != 2:
        _fail(fn, "h", "must be 2-D [rows, 2 * I] (gate columns, then up columns)", f"rank {h.dim()}")
    if h.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        _fail(fn, "h", "dtype must be bfloat16, float16 or float32", qd.dtype_name(h.dtype), TypeError)
    if h.shape[1] % 2 or h.shape[1] == 0:
        _fail(fn, "h", "must have an even, non-zero number of columns ([gate | up])", _shape(h))
    if granularity not in ("token", "group"):
        _fail(fn, "granularity", "must be 'token' or 'group'", repr(granularity))
    # The problem is the quantize of the activation: a view with its columns (no data is read).
    return validate_quantize(h[:, :h.shape[1] // 2], dtype, granularity, None, None, group_size_, (128, 128), fn)
