"""ctypes binding of libqbackend_cuda's scaled_mm and quantize entry points
(csrc_cuda/include/qbackend_cuda.h).

The one loader of the library (marlin_native binds its entry points on this same handle). The
library is $QBACKEND_CUDA_LIB when that is set (and nothing else then: a wrong path is an error, not a
reason to load another build), else the first of _lib/libqbackend_cuda.so next to this module (what
the install or `qbackend build` put in the package) and ~/.cache/qbackend/lib/libqbackend_cuda.so
(where `qbackend build` puts it when the package is not writable). Importing never raises: `load()`
returns the handle or None, `load_error()` says why not. Loading makes no CUDA call (no context is
created).

    scaled_mm(a, b, scale_a, scale_b, bias, out)   # out[M, N] = scale_a * scale_b * (a @ b) + bias
    quantize(x2d, q, scale, mode, scale_ub, workspace)

All are CUDA-graph capturable: no host sync; the only allocations are scaled_mm's split-K workspace
and the sm_90a grouped family's argument arrays, taken from torch's caching allocator (graph-private
memory while capturing). Errors raise RuntimeError with the library's message.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

import torch

from qbackend import bounded

from . import cuda_build, install_paths

__all__ = ["VARIANT_AUTO", "VARIANT_SM90", "VARIANT_SM89", "VARIANT_SM80", "VARIANT_SM75", "ACCUMULATE_PRECISE",
           "STATIC_TENSOR", "DYNAMIC_TENSOR", "DYNAMIC_TOKEN", "load", "load_error", "library_path",
           "library_candidates", "has_variant", "build_info", "describe", "scaled_mm", "scaled_mm_workspace_size",
           "block_workspace_size", "block_config_names", "quantize", "quantize_group",
           "quantize_workspace_size", "quantize_override", "config_names", "auto_config", "token_rows",
           "override", "set_programmatic_launch"]

VARIANT_AUTO, VARIANT_SM90, VARIANT_SM89, VARIANT_SM80, VARIANT_SM75 = 0, 90, 89, 80, 75
# OR'ed into a variant: e4m3 W8A8 with partial sums promoted into fp32 (accumulate="precise")
ACCUMULATE_PRECISE = 0x1000
STATIC_TENSOR, DYNAMIC_TENSOR, DYNAMIC_TOKEN = 0, 1, 2          # qb_quant_mode
_SCALE_TENSOR, _SCALE_ROW, _SCALE_BLOCK = 0, 1, 2              # qb_scale_kind
_DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float8_e4m3fn: 3,
          torch.float8_e5m2: 4, torch.int8: 5, torch.int32: 6}  # qb_dtype
_STATUS = {0: "QB_OK", 1: "QB_ERR_INVALID_ARGUMENT", 2: "QB_ERR_UNSUPPORTED", 3: "QB_ERR_NOT_BUILT",
           4: "QB_ERR_CUDA"}
_ERR_LEN = 1024
_WS_CACHE_MAX = 4096

# What `qbackend info` says to run when the library did not load.
BUILD_HINT = ("qbackend build  (for this machine's GPU; --archs all without one; needs nvcc, CMake, Ninja and "
              f"{cuda_build.CUTLASS_PIN}: pip install 'qbackend[cuda]')")

_lock = threading.Lock()
_lib = None
_load_error: str | None = None
_tried = False
_tls = threading.local()   # per-thread error buffer
# (device, M, N, K, a code, out code, variant, block scaling) -> workspace bytes
_ws_need = bounded.cache("native.workspace_sizes", _WS_CACHE_MAX)


def library_candidates() -> list:
    """[(where, path)] in search order: ("QBACKEND_CUDA_LIB", path) alone when it is set, else the
    package's copy and the per-user cache's."""
    if os.environ.get("QBACKEND_CUDA_LIB"):
        return [("QBACKEND_CUDA_LIB", os.environ["QBACKEND_CUDA_LIB"])]
    return [("package", str(install_paths.package_lib_dir() / cuda_build.LIB_NAME)),
            ("cache", str(install_paths.cache_lib_dir() / cuda_build.LIB_NAME))]


def _found() -> tuple:
    """(where, path) of the library to load: the first candidate that exists, else the first one."""
    candidates = library_candidates()
    return next(((w, p) for w, p in candidates if os.path.exists(p)), candidates[0])


def library_path() -> str:
    return _found()[1]


def _bind(lib) -> None:
    c = ctypes
    i64, sz, vp, ip, fp = c.c_int64, c.c_size_t, c.c_void_p, c.c_int, c.c_void_p
    lib.qb_build_info.argtypes = [c.c_char_p, sz]
    lib.qb_build_info.restype = ip
    lib.qb_has_variant.argtypes = [c.c_char_p, ip]
    lib.qb_has_variant.restype = ip
    mm = [vp, i64, vp, i64, vp, i64, i64, i64, i64, ip, ip, ip, fp, ip, fp, ip, vp, ip]
    lib.qb_scaled_mm.argtypes = mm + [vp, c.c_char_p, sz]
    lib.qb_scaled_mm.restype = ip
    lib.qb_scaled_mm_ws.argtypes = mm + [vp, sz, vp, c.c_char_p, sz]
    lib.qb_scaled_mm_ws.restype = ip
    lib.qb_scaled_mm_workspace_size.argtypes = [i64, i64, i64, ip, ip, ip]
    lib.qb_scaled_mm_workspace_size.restype = sz
    lib.qb_scaled_mm_config_count.argtypes = [ip, ip]
    lib.qb_scaled_mm_config_count.restype = ip
    lib.qb_scaled_mm_config_name.argtypes = [ip, ip, ip]
    lib.qb_scaled_mm_config_name.restype = c.c_char_p
    if hasattr(lib, "qb_scaled_mm_block_workspace_size"):  # libraries built before block scaling lack it
        lib.qb_scaled_mm_block_workspace_size.argtypes = [i64, i64, i64, ip, ip]
        lib.qb_scaled_mm_block_workspace_size.restype = sz
        lib.qb_scaled_mm_block_config_count.argtypes = [ip]
        lib.qb_scaled_mm_block_config_count.restype = ip
        lib.qb_scaled_mm_block_config_name.argtypes = [ip, ip]
        lib.qb_scaled_mm_block_config_name.restype = c.c_char_p
    lib.qb_scaled_mm_override.argtypes = [ip, ip, ip, ip]
    lib.qb_scaled_mm_override.restype = None
    if hasattr(lib, "qb_scaled_mm_auto_config"):  # libraries built before it lack it; auto_config says so
        ipp = c.POINTER(ip)
        lib.qb_scaled_mm_auto_config.argtypes = [i64, i64, i64, ip, ip, ip, ipp, ipp, ipp, ipp, c.c_char_p, sz]
        lib.qb_scaled_mm_auto_config.restype = ip
    if hasattr(lib, "qb_scaled_mm_token_rows"):  # libraries built before it lack it: no whole tiles then
        lib.qb_scaled_mm_token_rows.argtypes = [i64, i64, i64, ip, ip, ip, i64]
        lib.qb_scaled_mm_token_rows.restype = i64
    if hasattr(lib, "qb_grouped_scaled_mm"):  # absent from libraries built before it
        lib.qb_grouped_scaled_mm.argtypes = [vp, i64, vp, i64, i64, vp, i64, vp, i64, i64, i64, i64, ip, ip, ip,
                                             fp, ip, fp, ip, vp, ip, vp, c.c_char_p, sz]
        lib.qb_grouped_scaled_mm.restype = ip
        lib.qb_grouped_scaled_mm_config_count.argtypes = [ip]
        lib.qb_grouped_scaled_mm_config_count.restype = ip
        lib.qb_grouped_scaled_mm_config_name.argtypes = [ip, ip]
        lib.qb_grouped_scaled_mm_config_name.restype = c.c_char_p
        lib.qb_grouped_scaled_mm_override.argtypes = [ip]
        lib.qb_grouped_scaled_mm_override.restype = None
    if hasattr(lib, "qb_grouped_scaled_mm_ws"):  # absent from libraries built before the sm90 family
        lib.qb_grouped_scaled_mm_ws.argtypes = lib.qb_grouped_scaled_mm.argtypes[:-3] + [vp, sz, vp, c.c_char_p, sz]
        lib.qb_grouped_scaled_mm_ws.restype = ip
        lib.qb_grouped_scaled_mm_workspace_size.argtypes = [i64, i64, i64, i64, ip, ip, ip, ip]
        lib.qb_grouped_scaled_mm_workspace_size.restype = sz
    lib.qb_set_programmatic_launch.argtypes = [ip]
    lib.qb_set_programmatic_launch.restype = None
    lib.qb_quantize.argtypes = [vp, i64, vp, i64, fp, i64, i64, ip, ip, ip, fp, vp, vp, c.c_char_p, sz]
    lib.qb_quantize.restype = ip
    if hasattr(lib, "qb_quantize_group"):  # absent from libraries built before it
        lib.qb_quantize_group.argtypes = [vp, i64, vp, i64, fp, i64, i64, i64, i64, ip, ip, vp, c.c_char_p, sz]
        lib.qb_quantize_group.restype = ip
    if hasattr(lib, "qb_quantize_gather"):  # absent from libraries built before it
        lib.qb_quantize_gather.argtypes = [vp, i64, i64, vp, vp, i64, fp, i64, i64, i64, i64, ip, ip, vp,
                                           c.c_char_p, sz]
        lib.qb_quantize_gather.restype = ip
    if hasattr(lib, "qb_quantize_silu_mul"):  # absent from libraries built before it
        lib.qb_quantize_silu_mul.argtypes = [vp, i64, vp, i64, fp, i64, i64, i64, i64, ip, ip, vp, c.c_char_p, sz]
        lib.qb_quantize_silu_mul.restype = ip
    lib.qb_quantize_workspace_size.argtypes = [i64, i64, ip]
    lib.qb_quantize_workspace_size.restype = sz
    lib.qb_quantize_override.argtypes = [ip, ip]
    lib.qb_quantize_override.restype = None


def load():
    """The library handle (ctypes.CDLL), or None when it cannot be loaded (see load_error())."""
    global _lib, _load_error, _tried
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            where, path = _found()
            try:
                if not os.path.exists(path):
                    if where == "QBACKEND_CUDA_LIB":
                        raise OSError(f"QBACKEND_CUDA_LIB={path}: no such file")
                    searched = " or ".join(p for _, p in library_candidates())
                    raise OSError(f"not found: {searched} (run `qbackend build`, or set QBACKEND_CUDA_LIB)")
                lib = ctypes.CDLL(path)
                _bind(lib)
                if os.environ.get("QBACKEND_CUDA_PDL", "1").strip() == "0":
                    lib.qb_set_programmatic_launch(0)
                _lib = lib
            except (OSError, AttributeError) as e:  # AttributeError: a missing entry point
                _load_error = f"{type(e).__name__}: {e}"
            _tried = True
    return _lib


def load_error() -> str | None:
    load()
    return _load_error


def _need():
    lib = load()
    if lib is None:
        raise RuntimeError(f"libqbackend_cuda not available: {_load_error}")
    return lib


def _errbuf():
    buf = getattr(_tls, "buf", None)
    if buf is None:
        buf = _tls.buf = ctypes.create_string_buffer(_ERR_LEN)
    return buf


def _raise(fn: str, status: int, buf) -> None:
    msg = buf.value.decode(errors="replace") or "(no message)"
    raise RuntimeError(f"{fn} failed ({_STATUS.get(status, status)}): {msg}")


def has_variant(op: str, variant: int = 0) -> bool:
    lib = load()
    return bool(lib is not None and lib.qb_has_variant(op.encode(), int(variant)))


def build_info() -> dict:
    """{"abi": int, "archs": [str], "variants": {op: [int]}, "cuda_runtime": int, "cutlass": str,
    "path": str}."""
    lib = _need()
    buf = ctypes.create_string_buffer(4096)
    lib.qb_build_info(buf, len(buf))
    info: dict = {"variants": {}, "path": library_path()}
    for line in buf.value.decode().splitlines():
        key, _, val = line.partition("=")
        if key.startswith("variants."):
            info["variants"][key[len("variants."):]] = [int(v) for v in val.split()]
        elif key == "archs":
            info["archs"] = val.split()
        elif key in ("abi", "cuda_runtime"):
            info[key] = int(val)
        elif key:
            info[key] = val
    return info


def describe() -> dict:
    """For `qbackend info`: {"name", "path", "found_in", "loaded", "archs", "error"}, and when the
    library did not load, "hint" (what to run) and "build_log" (the last build's log, if any)."""
    lib = load()
    where, path = _found()
    d = {"name": "libqbackend_cuda", "path": path, "found_in": where, "loaded": lib is not None,
         "archs": [], "error": _load_error}
    if lib is not None:
        info = build_info()
        d["archs"] = info.get("archs", [])
        d["variants"] = info.get("variants", {})
    else:
        d["hint"] = BUILD_HINT
        logs = [str(p) for p in cuda_build.build_log_candidates() if p.exists()]
        d["build_log"] = logs[0] if logs else None
    return d


def _code(t: torch.Tensor, what: str) -> int:
    try:
        return _DTYPE[t.dtype]
    except KeyError:
        raise TypeError(f"{what}: unsupported dtype {t.dtype}") from None


class _on_device:
    """Make `dev` the current CUDA device for the call, only switching when it is not already."""
    __slots__ = ("dev", "prev")

    def __init__(self, dev: torch.device):
        self.dev = dev.index if dev.index is not None else torch.cuda.current_device()
        self.prev = None

    def __enter__(self):
        cur = torch.cuda.current_device()
        if cur != self.dev:
            self.prev = cur
            torch.cuda.set_device(self.dev)
        return self.dev

    def __exit__(self, *exc):
        if self.prev is not None:
            torch.cuda.set_device(self.prev)


def block_workspace_size(M: int, N: int, K: int, out_dtype: torch.dtype, variant: int = 0) -> int:
    """Bytes of workspace the block-scaled family wants for this problem on the current device."""
    lib = _need()
    if not hasattr(lib, "qb_scaled_mm_block_workspace_size"):
        return 0
    return int(lib.qb_scaled_mm_block_workspace_size(M, N, K, _DTYPE[out_dtype], int(variant)))


def scaled_mm_workspace_size(M: int, N: int, K: int, a_dtype: torch.dtype, out_dtype: torch.dtype,
                             variant: int = 0) -> int:
    """Bytes of workspace the library wants for this problem on the current device (0: none)."""
    return int(_need().qb_scaled_mm_workspace_size(M, N, K, _DTYPE[a_dtype], _DTYPE[out_dtype], int(variant)))


def _block_scales(scale_a: torch.Tensor, scale_b: torch.Tensor, M: int, N: int, K: int) -> None:
    """The block-scaled family's scale shapes: [M, ceil(K/128)] and [ceil(K/128), ceil(N/128)],
    both contiguous fp32."""
    kb, nb = -(-K // 128), -(-N // 128)
    for name, t, shape in (("scale_a", scale_a, (M, kb)), ("scale_b", scale_b, (kb, nb))):
        if t.dtype != torch.float32 or tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"scaled_mm: block scaling needs {name} as a contiguous float32 {list(shape)}, "
                             f"got {t.dtype} {list(t.shape)} with strides {tuple(t.stride())}")


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor | None, scale_b: torch.Tensor,
              bias: torch.Tensor | None, out: torch.Tensor, variant: int = 0,
              workspace: torch.Tensor | None = None, block: bool = False) -> torch.Tensor:
    """out[M, N] = (scale_a * scale_b) * (a @ b) + bias, written into the preallocated `out`.

    a: [M, K] e4m3fn/int8 with unit column stride (any row stride); b: [K, N] column-major (w.t() of a
    row-major [N, K] weight); scale_a: fp32 with 1 or M elements; scale_b: fp32 with 1 or N elements;
    bias: None or [N] in out's dtype; out: [M, N] bf16/fp16 with unit column stride.
    W8A16 (sm_90a): a bf16/fp16, b e4m3fn, scale_a None, out in a's dtype.
    block=True (sm_90a and sm_89+, e4m3fn): scale_a [M, ceil(K/128)], scale_b [ceil(K/128), ceil(N/128)].
    `workspace` (uint8 CUDA tensor) overrides the split-K scratch this function would allocate.
    """
    lib = _need()
    M, K = a.shape
    N = b.shape[1]
    if a.stride(1) != 1 and K > 1:
        raise ValueError(f"scaled_mm: a must have unit column stride, got strides {tuple(a.stride())}")
    if b.stride(0) != 1 and K > 1:
        raise ValueError(f"scaled_mm: b must be column-major ([K, N] view of a row-major [N, K]), "
                         f"got strides {tuple(b.stride())}")
    if out.stride(1) != 1 and N > 1:
        raise ValueError(f"scaled_mm: out must have unit column stride, got strides {tuple(out.stride())}")
    w8a16 = a.dtype in (torch.bfloat16, torch.float16)
    if w8a16 != (scale_a is None):
        raise ValueError("scaled_mm: scale_a must be None exactly when a is bf16/fp16 (W8A16)")
    if (scale_a is not None and scale_a.dtype != torch.float32) or scale_b.dtype != torch.float32:
        raise TypeError("scaled_mm: scale_a and scale_b must be float32")
    na, nb = (1 if scale_a is None else scale_a.numel()), scale_b.numel()
    if block:
        if scale_a is None:
            raise ValueError("scaled_mm: block scaling needs scale_a")
        _block_scales(scale_a, scale_b, M, N, K)
    elif na not in (1, M) or nb not in (1, N):
        raise ValueError(f"scaled_mm: scale_a needs 1 or M={M} elements (got {na}), "
                         f"scale_b 1 or N={N} (got {nb})")
    elif (na > 1 and not scale_a.is_contiguous()) or (nb > 1 and not scale_b.is_contiguous()):
        raise ValueError("scaled_mm: per-row / per-column scales must be contiguous")
    if bias is not None and (bias.numel() != N or not bias.is_contiguous() or bias.dtype != out.dtype):
        raise ValueError(f"scaled_mm: bias must be a contiguous [{N}] tensor of {out.dtype}")
    lda = a.stride(0) if M > 1 else K
    ldb = b.stride(1)
    ldo = out.stride(0) if M > 1 else N
    ac, bc, oc = _code(a, "a"), _code(b, "b"), _code(out, "out")
    kind_a = _SCALE_BLOCK if block else _SCALE_ROW if na > 1 else _SCALE_TENSOR
    kind_b = _SCALE_BLOCK if block else _SCALE_ROW if nb > 1 else _SCALE_TENSOR
    if M == 0:
        return out
    with _on_device(a.device) as dev:
        stream = torch.cuda.current_stream(dev).cuda_stream
        if workspace is None:
            key = (dev, M, N, K, ac, oc, variant, block)
            need = _ws_need.get(key)
            if need is None:
                need = (block_workspace_size(M, N, K, out.dtype, variant) if block else
                        int(lib.qb_scaled_mm_workspace_size(M, N, K, ac, oc, int(variant))))
                _ws_need.put(key, need)
            if need:
                workspace = torch.empty(need, dtype=torch.uint8, device=a.device)
        ws_ptr = workspace.data_ptr() if workspace is not None else None
        ws_len = workspace.numel() * workspace.element_size() if workspace is not None else 0
        buf = _errbuf()
        st = lib.qb_scaled_mm_ws(a.data_ptr(), lda, b.data_ptr(), ldb, out.data_ptr(), ldo, M, N, K,
                                 ac, bc, oc,
                                 None if scale_a is None else scale_a.data_ptr(), kind_a, scale_b.data_ptr(), kind_b,
                                 bias.data_ptr() if bias is not None else None, int(variant), ws_ptr, ws_len,
                                 stream, buf, _ERR_LEN)
    if st:
        _raise("qb_scaled_mm", st, buf)
    return out


def grouped_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      offsets: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                      block: bool = False, variant: int = 0) -> torch.Tensor:
    """Group g's rows offsets[g-1]:offsets[g] of out = scaled_mm of those rows of a with b[g]
    (qb_grouped_scaled_mm), written into the preallocated `out`; offsets are never read here.

    a: [M, K] e4m3fn, unit column stride; b: [G, K, N] e4m3fn, column-major per group; out: [M, N]
    bf16/fp16, unit column stride; offsets: int32 [G] contiguous; bias: None or contiguous [G, N]
    in out's dtype. Scales, contiguous fp32: block=False: scale_a 1 or M values, scale_b G values (one
    per group) or [G, N]; block=True: scale_a [M, ceil(K/128)], scale_b [G, ceil(K/128), ceil(N/128)].
    Where the library's choice wants a workspace (the sm_90a family), it is allocated here.
    """
    lib = _need()
    if not hasattr(lib, "qb_grouped_scaled_mm"):
        raise RuntimeError(f"{library_path()} predates qb_grouped_scaled_mm: rebuild csrc_cuda")
    M, K = a.shape
    G, _, N = b.shape
    if (a.stride(1) != 1 and K > 1) or (b.stride(1) != 1 and K > 1) or (out.stride(1) != 1 and N > 1):
        raise ValueError(f"grouped_scaled_mm: a, out need unit column stride and b unit stride along K, got "
                         f"{tuple(a.stride())}, {tuple(out.stride())}, {tuple(b.stride())}")
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        raise TypeError("grouped_scaled_mm: scale_a and scale_b must be float32")
    if not (scale_a.is_contiguous() and scale_b.is_contiguous() and offsets.is_contiguous()):
        raise ValueError("grouped_scaled_mm: scales and offsets must be contiguous")
    if block:
        kb, nb = -(-K // 128), -(-N // 128)
        shapes = {"scale_a": (scale_a, (M, kb)), "scale_b": (scale_b, (G, kb, nb))}
        for name, (t, shape) in shapes.items():
            if tuple(t.shape) != shape:
                raise ValueError(f"grouped_scaled_mm: block scaling needs {name} {list(shape)}, got {list(t.shape)}")
        kind_a = kind_b = _SCALE_BLOCK
    else:
        if scale_a.numel() not in (1, M) or scale_b.numel() not in (G, G * N):
            raise ValueError(f"grouped_scaled_mm: scale_a needs 1 or M={M} values (got {scale_a.numel()}), "
                             f"scale_b G={G} or G*N={G * N} (got {scale_b.numel()})")
        kind_a = _SCALE_ROW if scale_a.numel() == M and M > 1 else _SCALE_TENSOR
        kind_b = _SCALE_ROW if scale_b.numel() == G * N and N > 1 else _SCALE_TENSOR
    if bias is not None and (tuple(bias.shape) != (G, N) or not bias.is_contiguous() or bias.dtype != out.dtype):
        raise ValueError(f"grouped_scaled_mm: bias must be a contiguous [{G}, {N}] tensor of {out.dtype}")
    if offsets.dtype != torch.int32 or offsets.numel() != G:
        raise ValueError(f"grouped_scaled_mm: offsets must be int32 [{G}]")
    if M == 0:
        return out
    lda = a.stride(0) if M > 1 else K
    ldo = out.stride(0) if M > 1 else N
    ldb = b.stride(2) if N > 1 else K
    ldb_group = b.stride(0) if G > 1 else N * ldb
    oc = _code(out, "out")
    with _on_device(a.device) as dev:
        stream = torch.cuda.current_stream(dev).cuda_stream
        workspace = None
        if hasattr(lib, "qb_grouped_scaled_mm_ws"):
            key = ("grouped", dev, M, N, K, G, oc, kind_a, bias is not None, variant)
            need = _ws_need.get(key)
            if need is None:
                need = int(lib.qb_grouped_scaled_mm_workspace_size(M, N, K, G, oc, kind_a, int(bias is not None),
                                                                   int(variant)))
                _ws_need.put(key, need)
            if need:
                workspace = torch.empty(need, dtype=torch.uint8, device=a.device)
        args = (a.data_ptr(), lda, b.data_ptr(), ldb, ldb_group, out.data_ptr(), ldo, offsets.data_ptr(), M, N, K, G,
                _code(a, "a"), _code(b, "b"), oc, scale_a.data_ptr(), kind_a, scale_b.data_ptr(), kind_b,
                bias.data_ptr() if bias is not None else None, int(variant))
        buf = _errbuf()
        if workspace is not None:
            st = lib.qb_grouped_scaled_mm_ws(*args, workspace.data_ptr(), workspace.numel(), stream, buf, _ERR_LEN)
        else:
            st = lib.qb_grouped_scaled_mm(*args, stream, buf, _ERR_LEN)
    if st:
        _raise("qb_grouped_scaled_mm", st, buf)
    return out


def grouped_workspace_size(M: int, N: int, K: int, groups: int, out_dtype: torch.dtype, block: bool,
                           bias: bool = False, variant: int = 0) -> int:
    """Bytes of workspace grouped_scaled_mm allocates for such a call on the current device (0: none)."""
    lib = _need()
    if not hasattr(lib, "qb_grouped_scaled_mm_workspace_size"):
        return 0
    kind = _SCALE_BLOCK if block else _SCALE_ROW
    return int(lib.qb_grouped_scaled_mm_workspace_size(M, N, K, groups, _DTYPE[out_dtype], kind, int(bias),
                                                       int(variant)))


def grouped_config_names(variant: int = 89) -> list[str]:
    """Tests: the grouped family's configs, index = config id for grouped_override()."""
    lib = _need()
    if not hasattr(lib, "qb_grouped_scaled_mm_config_count"):
        return []
    return [lib.qb_grouped_scaled_mm_config_name(variant, i).decode()
            for i in range(lib.qb_grouped_scaled_mm_config_count(variant))]


def grouped_override(config: int = -1) -> None:
    """Tests: force a grouped config for this thread's later grouped calls (-1: automatic)."""
    _need().qb_grouped_scaled_mm_override(int(config))


def quantize_workspace_size(rows: int, cols: int, mode: int) -> int:
    return int(_need().qb_quantize_workspace_size(rows, cols, mode))


def _rows_and_strides(fn: str, x2d: torch.Tensor, q: torch.Tensor) -> tuple:
    """(rows, cols, ldx, ldq) of a quantize call's x and q, after the checks both entry points share:
    unit column strides and q of x's shape. A single row's stride is its length, whatever torch says."""
    rows, cols = x2d.shape
    if x2d.stride(1) != 1 and cols > 1:
        raise ValueError(f"{fn}: x must have unit column stride, got strides {tuple(x2d.stride())}")
    if q.shape != x2d.shape or (q.stride(1) != 1 and cols > 1):
        raise ValueError(f"{fn}: q must be {tuple(x2d.shape)} with unit column stride")
    return rows, cols, (x2d.stride(0) if rows > 1 else cols), (q.stride(0) if rows > 1 else cols)


def quantize(x2d: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, mode: int,
             scale_ub: torch.Tensor | float | None = None, workspace: torch.Tensor | None = None) -> None:
    """q = saturate(x2d / scale) into the preallocated q; scale is read (STATIC_TENSOR) or written.

    x2d: [rows, cols] f32/f16/bf16 with unit column stride (any row stride); q: [rows, cols]
    e4m3fn/e5m2/int8 with unit column stride; scale: fp32, 1 element (tensor modes) or `rows`
    contiguous elements (DYNAMIC_TOKEN); scale_ub: None or a 1-element fp32 CUDA tensor (dynamic
    modes); workspace: None or quantize_workspace_size() bytes for DYNAMIC_TENSOR (without it the
    library accumulates in `scale` and needs one more tiny launch).
    """
    lib = _need()
    rows, cols, ldx, ldq = _rows_and_strides("quantize", x2d, q)
    if scale.dtype != torch.float32:
        raise TypeError("quantize: scale must be float32")
    want = rows if mode == DYNAMIC_TOKEN else 1
    if scale.numel() != want or not scale.is_contiguous():
        raise ValueError(f"quantize: scale must be a contiguous fp32 tensor of {want} element(s)")
    if isinstance(scale_ub, (int, float)):  # convenience; pass a tensor to stay CUDA-graph friendly
        scale_ub = torch.full((1,), float(scale_ub), dtype=torch.float32, device=x2d.device)
    if scale_ub is not None and (scale_ub.dtype != torch.float32 or scale_ub.numel() != 1):
        raise ValueError("quantize: scale_ub must be a 1-element fp32 tensor")
    if rows == 0:
        return
    with _on_device(x2d.device) as dev:
        stream = torch.cuda.current_stream(dev).cuda_stream
        buf = _errbuf()
        st = lib.qb_quantize(x2d.data_ptr(), ldx, q.data_ptr(), ldq, scale.data_ptr(), rows, cols,
                             _code(x2d, "x"), _code(q, "q"), int(mode),
                             scale_ub.data_ptr() if scale_ub is not None else None,
                             workspace.data_ptr() if workspace is not None else None, stream, buf, _ERR_LEN)
    if st:
        _raise("qb_quantize", st, buf)


def quantize_group(x2d: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int) -> None:
    """Per-token-group dynamic quantize into the preallocated q and scale: scale[r, g] over columns
    [g * group, (g + 1) * group) of row r (the last group may be shorter).

    x2d: [rows, cols] f32/f16/bf16 with unit column stride (any row stride); q: [rows, cols]
    e4m3fn/e5m2/int8 with unit column stride; scale: [rows, ceil(cols / group)] fp32 with unit
    column stride (any row stride).
    """
    lib = _need()
    if not hasattr(lib, "qb_quantize_group"):
        raise RuntimeError("quantize_group: this libqbackend_cuda predates qb_quantize_group; rebuild it "
                           "(`qbackend build`)")
    if not isinstance(group, int) or group <= 0:
        raise ValueError(f"quantize_group: group must be a positive int, got {group!r}")
    rows, cols, ldx, ldq = _rows_and_strides("quantize_group", x2d, q)
    ld_scale = _dynamic_scale_ld("quantize_group", scale, rows, cols, group)
    if rows == 0:
        return
    with _on_device(x2d.device) as dev:
        stream = torch.cuda.current_stream(dev).cuda_stream
        buf = _errbuf()
        st = lib.qb_quantize_group(x2d.data_ptr(), ldx, q.data_ptr(), ldq, scale.data_ptr(), ld_scale, rows, cols,
                                   int(group), _code(x2d, "x"), _code(q, "q"), stream, buf, _ERR_LEN)
    if st:
        _raise("qb_quantize_group", st, buf)


def _dynamic_scale_ld(fn: str, scale: torch.Tensor, rows: int, cols: int, group: int) -> int:
    """Checks the dynamic scale a quantize kernel writes (per token [rows] for group 0, per token group
    [rows, ceil(cols / group)]) and returns its row stride: fp32, unit stride along its last
    dimension wherever that has more than one element."""
    groups = -(-cols // group) if group else 1
    want = (rows, groups) if group else (rows,)
    if scale.dtype != torch.float32 or tuple(scale.shape) != want or (scale.stride(-1) != 1 and want[-1] > 1):
        raise ValueError(f"{fn}: scale must be fp32 {list(want)} with unit last stride, got "
                         f"{scale.dtype} {tuple(scale.shape)} strides {tuple(scale.stride())}")
    return (scale.stride(0) if rows > 1 else groups) if group else 1


def _dynamic_outputs(fn: str, q: torch.Tensor, scale: torch.Tensor, rows: int, cols: int, group: int):
    """Checks q [rows, cols] and the dynamic scale of a fused quantize whose x is not q's shape (a
    gather, a gated activation); returns their row strides (ldq, ld_scale)."""
    if q.shape != (rows, cols) or (q.stride(1) != 1 and cols > 1):
        raise ValueError(f"{fn}: q must be {(rows, cols)} with unit column stride")
    return (q.stride(0) if rows > 1 else cols), _dynamic_scale_ld(fn, scale, rows, cols, group)


def has_quantize_gather() -> bool:
    """Whether the loaded library has qb_quantize_gather (libraries built before it do not)."""
    return hasattr(_need(), "qb_quantize_gather")


def quantize_gather(x2d: torch.Tensor, index: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                    group: int) -> None:
    """Row r of q (and of scale) is the dynamic quantize of row index[r] of x2d: per token (group 0,
    scale [rows] contiguous) or per token group (scale [rows, ceil(cols / group)], unit column
    stride). An index outside [0, x2d.shape[0]) gives that row NaN scales (no host check).

    x2d: [x_rows, cols] f32/f16/bf16 with unit column stride; index: [rows] int64 on x2d's device;
    q: [rows, cols] e4m3fn/e5m2/int8 with unit column stride.
    """
    lib = _need()
    if not hasattr(lib, "qb_quantize_gather"):
        raise RuntimeError("quantize_gather: this libqbackend_cuda predates qb_quantize_gather; rebuild it "
                           "(`qbackend build`)")
    if not isinstance(group, int) or group < 0:
        raise ValueError(f"quantize_gather: group must be an int >= 0 (0: per token), got {group!r}")
    if index.dtype != torch.int64 or index.dim() != 1 or index.device != x2d.device or \
            (index.stride(0) != 1 and index.numel() > 1):
        raise ValueError(f"quantize_gather: index must be a contiguous 1-D int64 tensor on {x2d.device}, got "
                         f"{index.dtype} {tuple(index.shape)} on {index.device}")
    rows, cols = index.numel(), x2d.shape[1]
    if x2d.stride(1) != 1 and cols > 1:
        raise ValueError(f"quantize_gather: x must have unit column stride, got strides {tuple(x2d.stride())}")
    ldq, ld_scale = _dynamic_outputs("quantize_gather", q, scale, rows, cols, group)
    if rows == 0:
        return
    ldx = x2d.stride(0) if x2d.shape[0] > 1 else cols
    with _on_device(x2d.device) as dev:
        stream = torch.cuda.current_stream(dev).cuda_stream
        buf = _errbuf()
        st = lib.qb_quantize_gather(x2d.data_ptr(), ldx, x2d.shape[0], index.data_ptr(), q.data_ptr(), ldq,
                                    scale.data_ptr(), ld_scale, rows, cols, int(group), _code(x2d, "x"),
                                    _code(q, "q"), stream, buf, _ERR_LEN)
    if st:
        _raise("qb_quantize_gather", st, buf)


def has_quantize_silu_mul() -> bool:
    """Whether the loaded library has qb_quantize_silu_mul (libraries built before it do not)."""
    return hasattr(_need(), "qb_quantize_silu_mul")


def quantize_silu_mul(h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int) -> None:
    """Row r of q (and of scale) is the dynamic quantize of SiLU(h[r, :I]) * h[r, I:] (in fp32, rounded
    to h's dtype), I = h.shape[1] // 2: per token (group 0, scale [rows] contiguous) or per token group
    (scale [rows, ceil(I / group)], unit column stride).

    h: [rows, 2 * I] f16/bf16 with unit column stride; q: [rows, I] e4m3fn/e5m2/int8, unit column stride.
    """
    lib = _need()
    if not hasattr(lib, "qb_quantize_silu_mul"):
        raise RuntimeError("quantize_silu_mul: this libqbackend_cuda predates qb_quantize_silu_mul; rebuild it "
                           "(`qbackend build`)")
    if not isinstance(group, int) or group < 0:
        raise ValueError(f"quantize_silu_mul: group must be an int >= 0 (0: per token), got {group!r}")
    if h.dim() != 2 or h.shape[1] % 2 or (h.stride(1) != 1 and h.shape[1] > 1):
        raise ValueError(f"quantize_silu_mul: h must be 2-D [rows, 2 * I] with unit column stride, got shape "
                         f"{tuple(h.shape)} strides {tuple(h.stride())}")
    rows, cols = h.shape[0], h.shape[1] // 2
    ldq, ld_scale = _dynamic_outputs("quantize_silu_mul", q, scale, rows, cols, group)
    if rows == 0 or cols == 0:
        return
    ldx = h.stride(0) if rows > 1 else 2 * cols
    with _on_device(h.device) as dev:
        stream = torch.cuda.current_stream(dev).cuda_stream
        buf = _errbuf()
        st = lib.qb_quantize_silu_mul(h.data_ptr(), ldx, q.data_ptr(), ldq, scale.data_ptr(), ld_scale, rows, cols,
                                      int(group), _code(h, "h"), _code(q, "q"), stream, buf, _ERR_LEN)
    if st:
        _raise("qb_quantize_silu_mul", st, buf)


def quantize_override(token_kernel: int = -1, row_vecs: int = 0) -> None:
    """Tuning/tests: force the dynamic quantize kernel (-1 automatic; per token, 0 block per row and
    1 row-pipelined; per group, 2 a warp per group where a block per row would run) and the
    block-per-row kernels' 16-byte vectors per thread (1, 2 or 4, 3 runs as 2; 0 automatic)."""
    _need().qb_quantize_override(int(token_kernel), int(row_vecs))


def set_programmatic_launch(enabled: bool) -> None:
    """Process-wide: launch the sm_90 kernels that support it (scaled_mm without workspace, per-token
    and static quantize) as programmatic dependents of the previous kernel (on by default;
    QBACKEND_CUDA_PDL=0 turns it off at load)."""
    _need().qb_set_programmatic_launch(int(bool(enabled)))


def config_names(a_dtype: torch.dtype, variant: int) -> list[str]:
    """Tuning: the kernel configs of a (non-AUTO) variant, index = config id for override()."""
    lib = _need()
    code = _DTYPE[a_dtype]
    return [lib.qb_scaled_mm_config_name(code, variant, i).decode()
            for i in range(lib.qb_scaled_mm_config_count(code, variant))]


def block_config_names(variant: int = 90) -> list[str]:
    """Tuning: the block-scaled family's configs, index = config id for override()."""
    lib = _need()
    if not hasattr(lib, "qb_scaled_mm_block_config_count"):
        return []
    return [lib.qb_scaled_mm_block_config_name(variant, i).decode()
            for i in range(lib.qb_scaled_mm_block_config_count(variant))]


def auto_config(M: int, N: int, K: int, a_dtype: torch.dtype = torch.float8_e4m3fn, variant: int = 90,
                sm_count: int = 132) -> dict:
    """Which config the automatic choice runs for an M x N x K problem on a GPU with `sm_count`
    multiprocessors (132: the H100 / H200 SXM), answered without a GPU: {"config": name,
    "decomposition": 0 DP, 1 split-K, 2 stream-K or 3 CUTLASS heuristic, "splits", "swizzle"}, the
    arguments override() would take to force the same. Only the sm90 FP8 family answers."""
    lib = _need()
    if not hasattr(lib, "qb_scaled_mm_auto_config"):
        raise RuntimeError(f"{library_path()} predates qb_scaled_mm_auto_config: rebuild csrc_cuda")
    out = [ctypes.c_int(-1) for _ in range(4)]
    buf = _errbuf()
    code = _DTYPE[a_dtype]
    rc = lib.qb_scaled_mm_auto_config(int(M), int(N), int(K), code, int(variant), int(sm_count),
                                      *[ctypes.byref(v) for v in out], buf, len(buf))
    if rc != 0:
        _raise("qb_scaled_mm_auto_config", rc, buf)
    config, decomposition, splits, swizzle = (v.value for v in out)
    return {"config": lib.qb_scaled_mm_config_name(code, int(variant), config).decode(),
            "decomposition": decomposition, "splits": splits, "swizzle": swizzle}


@functools.lru_cache(maxsize=4096)
def token_rows(M: int, N: int = 0, K: int = 0, sm_count: int = 0, rows_available: int = 0,
               a_dtype: torch.dtype = torch.float8_e4m3fn, variant: int = 90) -> int:
    """Whole token tiles (qb_scaled_mm_token_rows): with N = 0, how many rows to give an activation
    buffer of M rows (and its per-token scales) so that GEMMs can run on whole token tiles; with
    N > 0, how many rows (M to rows_available) this GEMM should run on when A and scale_a have
    storage for rows_available rows. M when the library does not pad (only the sm90 FP8 family
    does) or predates the function. No GPU needed."""
    lib = load()
    if lib is None or not hasattr(lib, "qb_scaled_mm_token_rows"):
        return int(M)
    return int(lib.qb_scaled_mm_token_rows(int(M), int(N), int(K), _DTYPE[a_dtype], int(variant),
                                           int(sm_count), int(rows_available)))


def override(config: int = -1, decomposition: int = -1, splits: int = -1, swizzle: int = -1) -> None:
    """Tuning/tests: force a config / decomposition (0 DP, 1 split-K, 2 stream-K, 3 heuristic) / split
    count / tile swizzle for this thread's later scaled_mm calls; override() restores the automatic
    choice. The SM90 small-M configs ("stream_*") read `splits` as their cluster size (its CTAs split
    the K range of the cluster's last tile; < 1: the kernel's own plan) and `swizzle` as the tiles
    each CTA streams alone before that one (< 0: none)."""
    _need().qb_scaled_mm_override(int(config), int(decomposition), int(splits), int(swizzle))
    _ws_need.clear()
