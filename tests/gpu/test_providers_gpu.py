"""The native providers through the public API on a CUDA GPU, against the reference provider.

Outputs are poisoned (NaN) by the caching allocator's reuse of a NaN-filled block before each
call, results are checked NaN-free, and tolerances are relative to the output's magnitude.
"""
import pytest
import torch

import qbackend
from gpu_helpers import captured, needs_sm, poison, reference, rel_err, with_provider

pytestmark = pytest.mark.gpu
DEV = "cuda"
F8 = torch.float8_e4m3fn
SM = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
CUTLASS_VARIANTS = [v for v in ("90", "89") if (v == "90" and SM == (9, 0)) or (v == "89" and SM >= (8, 9))]


@needs_sm((8, 9), "fp8 tensor cores")
@pytest.mark.parametrize("variant", CUTLASS_VARIANTS)
@pytest.mark.parametrize("M", [1, 2, 3, 15, 16, 17, 63, 64, 127, 128, 255, 1000, 4096])
def test_cutlass_fp8_through_api(monkeypatch, variant, M):
    with_provider(monkeypatch, "cutlass", QBACKEND_CUTLASS_VARIANT=variant)
    g = torch.Generator(device=DEV).manual_seed(torch.seed() % 2**31)
    for (N, K) in [(4096, 4096), (256, 28672), (512, 14336)]:
        wide = torch.randn(M, K + 64, device=DEV, generator=g)
        x = wide[:, 32:32 + K]                               # a row-strided (sliced) activation
        w = torch.randn(N, K, device=DEV, generator=g)
        qw, sw = qbackend.quantize(w, F8, "channel")
        for act_gran, w_scale in (("token", sw.t()), ("tensor", sw.max())):
            qx, sx = qbackend.quantize(x, F8, act_gran)
            for out_dtype in (torch.bfloat16, torch.float16):
                bias = torch.randn(N, device=DEV, generator=g).to(out_dtype)
                for b in (bias, None):
                    poison()
                    out = qbackend.scaled_mm(qx, qw.t(), sx, w_scale, out_dtype=out_dtype, bias=b)
                    ref = reference(qbackend.scaled_mm, qx, qw.t(), sx, w_scale, out_dtype=torch.float32,
                                    bias=None if b is None else b.float())
                    # Hopper's fp8 tensor cores accumulate with reduced precision (fast
                    # accumulation, as cuBLASLt's use_fast_accum): measured up to 3e-3 of
                    # max|out| at K=4096 and 1.1e-2 to 1.3e-2 at K=14336 and 28672.
                    tol = 1e-2 if K <= 8192 else 2e-2
                    assert rel_err(out, ref) < tol, (N, K, act_gran, out_dtype, b is None)


@pytest.mark.skipif(SM != (9, 0), reason="whole token tiles are asked for by the sm_90a kernels only")
@pytest.mark.parametrize("N", [4096, 10240])
@pytest.mark.parametrize("M", [33, 40, 41, 65, 72, 73, 80, 96, 104, 105, 112, 150, 200, 240])
def test_whole_token_tiles(monkeypatch, M, N):
    """quantize leaves storage for whole token tiles where the library asks for it
    (native.token_rows), and scaled_mm then runs the GEMM on as many of those rows as the library
    asks for this N and K (at N = 10240 from M = 65 to 96, all 128 of them for the wave-fit tiles).
    The rows past M, poisoned here with NaN, change nothing: the result is finite, matches the
    reference and, where both paths run the same kernel config, equals bit for bit the same call on
    copies of A and scale_a that have no such rows (the plain path)."""
    from qbackend_providers import native
    with_provider(monkeypatch, "cutlass")
    K = 4096
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    alloc = native.token_rows(M)
    rows = native.token_rows(M, N, K, sms, alloc)
    assert M <= rows <= alloc
    same_kernel = native.auto_config(M, N, K, sm_count=sms) == native.auto_config(rows, N, K, sm_count=sms)
    g = torch.Generator(device=DEV).manual_seed(torch.seed() % 2**31)
    x = torch.randn(M, K, device=DEV, generator=g)
    w = torch.randn(N, K, device=DEV, generator=g)
    qw, sw = qbackend.quantize(w, F8, "channel")
    for gran in ("token", "tensor"):
        qx, sx = qbackend.quantize(x, F8, gran)
        assert qx.untyped_storage().nbytes() == alloc * K
        if alloc > M:
            qx.as_strided((alloc - M, K), qx.stride(), M * K).view(torch.uint8).fill_(0x7F)  # e4m3 NaN
            if gran == "token":
                assert sx.untyped_storage().nbytes() == alloc * 4
                sx.as_strided((alloc - M, 1), (1, 1), M).fill_(float("nan"))
        poison()
        out = qbackend.scaled_mm(qx, qw.t(), sx, sw.t(), out_dtype=torch.bfloat16)
        assert out.shape == (M, N) and out.untyped_storage().nbytes() == rows * N * 2
        plain = qbackend.scaled_mm(qx.clone(), qw.t(), sx.clone(), sw.t(), out_dtype=torch.bfloat16)
        assert plain.untyped_storage().nbytes() == M * N * 2
        assert torch.isfinite(out).all(), gran
        if same_kernel:
            assert torch.equal(out.view(torch.int16), plain.view(torch.int16)), gran
        ref = reference(qbackend.scaled_mm, qx, qw.t(), sx, sw.t(), out_dtype=torch.float32)
        assert rel_err(out, ref) < 1e-2 and rel_err(plain, ref) < 1e-2, gran


@pytest.mark.parametrize("dtype", [F8, torch.float8_e5m2, torch.int8])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_quantize_bit_exact(monkeypatch, dtype, x_dtype):
    with_provider(monkeypatch, "cutlass")
    x_full = (torch.randn(1031, 4096 + 48, device=DEV) * 3).to(x_dtype)
    x = x_full[:, 16:16 + 4096]                             # arbitrary row stride
    x[5].zero_()
    ub = torch.tensor([2.0], device=DEV)
    cases = [dict(granularity="token"), dict(granularity="tensor"),
             dict(granularity="token", scale_ub=ub), dict(scale=torch.tensor(0.01, device=DEV))]
    for kw in cases:
        poison()
        q, s = qbackend.quantize(x, dtype, **kw)
        rq, rs = reference(qbackend.quantize, x, dtype, **kw)
        assert torch.equal(s, rs), kw
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), kw
        problem = qbackend.Problem(qbackend.Op.QUANTIZE, x_dtype, dtype,
                                   scale_a=qbackend.Granularity(kw.get("granularity", "tensor")),
                                   static="scale" in kw, has_scale_ub="scale_ub" in kw)
        assert qbackend.select(problem, torch.device(DEV)).name == "cutlass"


@needs_sm((8, 9), "fp8 tensor cores")
def test_cuda_graph_quantize_and_scaled_mm():
    N, K = 2048, 4096
    w = torch.randn(N, K, device=DEV)
    qw, sw = qbackend.quantize(w, F8, "channel")
    pw = qbackend.prepare_weight(qw, sw, F8)
    assert pw.provider == "cutlass"
    static_x = torch.randn(16, K, device=DEV)

    def step():
        qx, sx = qbackend.quantize(static_x, F8, "token")
        return qbackend.linear(qx, pw, sx)

    graph, out = captured(step)
    for _ in range(3):
        static_x.copy_(torch.randn(16, K, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        expect = step()
        assert torch.equal(out, expect)
        ref = static_x @ w.t()
        assert rel_err(out, ref) < 0.1


@needs_sm((8, 9), "fp8 tensor cores")
def test_compile_fullgraph_on_gpu():
    w = torch.randn(1024, 2048, device=DEV)
    qw, sw = qbackend.quantize(w, F8, "channel")

    def f(x):
        qx, sx = qbackend.quantize(x, F8, "token")
        return qbackend.scaled_mm(qx, qw.t(), sx, sw.t()).float().relu()

    x = torch.randn(33, 2048, device=DEV)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x), rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["80", "75"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 2, 7, 16, 17, 33, 64, 128, 1000])
def test_marlin_forced_through_prepare_and_linear(monkeypatch, variant, act, M):
    if variant == "75" and act == torch.bfloat16:
        with_provider(monkeypatch, "marlin", QBACKEND_MARLIN_VARIANT=variant)
        w = torch.randn(256, 512, device=DEV)
        qw, sw = qbackend.quantize(w, F8, "channel")
        pw = qbackend.prepare_weight(qw, sw, act)
        assert pw.provider == "torch"  # refused with a reason, served by the torch provider
        return
    with_provider(monkeypatch, "marlin", QBACKEND_MARLIN_VARIANT=variant)
    for (N, K) in [(4096, 4096), (1024, 14336), (264, 2064)]:
        w = torch.randn(N, K, device=DEV)
        qw, sw = qbackend.quantize(w, F8, "channel")
        for w_scale in (sw, sw.max()):
            pw = qbackend.prepare_weight(qw, w_scale, act, bias=True)
            assert pw.provider == "marlin"
            x = torch.randn(M, K, device=DEV).to(act)
            bias = torch.randn(N, device=DEV).to(act)
            for b in (bias, None):
                poison()
                out = qbackend.linear(x, pw, None, b)
                ref = reference(qbackend.scaled_mm, x, qw.t(), None, pw.scale, out_dtype=torch.float32,
                                bias=None if b is None else b.float())
                tol = 1e-2 if act == torch.bfloat16 else 2e-3
                assert out.dtype == act and rel_err(out, ref) < tol, (N, K, b is None)


def test_marlin_weight_is_packed_for_its_activation_dtype(monkeypatch):
    """Marlin packs a weight's bits for the decode of the activation dtype it was prepared for
    (float16 and bfloat16 read them from different places). Called with the other dtype, linear
    raises instead of decoding wrong weights; prepared for each, both are right."""
    with_provider(monkeypatch, "marlin")
    N, K = 512, 1024
    qw, sw = qbackend.quantize(torch.randn(N, K, device=DEV), F8, "channel")
    prepared = {act: qbackend.prepare_weight(qw, sw, act) for act in (torch.float16, torch.bfloat16)}
    assert all(pw.provider == "marlin" for pw in prepared.values())
    assert prepared[torch.float16].layout != prepared[torch.bfloat16].layout
    x = torch.randn(16, K, device=DEV)
    for act, pw in prepared.items():
        other = torch.bfloat16 if act == torch.float16 else torch.float16
        with pytest.raises(ValueError, match="prepared for .* activations"):
            qbackend.linear(x.to(other), pw)
        out = qbackend.linear(x.to(act), pw)
        ref = reference(qbackend.scaled_mm, x.to(act), qw.t(), None, pw.scale, out_dtype=torch.float32)
        assert rel_err(out, ref) < 1e-2, act


def test_forced_marlin_keeps_its_other_rules(monkeypatch):
    """Forced on a newer GPU, marlin serves only what its rules take; the rest goes to normal
    selection. Before, a block scale_b with N values ([128, N / 128] at K = 16384) reached its kernel
    and was read as per-channel scales (a wrong result), and N = 100 reached its library, which
    refused it with an error."""
    with_provider(monkeypatch, "marlin")
    g = torch.Generator(device=DEV).manual_seed(torch.seed() % 2**31)
    for N, K, gran in ((256, 16384, "block"), (100, 512, "channel")):
        qw, sw = qbackend.quantize(torch.randn(N, K, device=DEV, generator=g), F8, gran)
        scale_b = sw.t().contiguous() if gran == "block" else sw.t()
        x = torch.randn(8, K, device=DEV, generator=g).to(torch.bfloat16)
        poison()
        out = qbackend.scaled_mm(x, qw.t(), None, scale_b, out_dtype=torch.bfloat16)
        ref = reference(qbackend.scaled_mm, x, qw.t(), None, scale_b, out_dtype=torch.float32)
        assert rel_err(out, ref) < 1e-2, (N, K, gran)
