"""ROCm's hipBLASLt, reached through its C API with ctypes: where the library is, which version it
is, and the enum values of that version.

The library is $QBACKEND_HIPBLASLT_LIB when that is set (and nothing else then: a wrong path is an
error, not a reason to load another copy), else libhipblaslt.so in $ROCM_PATH/lib, then in
/opt/rocm/lib, then wherever the dynamic loader finds it. Loading it makes no HIP call (no GPU
context is created).

The version decides the enum values qbackend passes, so it is read before anything is called:
from the library's file name (libhipblaslt.so.MAJOR.MINOR...), else from the ROCm release that
holds it (<root>/.info/version) through the table of which hipBLASLt each ROCm release ships. When
the first handle exists, hipblasLtGetVersion confirms it (HipBlasLt.confirm). A version outside
RELEASES is refused, naming the version found and the versions known: its enum values were never
read here, and some ids changed meaning between releases (102 / 103 are A/B_SCALE_POINTER_VEC_EXT
in hipBLASLt 0.10-0.12, nothing in 1.0, and EPILOGUE_ACT_ARG0/1_EXT from 1.1).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

ENV_LIB = "QBACKEND_HIPBLASLT_LIB"
LIB_NAME = "libhipblaslt.so"

# --- values that are the same in every release qbackend knows ---------------------------------
# hipblasStatus_t (hipblas-common.h)
STATUS_NAMES = {0: "HIPBLAS_STATUS_SUCCESS", 1: "HIPBLAS_STATUS_NOT_INITIALIZED", 2: "HIPBLAS_STATUS_ALLOC_FAILED",
                3: "HIPBLAS_STATUS_INVALID_VALUE", 4: "HIPBLAS_STATUS_MAPPING_ERROR",
                5: "HIPBLAS_STATUS_EXECUTION_FAILED", 6: "HIPBLAS_STATUS_INTERNAL_ERROR",
                7: "HIPBLAS_STATUS_NOT_SUPPORTED", 8: "HIPBLAS_STATUS_ARCH_MISMATCH",
                9: "HIPBLAS_STATUS_HANDLE_IS_NULLPTR", 10: "HIPBLAS_STATUS_INVALID_ENUM", 11: "HIPBLAS_STATUS_UNKNOWN"}
# hipDataType (HIP's library_types.h); the OCP fp8 types exist from ROCm 6.3.
HIP_R_32F, HIP_R_16F, HIP_R_16BF = 0, 2, 14
HIP_R_8F_E4M3, HIP_R_8F_E5M2 = 28, 29
HIP_R_8F_E4M3_FNUZ, HIP_R_8F_E5M2_FNUZ = 1000, 1001
HIPBLAS_OP_N, HIPBLAS_OP_T = 111, 112            # hipblasOperation_t
HIPBLAS_COMPUTE_32F = 2                          # hipblasComputeType_t
# hipblasLtMatmulDescAttributes_t: ids 0 to 6 are unchanged from ROCm 6.0 to the newest headers.
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER, DESC_BIAS_DATA_TYPE = 0, 1, 2, 3, 4
DESC_A_SCALE_POINTER, DESC_B_SCALE_POINTER = 5, 6
EPILOGUE_DEFAULT, EPILOGUE_BIAS = 1, 4           # hipblasLtEpilogue_t
PREF_MAX_WORKSPACE_BYTES = 1                     # hipblasLtMatmulPreferenceAttributes_t


@dataclass(frozen=True)
class Release:
    """What qbackend needs from one range of hipBLASLt versions, read from their public headers
    (library/include/hipblaslt.h, hipblaslt-types.h)."""
    first: tuple                      # (major, minor), inclusive
    last: tuple                       # (major, minor), inclusive
    rocm: str                         # the ROCm releases that ship it
    gfx950: bool                      # has kernels for gfx950 (MI350)
    # per-row / per-column scales, one of two forms:
    scale_vec_ext: tuple | None = None   # (A, B) HIPBLASLT_MATMUL_DESC_*_SCALE_POINTER_VEC_EXT
    scale_mode: tuple | None = None      # (A, B) HIPBLASLT_MATMUL_DESC_*_SCALE_MODE ...
    outer_vec_32f: int | None = None     # ... set to HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F

    @property
    def rowwise(self) -> bool:
        return self.scale_vec_ext is not None or self.scale_mode is not None

    def covers(self, version: tuple) -> bool:
        return self.first <= tuple(version[:2]) <= self.last

    @property
    def label(self) -> str:
        return f"hipBLASLt {dotted(self.first)}-{dotted(self.last)} (ROCm {self.rocm})"


RELEASES = (
    # ROCm/hipBLASLt library/include/hipblaslt.h at tags rocm-6.0.0 (592518e7), rocm-6.1.0 (1549b021),
    # rocm-6.2.0 (50015815); versions 0.6.0 / 0.7.0 / 0.8.0 (CMakeLists.txt VERSION_STRING).
    Release((0, 6), (0, 8), "6.0-6.2", gfx950=False),
    # ROCm/hipBLASLt library/include/hipblaslt.h on release-staging/rocm-rel-6.3 (902dbb92, 0.10.0):
    # A/B_SCALE_POINTER_VEC_EXT = 102 / 103 (after COMPUTE_INPUT_TYPE_A/B_EXT = 100 / 101); its
    # rocblaslt sources require A and B scales to be both scalars or both vectors. hipBLASLt 0.12
    # (ROCm 6.4.3) has the same values (bindgen output of its headers, checked against 6.3.3's).
    Release((0, 10), (0, 12), "6.3-6.4", gfx950=False, scale_vec_ext=(102, 103)),
    # hipBLASLt 1.0 (ROCm 7.0.2), 1.1 (7.1.1), 1.2 (7.2.x): bindgen output of their headers, and
    # ROCm/rocm-libraries projects/hipblaslt/library/include/hipblaslt/hipblaslt.h on develop
    # (006d2e0f, a 1.4 version by TheRock's versioning notes): A/B_SCALE_MODE = 31 / 32,
    # hipblasLtMatmulMatrixScale_t OUTER_VEC_32F = 3, the *_VEC_EXT ids gone (a static_assert names
    # SCALE_MODE as their replacement). 1.3 lies between releases with these same values. gfx950
    # kernels from ROCm 7.0 (hipBLASLt 1.0).
    Release((1, 0), (1, 4), "7.0-7.2 and the develop headers", gfx950=True,
            scale_mode=(31, 32), outer_vec_32f=3),
)

# The hipBLASLt each ROCm release ships: CMakeLists.txt VERSION_STRING at ROCm/hipBLASLt's rocm-6.0.0,
# rocm-6.1.0, rocm-6.2.0 tags and release-staging/rocm-rel-6.3; HIPBLASLT_VERSION_MAJOR / MINOR in the
# bindgen output of the ROCm 6.4.3, 7.0.2, 7.1.1 and 7.2.x headers (and the ROCm 7.0.1 release,
# "hipblaslt 1.0.0").
ROCM_HIPBLASLT = {(6, 0): (0, 6), (6, 1): (0, 7), (6, 2): (0, 8), (6, 3): (0, 10), (6, 4): (0, 12),
                  (7, 0): (1, 0), (7, 1): (1, 1), (7, 2): (1, 2)}
NEWEST_ROCM = max(ROCM_HIPBLASLT)


def dotted(version) -> str:
    return ".".join(str(x) for x in version)


def known_versions() -> str:
    return ", ".join(r.label for r in RELEASES)


def release_for(version: tuple | None) -> Release | None:
    if version is None:
        return None
    return next((r for r in RELEASES if r.covers(version)), None)


def parse_version(text: str) -> tuple | None:
    """'6.3.1-48' or '6.3' -> (6, 3, 1) / (6, 3); None when it does not start with numbers."""
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def hipblaslt_for_rocm(rocm: tuple) -> tuple | None:
    return ROCM_HIPBLASLT.get(tuple(rocm[:2]))


# --- the C API --------------------------------------------------------------------------------

class Algo(ctypes.Structure):
    """hipblasLtMatmulAlgo_t"""
    _fields_ = [("data", ctypes.c_uint8 * 16), ("max_workspace_bytes", ctypes.c_size_t)]


class HeuristicResult(ctypes.Structure):
    """hipblasLtMatmulHeuristicResult_t (the same layout from ROCm 6.0 to the develop headers)"""
    _fields_ = [("algo", Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _bind(lib) -> None:
    """The prototypes of hipblaslt.h's functions qbackend calls. Enums are C ints, handles and
    descriptors pointers, and every function returns hipblasStatus_t."""
    c = ctypes
    vp, vpp, i32 = c.c_void_p, c.POINTER(c.c_void_p), c.c_int
    protos = {
        "hipblasLtCreate": [vpp],
        "hipblasLtDestroy": [vp],
        "hipblasLtGetVersion": [vp, c.POINTER(c.c_int)],
        "hipblasLtGetGitRevision": [vp, c.c_char_p],
        "hipblasLtMatrixLayoutCreate": [vpp, i32, c.c_uint64, c.c_uint64, c.c_int64],
        "hipblasLtMatrixLayoutDestroy": [vp],
        "hipblasLtMatmulDescCreate": [vpp, i32, i32],
        "hipblasLtMatmulDescDestroy": [vp],
        "hipblasLtMatmulDescSetAttribute": [vp, i32, vp, c.c_size_t],
        "hipblasLtMatmulPreferenceCreate": [vpp],
        "hipblasLtMatmulPreferenceDestroy": [vp],
        "hipblasLtMatmulPreferenceSetAttribute": [vp, i32, vp, c.c_size_t],
        "hipblasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, c.POINTER(HeuristicResult),
                                            c.POINTER(c.c_int)],
        "hipblasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, c.POINTER(Algo), vp, c.c_size_t, vp],
    }
    for name, argtypes in protos.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = c.c_int


class HipBlasLtError(RuntimeError):
    """A hipBLASLt call returned a status other than success."""

    def __init__(self, call: str, status: int):
        self.call, self.status = call, int(status)
        super().__init__(f"{call} failed with {status_name(status)}")


def status_name(status: int) -> str:
    return f"{STATUS_NAMES.get(int(status), 'an unknown status')} ({int(status)})"


# --- finding it -------------------------------------------------------------------------------

def candidates() -> list:
    """[(where, path or soname)] in search order."""
    if os.environ.get(ENV_LIB):
        return [(ENV_LIB, os.environ[ENV_LIB])]
    found = []
    if os.environ.get("ROCM_PATH"):
        found.append(("ROCM_PATH", str(Path(os.environ["ROCM_PATH"]) / "lib" / LIB_NAME)))
    found.append(("/opt/rocm", f"/opt/rocm/lib/{LIB_NAME}"))
    soname = ctypes.util.find_library("hipblaslt")
    if soname:
        found.append(("the loader's path", soname))
    return found


def _loaded_path(soname: str) -> str | None:
    """The file the dynamic loader mapped for a library opened by name (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith(LIB_NAME):
                    return path
    except OSError:
        pass
    return None


def read_rocm_version(lib_path: str | None) -> tuple:
    """(version tuple or None, the file it was read from or None): <root>/.info/version of the ROCm
    tree holding the library, else of $ROCM_PATH, else of /opt/rocm."""
    roots = []
    if lib_path and os.path.isabs(lib_path):
        roots.append(Path(os.path.realpath(lib_path)).parent.parent)
    if os.environ.get("ROCM_PATH"):
        roots.append(Path(os.environ["ROCM_PATH"]))
    roots.append(Path("/opt/rocm"))
    for root in roots:
        info = root / ".info" / "version"
        try:
            text = info.read_text()
        except OSError:
            continue
        version = parse_version(text)
        if version is not None:
            return version, str(info)
    return None, None


def version_from_file_name(path: str | None) -> tuple | None:
    """(major, minor) from libhipblaslt.so.MAJOR.MINOR[.PATCH-OR-ROCM]; None without both."""
    if not path:
        return None
    m = re.fullmatch(re.escape(LIB_NAME) + r"\.(\d+)\.(\d+)(?:\..*)?", os.path.basename(os.path.realpath(path)))
    return (int(m.group(1)), int(m.group(2))) if m else None


class HipBlasLt:
    """The loaded library (or why not), its versions and the enum values to use with it."""

    def __init__(self, path: str | None, found_in: str | None, lib=None, error: str | None = None):
        self.path, self.found_in, self.lib, self.error = path, found_in, lib, error
        self.rocm_version, self.rocm_source = read_rocm_version(path if lib is not None else None)
        self.version, self.version_source = None, None
        file_version = version_from_file_name(path) if lib is not None else None
        if file_version is not None:
            name = os.path.basename(os.path.realpath(path))
            self.version, self.version_source = file_version, f"the file name {name}"
        elif self.rocm_version is not None and hipblaslt_for_rocm(self.rocm_version) is not None:
            self.version = hipblaslt_for_rocm(self.rocm_version)
            self.version_source = f"ROCm {dotted(self.rocm_version)} ({self.rocm_source})"
        self.release = release_for(self.version)
        self.reported_version = None      # what hipblasLtGetVersion said, once a handle exists
        self.git_revision = None

    @classmethod
    def open(cls, path: str, found_in: str = "given") -> HipBlasLt:
        """Load and bind one file (or soname); never raises: a failure is kept in .error."""
        try:
            if os.sep in path and not os.path.exists(path):
                raise OSError(f"{path}: no such file")
            lib = ctypes.CDLL(path)
            _bind(lib)
        except (OSError, AttributeError) as exc:   # AttributeError: a function missing
            return cls(path, found_in, error=f"{type(exc).__name__}: {exc}")
        if os.sep not in path:
            path = _loaded_path(path) or path
        return cls(path, found_in, lib)

    @property
    def reason(self) -> str | None:
        """Why the library cannot be used, or None."""
        if self.lib is None:
            return f"hipBLASLt not loaded: {self.error}"
        if self.version is None:
            rocm = (f"ROCm {dotted(self.rocm_version)} ({self.rocm_source}) is not one qbackend knows the hipBLASLt of"
                    if self.rocm_version else
                    "no ROCm version file was found (<root>/.info/version, $ROCM_PATH, /opt/rocm)")
            return (f"cannot tell which hipBLASLt {self.path} is: its file name carries no version and {rocm}; "
                    f"qbackend knows {known_versions()}")
        if self.release is None:
            return (f"hipBLASLt {dotted(self.version)} (from {self.version_source}) is not a version qbackend knows "
                    f"the enum values of; it knows {known_versions()}")
        return None

    def check(self, call: str, status: int) -> None:
        if status != 0:
            raise HipBlasLtError(call, status)

    def confirm(self, handle) -> str | None:
        """Ask the library its version through a handle; None when it is in the release whose enum
        values were chosen, else why not (both versions named)."""
        version = ctypes.c_int(0)
        self.check("hipblasLtGetVersion", self.lib.hipblasLtGetVersion(handle, ctypes.byref(version)))
        v = version.value
        self.reported_version = (v // 100000, v // 100 % 1000, v % 100)
        rev = ctypes.create_string_buffer(256)
        if self.lib.hipblasLtGetGitRevision(handle, rev) == 0:
            self.git_revision = rev.value.decode(errors="replace")
        if release_for(self.reported_version) is not self.release:
            return (f"hipblasLtGetVersion reports {dotted(self.reported_version)}, but qbackend chose the enum "
                    f"values of {dotted(self.version)} (from {self.version_source}); set {ENV_LIB} to the library of "
                    "the ROCm install in use")
        return None

    def describe(self) -> dict:
        """For `qbackend info`: a native-library entry with the versions as detail lines."""
        details = [f"ROCm: {dotted(self.rocm_version)} ({self.rocm_source})" if self.rocm_version
                   else "ROCm: no version file found (<root>/.info/version, $ROCM_PATH, /opt/rocm)"]
        if self.lib is not None:
            details.append(f"hipBLASLt: {dotted(self.version)} (from {self.version_source})" if self.version
                           else "hipBLASLt: version unknown")
            if self.reported_version:
                details.append(f"hipblasLtGetVersion: {dotted(self.reported_version)}"
                               + (f", git {self.git_revision}" if self.git_revision else ""))
            details.append(f"enum values: {self.release.label}" if self.release
                           else f"enum values: none (known: {known_versions()})")
            if self.release:
                details.append("per-row / per-column scales: " + rowwise_form(self.release))
        return {"name": "libhipblaslt", "path": self.path, "found_in": self.found_in, "loaded": self.lib is not None,
                "archs": [], "error": self.reason, "details": details}


def rowwise_form(release: Release) -> str:
    if release.scale_vec_ext:
        return "A/B_SCALE_POINTER_VEC_EXT (%d / %d)" % release.scale_vec_ext
    if release.scale_mode:
        return "A/B_SCALE_MODE (%d / %d) = OUTER_VEC_32F (%d)" % (*release.scale_mode, release.outer_vec_32f)
    return "no (hipBLASLt 0.10+, ROCm 6.3+, has them)"


_lock = threading.Lock()
_loaded: HipBlasLt | None = None


def load() -> HipBlasLt:
    """The library of this process, found and loaded once (see the module's docstring)."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded = _find()
    return _loaded


def _find() -> HipBlasLt:
    tried = []
    for where, path in candidates():
        if where != ENV_LIB and os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        found = HipBlasLt.open(path, where)
        if found.lib is not None or where == ENV_LIB:
            return found
        tried.append(f"{path} ({found.error})")
    looked = ", ".join(tried) or "it on the loader path"
    return HipBlasLt(None, None, error=f"{LIB_NAME} not found (looked for {looked}); install ROCm's hipblaslt, or "
                                      f"set {ENV_LIB} or ROCM_PATH")


def reset() -> None:
    """Forget the loaded library (the next load() searches again)."""
    global _loaded
    with _lock:
        _loaded = None
