"""ctypes binding of libqbackend_rocm's quantize entry points (csrc_rocm/include/qbackend_rocm.h).

The library is $QBACKEND_ROCM_LIB when that is set (and nothing else then: a wrong path is an error,
not a reason to load another build), else the first of _lib/libqbackend_rocm.so next to this module
(what the install or `qbackend build --rocm` put in the package) and
~/.cache/qbackend/lib/libqbackend_rocm.so. Importing never raises: `load()` returns a RocmLibrary or
None, `load_error()` says why not. Loading runs no kernel and makes no HIP call of its own.

    lib = load()
    lib.quantize(x2d, q, scale, mode, scale_ub, workspace)   # q = saturate(x2d / scale)
    lib.quantize_group(x2d, q, scale, group)

Tensors live on the GPU for a library built for gfx targets, on the CPU for one built against the
HIP-CPU runtime (archs "cpu": how the tests run the kernels without an AMD GPU). On the GPU there is
no host sync and no allocation on the call path; a HIP-CPU call returns when its kernels are done, as
a CPU op does (its caller may free a temporary, such as the provider's workspace, right after).
Bad arguments raise ValueError / TypeError naming the argument; a failure inside the library raises
RuntimeError with its message.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import torch

from qbackend import dtypes as qd

from . import install_paths, rocm_build

__all__ = ["STATIC_TENSOR", "DYNAMIC_TENSOR", "DYNAMIC_TOKEN", "RocmLibrary", "load", "load_error",
           "library_candidates", "relevant", "describe"]

STATIC_TENSOR, DYNAMIC_TENSOR, DYNAMIC_TOKEN = 0, 1, 2  # qb_quant_mode
MODES = {STATIC_TENSOR: "static tensor", DYNAMIC_TENSOR: "dynamic tensor", DYNAMIC_TOKEN: "dynamic token"}
X_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
Q_CODES = {qd.E4M3: 3, qd.E5M2: 4, torch.int8: 5, qd.E4M3_FNUZ: 7, qd.E5M2_FNUZ: 8}
_STATUS = {0: "QB_OK", 1: "QB_ERR_INVALID_ARGUMENT", 2: "QB_ERR_UNSUPPORTED", 3: "QB_ERR_NOT_BUILT",
           4: "QB_ERR_RUNTIME"}
_ERR_LEN = 1024


def _names(dtypes) -> str:
    return ", ".join(qd.dtype_name(d) for d in dtypes)


class RocmLibrary:
    """One loaded libqbackend_rocm (or its HIP-CPU build) and its quantize calls."""

    def __init__(self, path: str):
        self.path = str(path)
        self._lib = lib = ctypes.CDLL(self.path)
        c = ctypes
        i64, sz, vp, ip = c.c_int64, c.c_size_t, c.c_void_p, c.c_int
        lib.qb_build_info.argtypes = [c.c_char_p, sz]
        lib.qb_build_info.restype = ip
        lib.qb_quantize.argtypes = [vp, i64, vp, i64, vp, i64, i64, ip, ip, ip, vp, vp, vp, c.c_char_p, sz]
        lib.qb_quantize.restype = ip
        lib.qb_quantize_group.argtypes = [vp, i64, vp, i64, vp, i64, i64, i64, i64, ip, ip, vp, c.c_char_p, sz]
        lib.qb_quantize_group.restype = ip
        lib.qb_quantize_workspace_size.argtypes = [i64, i64, ip]
        lib.qb_quantize_workspace_size.restype = sz
        self._tls = threading.local()  # one error buffer per calling thread
        self.info = self._build_info()
        self.archs = tuple(self.info.get("archs", "").replace(",", " ").split())
        self.on_cpu = self.archs == ("cpu",)
        self._cpu_stream = None
        if self.on_cpu:
            lib.qb_hip_cpu_synchronize.argtypes = []
            lib.qb_hip_cpu_synchronize.restype = ip
            lib.qb_hip_cpu_stream.argtypes = []
            lib.qb_hip_cpu_stream.restype = vp
            self._cpu_stream = lib.qb_hip_cpu_stream()
            if not self._cpu_stream:
                raise OSError(f"{self.path}: the HIP-CPU runtime could not create a stream")

    def _build_info(self) -> dict:
        buf = ctypes.create_string_buffer(1024)
        self._lib.qb_build_info(buf, len(buf))
        return dict(line.partition("=")[::2] for line in buf.value.decode().splitlines() if "=" in line)

    def _finish(self) -> None:
        """HIP-CPU builds: wait for the kernels just launched (they run on the runtime's worker threads)."""
        if self.on_cpu and self._lib.qb_hip_cpu_synchronize() != 0:
            raise RuntimeError(f"{self.path}: waiting for the HIP-CPU stream failed")

    def workspace_size(self, rows: int, cols: int, mode: int) -> int:
        return int(self._lib.qb_quantize_workspace_size(int(rows), int(cols), int(mode)))

    # --- argument checks -------------------------------------------------------------------------------

    def _check_device(self, fn: str, **tensors) -> None:
        """Every tensor on one device, the GPU for a GPU build and the CPU for a HIP-CPU build."""
        where = "cpu" if self.on_cpu else "cuda"
        first = None
        for name, t in tensors.items():
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{fn}: {name}: must be a torch.Tensor, got {type(t).__name__}")
            if t.device.type != where:
                place = "the CPU (this is a HIP-CPU build)" if self.on_cpu else "the GPU"
                raise ValueError(f"{fn}: {name}: must be on {place}, got a tensor on {t.device}")
            if first is None:
                first = (name, t.device)
            elif t.device != first[1]:
                raise ValueError(f"{fn}: {name}: must be on the device of {first[0]} ({first[1]}), got {t.device}")

    @staticmethod
    def _rows_and_strides(fn: str, x2d: torch.Tensor, q: torch.Tensor) -> tuple:
        """(rows, cols, ldx, ldq) after the checks both entry points share. A single row's stride is its
        length, whatever torch says."""
        if x2d.dim() != 2:
            raise ValueError(f"{fn}: x: must be 2-D [rows, cols], got shape {list(x2d.shape)}")
        if x2d.dtype not in X_CODES:
            raise TypeError(f"{fn}: x: dtype must be one of {_names(X_CODES)}, got {qd.dtype_name(x2d.dtype)}")
        if q.dtype not in Q_CODES:
            raise TypeError(f"{fn}: q: dtype must be one of {_names(Q_CODES)}, got {qd.dtype_name(q.dtype)}")
        rows, cols = x2d.shape
        if cols == 0:
            raise ValueError(f"{fn}: x: must have at least one column, got shape {list(x2d.shape)}")
        if x2d.stride(1) != 1 and cols > 1:
            raise ValueError(f"{fn}: x: must have unit column stride, got strides {tuple(x2d.stride())}")
        if q.shape != x2d.shape or (q.stride(1) != 1 and cols > 1):
            raise ValueError(f"{fn}: q: must be {list(x2d.shape)} with unit column stride, got shape "
                             f"{list(q.shape)} with strides {tuple(q.stride())}")
        for name, t in (("x", x2d), ("q", q)):
            if rows > 1 and t.stride(0) < cols:
                raise ValueError(f"{fn}: {name}: rows must not overlap (row stride >= {cols}), got strides "
                                 f"{tuple(t.stride())}")
        return rows, cols, (x2d.stride(0) if rows > 1 else cols), (q.stride(0) if rows > 1 else cols)

    def _raise(self, fn: str, status: int, buf) -> None:
        msg = buf.value.decode(errors="replace") or "(no message)"
        raise RuntimeError(f"{fn} failed ({_STATUS.get(status, status)}): {msg}")

    def _errbuf(self):
        buf = getattr(self._tls, "buf", None)
        if buf is None:
            buf = self._tls.buf = ctypes.create_string_buffer(_ERR_LEN)
        return buf

    def _on_device(self, device: torch.device):
        """The tensors' GPU as the current device for the call (switching only when it is not); nothing
        for a HIP-CPU build."""
        if self.on_cpu or device.index is None or device.index == torch.cuda.current_device():
            return contextlib.nullcontext()
        return torch.cuda.device(device)

    def _stream_of(self, device: torch.device):
        """The raw stream to launch on: torch's current stream of that GPU, or the HIP-CPU build's own."""
        return self._cpu_stream if self.on_cpu else torch.cuda.current_stream(device).cuda_stream

    # --- the calls -------------------------------------------------------------------------------------

    def quantize(self, x2d: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, mode: int,
                 scale_ub: torch.Tensor | None = None, workspace: torch.Tensor | None = None) -> None:
        """q = saturate(x2d / scale) into the preallocated q; scale is read (STATIC_TENSOR) or written.

        x2d: [rows, cols] f32/f16/bf16 with unit column stride (any row stride); q: [rows, cols] of an
        fp8 format or int8 with unit column stride; scale: fp32, 1 element (tensor modes) or `rows`
        contiguous elements (DYNAMIC_TOKEN); scale_ub: None or a 1-element fp32 tensor (dynamic modes);
        workspace: None or workspace_size() bytes for DYNAMIC_TENSOR (without it the library
        accumulates in `scale` and runs one more tiny kernel).
        """
        fn = "rocm quantize"
        if mode not in MODES:
            raise ValueError(f"{fn}: mode: must be one of {sorted(MODES)} ({', '.join(MODES.values())}), got {mode!r}")
        self._check_device(fn, x=x2d, q=q, scale=scale, scale_ub=scale_ub, workspace=workspace)
        rows, cols, ldx, ldq = self._rows_and_strides(fn, x2d, q)
        want = rows if mode == DYNAMIC_TOKEN else 1
        if scale.dtype != torch.float32 or scale.numel() != want or not scale.is_contiguous():
            raise ValueError(f"{fn}: scale: must be a contiguous float32 tensor of {want} element(s) for "
                             f"{MODES[mode]} mode, got {qd.dtype_name(scale.dtype)} {list(scale.shape)}")
        if scale_ub is not None:
            if mode == STATIC_TENSOR:
                raise ValueError(f"{fn}: scale_ub: applies to the dynamic modes only")
            if scale_ub.dtype != torch.float32 or scale_ub.numel() != 1:
                raise ValueError(f"{fn}: scale_ub: must be a 1-element float32 tensor, got "
                                 f"{qd.dtype_name(scale_ub.dtype)} {list(scale_ub.shape)}")
        if workspace is not None:
            need = self.workspace_size(rows, cols, mode)
            if mode != DYNAMIC_TENSOR or workspace.numel() * workspace.element_size() < need:
                raise ValueError(f"{fn}: workspace: dynamic tensor mode only, at least {need} bytes")
        if rows == 0:
            return
        buf = self._errbuf()
        with self._on_device(x2d.device):
            st = self._lib.qb_quantize(x2d.data_ptr(), ldx, q.data_ptr(), ldq, scale.data_ptr(), rows, cols,
                                       X_CODES[x2d.dtype], Q_CODES[q.dtype], int(mode),
                                       scale_ub.data_ptr() if scale_ub is not None else None,
                                       workspace.data_ptr() if workspace is not None else None,
                                       self._stream_of(x2d.device), buf, _ERR_LEN)
        self._finish()
        if st:
            self._raise("qb_quantize", st, buf)

    def quantize_group(self, x2d: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, group: int) -> None:
        """Per-token-group dynamic quantize into the preallocated q and scale: scale[r, g] over columns
        [g * group, (g + 1) * group) of row r (the last group may be shorter).

        x2d and q as for quantize(); scale: [rows, ceil(cols / group)] float32 with unit column stride
        (any row stride: the group scales may be a view into a wider buffer).
        """
        fn = "rocm quantize_group"
        if isinstance(group, bool) or not isinstance(group, int) or not 1 <= group <= 1 << 30:
            raise ValueError(f"{fn}: group: must be an int in [1, 2^30], got {group!r}")
        self._check_device(fn, x=x2d, q=q, scale=scale)
        rows, cols, ldx, ldq = self._rows_and_strides(fn, x2d, q)
        groups = -(-cols // group)
        if (scale.dtype != torch.float32 or tuple(scale.shape) != (rows, groups)
                or (scale.stride(1) != 1 and groups > 1) or (rows > 1 and scale.stride(0) < groups)):
            raise ValueError(f"{fn}: scale: must be float32 [{rows}, {groups}] with unit column stride and rows "
                             f"apart, got {qd.dtype_name(scale.dtype)} {list(scale.shape)} with strides "
                             f"{tuple(scale.stride())}")
        if rows == 0:
            return
        buf = self._errbuf()
        with self._on_device(x2d.device):
            st = self._lib.qb_quantize_group(x2d.data_ptr(), ldx, q.data_ptr(), ldq, scale.data_ptr(),
                                             scale.stride(0) if rows > 1 else groups, rows, cols, group,
                                             X_CODES[x2d.dtype], Q_CODES[q.dtype], self._stream_of(x2d.device),
                                             buf, _ERR_LEN)
        self._finish()
        if st:
            self._raise("qb_quantize_group", st, buf)


# --- the library this installation uses ---------------------------------------------------------------------

_lock = threading.Lock()
_loaded: RocmLibrary | None = None
_load_error: str | None = None
_tried = False


def library_candidates() -> list:
    """[(where, path)] in search order: ("QBACKEND_ROCM_LIB", path) alone when it is set, else the
    package's copy and the per-user cache's."""
    if os.environ.get("QBACKEND_ROCM_LIB"):
        return [("QBACKEND_ROCM_LIB", os.environ["QBACKEND_ROCM_LIB"])]
    return [("package", str(install_paths.package_lib_dir() / rocm_build.LIB_NAME)),
            ("cache", str(install_paths.cache_lib_dir() / rocm_build.LIB_NAME))]


def _found() -> tuple:
    candidates = library_candidates()
    return next(((w, p) for w, p in candidates if os.path.exists(p)), candidates[0])


def load() -> RocmLibrary | None:
    """The library (loaded once), or None when it cannot be loaded (see load_error())."""
    global _loaded, _load_error, _tried
    if _tried:
        return _loaded
    with _lock:
        if not _tried:
            where, path = _found()
            try:
                if not os.path.exists(path):
                    if where == "QBACKEND_ROCM_LIB":
                        raise OSError(f"QBACKEND_ROCM_LIB={path}: no such file")
                    searched = " or ".join(p for _, p in library_candidates())
                    raise OSError(f"not found: {searched} (run `qbackend build --rocm`, or set QBACKEND_ROCM_LIB)")
                _loaded = RocmLibrary(path)
            except (OSError, AttributeError) as e:  # AttributeError: a missing entry point
                _load_error = f"{type(e).__name__}: {e}"
            _tried = True
    return _loaded


def load_error() -> str | None:
    load()
    return _load_error


def relevant() -> bool:
    """Whether `qbackend info` should list the library: under a ROCm build of torch, or where one was
    built or named. On other machines it is noise."""
    return bool(torch.version.hip) or any(os.path.exists(p) or w == "QBACKEND_ROCM_LIB"
                                          for w, p in library_candidates())


def describe() -> dict:
    """For `qbackend info`: {"name", "path", "found_in", "loaded", "archs", "error"}, and "hint" (what
    to run) when the library did not load."""
    lib = load()
    where, path = _found()
    d = {"name": "libqbackend_rocm", "path": path, "found_in": where, "loaded": lib is not None,
         "archs": list(lib.archs) if lib is not None else [], "error": _load_error}
    if lib is None:
        d["hint"] = rocm_build.BUILD_HINT
    return d

