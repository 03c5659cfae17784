"""The hipblaslt provider's hipBLASLt call path, run on the CPU against a recording fake of
hip-python's bindings. The fake records every call and, in hipblasLtMatmul, computes the GEMM with
torch from the tensors behind the pointers, honouring the layouts, transposes, scale pointers and
bias epilogue it was given. So these tests check the call sequence and the column-major mapping;
they say nothing about real hipBLASLt kernels (no AMD GPU is reachable).
"""
from __future__ import annotations

import ctypes
import enum
import sys
import types

import pytest
import torch

import qbackend
from helpers import rand_q, rand_scale
from qbackend.probe import DeviceInfo
from qbackend.validate import validate_scaled_mm
from qbackend_providers import hipblaslt as hl
from qbackend_providers.reference import reference_scaled_mm

FNUZ_E4M3, FNUZ_E5M2 = torch.float8_e4m3fnuz, torch.float8_e5m2fnuz


class Status(enum.IntEnum):
    HIPBLAS_STATUS_SUCCESS = 0
    HIPBLAS_STATUS_NOT_INITIALIZED = 1
    HIPBLAS_STATUS_INVALID_VALUE = 3
    HIPBLAS_STATUS_EXECUTION_FAILED = 5
    HIPBLAS_STATUS_NOT_SUPPORTED = 7


class DataType(enum.IntEnum):
    HIP_R_32F = 0
    HIP_R_16F = 2
    HIP_R_16BF = 14
    HIP_R_8F_E4M3_FNUZ = 1000
    HIP_R_8F_E5M2_FNUZ = 1001
    HIP_R_8F_E4M3 = 28
    HIP_R_8F_E5M2 = 29


class Op(enum.IntEnum):
    HIPBLAS_OP_N = 111
    HIPBLAS_OP_T = 112


class Compute(enum.IntEnum):
    HIPBLAS_COMPUTE_32F = 2


class DescAttr(enum.IntEnum):
    HIPBLASLT_MATMUL_DESC_TRANSA = 3
    HIPBLASLT_MATMUL_DESC_TRANSB = 4
    HIPBLASLT_MATMUL_DESC_EPILOGUE = 5
    HIPBLASLT_MATMUL_DESC_BIAS_POINTER = 6
    HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 7
    HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER = 8
    HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER = 9


class Epilogue(enum.IntEnum):
    HIPBLASLT_EPILOGUE_DEFAULT = 1
    HIPBLASLT_EPILOGUE_BIAS = 4


class PrefAttr(enum.IntEnum):
    HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1


TORCH_OF = {DataType.HIP_R_32F: torch.float32, DataType.HIP_R_16F: torch.float16,
            DataType.HIP_R_16BF: torch.bfloat16, DataType.HIP_R_8F_E4M3_FNUZ: FNUZ_E4M3,
            DataType.HIP_R_8F_E5M2_FNUZ: FNUZ_E5M2, DataType.HIP_R_8F_E4M3: torch.float8_e4m3fn,
            DataType.HIP_R_8F_E5M2: torch.float8_e5m2}
POINTER_ATTRS = {DescAttr.HIPBLASLT_MATMUL_DESC_BIAS_POINTER, DescAttr.HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                 DescAttr.HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER}


class HeuristicResults:
    def __init__(self):
        self.algo = None
        self.workspaceSize = 0


class FakeHipBlasLt:
    """Implements the part of hip-python's hipblaslt/hipblas/hip bindings the provider uses.
    Functions return (status, *outputs) like hip-python's; `fail[name] = status` makes one fail."""
    hipblasStatus_t = Status
    hipDataType = DataType
    hipblasOperation_t = Op
    hipblasComputeType_t = Compute
    hipblasLtMatmulDescAttributes_t = DescAttr
    hipblasLtEpilogue_t = Epilogue
    hipblasLtMatmulPreferenceAttributes_t = PrefAttr

    class hipblasLtMatmulHeuristicResult_t:  # noqa: N801 (the bindings' name)
        @staticmethod
        def allocate(n):
            assert n == 1
            return HeuristicResults()

    def __init__(self):
        self.calls = []            # (name, args) in call order
        self.tensors = {}          # data_ptr -> tensor: what the "device pointers" point to
        self.layouts = {}
        self.descs = {}
        self.fail = {}
        self.workspace_size = 4096
        self._next = 100

    def register(self, *tensors):
        for t in tensors:
            if t is not None:
                self.tensors[t.data_ptr()] = t

    def names(self):
        return [n for n, _ in self.calls]

    def _new(self):
        self._next += 1
        return self._next

    def _ret(self, name, *outputs):
        status = self.fail.get(name, Status.HIPBLAS_STATUS_SUCCESS)
        return (status, *outputs) if outputs else status

    # -- the bindings' functions --------------------------------------------------------------

    def hipblasLtCreate(self):
        self.calls.append(("hipblasLtCreate", ()))
        return self._ret("hipblasLtCreate", "handle-%d" % self._new())

    def hipblasLtMatrixLayoutCreate(self, dtype, rows, cols, ld):
        self.calls.append(("hipblasLtMatrixLayoutCreate", (DataType(dtype), rows, cols, ld)))
        if ld < rows:  # column-major: the library refuses a leading dimension below the row count
            return Status.HIPBLAS_STATUS_INVALID_VALUE, None
        layout = self._new()
        self.layouts[layout] = (DataType(dtype), rows, cols, ld)
        return self._ret("hipblasLtMatrixLayoutCreate", layout)

    def hipblasLtMatmulDescCreate(self, compute, scale_type):
        self.calls.append(("hipblasLtMatmulDescCreate", (Compute(compute), DataType(scale_type))))
        desc = self._new()
        self.descs[desc] = {}
        return self._ret("hipblasLtMatmulDescCreate", desc)

    def hipblasLtMatmulDescSetAttribute(self, desc, attr, addr, size):
        attr = DescAttr(attr)
        if attr in POINTER_ATTRS:
            assert size == ctypes.sizeof(ctypes.c_void_p)
            value = ctypes.c_void_p.from_address(addr).value
        else:
            assert size == 4
            value = ctypes.c_int32.from_address(addr).value
        self.calls.append(("hipblasLtMatmulDescSetAttribute", (desc, attr, value)))
        self.descs[desc][attr] = value
        return self._ret("hipblasLtMatmulDescSetAttribute")

    def hipblasLtMatmulPreferenceCreate(self):
        self.calls.append(("hipblasLtMatmulPreferenceCreate", ()))
        return self._ret("hipblasLtMatmulPreferenceCreate", "pref")

    def hipblasLtMatmulPreferenceSetAttribute(self, pref, attr, addr, size):
        value = ctypes.c_uint64.from_address(addr).value
        self.calls.append(("hipblasLtMatmulPreferenceSetAttribute", (pref, PrefAttr(attr), value)))
        return self._ret("hipblasLtMatmulPreferenceSetAttribute")

    def hipblasLtMatmulPreferenceDestroy(self, pref):
        self.calls.append(("hipblasLtMatmulPreferenceDestroy", (pref,)))
        return self._ret("hipblasLtMatmulPreferenceDestroy")

    def hipblasLtMatmulAlgoGetHeuristic(self, handle, desc, la, lb, lc, ld, pref, requested, results):
        self.calls.append(("hipblasLtMatmulAlgoGetHeuristic", (handle, desc, la, lb, lc, ld, pref, requested)))
        results.algo = ("algo", desc)
        results.workspaceSize = self.workspace_size
        return self._ret("hipblasLtMatmulAlgoGetHeuristic", 1)

    def _view(self, ptr, layout):
        """The column-major rows x cols matrix with leading dimension ld starting at ptr."""
        dtype, rows, cols, ld = self.layouts[layout]
        t = self.tensors[ptr]
        assert t.dtype == TORCH_OF[dtype], (t.dtype, dtype)
        assert ld >= rows
        return torch.as_strided(t, (rows, cols), (1, ld), t.storage_offset())

    def hipblasLtMatmul(self, handle, desc, alpha, pa, la, pb, lb, beta, pc, lc, pd, ld,
                        algo, workspace, workspace_size, stream):
        self.calls.append(("hipblasLtMatmul", (handle, desc, pa, la, pb, lb, pc, lc, pd, ld, algo,
                                               workspace, workspace_size, stream)))
        if "hipblasLtMatmul" in self.fail:
            return self.fail["hipblasLtMatmul"]
        attrs = self.descs[desc]
        alpha = ctypes.c_float.from_address(alpha).value
        assert ctypes.c_float.from_address(beta).value == 0.0 and pc == pd and lc == ld
        assert workspace_size <= self.workspace_size
        a = self._view(pa, la).float()
        b = self._view(pb, lb).float()
        if attrs[DescAttr.HIPBLASLT_MATMUL_DESC_TRANSA] == Op.HIPBLAS_OP_T:
            a = a.t()
        if attrs[DescAttr.HIPBLASLT_MATMUL_DESC_TRANSB] == Op.HIPBLAS_OP_T:
            b = b.t()
        scale_a = self.tensors[attrs[DescAttr.HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER]]
        scale_b = self.tensors[attrs[DescAttr.HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER]]
        assert scale_a.dtype == scale_b.dtype == torch.float32 and scale_a.numel() == scale_b.numel() == 1
        d = (alpha * scale_a.reshape(()) * scale_b.reshape(())) * (a @ b)
        if attrs.get(DescAttr.HIPBLASLT_MATMUL_DESC_EPILOGUE, Epilogue.HIPBLASLT_EPILOGUE_DEFAULT) \
                == Epilogue.HIPBLASLT_EPILOGUE_BIAS:
            bias = self.tensors[attrs[DescAttr.HIPBLASLT_MATMUL_DESC_BIAS_POINTER]]
            assert bias.dtype == TORCH_OF[DataType(attrs[DescAttr.HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE])]
            assert bias.shape == (d.shape[0],)
            d = d + bias.float().reshape(-1, 1)        # the bias runs along D's rows
        dtype, rows, cols, ldd = self.layouts[ld]
        assert d.shape == (rows, cols)
        # D was allocated by the provider (not registered): write through its raw host address.
        item = torch.empty((), dtype=TORCH_OF[dtype]).element_size()
        nbytes = ((cols - 1) * ldd + rows) * item
        raw = torch.frombuffer((ctypes.c_char * nbytes).from_address(pd), dtype=torch.uint8)
        torch.as_strided(raw.view(TORCH_OF[dtype]), (rows, cols), (1, ldd)).copy_(d.to(TORCH_OF[dtype]))
        return Status.HIPBLAS_STATUS_SUCCESS


STREAM = 0x5EED


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(hl, "_current_stream", lambda device: STREAM)
    return FakeHipBlasLt()


def _operands(gen, M, N, K, a_dtype=FNUZ_E4M3, b_dtype=FNUZ_E4M3, out_dtype=torch.bfloat16,
              bias=False, a_pad=0, b_pad=0):
    """a [M, K] row-major, sliced out of a wider buffer when a_pad; b = w.t() of a [N, K] weight
    (column stride K + b_pad); 0-d fp32 scales; bias [N] in out_dtype."""
    a = rand_q((M, K + a_pad), a_dtype, gen)[:, a_pad:] if a_pad else rand_q((M, K), a_dtype, gen)
    w = rand_q((N, K + b_pad), b_dtype, gen)[:, :K]
    b = w.t()
    scale_a, scale_b = rand_scale((), gen), rand_scale((), gen)
    bias_t = (torch.randn(N, generator=gen) * 4).to(out_dtype) if bias else None
    return a, b, scale_a, scale_b, out_dtype, bias_t


def _run(provider, fake, a, b, scale_a, scale_b, out_dtype, bias):
    problem = validate_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias)
    fake.register(a, b, scale_a, scale_b, bias)
    out = provider.scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, problem)
    expected = reference_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, problem)
    return out, expected


@pytest.mark.parametrize("M", [1, 7, 64])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_reference(fake, gen, M, out_dtype, bias):
    provider = hl.HipBlasLtProvider(bindings=fake)
    for N, K, a_pad, b_pad in ((48, 32, 0, 0), (32, 80, 16, 0), (16, 64, 32, 16)):
        ops = _operands(gen, M, N, K, out_dtype=out_dtype, bias=bias, a_pad=a_pad, b_pad=b_pad)
        out, expected = _run(provider, fake, *ops)
        assert out.shape == (M, N) and out.dtype == out_dtype and out.is_contiguous()
        torch.testing.assert_close(out, expected)


def test_one_row_with_a_small_row_stride(fake, gen):
    """A [1, K] view may report any row stride (here 1, below K); the layout must still say ld >= K."""
    M, N, K = 1, 32, 64
    a, b, scale_a, scale_b, out_dtype, bias = _operands(gen, M, N, K)
    a = torch.as_strided(a.contiguous(), (1, K), (1, 1))
    assert a.stride(0) < K
    provider = hl.HipBlasLtProvider(bindings=fake)
    out, expected = _run(provider, fake, a, b, scale_a, scale_b, out_dtype, bias)
    torch.testing.assert_close(out, expected)
    layouts = [args for name, args in fake.calls if name == "hipblasLtMatrixLayoutCreate"]
    assert layouts[1][1:] == (K, M, K)


@pytest.mark.parametrize("a_dtype,b_dtype", [(FNUZ_E4M3, FNUZ_E5M2), (FNUZ_E5M2, FNUZ_E4M3),
                                             (torch.float8_e4m3fn, torch.float8_e4m3fn)])
def test_mixed_and_ocp_formats(fake, gen, a_dtype, b_dtype):
    provider = hl.HipBlasLtProvider(bindings=fake)
    ops = _operands(gen, 7, 32, 48, a_dtype=a_dtype, b_dtype=b_dtype, bias=True)
    out, expected = _run(provider, fake, *ops)
    torch.testing.assert_close(out, expected)
    layouts = [args for name, args in fake.calls if name == "hipblasLtMatrixLayoutCreate"]
    names = {v: k for k, v in hl._HIP_DTYPE.items()}
    assert [names[t.name] for t, *_ in layouts[:2]] == [b_dtype, a_dtype]


def test_call_sequence(fake, gen):
    provider = hl.HipBlasLtProvider(bindings=fake)
    M, N, K = 7, 48, 64
    a, b, scale_a, scale_b, out_dtype, bias = _operands(gen, M, N, K, bias=True, a_pad=16, b_pad=16)
    assert a.stride(0) == K + 16 and b.stride(1) == K + 16
    out, expected = _run(provider, fake, a, b, scale_a, scale_b, out_dtype, bias)
    torch.testing.assert_close(out, expected)

    assert fake.names() == [
        "hipblasLtCreate",
        "hipblasLtMatrixLayoutCreate", "hipblasLtMatrixLayoutCreate", "hipblasLtMatrixLayoutCreate",
        "hipblasLtMatmulDescCreate",
        *["hipblasLtMatmulDescSetAttribute"] * 7,
        "hipblasLtMatmulPreferenceCreate", "hipblasLtMatmulPreferenceSetAttribute",
        "hipblasLtMatmulAlgoGetHeuristic", "hipblasLtMatmulPreferenceDestroy",
        "hipblasLtMatmul",
    ]
    layouts = [args for name, args in fake.calls if name == "hipblasLtMatrixLayoutCreate"]
    # hipBLASLt's A is b (K x N column-major, ld = b's column stride), its B is a (a^T: K x M with
    # ld = a's row stride), D is out^T (N x M, ld = N).
    assert layouts == [(DataType.HIP_R_8F_E4M3_FNUZ, K, N, K + 16),
                       (DataType.HIP_R_8F_E4M3_FNUZ, K, M, K + 16),
                       (DataType.HIP_R_16BF, N, M, N)]
    assert fake.calls[4] == ("hipblasLtMatmulDescCreate", (Compute.HIPBLAS_COMPUTE_32F, DataType.HIP_R_32F))
    attrs = {args[1]: args[2] for name, args in fake.calls if name == "hipblasLtMatmulDescSetAttribute"}
    assert attrs == {
        DescAttr.HIPBLASLT_MATMUL_DESC_TRANSA: Op.HIPBLAS_OP_T,
        DescAttr.HIPBLASLT_MATMUL_DESC_TRANSB: Op.HIPBLAS_OP_N,
        DescAttr.HIPBLASLT_MATMUL_DESC_EPILOGUE: Epilogue.HIPBLASLT_EPILOGUE_BIAS,
        DescAttr.HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: DataType.HIP_R_16BF,
        DescAttr.HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER: scale_b.data_ptr(),   # A is b
        DescAttr.HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER: scale_a.data_ptr(),   # B is a
        DescAttr.HIPBLASLT_MATMUL_DESC_BIAS_POINTER: bias.data_ptr(),
    }
    pref = [args for name, args in fake.calls if name == "hipblasLtMatmulPreferenceSetAttribute"][0]
    assert pref[1:] == (PrefAttr.HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, hl.WORKSPACE_BYTES)
    _, mm = fake.calls[-1]
    handle, desc, pa, la, pb, lb, pc, lc, pd, ld, algo, workspace, ws_size, stream = mm
    assert handle.startswith("handle-") and desc in fake.descs
    assert (pa, pb, pc) == (b.data_ptr(), a.data_ptr(), pd) and pd == out.data_ptr()
    assert [la, lb, ld] == list(fake.layouts) and lc == ld
    assert algo == ("algo", desc) and ws_size == fake.workspace_size and stream == STREAM
    assert workspace == provider._workspaces[a.device].data_ptr()

    # A second call of the same shape reuses handle, layouts, descriptor and algorithm: it only
    # re-points the scales and bias, then launches.
    fake.calls.clear()
    a2, b2, sa2, sb2, _, bias2 = _operands(gen, M, N, K, bias=True, a_pad=16, b_pad=16)
    out2, expected2 = _run(provider, fake, a2, b2, sa2, sb2, out_dtype, bias2)
    torch.testing.assert_close(out2, expected2)
    assert fake.names() == ["hipblasLtMatmulDescSetAttribute"] * 3 + ["hipblasLtMatmul"]
    assert [args[1:] for _, args in fake.calls[:3]] == [
        (DescAttr.HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER, sb2.data_ptr()),
        (DescAttr.HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER, sa2.data_ptr()),
        (DescAttr.HIPBLASLT_MATMUL_DESC_BIAS_POINTER, bias2.data_ptr())]

    # Another M is another plan, on the same handle.
    fake.calls.clear()
    _run(provider, fake, *_operands(gen, 64, N, K))
    assert "hipblasLtCreate" not in fake.names() and fake.names().count("hipblasLtMatrixLayoutCreate") == 3


def test_no_bias_sets_no_epilogue(fake, gen):
    provider = hl.HipBlasLtProvider(bindings=fake)
    _run(provider, fake, *_operands(gen, 1, 16, 16))
    attrs = {args[1] for name, args in fake.calls if name == "hipblasLtMatmulDescSetAttribute"}
    assert attrs == {DescAttr.HIPBLASLT_MATMUL_DESC_TRANSA, DescAttr.HIPBLASLT_MATMUL_DESC_TRANSB,
                     DescAttr.HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER, DescAttr.HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER}


@pytest.mark.parametrize("call,status", [
    ("hipblasLtMatmul", Status.HIPBLAS_STATUS_EXECUTION_FAILED),
    ("hipblasLtCreate", Status.HIPBLAS_STATUS_NOT_INITIALIZED),
    ("hipblasLtMatrixLayoutCreate", Status.HIPBLAS_STATUS_INVALID_VALUE),
    ("hipblasLtMatmulDescSetAttribute", Status.HIPBLAS_STATUS_INVALID_VALUE),
    ("hipblasLtMatmulAlgoGetHeuristic", Status.HIPBLAS_STATUS_NOT_SUPPORTED),
])
def test_failing_status_raises(fake, gen, call, status):
    provider = hl.HipBlasLtProvider(bindings=fake)
    fake.fail[call] = status
    with pytest.raises(RuntimeError, match=f"{call}.*failed with status {status.name} \\({int(status)}\\)"):
        _run(provider, fake, *_operands(gen, 7, 16, 32))


def test_no_algorithm_declines_once_per_shape(fake, gen, monkeypatch):
    """No algorithm from the heuristic: the provider declines (nothing enqueued, its descriptors
    freed), and a later call of the same shape declines without asking the heuristic again."""
    provider = hl.HipBlasLtProvider(bindings=fake)
    monkeypatch.setattr(fake, "hipblasLtMatmulAlgoGetHeuristic", lambda *args: (Status.HIPBLAS_STATUS_SUCCESS, 0))
    destroyed = []
    monkeypatch.setattr(fake, "hipblasLtMatmulDescDestroy", lambda desc: destroyed.append(desc), raising=False)
    monkeypatch.setattr(fake, "hipblasLtMatrixLayoutDestroy", lambda lay: destroyed.append(lay), raising=False)
    ops = _operands(gen, 7, 16, 32)
    for _ in range(2):
        with pytest.raises(qbackend.Declined, match="found no algorithm"):
            _run(provider, fake, *ops)
    assert fake.names().count("hipblasLtMatmulDescCreate") == 1 and len(destroyed) == 4
    assert "hipblasLtMatmul" not in fake.names()


def test_a_declined_call_is_served_by_the_next_provider(fake, gen, monkeypatch):
    """Through the public API on a (pretended) MI300: hipblaslt declines, the call is served by the
    next provider that accepts the problem, with one warning naming the reason."""
    import warnings

    from qbackend import probe, registry

    monkeypatch.setattr(fake, "hipblasLtMatmulAlgoGetHeuristic", lambda *args: (Status.HIPBLAS_STATUS_SUCCESS, 0))
    provider = hl.HipBlasLtProvider(bindings=fake)
    monkeypatch.setenv("QBACKEND_DISABLE", "torch")  # the reference is then the next: it runs on the CPU
    reg = registry.reload()
    monkeypatch.setitem(reg.providers, "hipblaslt", provider)
    monkeypatch.setattr(probe, "device_info", lambda device=None: _mi300())
    a, b, scale_a, scale_b, out_dtype, bias = _operands(gen, 7, 16, 32)
    fake.register(a, b, scale_a, scale_b, bias)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = qbackend.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
        out2 = qbackend.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    problem = validate_scaled_mm(a, b, scale_a, scale_b, out_dtype, None)
    torch.testing.assert_close(out, reference_scaled_mm(a, b, scale_a, scale_b, out_dtype, None, problem))
    torch.testing.assert_close(out2, out)
    declined = [str(w.message) for w in caught if "declined" in str(w.message)]
    assert len(declined) == 1 and "hipblaslt declined: hipblasLtMatmulAlgoGetHeuristic found no algorithm" \
        in declined[0], declined
    monkeypatch.delenv("QBACKEND_DISABLE")
    registry.reload()


def _mi300(simulated=False):
    return DeviceInfo(backend="hip", index=0, name="AMD Instinct MI300X", arch="gfx942",
                      fp8_dtypes=(FNUZ_E4M3, FNUZ_E5M2), simulated=simulated)


def _problem(gen):
    a, b, scale_a, scale_b, out_dtype, bias = _operands(gen, 7, 16, 32)
    return validate_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias)


def test_runtime_verdict_without_bindings(gen, monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)        # `from hip import ...` raises ImportError
    provider = hl.HipBlasLtProvider()
    problem = _problem(gen)
    verdict = provider.supports(_mi300(), problem)
    assert not verdict.ok
    assert verdict.reason == "hip-python's hipblaslt bindings are not installed (pip install hip-python)"
    assert provider.runtime_verdict(_mi300(simulated=True), problem) is None
    assert provider.supports(_mi300(simulated=True), problem).ok


def test_runtime_verdict_with_bindings(gen, monkeypatch):
    fake = FakeHipBlasLt()
    hip_pkg = types.ModuleType("hip")
    hip_pkg.hipblaslt, hip_pkg.hip = fake, types.ModuleType("hip.hip")
    monkeypatch.setitem(sys.modules, "hip", hip_pkg)
    provider = hl.HipBlasLtProvider()
    assert provider.runtime_verdict(_mi300(), _problem(gen)) is None
    assert provider.bindings.hipblasLtCreate == fake.hipblasLtCreate
    # An injected module is used as given.
    assert hl.HipBlasLtProvider(bindings=fake).runtime_verdict(_mi300(), _problem(gen)) is None
