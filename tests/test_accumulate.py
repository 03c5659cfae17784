"""accumulate="fast" | "precise" (scaled_mm, prepare_weight, QuantLinear): validation, which providers
serve each mode (simulated devices), what explain says, and that the torch provider hands the mode to
torch._scaled_mm as use_fast_accum."""
from dataclasses import replace

import pytest
import torch

import qbackend
from qbackend import probe, registry
from qbackend.problem import representative
from qbackend_providers import torch_paths as tp

E4M3 = torch.float8_e4m3fn


def _choice(kind, arch, accumulate):
    p = replace(representative(kind, E4M3, torch.bfloat16), accumulate=accumulate)
    return qbackend.select(p, probe.simulated(arch)).name


def test_a_mode_that_does_not_exist_is_refused_by_name():
    qa, sa = qbackend.quantize(torch.randn(4, 64), E4M3, "token")
    qw, sw = qbackend.quantize(torch.randn(32, 64), E4M3, "channel")
    with pytest.raises(ValueError, match="accumulate: must be 'fast' or 'precise'; got 'exact'"):
        qbackend.scaled_mm(qa, qw.t(), sa, sw.t(), accumulate="exact")
    with pytest.raises(ValueError, match="accumulate"):
        qbackend.prepare_weight(qw, sw, E4M3, accumulate="fp32")
    with pytest.raises(ValueError, match="accumulate"):
        qbackend.nn.QuantLinear(64, 32, accumulate="slow")


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
def test_precise_fp8_goes_where_partial_sums_are_promoted(arch):
    """The cutlass FP8 W8A8 families accumulate fast: a precise call goes to torch._scaled_mm without
    fast accumulation (on sm_90 cutlass's promoting family serves it only when forced). The kinds
    whose kernels promote into fp32 anyway (int8, W8A16, block) stay where they are."""
    for kind in ("fp8_w8a8_per_tensor", "fp8_w8a8_per_token_channel"):
        assert _choice(kind, arch, "fast") == "cutlass"
        assert _choice(kind, arch, "precise") == "torch"
    assert _choice("int8_w8a8", arch, "precise") == "cutlass"
    assert _choice("fp8_w8a16", arch, "precise") == _choice("fp8_w8a16", arch, "fast")
    assert _choice("fp8_block", arch, "precise") == _choice("fp8_block", arch, "fast")


def test_forcing_cutlass_runs_its_promoting_family_on_sm_90_only(monkeypatch):
    p = replace(representative("fp8_w8a8_per_token_channel", E4M3, torch.bfloat16), accumulate="precise")
    monkeypatch.setenv("QBACKEND_PROVIDER", "cutlass")
    registry.reload()
    try:
        assert qbackend.select(p, probe.simulated("sm_90")).name == "cutlass"
        on_89 = qbackend.select(p, probe.simulated("sm_89"))
        assert on_89.name == "torch"
        assert dict(on_89.verdicts)["cutlass"].reason.startswith("serves sm_90 only")
    finally:
        monkeypatch.delenv("QBACKEND_PROVIDER")
        registry.reload()
    text = qbackend.explain(p, probe.simulated("sm_90"))
    assert "-- cutlass: precise fp8 runs on the torch provider" in text and "-> torch" in text


def test_explain_names_the_mode_and_the_reason():
    p = replace(representative("fp8_w8a8_per_token_channel", E4M3, torch.bfloat16), accumulate="precise")
    text = qbackend.explain(p, probe.simulated("sm_89"))
    assert "precise accumulation on sm_89" in text.splitlines()[0]
    assert "accumulate='precise': fp32 accumulation throughout" in text
    assert "cutlass: serves sm_90 only (sm_90a FP8 kernels with fp32 promotion); device is sm_89" in text
    assert "torch: ok: torch._scaled_mm with per-row and per-column scales, use_fast_accum=False" in text
    fast = qbackend.explain(replace(p, accumulate="fast"), probe.simulated("sm_90"))
    assert "accumulate='fast'" in fast and "use_fast_accum=True" in fast


@pytest.fixture
def torch_forced(monkeypatch):
    monkeypatch.setenv("QBACKEND_PROVIDER", "torch")
    registry.reload()
    yield
    monkeypatch.delenv("QBACKEND_PROVIDER")
    registry.reload()


@pytest.mark.parametrize("accumulate", ["fast", "precise"])
def test_the_torch_provider_passes_the_mode_to_scaled_mm(torch_forced, monkeypatch, accumulate):
    cpu = probe.cpu_info()
    if not tp.scaled_mm_pairs(cpu):
        pytest.skip("this torch has no torch._scaled_mm on the CPU")
    seen = []
    real = torch._scaled_mm

    def recording(*args, **kw):
        seen.append(kw.get("use_fast_accum"))
        return real(*args, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    g = torch.Generator().manual_seed(1)
    qa, sa = qbackend.quantize(torch.randn(5, 256, generator=g), E4M3, "tensor")
    qw, sw = qbackend.quantize(torch.randn(48, 256, generator=g), E4M3, "tensor")
    out = qbackend.scaled_mm(qa, qw.t(), sa, sw, accumulate=accumulate)
    ref = qa.float() @ qw.float().t() * (sa * sw)
    assert seen == [accumulate == "fast"]
    assert (out.float() - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_prepared_weights_and_layers_keep_the_mode(monkeypatch):
    """prepare_weight records the mode, linear() runs its problem with it, and QuantLinear prepares
    again when the mode changes."""
    qw, sw = qbackend.quantize(torch.randn(32, 64), E4M3, "channel")
    pw = qbackend.prepare_weight(qw, sw, E4M3, "token", accumulate="precise")
    assert pw.problem.accumulate == "precise"
    provider = registry.get().providers[pw.provider]
    seen = []
    real = provider.scaled_mm_prepared

    def recording(a, weight, scale_a, out_dtype, bias, problem):
        seen.append(problem.accumulate)
        return real(a, weight, scale_a, out_dtype, bias, problem)

    monkeypatch.setattr(provider, "scaled_mm_prepared", recording)
    qa, sa = qbackend.quantize(torch.randn(3, 64), E4M3, "token")
    qbackend.linear(qa, pw, sa)
    assert seen == ["precise"]

    layer = qbackend.nn.QuantLinear.from_linear(torch.nn.Linear(64, 32), "fp8_dynamic", accumulate="precise")
    assert "accumulate=precise" in repr(layer)
    layer(torch.randn(2, 64))
    assert {p.weight.problem.accumulate for p in layer._prepared.values()} == {"precise"}
    layer.accumulate = "fast"
    assert layer._prepared == {}
    layer(torch.randn(2, 64))
    assert {p.weight.problem.accumulate for p in layer._prepared.values()} == {"fast"}
