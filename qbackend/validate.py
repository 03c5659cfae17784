"""The one validation layer every provider relies on.

Each rule that a call breaks raises TypeError (wrong kind of object) or ValueError (wrong value),
with a message naming the function, the argument, the rule and what was given. Checks run on shapes,
strides and dtypes only, never on tensor data, so they cost no device sync and run on fake tensors
under torch.compile (where data pointers do not exist and their alignment is checked at run time).
"""
from __future__ import annotations

import torch

from . import dtypes as qd
from .problem import ACCUMULATE_MODES, Op, Problem, alignment
from .problem import Granularity as G
from .scales import group_size

# |a|, |b| <= 128 for int8: K products of 2^14 stay inside int32 up to this K.
INT8_MAX_K = (2**31 - 1) // (128 * 128)
GRANULARITIES = ("tensor", "token", "channel", "group", "block")


class WeightSpec:
    """Stands in for `b` when the weight is held in a provider's own layout (a PreparedWeight):
    the shape, dtype and device of the column-major [K, N] operand it represents."""

    def __init__(self, K: int, N: int, dtype: torch.dtype, device: torch.device):
        self.shape, self.dtype, self.device = (K, N), dtype, device

    def dim(self) -> int:
        return 2

    def stride(self, i: int) -> int:
        # prepare_weight pads the weight's rows to whole 16-byte units (one byte per element)
        return (1, -(-self.shape[0] // 16) * 16)[i]

    def element_size(self) -> int:
        return 1

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def data_ptr(self) -> int:
        return 0


def _fail(fn: str, arg: str, rule: str, got, exc=ValueError):
    raise exc(f"qbackend.{fn}: {arg}: {rule}; got {got}")


def _is_fake(t: torch.Tensor) -> bool:
    return t.device.type == "meta" or type(t).__name__ in ("FakeTensor", "FunctionalTensor")


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(int(s)) for s in t.shape) + "]"


def _check_tensor(fn: str, arg: str, t, allow_none: bool = False):
    if t is None and allow_none:
        return
    if not isinstance(t, torch.Tensor):
        _fail(fn, arg, "must be a torch.Tensor", type(t).__name__, TypeError)


def _check_same_device(fn: str, arg: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str):
    if t.device != ref.device:
        _fail(fn, arg, f"must be on the same device as {ref_name} ({ref.device})", t.device)


def _check_aligned_ptr(fn: str, arg: str, t: torch.Tensor):
    if t.numel() and not _is_fake(t) and t.data_ptr() % 16:
        _fail(fn, arg, "data pointer must be 16-byte aligned (slice at a 16-byte boundary or "
              "copy with .contiguous())", f"address ending in 0x{t.data_ptr() % 256:02x}")


def _check_scale_tensor(fn: str, arg: str, s, ref: torch.Tensor):
    _check_tensor(fn, arg, s)
    if s.dtype != torch.float32:
        _fail(fn, arg, "must be a float32 tensor", qd.dtype_name(s.dtype), TypeError)
    _check_same_device(fn, arg, s, ref, "a" if fn == "scaled_mm" else "x")


def check_out_dtype(fn: str, out_dtype, default: torch.dtype) -> torch.dtype:
    if out_dtype is None:
        return default
    if not isinstance(out_dtype, torch.dtype):
        _fail(fn, "out_dtype", "must be a torch.dtype", type(out_dtype).__name__, TypeError)
    if out_dtype not in qd.OUT_DTYPES:
        _fail(fn, "out_dtype", "must be one of bfloat16, float16, float32", qd.dtype_name(out_dtype))
    return out_dtype


def _dtype_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    fn = "scaled_mm"
    if a.dtype not in qd.QUANT_DTYPES + qd.ACTIVATION_DTYPES:
        _fail(fn, "a", "dtype must be float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), int8, or "
              "bfloat16/float16 for weight-only (W8A16)", qd.dtype_name(a.dtype), TypeError)
    if b.dtype not in qd.QUANT_DTYPES:
        _fail(fn, "b", "dtype must be float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz) or int8",
              qd.dtype_name(b.dtype), TypeError)
    pair = f"a {qd.dtype_name(a.dtype)} with b {qd.dtype_name(b.dtype)}"
    if a.dtype in qd.ACTIVATION_DTYPES:
        if not qd.is_fp8(b.dtype):
            _fail(fn, "b", "weight-only (W8A16) needs float8 weights", pair, TypeError)
    elif (a.dtype == torch.int8) != (b.dtype == torch.int8):
        _fail(fn, "a, b", "int8 pairs only with int8", pair, TypeError)
    elif qd.is_fp8(a.dtype) and qd.fp8_family(a.dtype) != qd.fp8_family(b.dtype):
        _fail(fn, "a, b", "float8 formats cannot mix the OCP (fn/e5m2) and MI300 (fnuz) families",
              pair, TypeError)


def _scale_a_granularity(scale_a: torch.Tensor, lead: tuple, M: int, K: int, g: int) -> G:
    fn = "scaled_mm"
    if scale_a.numel() == 1 and scale_a.dim() <= 2:
        return G.TENSOR
    if scale_a.dim() == len(lead) + 1 and tuple(scale_a.shape[:-1]) == lead:
        cols = scale_a.shape[-1]
    elif scale_a.dim() == 2 and scale_a.shape[0] == M:
        cols = scale_a.shape[1]
    else:
        cols = None
    if cols == 1:
        return G.TOKEN
    if cols is not None and cols > 1 and group_size(K, cols, g) is not None:
        return G.GROUP
    lead_s = ", ".join(str(d) for d in lead)
    _fail(fn, "scale_a", f"shape must be [] or [1] (per-tensor), [{lead_s}, 1] (per-token) or "
          f"[{lead_s}, {-(-K // g)}] (per-group: ceil(K/group_size) groups of group_size={g} along "
          f"K={K})", _shape(scale_a))


def _scale_b_granularity(scale_b: torch.Tensor, K: int, N: int, g: int) -> G:
    fn = "scaled_mm"
    shape = tuple(scale_b.shape)
    if scale_b.numel() == 1 and scale_b.dim() <= 2:
        return G.TENSOR
    if shape in ((N,), (1, N)):
        return G.CHANNEL
    if scale_b.dim() == 2:
        kb, nb = shape
        if nb == 1 and kb == N:
            _fail(fn, "scale_b", "shape must be [1, N] for per-channel scales (pass "
                  "weight_scale.t() of an [N, 1] weight scale)", _shape(scale_b))
        if (kb > 1 or nb > 1) and group_size(K, kb, g) is not None and group_size(N, nb, g) is not None:
            return G.BLOCK
    _fail(fn, "scale_b", f"shape must be [] or [1] (per-tensor), [{N}] or [1, {N}] (per-channel), or "
          f"[{-(-K // g)}, {-(-N // g)}] / [{-(-K // g)}, {N}] blocks of group_size={g} over K={K}, N={N}",
          _shape(scale_b))


def validate_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, group_size_: int = 128,
                       accumulate: str = "fast") -> Problem:
    """Check a scaled_mm call; return its Problem. `a` may have leading batch dimensions."""
    fn = "scaled_mm"
    _check_tensor(fn, "a", a)
    if not isinstance(b, WeightSpec):
        _check_tensor(fn, "b", b)
    if a.dim() < 2:
        _fail(fn, "a", "must have rank >= 2 ([..., M, K] or [M, K])", f"rank {a.dim()}")
    if b.dim() != 2:
        _fail(fn, "b", "must have rank 2 ([K, N], column-major)", f"rank {b.dim()}")
    _check_same_device(fn, "b", b, a, "a")
    _dtype_pair(a, b)
    weight_only = a.dtype in qd.ACTIVATION_DTYPES
    out_dtype = check_out_dtype(fn, out_dtype, a.dtype if weight_only else torch.bfloat16)

    if not isinstance(group_size_, int) or group_size_ <= 0:
        _fail(fn, "group_size", "must be a positive int", repr(group_size_))
    if accumulate not in ACCUMULATE_MODES:
        _fail(fn, "accumulate", "must be 'fast' or 'precise'", repr(accumulate))
    lead = tuple(int(d) for d in a.shape[:-1])
    K, N = int(a.shape[-1]), int(b.shape[1])
    M = 1
    for d in lead:
        M *= d
    if int(b.shape[0]) != K:
        _fail(fn, "b", f"must have K rows matching a's last dimension ({K})", f"b of shape {_shape(b)}")
    if K == 0 or N == 0:
        _fail(fn, "a, b", "K and N must be positive", f"K={K}, N={N}")
    if a.dtype == torch.int8 and K > INT8_MAX_K:
        _fail(fn, "a", f"int8 products overflow int32 accumulation beyond K={INT8_MAX_K}", f"K={K}")

    # Layout: a row-major with any row stride, b column-major with any column stride.
    if K > 1 and a.stride(-1) != 1:
        _fail(fn, "a", "must be row-major (stride 1 along K)", f"strides {tuple(a.stride())}")
    if N > 1 and K > 1 and b.stride(0) != 1:
        _fail(fn, "b", "must be column-major: b = w.t() of a row-major [N, K] weight (stride 1 "
              "along K)", f"strides {tuple(b.stride())} for shape {_shape(b)}")
    if N > 1 and b.stride(1) < K:
        _fail(fn, "b", f"column stride must be >= K ({K})", f"stride {b.stride(1)}")
    for d in range(a.dim() - 1):
        if a.shape[d] > 1 and a.stride(d) * a.element_size() % 16:
            _fail(fn, "a", "row stride must be a multiple of 16 bytes (K padded to 16 / "
                  f"{a.element_size()} elements)", f"stride {a.stride(d)} elements in dim {d}")
    if N > 1 and b.stride(1) * b.element_size() % 16:
        _fail(fn, "b", "column stride must be a multiple of 16 bytes", f"stride {b.stride(1)}")
    if a.dim() == 2 and M > 1 and a.stride(0) < K:
        _fail(fn, "a", f"row stride must be >= K ({K})", f"stride {a.stride(0)}")
    _check_aligned_ptr(fn, "a", a)
    _check_aligned_ptr(fn, "b", b)

    if weight_only:
        if scale_a is not None:
            _fail(fn, "scale_a", "must be None for weight-only (W8A16) calls with "
                  f"{qd.dtype_name(a.dtype)} activations", "a tensor")
        ga = G.NONE
    else:
        if scale_a is None:
            _fail(fn, "scale_a", "is required for W8A8 (a is quantized)", "None")
        _check_scale_tensor(fn, "scale_a", scale_a, a)
        ga = _scale_a_granularity(scale_a, lead, M, K, group_size_)
    if scale_b is None:
        _fail(fn, "scale_b", "is required", "None")
    _check_scale_tensor(fn, "scale_b", scale_b, a)
    gb = _scale_b_granularity(scale_b, K, N, group_size_)

    if bias is not None:
        check_bias(fn, bias, a, out_dtype, (N,), f"[N] = [{N}]")
    group, extents = scale_extents(ga, gb, scale_a, scale_b, K, N, group_size_)
    return Problem(Op.SCALED_MM, a.dtype, b.dtype, out_dtype, ga, gb, bias is not None,
                   alignment(K), alignment(N), group=group, group_extents=extents, accumulate=accumulate)


def check_bias(fn: str, bias: torch.Tensor, a: torch.Tensor, out_dtype: torch.dtype, shape: tuple, rule: str):
    """A bias in out_dtype on a's device, of `shape` (`rule` says it to the user), contiguous along N
    (its last dim): the kernels read it as N consecutive values."""
    _check_tensor(fn, "bias", bias)
    _check_same_device(fn, "bias", bias, a, "a")
    if bias.dtype != out_dtype:
        _fail(fn, "bias", f"dtype must equal out_dtype ({qd.dtype_name(out_dtype)})",
              qd.dtype_name(bias.dtype), TypeError)
    if tuple(bias.shape) != shape:
        _fail(fn, "bias", f"shape must be {rule}", _shape(bias))
    if shape[-1] > 1 and bias.stride(-1) != 1:
        _fail(fn, "bias", "must be contiguous along N", f"strides {tuple(bias.stride())}")


def scale_extents(ga, gb, scale_a: torch.Tensor, scale_b: torch.Tensor, K: int, N: int, group_size_) -> tuple:
    """(group, group_extents) of a Problem: for 1 x g activation groups or g x g weight blocks, the
    group size and the (a_k, b_k, b_n) extents the scales imply; (0, ()) for the other scales. The
    weight's block counts are the last two dims of scale_b ([K/g, N/g], or [G, K/g, N/g] grouped)."""
    if ga is not G.GROUP and gb is not G.BLOCK:
        return 0, ()
    a_k = group_size(K, scale_a.shape[-1], group_size_) if ga is G.GROUP else 0
    b_k, b_n = ((group_size(K, scale_b.shape[-2], group_size_), group_size(N, scale_b.shape[-1], group_size_))
                if gb is G.BLOCK else (0, 0))
    return group_size_, (a_k, b_k, b_n)


def _check_positive_finite(fn: str, arg: str, s: torch.Tensor):
    """Refuse a scale holding 0, a negative or a non-finite value, where that costs no device
    sync: on the CPU. A scale on a GPU is not read here; the kernels turn such a value into a NaN
    scale instead (see docs/api.md, "Non-finite values")."""
    if s.device.type != "cpu" or _is_fake(s) or s.numel() == 0:
        return
    bad = ~((s > 0) & torch.isfinite(s))
    if bool(bad.any()):
        first = s.reshape(-1)[bad.reshape(-1)][0].item()
        _fail(fn, arg, "must be positive and finite (a scale of 0, a negative or a non-finite one "
              "quantizes to nothing usable)", f"{int(bad.sum())} such value(s), the first {first}")


def check_index_values(fn: str, arg: str, t: torch.Tensor, bound: int, bound_name: str) -> None:
    """An integer tensor's values within [0, bound), read on the CPU in eager mode only: on a GPU
    (or while tracing, where fake tensors hold no values) reading them would be a host sync."""
    if t.device.type == "cpu" and t.numel() and not torch.compiler.is_compiling() and not _is_fake(t):
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= bound:
            _fail(fn, arg, f"values must lie in [0, {bound_name}) = [0, {bound})", f"values from {lo} to {hi}")


def quantize_scale_shape(x, granularity: str, group: int, block: tuple) -> tuple:
    """The scale's shape for quantizing x (a tensor, or its shape) at a granularity."""
    shape = tuple(int(d) for d in (x.shape if isinstance(x, torch.Tensor) else x))
    if granularity == "tensor":
        return ()
    if granularity in ("token", "channel"):
        return shape[:-1] + (1,)
    if granularity == "group":
        return shape[:-1] + (-(-shape[-1] // group),)
    rows, cols = shape
    return (-(-rows // block[0]), -(-cols // block[1]))


def validate_quantize(x, dtype, granularity, scale, scale_ub, group_size_, block_size, fn: str = "quantize"
                      ) -> Problem:
    _check_tensor(fn, "x", x)
    if x.dtype not in qd.FLOAT_INPUT_DTYPES:
        _fail(fn, "x", "dtype must be bfloat16, float16 or float32", qd.dtype_name(x.dtype), TypeError)
    if x.dim() < 1:
        _fail(fn, "x", "must have rank >= 1", "a 0-d tensor")
    if not isinstance(dtype, torch.dtype):
        _fail(fn, "dtype", "must be a torch.dtype", type(dtype).__name__, TypeError)
    if dtype not in qd.QUANT_DTYPES:
        _fail(fn, "dtype", "must be float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz "
              "or int8", qd.dtype_name(dtype))
    if granularity not in GRANULARITIES:
        _fail(fn, "granularity", f"must be one of {', '.join(GRANULARITIES)}", repr(granularity))
    cols = int(x.shape[-1])
    if granularity == "channel" and x.dim() != 2:
        _fail(fn, "x", "per-channel quantization takes a 2-D [N, K] weight", f"rank {x.dim()}")
    if granularity == "group":
        if not isinstance(group_size_, int) or group_size_ <= 0:
            _fail(fn, "group_size", "must be a positive int", repr(group_size_))
    if granularity == "block":
        if x.dim() != 2:
            _fail(fn, "x", "block quantization takes a 2-D [N, K] weight", f"rank {x.dim()}")
        if (not isinstance(block_size, (tuple, list)) or len(block_size) != 2
                or not all(isinstance(v, int) and v > 0 for v in block_size)):
            _fail(fn, "block_size", "must be two positive ints", repr(block_size))
    if scale is not None:
        _check_scale_tensor(fn, "scale", scale, x)
        want = quantize_scale_shape(x, granularity, group_size_, tuple(block_size))
        ok = scale.numel() == 1 if granularity == "tensor" else tuple(scale.shape) == want
        if not ok:
            _fail(fn, "scale", f"shape must be {list(want)} for {granularity} granularity", _shape(scale))
        if scale_ub is not None:
            _fail(fn, "scale_ub", "applies to dynamic quantization only (scale was given)", "both")
        _check_positive_finite(fn, "scale", scale)
    if scale_ub is not None:
        _check_scale_tensor(fn, "scale_ub", scale_ub, x)
        if granularity not in ("tensor", "token"):
            _fail(fn, "scale_ub", "applies to per-tensor and per-token quantization only", granularity)
        if scale_ub.numel() != 1:
            _fail(fn, "scale_ub", "must hold one value", _shape(scale_ub))
        _check_positive_finite(fn, "scale_ub", scale_ub)
    return Problem(Op.QUANTIZE, x.dtype, dtype, None, G(granularity), G.NONE, False,
                   alignment(cols), 16 if (cols <= 1 or x.stride(-1) == 1) else 1,
                   scale is not None, scale_ub is not None)
