"""The hipblaslt provider through its real ctypes prototypes, against the stand-in hipBLASLt
(tests/hipblaslt_standin). The stand-in checks every argument the way hipBLASLt documents (enum ids
of the version it pretends to be, attribute sizes, ld >= rows, scale pointers and modes, the
workspace an algorithm needs, algorithms used only for the problem they were found for), records
the calls and computes the GEMM on the CPU. So these tests check the call sequence, the enum values
of each hipBLASLt release, the column-major mapping and the numbers against the reference provider;
they say nothing about real hipBLASLt kernels (no AMD GPU is reachable here).
"""
from __future__ import annotations

import ctypes
import warnings

import pytest
import torch

import qbackend
from helpers import assert_close, rand_q, rand_scale
from hipblaslt_standin import HEUR_BAD_STATE, HEUR_IGNORE_LIMIT, HEUR_NONE, StandIn, build, install
from qbackend.probe import DeviceInfo
from qbackend.provider import Declined
from qbackend.validate import validate_scaled_mm
from qbackend_providers import hipblaslt as hb
from qbackend_providers import hipblaslt_lib as hl
from qbackend_providers.reference import reference_scaled_mm

FZ4, FZ5 = torch.float8_e4m3fnuz, torch.float8_e5m2fnuz
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
# Of max |reference|: one rounding of the output apart (the sums may round differently in fp32).
TOL = {BF16: 1e-2, FP16: 2e-3, FP32: 1e-5}

# (hipBLASLt version, arch the stand-in pretends, ROCm release)
ROCM_6_2 = ((0, 8, 0), "gfx942", "6.2.4")
ROCM_6_3 = ((0, 10, 0), "gfx942", "6.3.1")
ROCM_7_0 = ((1, 0, 0), "gfx942", "7.0.2")
ROCM_7_2 = ((1, 2, 2), "gfx942", "7.2.1")
ROCM_7_2_MI350 = ((1, 2, 2), "gfx950", "7.2.1")
SCALES = [("tensor", "tensor"), ("token", "channel"), ("token", "tensor"), ("tensor", "channel")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("standin"))


@pytest.fixture
def rocm(built, tmp_path):
    """rocm(release) -> (HipBlasLt, StandIn): a fresh copy of the stand-in installed as that ROCm
    release's libhipblaslt.so.MAJOR.MINOR.ROCM, pretending that hipBLASLt on that arch."""
    made = []

    def make(release=ROCM_6_3):
        version, arch, rocm_version = release
        major, minor, patch = (int(x) for x in rocm_version.split("."))
        file_version = f"{version[0]}.{version[1]}.{major * 10000 + minor * 100 + patch}"
        path = install(built, tmp_path / f"rocm{len(made)}", rocm=rocm_version, file_version=file_version)
        lib = hl.HipBlasLt.open(str(path), "test")
        assert lib.reason is None, lib.reason
        made.append(lib)
        return lib, StandIn(lib.lib).pretend(version, arch)
    return make


def fp8_of(release):
    return FZ4 if release[1] == "gfx942" else E4


def operands(gen, M, N, K, a_dtype, b_dtype, out_dtype=BF16, bias=False, a_pad=0, b_pad=0,
             scale_a="tensor", scale_b="tensor"):
    """a [M, K] row-major, a column window of a wider buffer when a_pad; b = w.t() of a [N, K]
    weight with column stride K + b_pad; fp32 scales of the given granularities; bias [N]."""
    a = rand_q((M, K + a_pad), a_dtype, gen)[:, a_pad:]
    b = rand_q((N, K + b_pad), b_dtype, gen)[:, :K].t()
    sa = rand_scale((M, 1) if scale_a == "token" else (), gen)
    sb = rand_scale((1, N) if scale_b == "channel" else (), gen)
    bias_t = (torch.randn(N, generator=gen) * 4).to(out_dtype) if bias else None
    return a, b, sa, sb, out_dtype, bias_t


def run(provider, a, b, scale_a, scale_b, out_dtype, bias):
    problem = validate_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias)
    out = provider.scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, problem)
    return out, reference_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, problem)


def attrs_set(standin):
    """{attribute id: value} of every hipblasLtMatmulDescSetAttribute call, in call order."""
    return {int(r["attr"]): r["value"] for r in standin.calls("hipblasLtMatmulDescSetAttribute")}


def ptr(t: torch.Tensor) -> str:
    return hex(t.data_ptr())


# --- numbers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("release", [ROCM_6_3, ROCM_7_0, ROCM_7_2_MI350], ids=["rocm6.3", "rocm7.0", "rocm7.2-gfx950"])
@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scales", SCALES, ids=lambda s: "x".join(s))
def test_matches_reference(rocm, gen, release, out_dtype, bias, scales):
    lib, standin = rocm(release)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    fp8 = fp8_of(release)
    for M, N, K, a_pad, b_pad in ((1, 16, 32, 0, 0), (7, 48, 80, 16, 0), (33, 32, 64, 32, 16)):
        ops = operands(gen, M, N, K, fp8, fp8, out_dtype, bias, a_pad, b_pad, *scales)
        out, expected = run(provider, *ops)
        assert out.shape == (M, N) and out.dtype == out_dtype and out.is_contiguous()
        assert_close(out, expected, TOL[out_dtype], f"M={M} N={N} K={K}")
    assert not standin.failures()
    assert len(standin.calls("hipblasLtMatmul")) == 3


@pytest.mark.parametrize("release", [ROCM_6_3, ROCM_7_0, ROCM_7_2_MI350], ids=["rocm6.3", "rocm7.0", "rocm7.2-gfx950"])
@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32])
def test_bit_exact_where_every_sum_is_exact(rocm, gen, release, out_dtype):
    """Small integers and power-of-two scales: every product and sum is exact, so the stand-in's
    output and the reference's are the same rounding of the same number, bit for bit."""
    lib, _ = rocm(release)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    fp8 = fp8_of(release)
    M, N, K = 9, 32, 64
    a = torch.randint(-4, 5, (M, K), generator=gen).float().to(fp8)
    b = torch.randint(-4, 5, (N, K), generator=gen).float().to(fp8).t()
    sa = 2.0 ** torch.randint(-3, 3, (M, 1), generator=gen).float()
    sb = 2.0 ** torch.randint(-3, 3, (1, N), generator=gen).float()
    bias = torch.randint(-8, 9, (N,), generator=gen).to(out_dtype)
    out, expected = run(provider, a, b, sa, sb, out_dtype, bias)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("release,fp8", [(ROCM_6_3, FZ4), (ROCM_6_3, FZ5), (ROCM_7_2_MI350, E4), (ROCM_7_2_MI350, E5)],
                         ids=["e4m3fnuz", "e5m2fnuz", "e4m3fn", "e5m2"])
@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32])
def test_every_fp8_code_and_every_output_rounding(rocm, gen, release, fp8, out_dtype):
    """Row i of a holds fp8 code i (all 256, NaN and infinities included) and zeros; b picks it; the
    per-row scales span 2^-40 to 2^21, through fp16's subnormals and past its largest value. So the
    stand-in's fp8 decoding and its rounding to fp16 / bf16 are checked, bit for bit, against torch's
    (the reference provider's), NaNs where torch has NaNs."""
    lib, _ = rocm(release)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    a = torch.zeros(256, 16, dtype=torch.uint8)
    a[:, 0] = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    a = a.view(fp8)
    w = torch.zeros(16, 16)
    w[:, 0] = 1.0
    b = w.to(fp8).t()
    # 10-bit mantissas: the products have at most 14 significant bits, so many are exact ties when
    # rounded to fp16 (11 bits) or bf16 (8): round-half-to-even is checked too.
    mantissa = 1 + torch.randint(0, 512, (256, 1), generator=gen).float() / 512
    sa = mantissa * 2.0 ** torch.randint(-40, 21, (256, 1), generator=gen).float()
    out, expected = run(provider, a, b, sa, torch.ones(()), out_dtype, None)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    v = expected.float()
    assert torch.isnan(v).any()
    if out_dtype == FP16:                 # the draw did reach fp16's subnormals and its overflow
        assert ((v != 0) & (v.abs() < 2.0**-14)).any() and torch.isinf(v).any()


@pytest.mark.parametrize("release,a_dtype,b_dtype", [
    (ROCM_6_3, FZ4, FZ5), (ROCM_6_3, FZ5, FZ4), (ROCM_7_2_MI350, E4, E5), (ROCM_7_2_MI350, E5, E4)])
def test_mixed_formats(rocm, gen, release, a_dtype, b_dtype):
    lib, standin = rocm(release)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    out, expected = run(provider, *operands(gen, 7, 32, 48, a_dtype, b_dtype, bias=True, scale_a="token",
                                            scale_b="channel"))
    assert_close(out, expected, TOL[BF16])
    layouts = standin.calls("hipblasLtMatrixLayoutCreate")
    # hipBLASLt's A is b, its B is a.
    assert [int(r["type"]) for r in layouts[:2]] == [hb._HIP_DTYPE[b_dtype], hb._HIP_DTYPE[a_dtype]]


# --- the call sequence and each release's enum values ---------------------------------------

def test_call_sequence_rocm63_vector_scales(rocm, gen):
    """hipBLASLt 0.10-0.12: per-token x per-channel scales through A/B_SCALE_POINTER_VEC_EXT (102 /
    103), A (our b) taking the per-channel vector and B (our a) the per-token one."""
    lib, standin = rocm(ROCM_6_3)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    M, N, K = 7, 48, 64
    a, b, sa, sb, out_dtype, bias = operands(gen, M, N, K, FZ4, FZ4, bias=True, a_pad=16, b_pad=16,
                                             scale_a="token", scale_b="channel")
    out, expected = run(provider, a, b, sa, sb, out_dtype, bias)
    assert_close(out, expected, TOL[BF16])
    assert standin.names() == [
        "hipblasLtCreate", "hipblasLtGetVersion", "hipblasLtGetGitRevision",
        *["hipblasLtMatrixLayoutCreate"] * 3, "hipblasLtMatmulDescCreate",
        *["hipblasLtMatmulDescSetAttribute"] * 7,
        "hipblasLtMatmulPreferenceCreate", "hipblasLtMatmulPreferenceSetAttribute",
        "hipblasLtMatmulAlgoGetHeuristic", "hipblasLtMatmulPreferenceDestroy", "hipblasLtMatmul"]
    layouts = [(int(r["type"]), int(r["rows"]), int(r["cols"]), int(r["ld"]))
               for r in standin.calls("hipblasLtMatrixLayoutCreate")]
    # A is b (K x N column-major, ld = b's column stride), B is a (a^T: K x M, ld = a's row
    # stride), D is out^T (N x M, ld = N).
    assert layouts == [(1000, K, N, K + 16), (1000, K, M, K + 16), (14, N, M, N)]
    assert standin.calls("hipblasLtMatmulDescCreate")[0]["compute"] == "2"
    assert attrs_set(standin) == {0: "112", 1: "111", 2: "4", 4: "14", 102: ptr(sb), 103: ptr(sa), 3: ptr(bias)}
    heur = standin.calls("hipblasLtMatmulAlgoGetHeuristic")[0]
    assert heur["vector"] == "1" and (heur["m"], heur["n"], heur["k"]) == (str(N), str(M), str(K))
    pref = standin.calls("hipblasLtMatmulPreferenceSetAttribute")[0]
    assert (pref["attr"], pref["value"]) == ("1", str(hb.WORKSPACE_BYTES))
    mm = standin.calls("hipblasLtMatmul")[0]
    assert (mm["a"], mm["b"], mm["c"], mm["d"]) == (ptr(b), ptr(a), ptr(out), ptr(out))
    assert mm["workspace_size"] == str(hb.WORKSPACE_BYTES) and mm["vector"] == "1"


def test_call_sequence_rocm70_scale_mode(rocm, gen):
    """hipBLASLt 1.0: A/B_SCALE_MODE (31 / 32) = OUTER_VEC_32F (3), the vectors through the plain scale
    pointers (5 / 6); ids 102 / 103 do not exist in this version (the stand-in would refuse them)."""
    lib, standin = rocm(ROCM_7_0)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    a, b, sa, sb, out_dtype, _ = operands(gen, 5, 32, 32, FZ4, FZ4, scale_a="token", scale_b="channel")
    out, expected = run(provider, a, b, sa, sb, out_dtype, None)
    assert_close(out, expected, TOL[BF16])
    assert attrs_set(standin) == {0: "112", 1: "111", 31: "3", 32: "3", 5: ptr(sb), 6: ptr(sa)}
    assert not standin.failures()


def test_per_tensor_sets_scalar_pointers(rocm, gen):
    lib, standin = rocm(ROCM_7_2)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    a, b, sa, sb, out_dtype, _ = operands(gen, 3, 16, 32, FZ4, FZ4)
    run(provider, a, b, sa, sb, out_dtype, None)
    assert attrs_set(standin) == {0: "112", 1: "111", 5: ptr(sb), 6: ptr(sa)}


def test_one_side_per_tensor_is_sent_as_a_vector(rocm, gen):
    """hipBLASLt takes A and B scales both as scalars or both as vectors: a per-tensor side next to a
    per-channel one goes as a vector of that one value."""
    lib, standin = rocm(ROCM_6_3)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    a, b, sa, sb, out_dtype, _ = operands(gen, 4, 16, 32, FZ4, FZ4, scale_a="tensor", scale_b="channel")
    out, expected = run(provider, a, b, sa, sb, out_dtype, None)
    assert_close(out, expected, TOL[BF16])
    sent = attrs_set(standin)
    assert sent[102] == ptr(sb) and sent[103] != ptr(sa)   # a 4-value copy of the scalar


def test_rocm62_takes_per_tensor_only(rocm, gen):
    lib, standin = rocm(ROCM_6_2)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    out, expected = run(provider, *operands(gen, 3, 16, 32, FZ4, FZ4))
    assert_close(out, expected, TOL[BF16])
    with pytest.raises(Declined, match=r"per-token / per-channel scales need hipBLASLt 0\.10\+ .* hipBLASLt 0\.8"):
        run(provider, *operands(gen, 3, 16, 32, FZ4, FZ4, scale_a="token", scale_b="channel"))
    assert not any(int(r["attr"]) > 14 for r in standin.calls("hipblasLtMatmulDescSetAttribute"))


# --- defects that must stay fixed ------------------------------------------------------------

def test_one_row_with_a_row_stride_below_k(rocm, gen):
    """A [1, K] view may report any row stride (here 1, below K): hipBLASLt must still see ld >= K
    (the stand-in, like hipBLASLt, refuses a layout with ld < rows)."""
    lib, standin = rocm(ROCM_6_3)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    M, N, K = 1, 32, 64
    a, b, sa, sb, out_dtype, bias = operands(gen, M, N, K, FZ4, FZ4, scale_a="token", scale_b="channel")
    a = torch.as_strided(a.contiguous(), (1, K), (1, 1))
    assert a.stride(0) < K
    out, expected = run(provider, a, b, sa, sb, out_dtype, bias)
    assert_close(out, expected, TOL[BF16])
    assert [int(r["ld"]) for r in standin.calls("hipblasLtMatrixLayoutCreate")][1] == K
    assert not standin.failures()


@pytest.mark.parametrize("mode,workspace,reason", [
    (HEUR_NONE, 4096, "hipblasLtMatmulAlgoGetHeuristic found no algorithm for float8_e4m3fnuz x float8_e4m3fnuz "
                      "-> bfloat16, M=7 N=16 K=32"),
    (HEUR_BAD_STATE, 4096, "has state HIPBLAS_STATUS_NOT_SUPPORTED (7)"),
    (HEUR_IGNORE_LIMIT, 2 * hb.WORKSPACE_BYTES, f"needs {2 * hb.WORKSPACE_BYTES} bytes of workspace"),
], ids=["no-algorithm", "bad-state", "workspace"])
def test_an_unusable_heuristic_answer_declines(rocm, gen, mode, workspace, reason):
    """No algorithm, one whose state is not success, or one that needs more workspace than the
    provider holds: Declined (the call goes to the next provider), nothing enqueued, the
    descriptors freed, and the verdict kept so the next call does not ask hipBLASLt again."""
    lib, standin = rocm(ROCM_6_3)
    standin.heuristic(mode, workspace)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    ops = operands(gen, 7, 16, 32, FZ4, FZ4)
    for _ in range(2):
        with pytest.raises(Declined) as declined:
            run(provider, *ops)
        assert reason in str(declined.value)
    assert len(standin.calls("hipblasLtMatmulAlgoGetHeuristic")) == 1
    assert not standin.calls("hipblasLtMatmul")
    assert standin.live("desc") == standin.live("layout") == standin.live("pref") == 0


def test_a_declined_call_is_served_by_the_next_provider(rocm, gen, monkeypatch):
    """Through the public API on a (pretended) MI300: hipblaslt declines, the next provider that
    accepts the problem serves the call, with one warning naming the reason."""
    from qbackend import probe, registry

    lib, standin = rocm(ROCM_6_3)
    standin.heuristic(HEUR_NONE)
    monkeypatch.setenv("QBACKEND_DISABLE", "torch")  # the reference is then the next: it runs on the CPU
    reg = registry.reload()
    monkeypatch.setitem(reg.providers, "hipblaslt", hb.HipBlasLtProvider(lib, host_pointers=True))
    monkeypatch.setattr(probe, "device_info", lambda device=None: mi300())
    a, b, sa, sb, out_dtype, _ = operands(gen, 7, 16, 32, FZ4, FZ4, scale_a="token", scale_b="channel")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = qbackend.scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
        out2 = qbackend.scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
    problem = validate_scaled_mm(a, b, sa, sb, out_dtype, None)
    torch.testing.assert_close(out, reference_scaled_mm(a, b, sa, sb, out_dtype, None, problem))
    torch.testing.assert_close(out2, out)
    declined = [str(w.message) for w in caught if "declined" in str(w.message)]
    assert len(declined) == 1 and "hipblaslt declined: hipblasLtMatmulAlgoGetHeuristic found no algorithm" \
        in declined[0], declined


def test_plans_are_bounded_and_destroyed(rocm, gen, monkeypatch):
    """A server whose batch size changes on every call keeps at most PLANS_MAX plans: the least
    recently used one is dropped with its descriptors destroyed. A plan's algorithm serves only the
    M it was found for (the stand-in refuses an algorithm used for another problem)."""
    monkeypatch.setattr(hb, "PLANS_MAX", 4)
    lib, standin = rocm(ROCM_6_3)
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    N, K = 32, 64
    w = rand_q((N, K), FZ4, gen)
    sb = rand_scale((1, N), gen)
    for M in range(1, 13):
        a, _, sa, _, _, _ = operands(gen, M, N, K, FZ4, FZ4, scale_a="token")
        out, expected = run(provider, a, w.t(), sa, sb, BF16, None)
        assert_close(out, expected, TOL[BF16], f"M={M}")
        assert standin.live("desc") <= 4 and standin.live("layout") <= 12
    assert standin.live("desc") == 4 and standin.live("layout") == 12 and standin.live("pref") == 0
    assert len(provider._plans) == 4 and not standin.failures()
    heuristics = lambda: len(standin.calls("hipblasLtMatmulAlgoGetHeuristic"))
    assert heuristics() == 12
    a, _, sa, _, _, _ = operands(gen, 12, N, K, FZ4, FZ4, scale_a="token")
    run(provider, a, w.t(), sa, sb, BF16, None)          # still cached
    assert heuristics() == 12
    a, _, sa, _, _, _ = operands(gen, 1, N, K, FZ4, FZ4, scale_a="token")
    run(provider, a, w.t(), sa, sb, BF16, None)          # dropped: planned again
    assert heuristics() == 13 and standin.live("desc") == 4


def test_a_library_of_another_version_than_chosen_is_refused(rocm, gen):
    """The enum values were chosen from the file name (hipBLASLt 0.10); hipblasLtGetVersion says
    1.1, where id 102 means EPILOGUE_ACT_ARG0_EXT: the provider declines before setting anything."""
    lib, standin = rocm(ROCM_6_3)
    standin.pretend((1, 1, 0))
    provider = hb.HipBlasLtProvider(lib, host_pointers=True)
    ops = operands(gen, 3, 16, 32, FZ4, FZ4, scale_a="token", scale_b="channel")
    for _ in range(2):
        with pytest.raises(Declined, match=r"hipblasLtGetVersion reports 1\.1\.0, but qbackend chose the enum "
                                           r"values of 0\.10 \(from the file name libhipblaslt\.so\.0\.10\.60301\)"):
            run(provider, *ops)
    assert standin.names() == ["hipblasLtCreate", "hipblasLtGetVersion", "hipblasLtGetGitRevision", "hipblasLtDestroy"]
    assert standin.live("handle") == 0


def test_cpu_tensors_are_refused_outside_the_tests(rocm, gen):
    lib, standin = rocm(ROCM_6_3)
    provider = hb.HipBlasLtProvider(lib)
    with pytest.raises(ValueError, match=r"qbackend hipblaslt: a: must be on a ROCm GPU .*not cpu"):
        run(provider, *operands(gen, 3, 16, 32, FZ4, FZ4))
    assert not standin.calls()


def mi300(simulated=False):
    return DeviceInfo(backend="hip", index=0, name="AMD Instinct MI300X", arch="gfx942",
                      fp8_dtypes=(FZ4, FZ5), simulated=simulated)


# --- the stand-in itself refuses what hipBLASLt refuses ----------------------------------------

def _layout(lib, dtype, rows, cols, ld):
    out = ctypes.c_void_p()
    return lib.hipblasLtMatrixLayoutCreate(ctypes.byref(out), dtype, rows, cols, ld), out


def _desc(lib):
    out = ctypes.c_void_p()
    assert lib.hipblasLtMatmulDescCreate(ctypes.byref(out), hl.HIPBLAS_COMPUTE_32F, hl.HIP_R_32F) == 0
    return out


def _set(lib, desc, attr, value):
    return lib.hipblasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), ctypes.sizeof(value))


@pytest.mark.parametrize("release,attr,value,status", [
    (ROCM_6_3, 102, ctypes.c_void_p(8), 0),           # A_SCALE_POINTER_VEC_EXT
    (ROCM_7_0, 102, ctypes.c_void_p(8), 3),           # no such id in 1.0
    (ROCM_7_2, 102, ctypes.c_void_p(8), 3),           # EPILOGUE_ACT_ARG0_EXT: a float, 4 bytes
    (ROCM_7_2, 102, ctypes.c_float(1.0), 0),
    (ROCM_6_3, 31, ctypes.c_int32(3), 3),             # A_SCALE_MODE exists from 1.0
    (ROCM_7_0, 31, ctypes.c_int32(3), 0),
    (ROCM_7_0, 31, ctypes.c_int32(9), 3),             # no such hipblasLtMatmulMatrixScale_t
    (ROCM_6_3, hl.DESC_TRANSA, ctypes.c_int64(112), 3),   # int32_t
    (ROCM_6_3, hl.DESC_TRANSA, ctypes.c_int32(7), 3),     # no such hipblasOperation_t
    (ROCM_6_2, hl.DESC_BIAS_DATA_TYPE, ctypes.c_int32(hl.HIP_R_8F_E4M3), 3),  # no OCP fp8 before ROCm 6.3
], ids=lambda v: repr(v) if not isinstance(v, tuple) else v[2])
def test_standin_checks_attributes_by_version(rocm, release, attr, value, status):
    lib, standin = rocm(release)
    assert _set(lib.lib, _desc(lib.lib), attr, value) == status, standin.lines()[-1]


def test_standin_checks_layouts_scales_workspace_and_algorithms(rocm):
    lib, standin = rocm(ROCM_6_3)
    c = lib.lib
    assert _layout(c, hl.HIP_R_8F_E4M3_FNUZ, 64, 1, 63)[0] == 3           # ld < rows
    assert _layout(c, 12345, 64, 1, 64)[0] == 3                            # no such hipDataType
    handle = ctypes.c_void_p()
    assert c.hipblasLtCreate(ctypes.byref(handle)) == 0
    la, lb, ld = (_layout(c, t, r, col, r)[1] for t, r, col in ((1000, 32, 16), (1000, 32, 8), (14, 16, 8)))
    pref = ctypes.c_void_p()
    assert c.hipblasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
    ws = ctypes.c_uint64(1 << 20)
    assert c.hipblasLtMatmulPreferenceSetAttribute(pref, 1, ctypes.byref(ws), 8) == 0
    desc = _desc(c)
    assert _set(c, desc, hl.DESC_TRANSA, ctypes.c_int32(hl.HIPBLAS_OP_T)) == 0
    scales = torch.ones(16)
    result, found = hl.HeuristicResult(), ctypes.c_int(0)

    def heuristic():
        return c.hipblasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, ctypes.byref(result),
                                                 ctypes.byref(found))
    assert _set(c, desc, 102, ctypes.c_void_p(scales.data_ptr())) == 0    # A a vector, B a scalar
    assert _set(c, desc, hl.DESC_B_SCALE_POINTER, ctypes.c_void_p(scales.data_ptr())) == 0
    assert heuristic() == 3 and "both scalar or vector" in standin.failures()[-1][1]["why"]
    assert _set(c, desc, hl.DESC_A_SCALE_POINTER, ctypes.c_void_p(scales.data_ptr())) == 0
    assert heuristic() == 0 and found.value == 1 and result.workspaceSize == 4096
    a, b, d = torch.zeros(16, 32, dtype=FZ4), torch.zeros(8, 32, dtype=FZ4), torch.zeros(8, 16, dtype=BF16)
    one, zero, workspace = ctypes.c_float(1), ctypes.c_float(0), torch.empty(4096, dtype=torch.uint8)

    def matmul(size, layout_b=lb):
        return c.hipblasLtMatmul(handle, desc, ctypes.byref(one), a.data_ptr(), la, b.data_ptr(), layout_b,
                                 ctypes.byref(zero), d.data_ptr(), ld, d.data_ptr(), ld, ctypes.byref(result.algo),
                                 workspace.data_ptr(), size, None)
    assert matmul(4096) == 0
    assert matmul(4095) == 3 and "the algo needs" in standin.failures()[-1][1]["why"]
    other_b = _layout(c, 1000, 32, 8, 48)[1]                               # another ld: another problem
    assert matmul(4096, other_b) == 3 and "found for another problem" in standin.failures()[-1][1]["why"]
    assert c.hipblasLtMatmulDescDestroy(desc) == 0 and c.hipblasLtMatmulDescDestroy(desc) == 3
    assert ctypes.sizeof(hl.HeuristicResult) == c.standin_sizeof_heuristic_result() == 56
