"""The hipblaslt provider on a real AMD GPU (MI300X gfx942, MI350 gfx950), against the reference
provider on the same device: shapes, dtypes, scales, bias, strides, CUDA-graph capture.

Skipped without a ROCm GPU (a ROCm build of torch that sees a device). Not run yet: no AMD GPU was
reachable when it was written (docs/selection.md, ROCm status). Run it with
    python -m pytest -q tests/rocm
"""
from __future__ import annotations

import warnings

import pytest
import torch

import qbackend
from helpers import rel_err
from qbackend import registry
from qbackend_providers import hipblaslt as hb
from qbackend_providers import hipblaslt_lib as hl

ROCM = bool(torch.version.hip) and torch.cuda.is_available()
pytestmark = [pytest.mark.rocm, pytest.mark.skipif(not ROCM, reason="needs a ROCm GPU")]
DEV = "cuda"
ARCH = qbackend.device_info(DEV).arch if ROCM else None
FP8 = {"gfx942": (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz), "gfx950": (torch.float8_e4m3fn, torch.float8_e5m2)}
# Of max |reference|: fp32 accumulation in another order, then one rounding to the output dtype.
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def fp8_pair():
    if ARCH not in FP8:
        pytest.skip(f"hipblaslt serves gfx942 and gfx950, not {ARCH}")
    return FP8[ARCH]


@pytest.fixture
def hipblaslt(monkeypatch):
    """hipblaslt forced, so a call it cannot serve is an error here rather than a quiet fallback."""
    monkeypatch.setenv("QBACKEND_PROVIDER", "hipblaslt")
    reg = registry.reload()
    yield reg.providers["hipblaslt"]
    monkeypatch.delenv("QBACKEND_PROVIDER")
    registry.reload()


def rowwise() -> bool:
    release = hl.load().release
    return release is not None and release.rowwise


def reference(a, b, sa, sb, out_dtype, bias):
    from qbackend.validate import validate_scaled_mm
    from qbackend_providers.reference import reference_scaled_mm

    problem = validate_scaled_mm(a, b, sa, sb, out_dtype, bias)
    return reference_scaled_mm(a, b, sa, sb, out_dtype, bias, problem)


def operands(M, N, K, a_dtype, b_dtype, g, scale_a="tensor", scale_b="tensor", a_pad=0, b_pad=0):
    qmax_a, qmax_b = (torch.finfo(a_dtype).max, torch.finfo(b_dtype).max)
    a = (torch.randn(M, K + a_pad, device=DEV, generator=g) * qmax_a / 8).clamp(-qmax_a, qmax_a).to(a_dtype)
    a = a[:, a_pad:]
    w = (torch.randn(N, K + b_pad, device=DEV, generator=g) * qmax_b / 8).clamp(-qmax_b, qmax_b).to(b_dtype)
    sa = torch.rand((M, 1) if scale_a == "token" else (), device=DEV, generator=g) * 0.01 + 0.001
    sb = torch.rand((1, N) if scale_b == "channel" else (), device=DEV, generator=g) * 0.01 + 0.001
    return a, w[:, :K].t(), sa, sb


def generator():
    g = torch.Generator(device=DEV)
    g.manual_seed(torch.seed() % 2**31)
    return g


def test_library_found_and_known():
    lib = hl.load()
    assert lib.reason is None, lib.reason
    info = qbackend.device_info(DEV)
    assert info.backend == "hip" and info.arch in FP8, info


@pytest.mark.parametrize("M", [1, 2, 15, 16, 17, 64, 127, 128, 1000, 4096])
@pytest.mark.parametrize("scales", [("tensor", "tensor"), ("token", "channel"), ("token", "tensor"),
                                    ("tensor", "channel")], ids=lambda s: "x".join(s))
def test_matches_reference(hipblaslt, M, scales):
    e4, _ = fp8_pair()
    if scales != ("tensor", "tensor") and not rowwise():
        pytest.skip("this hipBLASLt has no vector scales (ROCm 6.3+)")
    g = generator()
    for N, K, a_pad, b_pad in ((4096, 4096, 0, 0), (256, 28672, 64, 0), (1280, 8192, 32, 128)):
        a, b, sa, sb = operands(M, N, K, e4, e4, g, *scales, a_pad=a_pad, b_pad=b_pad)
        for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
            bias = torch.randn(N, device=DEV, generator=g).to(out_dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("error")       # a decline would warn: fail instead
                out = qbackend.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias)
            assert out.shape == (M, N) and out.dtype == out_dtype
            err = rel_err(out.float(), reference(a, b, sa, sb, out_dtype, bias).float())
            assert err <= TOL[out_dtype], (M, N, K, out_dtype, err)


@pytest.mark.parametrize("pair", ["e4m3 x e5m2", "e5m2 x e4m3"])
def test_mixed_formats(hipblaslt, pair):
    e4, e5 = fp8_pair()
    a_dtype, b_dtype = (e4, e5) if pair == "e4m3 x e5m2" else (e5, e4)
    a, b, sa, sb = operands(33, 512, 1024, a_dtype, b_dtype, generator())
    out = qbackend.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert rel_err(out.float(), reference(a, b, sa, sb, torch.bfloat16, None).float()) <= TOL[torch.bfloat16]


def test_one_row_with_a_row_stride_below_k(hipblaslt):
    e4, _ = fp8_pair()
    K = 4096
    a, b, sa, sb = operands(1, 1024, K, e4, e4, generator())
    a = torch.as_strided(a.contiguous(), (1, K), (1, 1))
    out = qbackend.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert rel_err(out.float(), reference(a, b, sa, sb, torch.bfloat16, None).float()) <= TOL[torch.bfloat16]


def test_graph_capture_and_replay(hipblaslt):
    """Captured after one eager call (plans and workspace exist), replayed on new inputs written
    into the captured buffers: each replay equals an eager call on those inputs."""
    e4, _ = fp8_pair()
    scales = ("token", "channel") if rowwise() else ("tensor", "tensor")
    g = generator()
    a, b, sa, sb = operands(16, 2048, 4096, e4, e4, g, *scales)
    bias = torch.randn(2048, device=DEV, generator=g).to(torch.bfloat16)
    step = lambda: qbackend.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, bias=bias)
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        a2, _, sa2, _ = operands(16, 2048, 4096, e4, e4, g, *scales)
        a.copy_(a2)
        sa.copy_(sa2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step())


def test_plans_stay_bounded_on_the_device(hipblaslt, monkeypatch):
    e4, _ = fp8_pair()
    monkeypatch.setattr(hb, "PLANS_MAX", 4)
    g = generator()
    for M in range(1, 40, 3):
        a, b, sa, sb = operands(M, 512, 1024, e4, e4, g)
        out = qbackend.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        assert rel_err(out.float(), reference(a, b, sa, sb, torch.bfloat16, None).float()) <= TOL[torch.bfloat16]
    assert len(hipblaslt._plans) <= 4


def test_e4m3fn_layer_on_gfx942(hipblaslt):
    """An e4m3fn layer (as checkpoints hold it) on MI300: prepared as e4m3fnuz with doubled scales,
    served by hipBLASLt, close to the same layer computed by the reference on the CPU."""
    if ARCH != "gfx942" or not rowwise():
        pytest.skip("the fnuz re-encoding applies on gfx942; the layer's scales are per token x per channel")
    lin = torch.nn.Linear(4096, 1024).to(DEV)
    layer = qbackend.QuantLinear.from_linear(lin, "fp8_dynamic")
    assert layer._prepared[torch.float32].weight.dtype == torch.float8_e4m3fnuz
    x = torch.randn(8, 4096, device=DEV)
    assert qbackend.select("fp8_w8a8_per_token_channel", DEV).name == "hipblaslt"
    y = layer(x)
    cpu = qbackend.QuantLinear.from_linear(lin.cpu(), "fp8_dynamic")
    assert rel_err(y.cpu().float(), cpu(x.cpu()).float()) <= 2e-2
