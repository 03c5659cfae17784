"""The hipblaslt provider: W8A8 FP8 GEMMs through hipBLASLt on AMD Instinct GPUs.

gfx942 (MI300) computes the fnuz formats (e4m3fnuz / e5m2fnuz); gfx950 (MI350) the OCP formats.
Checkpoints in e4m3fn are re-encoded for gfx942 at load time (qbackend.fp8.to_fnuz).

Status: the hipBLASLt call path exists (through hip-python's `hip.hipblaslt` bindings) but is
unverified on MI300 hardware: it is tested only against a recording fake of the bindings on the CPU,
which checks the call sequence, layouts, transposes, scale and bias pointers, and recomputes the
product. On a real AMD device the provider serves problems when hip-python's hipblaslt bindings
import, and declines with that reason otherwise. Under QBACKEND_SIMULATE=gfx942 / gfx950 the rules
answer as if everything were installed.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from collections import OrderedDict

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend.problem import Op, Verdict
from qbackend.provider import Declined, Provider, Rule, granularities

HIP = frozenset({"hip"})
_OUT = frozenset(qd.OUT_DTYPES)
_FNUZ = frozenset({(qd.E4M3_FNUZ, qd.E4M3_FNUZ), (qd.E4M3_FNUZ, qd.E5M2_FNUZ), (qd.E5M2_FNUZ, qd.E4M3_FNUZ)})
_OCP = frozenset({(qd.E4M3, qd.E4M3), (qd.E4M3, qd.E5M2), (qd.E5M2, qd.E4M3)})

MISSING_BINDINGS = "hip-python's hipblaslt bindings are not installed (pip install hip-python)"
WORKSPACE_BYTES = 32 * 1024 * 1024
PLANS_MAX = 1024  # cached hipBLASLt plans per provider (all devices), least recently used dropped first

# torch dtype -> name of the hipDataType enumerator.
_HIP_DTYPE = {
    qd.E4M3_FNUZ: "HIP_R_8F_E4M3_FNUZ", qd.E5M2_FNUZ: "HIP_R_8F_E5M2_FNUZ",
    qd.E4M3: "HIP_R_8F_E4M3", qd.E5M2: "HIP_R_8F_E5M2",
    torch.bfloat16: "HIP_R_16BF", torch.float16: "HIP_R_16F", torch.float32: "HIP_R_32F",
}


class _Bindings:
    """hip-python's modules seen as one namespace: functions and enums are looked up in
    hip.hipblaslt, then hip.hipblas, then hip.hip (hipDataType lives in hip.hip,
    hipblasOperation_t / hipblasComputeType_t / hipblasStatus_t in hip.hipblas)."""

    def __init__(self, *modules):
        self._modules = modules

    def __getattr__(self, name):
        for module in self._modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"hip-python bindings have no {name!r}")


def import_bindings():
    """Import hip-python's hipblaslt bindings; raises ImportError when they are not installed."""
    from hip import hipblaslt  # noqa: I001  (hipblaslt first: it is the one that may be missing)
    from hip import hip
    try:
        from hip import hipblas
    except ImportError:
        hipblas = None
    return _Bindings(*(m for m in (hipblaslt, hipblas, hip) if m is not None))


def _current_stream(device: torch.device) -> int:
    """The raw stream handle the GEMM is enqueued on (torch's current stream on that device)."""
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return 0


def _on_device(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _enum(bindings, type_name: str, member: str):
    """bindings.<type_name>.<member>, or a module-level <member> (fakes and some versions)."""
    enum_type = getattr(bindings, type_name, None)
    if enum_type is not None and hasattr(enum_type, member):
        return getattr(enum_type, member)
    return getattr(bindings, member)


def _check(name: str, result):
    """hip-python calls return (status, *outputs) or a bare status; raise on a non-success status
    and return the outputs (None, one value, or a tuple)."""
    if isinstance(result, tuple):
        status, outputs = result[0], result[1:]
    else:
        status, outputs = result, ()
    if int(status) != 0:       # HIPBLAS_STATUS_SUCCESS
        label = getattr(status, "name", None) or str(status)
        raise RuntimeError(f"qbackend hipblaslt: {name} failed with status {label} ({int(status)})")
    if not outputs:
        return None
    return outputs[0] if len(outputs) == 1 else outputs


class _Plan:
    """Everything reusable for one problem shape on one device: layouts, the matmul descriptor
    (data types, transposes, epilogue) and the algorithm chosen by the heuristic."""
    __slots__ = ("desc", "layout_a", "layout_b", "layout_d", "algo", "workspace_size", "heuristic")


class HipBlasLtProvider(Provider):
    def __init__(self, bindings=None):
        tensor = granularities("tensor")
        super().__init__(
            name="hipblaslt", priority=80,
            description="hipBLASLt W8A8 FP8 GEMMs on AMD Instinct (gfx942 fnuz, gfx950 OCP)",
            rules=(
                Rule(Op.SCALED_MM, HIP, _FNUZ, tensor, tensor, _OUT, archs=frozenset({"gfx942"}),
                     k_align=16, n_align=16, why_arch="fnuz fp8 matrix cores"),
                Rule(Op.SCALED_MM, HIP, _OCP, tensor, tensor, _OUT, archs=frozenset({"gfx950"}),
                     k_align=16, n_align=16, why_arch="OCP fp8 matrix cores"),
            ))
        self._bindings = bindings
        self._lock = threading.Lock()
        self._handles = {}          # device -> hipblasLtHandle_t
        self._workspaces = {}       # device -> uint8 tensor of WORKSPACE_BYTES
        # (device, dtypes, M, N, K, strides, bias) -> _Plan, or the reason the shape is declined; least
        # recently used first, at most PLANS_MAX (a server's changing batch sizes would otherwise
        # grow it without end)
        self._plans = OrderedDict()

    @property
    def bindings(self):
        if self._bindings is None:
            self._bindings = import_bindings()
        return self._bindings

    def runtime_verdict(self, device, problem):
        if device.simulated:
            return None
        if self._bindings is not None:
            return None
        try:
            self._bindings = import_bindings()
        except ImportError:
            return Verdict(False, MISSING_BINDINGS)
        return None

    # -- per-device state ---------------------------------------------------------------------

    def _handle(self, device):
        handle = self._handles.get(device)
        if handle is None:
            with _on_device(device):
                handle = _check("hipblasLtCreate", self.bindings.hipblasLtCreate())
            self._handles[device] = handle
            # Allocated through torch's caching allocator once, outside any graph capture of later
            # calls, and reused: replaying a captured graph finds the same workspace.
            self._workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return handle

    def _set(self, desc, attr: str, value):
        """hipblasLtMatmulDescSetAttribute with a ctypes value (the library copies it)."""
        hb = self.bindings
        _check(f"hipblasLtMatmulDescSetAttribute({attr})",
               hb.hipblasLtMatmulDescSetAttribute(desc, _enum(hb, "hipblasLtMatmulDescAttributes_t", attr),
                                                  ctypes.addressof(value), ctypes.sizeof(value)))

    def _layout(self, dtype, rows: int, cols: int, ld: int):
        hb = self.bindings
        return _check("hipblasLtMatrixLayoutCreate",
                      hb.hipblasLtMatrixLayoutCreate(_enum(hb, "hipDataType", _HIP_DTYPE[dtype]), rows, cols, ld))

    def _plan(self, handle, a, b, scale_a, scale_b, out_dtype, bias) -> _Plan:
        """The cached plan for this shape, with this call's scale and bias pointers set."""
        M, K = a.shape
        N = b.shape[1]
        # A single row's stride is arbitrary in torch (a [1, K] view may report 1); hipBLASLt
        # requires ld >= K for a's K x M layout, and with one row any such ld reads the same bytes.
        lda = a.stride(0) if M > 1 else K
        key = (a.device, a.dtype, b.dtype, out_dtype, bias is not None, M, N, K, lda, b.stride(1))
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            if isinstance(plan, str):
                raise Declined(plan)
            self._set_pointers(plan.desc, scale_a, scale_b, bias)
            return plan
        hb = self.bindings
        # hipBLASLt is column-major. qbackend's out = a @ b is row-major [M, N], which is the same
        # memory as a column-major [N, M] matrix with leading dimension N. So we ask hipBLASLt for
        #     D (N x M, col-major) = op(A) @ op(B)   with A := b, B := a:
        # * b is [K, N] column-major: b[k, n] sits at k + n * b.stride(1), i.e. a column-major K x N
        #   matrix with ld = b.stride(1). We need b^T (N x K): TRANSA = T on a K x N layout.
        # * a is [M, K] row-major with row stride lda (>= K for sliced rows): a[m, k] sits at
        #   m * lda + k, i.e. a column-major K x M matrix (a^T) with ld = lda, which is already the
        #   K x M operand needed: TRANSB = N on a K x M layout.
        # * D and C (unused, beta = 0) are N x M with ld = N (out is contiguous [M, N]).
        # This is the "TN" form, the one hipBLASLt's FP8 kernels are built for.
        plan = _Plan()
        plan.layout_a = self._layout(b.dtype, K, N, b.stride(1))
        plan.layout_b = self._layout(a.dtype, K, M, lda)
        plan.layout_d = self._layout(out_dtype, N, M, N)
        plan.desc = _check("hipblasLtMatmulDescCreate",
                           hb.hipblasLtMatmulDescCreate(_enum(hb, "hipblasComputeType_t", "HIPBLAS_COMPUTE_32F"),
                                                        _enum(hb, "hipDataType", "HIP_R_32F")))
        op_t = ctypes.c_int32(int(_enum(hb, "hipblasOperation_t", "HIPBLAS_OP_T")))
        op_n = ctypes.c_int32(int(_enum(hb, "hipblasOperation_t", "HIPBLAS_OP_N")))
        self._set(plan.desc, "HIPBLASLT_MATMUL_DESC_TRANSA", op_t)
        self._set(plan.desc, "HIPBLASLT_MATMUL_DESC_TRANSB", op_n)
        if bias is not None:
            # The bias epilogue adds a vector of length rows(D) = N to every column: our bias[N]
            # added to every row of out.
            epilogue = ctypes.c_int32(int(_enum(hb, "hipblasLtEpilogue_t", "HIPBLASLT_EPILOGUE_BIAS")))
            self._set(plan.desc, "HIPBLASLT_MATMUL_DESC_EPILOGUE", epilogue)
            bias_type = ctypes.c_int32(int(_enum(hb, "hipDataType", _HIP_DTYPE[bias.dtype])))
            self._set(plan.desc, "HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE", bias_type)
        # The heuristic picks kernels by whether scale and bias pointers are set, so set them first
        # (to this call's tensors; later calls of the same shape set their own).
        self._set_pointers(plan.desc, scale_a, scale_b, bias)
        preference = _check("hipblasLtMatmulPreferenceCreate", hb.hipblasLtMatmulPreferenceCreate())
        try:
            max_ws = ctypes.c_uint64(WORKSPACE_BYTES)
            _check("hipblasLtMatmulPreferenceSetAttribute",
                   hb.hipblasLtMatmulPreferenceSetAttribute(
                       preference, _enum(hb, "hipblasLtMatmulPreferenceAttributes_t",
                                         "HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"),
                       ctypes.addressof(max_ws), ctypes.sizeof(max_ws)))
            results = hb.hipblasLtMatmulHeuristicResult_t.allocate(1)
            found = _check("hipblasLtMatmulAlgoGetHeuristic",
                           hb.hipblasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.layout_a, plan.layout_b,
                                                              plan.layout_d, plan.layout_d, preference, 1, results))
        finally:
            _check("hipblasLtMatmulPreferenceDestroy", hb.hipblasLtMatmulPreferenceDestroy(preference))
        why = None
        if not found:
            why = (f"hipblasLtMatmulAlgoGetHeuristic found no algorithm for {qd.dtype_name(a.dtype)} x "
                   f"{qd.dtype_name(b.dtype)} -> {qd.dtype_name(out_dtype)}, M={M} N={N} K={K}")
        elif int(results.workspaceSize) > WORKSPACE_BYTES:
            why = (f"the algorithm hipBLASLt chose needs {int(results.workspaceSize)} bytes of workspace, "
                   f"more than the {WORKSPACE_BYTES} allocated")
        if why is not None:
            # Nothing was enqueued: decline, so the call goes on to the next provider; the shape's
            # verdict is kept (an LRU entry like a plan) so later calls decline without asking again.
            self._destroy(plan)
            self._plans[key] = why
            self._trim()
            raise Declined(why)
        plan.heuristic = results        # keeps the algo's storage alive
        plan.algo = results.algo
        plan.workspace_size = int(results.workspaceSize)
        self._plans[key] = plan
        self._trim()
        return plan

    def _trim(self) -> None:
        while len(self._plans) > PLANS_MAX:
            dropped = self._plans.popitem(last=False)[1]
            if isinstance(dropped, _Plan):
                self._destroy(dropped)

    def _destroy(self, plan: _Plan) -> None:
        """Free a dropped plan's descriptors. Called under self._lock, so no call is between
        setting its pointers and enqueueing it; hipBLASLt reads descriptors when a matmul is
        enqueued, so calls already on a stream are not affected."""
        hb = self.bindings
        destroy_desc = getattr(hb, "hipblasLtMatmulDescDestroy", None)
        destroy_layout = getattr(hb, "hipblasLtMatrixLayoutDestroy", None)
        if destroy_desc is not None:
            destroy_desc(plan.desc)
        if destroy_layout is not None:
            for layout in (plan.layout_a, plan.layout_b, plan.layout_d):
                destroy_layout(layout)

    def _set_pointers(self, desc, scale_a, scale_b, bias):
        # Device pointers to the fp32 per-tensor scales. hipBLASLt's A is our b and its B our a
        # (see _plan), so A's scale is scale_b and B's is scale_a.
        self._set(desc, "HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER", ctypes.c_void_p(scale_b.data_ptr()))
        self._set(desc, "HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER", ctypes.c_void_p(scale_a.data_ptr()))
        if bias is not None:
            self._set(desc, "HIPBLASLT_MATMUL_DESC_BIAS_POINTER", ctypes.c_void_p(bias.data_ptr()))

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        M, N = a.shape[0], b.shape[1]
        device = a.device
        out = torch.empty((M, N), dtype=out_dtype, device=device)
        if M == 0:
            return out
        hb = self.bindings
        # Per-tensor scales as fp32 device scalars (a no-op for the scales the core passes).
        scale_a = scale_a.reshape(()).to(torch.float32)
        scale_b = scale_b.reshape(()).to(torch.float32)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        # One lock around plan lookup, pointer setting and the launch: the descriptor is shared by
        # every call of this shape, so another thread must not re-point it in between.
        with self._lock, _on_device(device):
            handle = self._handle(device)
            plan = self._plan(handle, a, b, scale_a, scale_b, out_dtype, bias)
            workspace = self._workspaces[device]
            _check("hipblasLtMatmul",
                   hb.hipblasLtMatmul(handle, plan.desc, ctypes.addressof(alpha),
                                      b.data_ptr(), plan.layout_a, a.data_ptr(), plan.layout_b,
                                      ctypes.addressof(beta), out.data_ptr(), plan.layout_d,
                                      out.data_ptr(), plan.layout_d, plan.algo,
                                      workspace.data_ptr(), plan.workspace_size, _current_stream(device)))
        return out


@qbackend.hookimpl
def qbackend_providers():
    return [HipBlasLtProvider()]
