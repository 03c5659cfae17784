"""ctypes binding of the marlin (W8A16) entry points of libqbackend_cuda.

The library, its loading and its error reporting are those of `native` (the same
libqbackend_cuda); this module binds the marlin entry points on that handle.

    packed = prepare(w_e4m3, torch.bfloat16)        # load time: [N, K] float8_e4m3fn -> packed bytes
    mm(a, packed, w_scale, bias, out, N, K)         # out = w_scale * (a @ w.T) + bias, in a's dtype
    w = unpack(packed, w_scale, N, K)               # w_scale * w as a dense [N, K] in that dtype

The packing depends on the activation dtype (the kernel decodes fp16 and bf16 weights from different
bit placements), so a weight is prepared for the dtype it will be multiplied with. The packed
tensor's dtype records which: uint8 for float16 activations, int8 for bfloat16; mm refuses the other.

`mm` never synchronizes and is CUDA-graph capturable. Split-K launches need a zeroed workspace
(tile counters the kernel returns to zero, plus partial sums). By default one workspace per (device,
stream) is created, zeroed, at the first eager call on that stream and kept for good (graphs may
hold its address): calls on one stream run one after the other and share it, calls on different
streams (several threads, each with its own stream) never do. Make one eager call per stream before
capturing (the usual warm-up): a call captured before any eager one on its stream gets a workspace
of its own whose zeroing is recorded in the graph. `workspace=new_workspace(N, K, device)` passes
one explicitly.
"""
from __future__ import annotations

import ctypes
import threading

import torch

from qbackend import bounded

from . import native

__all__ = ["VARIANT_AUTO", "VARIANT_SM80", "VARIANT_SM75", "load", "load_error", "has_variant",
           "packed_bytes", "workspace_bytes", "prepare", "mm", "new_workspace", "has_unpack", "unpack"]

VARIANT_AUTO, VARIANT_SM80, VARIANT_SM75 = 0, 80, 75
_ACT_CODE = {torch.float16: 1, torch.bfloat16: 2}  # QB_F16, QB_BF16 of qbackend_cuda.h
_SCALE_TENSOR, _SCALE_ROW = 0, 1
_lock = threading.Lock()
_lib = None              # native's handle, once the marlin entry points are bound on it
_bind_error = None
_workspaces: dict = {}   # (device index, stream handle) -> zeroed uint8 tensor (never freed: graphs may hold it)
_retired: list = []      # outgrown workspaces, kept alive for the graphs that captured them
_ws_need = bounded.cache("marlin.workspace_sizes", 4096)   # (device index, N, K) -> bytes
_DEFAULT_N = 1 << 20     # default workspaces are sized for any N up to this (counters are 4 B / 128 rows)


def _bind(lib):
    c = ctypes
    i64, sz, vp, ip = c.c_int64, c.c_size_t, c.c_void_p, c.c_int
    lib.qb_marlin_has_variant.argtypes = [ip]
    lib.qb_marlin_has_variant.restype = ip
    lib.qb_marlin_packed_bytes.argtypes = [i64, i64]
    lib.qb_marlin_packed_bytes.restype = sz
    lib.qb_marlin_workspace_bytes.argtypes = [i64, i64]
    lib.qb_marlin_workspace_bytes.restype = sz
    lib.qb_marlin_prepare.argtypes = [vp, i64, i64, i64, ip, vp, sz, vp, vp, c.c_char_p, sz]
    lib.qb_marlin_prepare.restype = ip
    mm_args = [vp, i64, vp, sz, vp, i64, i64, i64, i64, ip, vp, ip, vp, vp, sz, ip]
    lib.qb_marlin_mm.argtypes = mm_args + [vp, c.c_char_p, sz]
    lib.qb_marlin_mm.restype = ip
    lib.qb_marlin_mm_tuned.argtypes = mm_args + [ip, ip, ip, vp, c.c_char_p, sz]
    lib.qb_marlin_mm_tuned.restype = ip
    if hasattr(lib, "qb_marlin_unpack"):  # libraries built before it lack it: unpack is then unavailable
        lib.qb_marlin_unpack.argtypes = [vp, sz, i64, i64, ip, vp, ip, vp, i64, vp, c.c_char_p, sz]
        lib.qb_marlin_unpack.restype = ip


def load():
    """The loaded library (ctypes.CDLL) with the marlin entry points bound, or None; see load_error()."""
    global _lib, _bind_error
    if _lib is not None or _bind_error is not None:
        return _lib
    lib = native.load()
    if lib is None:
        return None
    with _lock:
        if _lib is None and _bind_error is None:
            try:
                _bind(lib)
                _lib = lib
            except AttributeError as e:  # a library built without the marlin entry points
                _bind_error = f"AttributeError: {e}"
    return _lib


def load_error():
    load()
    return native.load_error() or _bind_error


def _require():
    lib = load()
    if lib is None:
        raise RuntimeError(f"qbackend marlin: native library unavailable ({load_error()})")
    return lib


def _check(rc: int, what: str, buf) -> None:
    if rc != 0:
        native._raise(what, rc, buf)


def has_variant(variant: int = VARIANT_AUTO) -> bool:
    """Whether the marlin kernels of `variant` (80, 75, or 0 for either) are in the library."""
    lib = load()
    return bool(lib is not None and lib.qb_marlin_has_variant(int(variant)))


def packed_bytes(N: int, K: int) -> int:
    return int(_require().qb_marlin_packed_bytes(int(N), int(K)))


def workspace_bytes(N: int, K: int, device=None) -> int:
    """Workspace bytes qb_marlin_mm needs for (N, K) on `device` (default: current CUDA device)."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    key = (dev.index, int(N), int(K))
    n = _ws_need.get(key)
    if n is None:
        with torch.cuda.device(dev):
            n = int(_require().qb_marlin_workspace_bytes(int(N), int(K)))
        if n == 0:
            raise RuntimeError(f"qbackend marlin: no workspace size for N={N}, K={K} on {dev}")
        _ws_need.put(key, n)
    return n


def new_workspace(N: int, K: int, device) -> torch.Tensor:
    """A zeroed workspace for (N, K) on `device` (reusable by every later call on one stream)."""
    return torch.zeros(workspace_bytes(N, K, device), dtype=torch.uint8, device=device)


def _default_workspace(N: int, K: int, dev: torch.device, stream: int) -> torch.Tensor:
    key = (dev.index, stream)
    ws = _workspaces.get(key)
    need = workspace_bytes(N, K, dev)
    if ws is not None and ws.numel() >= need:
        return ws
    if torch.cuda.is_current_stream_capturing():
        # Cannot zero memory outside the graph now: this workspace is zeroed by the graph itself
        # (a memset node before the kernel) and is not shared with any other call.
        return torch.zeros(need, dtype=torch.uint8, device=dev)
    size = max(need, workspace_bytes(max(N, _DEFAULT_N), max(K, 128), dev))
    with _lock:
        ws = _workspaces.get(key)
        if ws is None or ws.numel() < need:
            if ws is not None:
                _retired.append(ws)
            # Zeroed on this stream, the one whose calls will use it: no other stream's ordering needed.
            ws = torch.zeros(size, dtype=torch.uint8, device=dev)
            _workspaces[key] = ws
    return ws


def _cuda_device_of(t: torch.Tensor, name: str) -> torch.device:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"marlin: {name} must be a torch.Tensor (got {type(t).__name__})")
    if t.device.type != "cuda":
        raise ValueError(f"marlin: {name} must be on a CUDA device (got {t.device})")
    return t.device


# The packed tensor's dtype for each activation dtype (the packing differs: see the module's top).
_PACKED_DTYPE = {torch.float16: torch.uint8, torch.bfloat16: torch.int8}
_PACKED_FOR = {v: k for k, v in _PACKED_DTYPE.items()}


def prepare(w_e4m3: torch.Tensor, act_dtype: torch.dtype, check_nan: bool = True) -> torch.Tensor:
    """Repack a [N, K] float8_e4m3fn weight (row-major, any row stride) for mm() with act_dtype
    (float16 or bfloat16) activations; returns a tensor of packed_bytes(N, K) bytes on the same
    device, uint8 for float16 and int8 for bfloat16. With check_nan (load time) it synchronizes once
    to check that the weight holds no NaN code (0x7F / 0xFF), which the kernel cannot represent;
    without it (per-call repacking, CUDA graphs) NaN weights decode as +-480."""
    lib = _require()
    dev = _cuda_device_of(w_e4m3, "w_e4m3")
    if act_dtype not in _PACKED_DTYPE:
        raise ValueError(f"marlin prepare: act_dtype must be torch.float16 or torch.bfloat16 (got {act_dtype})")
    if w_e4m3.dtype != torch.float8_e4m3fn:
        raise ValueError(f"marlin prepare: w_e4m3 must be torch.float8_e4m3fn (got {w_e4m3.dtype})")
    if w_e4m3.dim() != 2:
        raise ValueError(f"marlin prepare: w_e4m3 must be 2-D [N, K] (got shape {tuple(w_e4m3.shape)})")
    N, K = w_e4m3.shape
    if N < 1 or K < 1:
        raise ValueError(f"marlin prepare: w_e4m3 must be non-empty (got shape {(N, K)})")
    if w_e4m3.stride(1) != 1:
        w_e4m3 = w_e4m3.contiguous()
    nbytes = int(lib.qb_marlin_packed_bytes(N, K))
    if nbytes == 0:
        raise ValueError(f"marlin prepare: shape {(N, K)} is too large")
    packed = torch.empty(nbytes, dtype=_PACKED_DTYPE[act_dtype], device=dev)
    nan_count = torch.zeros(1, dtype=torch.int32, device=dev)
    buf = native._errbuf()
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        rc = lib.qb_marlin_prepare(w_e4m3.data_ptr(), w_e4m3.stride(0), N, K, _ACT_CODE[act_dtype],
                                   packed.data_ptr(), nbytes, nan_count.data_ptr(), stream, buf, native._ERR_LEN)
    _check(rc, "qb_marlin_prepare", buf)
    nans = int(nan_count.item()) if check_nan else 0
    if nans:
        raise ValueError(f"marlin prepare: the weight holds {nans} NaN value(s) (e4m3fn codes 0x7F/0xFF); "
                         "the marlin kernel cannot represent NaN weights")
    return packed


def mm(a: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor, bias, out: torch.Tensor, N: int, K: int,
       variant: int = VARIANT_AUTO, workspace: torch.Tensor | None = None, stages: int = 0,
       max_blocks: int = 0, blocks_per_sm: int = 0) -> torch.Tensor:
    """out[M, N] = w_scale * (a @ w.T) (+ bias), fp32 accumulation, rounded to a's dtype.

    a: [M, K] float16/bfloat16 CUDA tensor with unit column stride (any row stride, multiple of 8);
    packed: prepare(w, a.dtype) of the [N, K] weight; w_scale: float32, 1 element (per tensor) or N (per output
    channel); bias: None or [N] contiguous in a's dtype; out: [M, N] in a's dtype, unit column stride.
    variant: 0 (auto), 80 or 75 (force a kernel family). stages / max_blocks / blocks_per_sm: tuning
    knobs for benchmarks (0 = auto; see qb_marlin_mm_tuned).
    Returns out."""
    lib = _require()
    dev = _cuda_device_of(a, "a")
    for name, t in (("packed", packed), ("w_scale", w_scale), ("out", out)):
        if _cuda_device_of(t, name) != dev:
            raise ValueError(f"marlin mm: {name} is on {t.device}, a is on {dev}")
    code = _ACT_CODE.get(a.dtype)
    if code is None:
        raise ValueError(f"marlin mm: a must be float16 or bfloat16 (got {a.dtype})")
    if a.dim() != 2 or a.shape[1] != K:
        raise ValueError(f"marlin mm: a must be [M, K={K}] (got shape {tuple(a.shape)})")
    M = a.shape[0]
    if out.dtype != a.dtype:
        raise ValueError(f"marlin mm: out must have a's dtype {a.dtype} (got {out.dtype})")
    if out.dim() != 2 or tuple(out.shape) != (M, N):
        raise ValueError(f"marlin mm: out must be [M={M}, N={N}] (got shape {tuple(out.shape)})")
    if M > 0 and K > 1 and a.stride(1) != 1:
        raise ValueError(f"marlin mm: a must have unit column stride (got strides {a.stride()})")
    if M > 0 and N > 1 and out.stride(1) != 1:
        raise ValueError(f"marlin mm: out must have unit column stride (got strides {out.stride()})")
    if packed.dtype not in _PACKED_FOR or packed.dim() != 1:
        raise ValueError("marlin mm: packed must be the 1-D tensor returned by prepare()")
    if _PACKED_FOR[packed.dtype] != a.dtype:
        raise ValueError(f"marlin mm: packed was prepared for {_PACKED_FOR[packed.dtype]} activations "
                         f"({packed.dtype}), a is {a.dtype}: prepare the weight with act_dtype={a.dtype}")
    if w_scale.dtype != torch.float32:
        raise ValueError(f"marlin mm: w_scale must be float32 (got {w_scale.dtype})")
    if w_scale.numel() == 1:
        skind = _SCALE_TENSOR
    elif w_scale.numel() == N and (w_scale.dim() == 1 or w_scale.is_contiguous()):
        skind = _SCALE_ROW
        if w_scale.dim() > 1 and w_scale.stride(-1) != 1:
            raise ValueError("marlin mm: w_scale must be contiguous")
        if w_scale.dim() == 1 and w_scale.stride(0) != 1:
            raise ValueError("marlin mm: w_scale must be contiguous")
    else:
        raise ValueError(f"marlin mm: w_scale must hold 1 or N={N} values (got shape {tuple(w_scale.shape)})")
    bias_ptr = None
    if bias is not None:
        if _cuda_device_of(bias, "bias") != dev:
            raise ValueError(f"marlin mm: bias is on {bias.device}, a is on {dev}")
        if bias.dtype != a.dtype:
            raise ValueError(f"marlin mm: bias must have a's dtype {a.dtype} (got {bias.dtype})")
        strided = (bias.numel() > 1 and bias.stride(-1) != 1) or (bias.dim() > 1 and not bias.is_contiguous())
        if bias.numel() != N or strided:
            raise ValueError(f"marlin mm: bias must be a contiguous [N={N}] tensor (got shape {tuple(bias.shape)})")
        bias_ptr = bias.data_ptr()
    switch = torch.cuda.current_device() != dev.index
    if switch:
        prev = torch.cuda.current_device()
        torch.cuda.set_device(dev)
    try:
        stream = torch.cuda.current_stream(dev).cuda_stream
        if workspace is None:
            workspace = _default_workspace(N, K, dev, stream)
        elif _cuda_device_of(workspace, "workspace") != dev or workspace.dtype != torch.uint8:
            raise ValueError("marlin mm: workspace must be a uint8 tensor on a's device (see new_workspace)")
        buf = native._errbuf()
        lda = a.stride(0) if M > 0 else K
        ldo = out.stride(0) if M > 0 else N
        args = (a.data_ptr(), lda, packed.data_ptr(), packed.numel(), out.data_ptr(), ldo, M, N, K, code,
                w_scale.data_ptr(), skind, bias_ptr, workspace.data_ptr(), workspace.numel(), int(variant))
        if stages or max_blocks or blocks_per_sm:
            rc = lib.qb_marlin_mm_tuned(*args, int(stages), int(max_blocks), int(blocks_per_sm), stream, buf,
                                        native._ERR_LEN)
        else:
            rc = lib.qb_marlin_mm(*args, stream, buf, native._ERR_LEN)
    finally:
        if switch:
            torch.cuda.set_device(prev)
    _check(rc, "qb_marlin_mm", buf)
    return out


def has_unpack() -> bool:
    """Whether the loaded library has qb_marlin_unpack (with the SM80 family built)."""
    lib = load()
    return lib is not None and hasattr(lib, "qb_marlin_unpack") and has_variant(VARIANT_SM80)


def unpack(packed: torch.Tensor, w_scale: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """w_scale * w as a new contiguous [N, K] tensor in the activation dtype packed was prepared for
    (each element rounded once): for GEMMs with more rows than mm() is built for. w_scale: float32,
    1 or N values. Asynchronous, graph-capturable; sm_80 and newer."""
    lib = _require()
    dev = _cuda_device_of(packed, "packed")
    if packed.dtype not in _PACKED_FOR or packed.dim() != 1:
        raise ValueError("marlin unpack: packed must be the 1-D tensor returned by prepare()")
    if not hasattr(lib, "qb_marlin_unpack"):
        raise RuntimeError("marlin unpack: the loaded library has no qb_marlin_unpack (rebuild csrc_cuda)")
    if _cuda_device_of(w_scale, "w_scale") != dev or w_scale.dtype != torch.float32:
        raise ValueError(f"marlin unpack: w_scale must be float32 on {dev} (got {w_scale.dtype} on {w_scale.device})")
    if w_scale.numel() not in (1, N):
        raise ValueError(f"marlin unpack: w_scale must hold 1 or N={N} values (got shape {tuple(w_scale.shape)})")
    w_scale = w_scale.reshape(-1).contiguous()
    act = _PACKED_FOR[packed.dtype]
    out = torch.empty((N, K), dtype=act, device=dev)
    buf = native._errbuf()
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        rc = lib.qb_marlin_unpack(packed.data_ptr(), packed.numel(), N, K, _ACT_CODE[act], w_scale.data_ptr(),
                                  _SCALE_ROW if w_scale.numel() == N and N > 1 else _SCALE_TENSOR,
                                  out.data_ptr(), K, stream, buf, native._ERR_LEN)
    _check(rc, "qb_marlin_unpack", buf)
    return out
