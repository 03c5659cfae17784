"""The hipblaslt provider: W8A8 FP8 GEMMs through hipBLASLt on AMD Instinct GPUs.

gfx942 (MI300) computes the fnuz formats (e4m3fnuz / e5m2fnuz); gfx950 (MI350, hipBLASLt 1.0+) the
OCP formats. Checkpoints in e4m3fn are re-encoded for gfx942 at load time (qbackend.fp8.to_fnuz).
Scales: per-tensor on every version; per-token x per-channel (and either with a per-tensor other
side) where the installed hipBLASLt has vector scales (0.10+, ROCm 6.3+).

hipBLASLt is called through its C API with ctypes (hipblaslt_lib: finding it, its version, the
enum values of that version). Status: unverified on AMD hardware. The call path runs in the CPU
tests against a stand-in library (tests/hipblaslt_standin/) with the same C signatures. Under
QBACKEND_SIMULATE=gfx942 / gfx950 (optionally with :rocmX.Y) the rules answer for that ROCm release
as if it were installed.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from collections import OrderedDict

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend.problem import Granularity as G
from qbackend.problem import Op, Verdict
from qbackend.provider import Declined, Provider, Rule, granularities

from . import hipblaslt_lib as hl

HIP = frozenset({"hip"})
_OUT = frozenset(qd.OUT_DTYPES)
_FNUZ = frozenset({(qd.E4M3_FNUZ, qd.E4M3_FNUZ), (qd.E4M3_FNUZ, qd.E5M2_FNUZ), (qd.E5M2_FNUZ, qd.E4M3_FNUZ)})
_OCP = frozenset({(qd.E4M3, qd.E4M3), (qd.E4M3, qd.E5M2), (qd.E5M2, qd.E4M3)})

WORKSPACE_BYTES = 32 * 1024 * 1024
# Cached plans per provider (all devices), least recently used dropped first and its descriptors
# destroyed. A plan holds the algorithm the heuristic chose for one exact problem (M included):
# hipblasLtMatmul runs the algorithm's kernel without checking it against other sizes, so an
# algorithm is never reused for another M.
PLANS_MAX = 1024

_HIP_DTYPE = {
    qd.E4M3_FNUZ: hl.HIP_R_8F_E4M3_FNUZ, qd.E5M2_FNUZ: hl.HIP_R_8F_E5M2_FNUZ,
    qd.E4M3: hl.HIP_R_8F_E4M3, qd.E5M2: hl.HIP_R_8F_E5M2,
    torch.bfloat16: hl.HIP_R_16BF, torch.float16: hl.HIP_R_16F, torch.float32: hl.HIP_R_32F,
}


def _current_stream(device: torch.device) -> int:
    """The raw stream handle the GEMM is enqueued on (torch's current stream on that device)."""
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return 0


def _on_device(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def simulated_release(device) -> tuple:
    """(hipBLASLt version, Release or None, ROCm version) a simulated device stands for: its ROCm
    version (gfx942:rocm6.2) or the newest qbackend knows."""
    rocm = hl.parse_version(device.runtime_version) if device.runtime_version else hl.NEWEST_ROCM
    version = hl.hipblaslt_for_rocm(rocm) if rocm else None
    return version, hl.release_for(version), rocm


def _vector(scale: torch.Tensor, n: int) -> torch.Tensor:
    """An fp32 scale as n contiguous values (a per-tensor scale repeated)."""
    flat = scale.reshape(-1)
    if flat.numel() != n:
        flat = flat.expand(n)
    return flat.to(torch.float32).contiguous()


class _Plan:
    """Everything reusable for one problem on one device: layouts, the matmul descriptor (data
    types, transposes, epilogue, scale modes) and the algorithm the heuristic chose for it."""
    __slots__ = ("desc", "layout_a", "layout_b", "layout_d", "heuristic", "vector")

    def __init__(self):
        self.desc = self.layout_a = self.layout_b = self.layout_d = None
        self.heuristic = hl.HeuristicResult()


class HipBlasLtProvider(Provider):
    def __init__(self, library: hl.HipBlasLt | None = None, host_pointers: bool = False):
        """library: a hipblaslt_lib.HipBlasLt (default: the one hipblaslt_lib.load() finds).
        host_pointers: accept CPU tensors, passing their host addresses (the tests' stand-in
        library computes on the CPU); a real hipBLASLt must only see device memory."""
        a_scales = granularities("tensor", "token")
        b_scales = granularities("tensor", "channel")
        super().__init__(
            name="hipblaslt", priority=80,
            description="hipBLASLt W8A8 FP8 GEMMs on AMD Instinct (gfx942 fnuz, gfx950 OCP)",
            rules=(
                Rule(Op.SCALED_MM, HIP, _FNUZ, a_scales, b_scales, _OUT, archs=frozenset({"gfx942"}),
                     k_align=16, n_align=16, why_arch="fnuz fp8 matrix cores"),
                Rule(Op.SCALED_MM, HIP, _OCP, a_scales, b_scales, _OUT, archs=frozenset({"gfx950"}),
                     k_align=16, n_align=16, why_arch="OCP fp8 matrix cores"),
            ))
        self._library = library
        self._host_pointers = host_pointers
        self._lock = threading.Lock()
        self._handles = {}          # device -> hipblasLtHandle_t, or why the library refused there
        self._workspaces = {}       # device -> uint8 tensor of WORKSPACE_BYTES
        # (device, dtypes, scale form, bias, M, N, K, strides) -> _Plan, or the reason the problem is
        # declined; least recently used first, at most PLANS_MAX
        self._plans = OrderedDict()

    @property
    def library(self) -> hl.HipBlasLt:
        if self._library is None:
            self._library = hl.load()
        return self._library

    def runtime_verdict(self, device, problem):
        if device.simulated:
            version, release, rocm = simulated_release(device)
            if release is None:
                known = ", ".join(f"{a}.{b}" for a, b in sorted(hl.ROCM_HIPBLASLT))
                return Verdict(False, f"simulated ROCm {hl.dotted(rocm or ())}: not a release qbackend knows the "
                                      f"hipBLASLt of (known: ROCm {known})")
            found = f"simulated ROCm {hl.dotted(rocm)} (hipBLASLt {hl.dotted(version)})"
        else:
            lib = self.library
            if lib.reason is not None:
                return Verdict(False, lib.reason)
            release = lib.release
            rocm = hl.dotted(lib.rocm_version) if lib.rocm_version else "?"
            found = f"hipBLASLt {hl.dotted(lib.version)} (ROCm {rocm})"
        if device.arch == "gfx950" and not release.gfx950:
            return Verdict(False, f"gfx950 needs hipBLASLt 1.0+ (ROCm 7.0+); found {found}")
        if (problem.scale_a is G.TOKEN or problem.scale_b is G.CHANNEL) and not release.rowwise:
            return Verdict(False, f"per-token / per-channel scales need hipBLASLt 0.10+ (ROCm 6.3+); found {found}")
        return None

    def info(self) -> dict:
        lib = self._library
        if lib is None or lib.lib is None:
            return {}
        return {"library": lib.path, "hipblaslt": hl.dotted(lib.version) if lib.version else None,
                "enum_values": lib.release.label if lib.release else None}

    # -- per-device state ---------------------------------------------------------------------

    def _handle(self, device):
        handle = self._handles.get(device)
        if handle is None:
            lib = self.library
            if lib.reason is not None:
                raise Declined(lib.reason)
            handle = ctypes.c_void_p()
            with _on_device(device):
                lib.check("hipblasLtCreate", lib.lib.hipblasLtCreate(ctypes.byref(handle)))
            try:
                mismatch = lib.confirm(handle)
            except hl.HipBlasLtError:
                lib.lib.hipblasLtDestroy(handle)
                raise
            if mismatch is not None:
                lib.lib.hipblasLtDestroy(handle)
                handle = mismatch
            else:
                # Allocated through torch's caching allocator once, outside any graph capture of
                # later calls, and reused: replaying a captured graph finds the same workspace.
                self._workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            self._handles[device] = handle
        if isinstance(handle, str):
            raise Declined(handle)
        return handle

    def _set(self, desc, attr: int, value) -> None:
        """hipblasLtMatmulDescSetAttribute with a ctypes value (the library copies it)."""
        lib = self.library
        lib.check(f"hipblasLtMatmulDescSetAttribute({attr})",
                  lib.lib.hipblasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), ctypes.sizeof(value)))

    def _layout(self, dtype, rows: int, cols: int, ld: int):
        lib = self.library
        layout = ctypes.c_void_p()
        lib.check("hipblasLtMatrixLayoutCreate",
                  lib.lib.hipblasLtMatrixLayoutCreate(ctypes.byref(layout), _HIP_DTYPE[dtype], rows, cols, ld))
        return layout

    def _plan(self, handle, a, b, scale_a, scale_b, out_dtype, bias, vector) -> _Plan:
        """The cached plan for this problem, with this call's scale and bias pointers set."""
        M, K = a.shape
        N = b.shape[1]
        # A single row's (column's) stride is arbitrary in torch (a [1, K] view may report 1);
        # hipBLASLt requires ld >= rows, and with one row any such ld reads the same bytes.
        lda = a.stride(0) if M > 1 else K
        ldb = b.stride(1) if N > 1 else K
        key = (a.device, a.dtype, b.dtype, out_dtype, None if bias is None else bias.dtype, vector, M, N, K, lda, ldb)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            if isinstance(plan, str):
                raise Declined(plan)
            self._set_pointers(plan, scale_a, scale_b, bias)
            return plan
        lib = self.library
        release = lib.release
        if vector and not release.rowwise:
            raise Declined(f"per-token / per-channel scales need hipBLASLt 0.10+ (ROCm 6.3+); this is "
                           f"hipBLASLt {hl.dotted(lib.version)}")
        # hipBLASLt is column-major. qbackend's out = a @ b is row-major [M, N], which is the same
        # memory as a column-major [N, M] matrix with leading dimension N. So we ask hipBLASLt for
        #     D (N x M, col-major) = op(A) @ op(B)   with A := b, B := a:
        # * b is [K, N] column-major: b[k, n] sits at k + n * ldb, a column-major K x N matrix. We
        #   need b^T (N x K): TRANSA = T on a K x N layout.
        # * a is [M, K] row-major with row stride lda (>= K for sliced rows): a[m, k] sits at
        #   m * lda + k, a column-major K x M matrix (a^T) with ld = lda, already the K x M operand
        #   needed: TRANSB = N on a K x M layout.
        # * D and C (unused, beta = 0) are N x M with ld = N (out is contiguous [M, N]).
        # This is the "TN" form, the one hipBLASLt's FP8 kernels are built for. hipBLASLt's A
        # scale vector runs along D's rows (N: our per-channel scales), its B vector along D's
        # columns (M: our per-token scales).
        plan = _Plan()
        plan.vector = vector
        try:
            plan.layout_a = self._layout(b.dtype, K, N, ldb)
            plan.layout_b = self._layout(a.dtype, K, M, lda)
            plan.layout_d = self._layout(out_dtype, N, M, N)
            plan.desc = ctypes.c_void_p()
            lib.check("hipblasLtMatmulDescCreate",
                      lib.lib.hipblasLtMatmulDescCreate(ctypes.byref(plan.desc), hl.HIPBLAS_COMPUTE_32F, hl.HIP_R_32F))
            self._set(plan.desc, hl.DESC_TRANSA, ctypes.c_int32(hl.HIPBLAS_OP_T))
            self._set(plan.desc, hl.DESC_TRANSB, ctypes.c_int32(hl.HIPBLAS_OP_N))
            if bias is not None:
                # The bias epilogue adds a vector of length rows(D) = N to every column: our
                # bias[N] added to every row of out.
                self._set(plan.desc, hl.DESC_EPILOGUE, ctypes.c_uint32(hl.EPILOGUE_BIAS))
                self._set(plan.desc, hl.DESC_BIAS_DATA_TYPE, ctypes.c_int32(_HIP_DTYPE[bias.dtype]))
            if vector and release.scale_mode:
                for attr in release.scale_mode:
                    self._set(plan.desc, attr, ctypes.c_int32(release.outer_vec_32f))
            # The heuristic picks kernels by whether scale pointers are set (and to scalars or
            # vectors), so set them first (to this call's tensors; later calls set their own).
            self._set_pointers(plan, scale_a, scale_b, bias)
            why = self._choose_algorithm(handle, plan, a, b, out_dtype, M, N, K)
        except BaseException:
            self._destroy(plan)
            raise
        if why is not None:
            # Nothing was enqueued: decline, so the call goes on to the next provider; the verdict is
            # kept (an LRU entry like a plan) so later calls decline without asking again.
            self._destroy(plan)
            self._plans[key] = why
            self._trim()
            raise Declined(why)
        self._plans[key] = plan
        self._trim()
        return plan

    def _choose_algorithm(self, handle, plan, a, b, out_dtype, M, N, K) -> str | None:
        """Ask the heuristic for one algorithm into plan.heuristic; None, or why it gave none usable."""
        lib = self.library
        problem = (f"{qd.dtype_name(a.dtype)} x {qd.dtype_name(b.dtype)} -> {qd.dtype_name(out_dtype)}, "
                   f"M={M} N={N} K={K}" + (", vector scales" if plan.vector else ""))
        preference = ctypes.c_void_p()
        lib.check("hipblasLtMatmulPreferenceCreate", lib.lib.hipblasLtMatmulPreferenceCreate(ctypes.byref(preference)))
        try:
            max_ws = ctypes.c_uint64(WORKSPACE_BYTES)
            lib.check("hipblasLtMatmulPreferenceSetAttribute",
                      lib.lib.hipblasLtMatmulPreferenceSetAttribute(preference, hl.PREF_MAX_WORKSPACE_BYTES,
                                                                    ctypes.byref(max_ws), ctypes.sizeof(max_ws)))
            found = ctypes.c_int(0)
            status = lib.lib.hipblasLtMatmulAlgoGetHeuristic(
                handle, plan.desc, plan.layout_a, plan.layout_b, plan.layout_d, plan.layout_d, preference, 1,
                ctypes.byref(plan.heuristic), ctypes.byref(found))
        finally:
            lib.check("hipblasLtMatmulPreferenceDestroy", lib.lib.hipblasLtMatmulPreferenceDestroy(preference))
        result = plan.heuristic
        if status != 0:
            return f"hipblasLtMatmulAlgoGetHeuristic returned {hl.status_name(status)} for {problem}"
        if found.value < 1:
            return f"hipblasLtMatmulAlgoGetHeuristic found no algorithm for {problem}"
        if result.state != 0:
            return f"the algorithm hipBLASLt returned for {problem} has state {hl.status_name(result.state)}"
        if result.workspaceSize > WORKSPACE_BYTES:
            return (f"the algorithm hipBLASLt chose for {problem} needs {result.workspaceSize} bytes of "
                    f"workspace, more than the {WORKSPACE_BYTES} allocated")
        return None

    def _trim(self) -> None:
        while len(self._plans) > PLANS_MAX:
            dropped = self._plans.popitem(last=False)[1]
            if isinstance(dropped, _Plan):
                self._destroy(dropped)

    def _destroy(self, plan: _Plan) -> None:
        """Free a plan's descriptors. Called under self._lock, so no call is between setting its
        pointers and enqueueing it; hipBLASLt reads descriptors when a matmul is enqueued, so calls
        already on a stream (or in a captured graph) are not affected."""
        lib = self.library.lib
        if plan.desc is not None and plan.desc.value:
            lib.hipblasLtMatmulDescDestroy(plan.desc)
        for layout in (plan.layout_a, plan.layout_b, plan.layout_d):
            if layout is not None and layout.value:
                lib.hipblasLtMatrixLayoutDestroy(layout)

    def _set_pointers(self, plan: _Plan, scale_a, scale_b, bias) -> None:
        # Device pointers to the fp32 scales. hipBLASLt's A is our b and its B our a (see _plan),
        # so A's scale is scale_b and B's is scale_a.
        release = self.library.release
        if plan.vector and release.scale_vec_ext:
            attr_a, attr_b = release.scale_vec_ext
        else:
            attr_a, attr_b = hl.DESC_A_SCALE_POINTER, hl.DESC_B_SCALE_POINTER
        self._set(plan.desc, attr_a, ctypes.c_void_p(scale_b.data_ptr()))
        self._set(plan.desc, attr_b, ctypes.c_void_p(scale_a.data_ptr()))
        if bias is not None:
            self._set(plan.desc, hl.DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        device = a.device
        if device.type != "cuda" and not self._host_pointers:
            raise ValueError(f"qbackend hipblaslt: a: must be on a ROCm GPU (torch device 'cuda'), not {device}")
        M, N = a.shape[0], b.shape[1]
        out = torch.empty((M, N), dtype=out_dtype, device=device)
        if M == 0:
            return out
        vector = problem.scale_a is G.TOKEN or problem.scale_b is G.CHANNEL
        if vector:
            # hipBLASLt takes both sides as vectors or both as scalars.
            scale_a, scale_b = _vector(scale_a, M), _vector(scale_b, N)
        else:
            scale_a = scale_a.reshape(()).to(torch.float32)
            scale_b = scale_b.reshape(()).to(torch.float32)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        # One lock around plan lookup, pointer setting and the launch: the descriptor is shared by
        # every call of this problem, so another thread must not re-point it in between.
        with self._lock, _on_device(device):
            handle = self._handle(device)
            plan = self._plan(handle, a, b, scale_a, scale_b, out_dtype, bias, vector)
            workspace = self._workspaces[device]
            lib = self.library
            lib.check("hipblasLtMatmul", lib.lib.hipblasLtMatmul(
                handle, plan.desc, ctypes.byref(alpha), b.data_ptr(), plan.layout_a, a.data_ptr(), plan.layout_b,
                ctypes.byref(beta), out.data_ptr(), plan.layout_d, out.data_ptr(), plan.layout_d,
                ctypes.byref(plan.heuristic.algo), workspace.data_ptr(), WORKSPACE_BYTES, _current_stream(device)))
        return out


@qbackend.hookimpl
def qbackend_providers():
    return [HipBlasLtProvider()]


@qbackend.hookimpl
def qbackend_native_libraries():
    """libhipblaslt with its ROCm and hipBLASLt versions, where the default device is an AMD GPU
    (real or simulated) or torch is a ROCm build."""
    from qbackend import probe

    device = probe.device_info()
    if device.backend != "hip" and not torch.version.hip:
        return []
    entry = hl.load().describe()
    if device.simulated:
        version, release, rocm = simulated_release(device)
        if release is None:
            entry["details"].append(f"simulated ROCm {hl.dotted(rocm or ())}: no hipBLASLt release qbackend knows")
        else:
            entry["details"].append(f"simulated: ROCm {hl.dotted(rocm)}, hipBLASLt {hl.dotted(version)}, enum values "
                                    f"of {release.label}; per-row / per-column scales: {hl.rowwise_form(release)}")
    return [entry]
