"""QuantLinear and quantize_model on the CPU (reference provider)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import qbackend
from qbackend.nn import (
    SCHEMES,
    QuantizedWeight,
    QuantLinear,
    Scheme,
    calibrate,
    calibration,
    matches,
    quantize_model,
)

FP8 = torch.float8_e4m3fn
DYNAMIC_SCHEMES = [n for n, s in SCHEMES.items() if not s.static_activations]


def _linear(gen, k, n, bias=True, dtype=torch.float32):
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen) / k**0.5)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=gen))
    return lin.to(dtype)


def _expected(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """What the layer must compute, written out in float64 from the public quantize/dequantize."""
    qw = layer.quantized_weight()
    w = qw.dequantize(torch.float64)
    s = layer.scheme
    if s.weight_only:
        a = (x if x.dtype in (torch.bfloat16, torch.float16) else x.bfloat16()).double()
    else:
        if s.static_activations:
            q, sa = qbackend.quantize(x, FP8, "tensor", scale=layer.input_scale)
        elif s.activations == "group":
            q, sa = qbackend.quantize(x, s.weight_dtype, "group", group_size=s.block_size[1])
        else:
            q, sa = qbackend.quantize(x, s.weight_dtype, s.activations)
        a = qbackend.dequantize(q, sa, torch.float64)
    y = a @ w.t()
    if layer.bias is not None:
        y = y + layer.bias.double()
    return y


@pytest.mark.parametrize("scheme", DYNAMIC_SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_scheme_semantics(gen, scheme, dtype):
    k = 256 if scheme == "fp8_block" else 96
    lin = _linear(gen, k, 320, dtype=dtype)
    layer = QuantLinear.from_linear(lin, scheme)
    x = torch.randn(2, 7, k, generator=gen).to(dtype)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (2, 7, 320)
    want = _expected(layer, x)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert torch.allclose(y.double(), want, rtol=tol, atol=tol * want.abs().max().item())
    # And it approximates the float layer.
    ref = lin(x).double()
    assert (y.double() - ref).norm() / ref.norm() < 0.08


@pytest.mark.parametrize("k", [320, 130])
def test_block_scheme_with_a_shorter_last_k_block(gen, k):
    """K = 320 (two 128-blocks and a 64-wide one) and K = 130 (padded to 144 for 16-byte rows): the
    last activation group and weight block are shorter; the layer computes what the public
    quantize / dequantize say."""
    lin = _linear(gen, k, 256)
    layer = QuantLinear.from_linear(lin, "fp8_block")
    assert layer.weight_scale.shape == (2, -(-k // 128))
    x = torch.randn(3, k, generator=gen)
    y = layer(x)
    want = _expected(layer, x)
    assert torch.allclose(y.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_static_scheme_needs_calibration_then_uses_amax(gen):
    lin = _linear(gen, 64, 32)
    layer = QuantLinear.from_linear(lin, "fp8_static")
    x = torch.randn(5, 64, generator=gen)
    with pytest.raises(RuntimeError, match="calibrate"):
        layer(x)
    batches = [torch.randn(3, 64, generator=gen) * (i + 1) for i in range(3)]
    calibrate(layer, batches)
    amax = max(b.abs().max() for b in batches)
    assert torch.allclose(layer.input_scale, amax / 448.0)
    y = layer(x)
    assert torch.allclose(y.double(), _expected(layer, x), rtol=1e-4, atol=1e-4)


def test_static_scale_given_at_construction(gen):
    lin = _linear(gen, 32, 16)
    layer = QuantLinear.from_linear(lin, "fp8_static", input_scale=0.01)
    assert layer.input_scale.item() == pytest.approx(0.01)
    x = torch.randn(4, 32, generator=gen)
    assert torch.allclose(layer(x).double(), _expected(layer, x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="no static input scale"):
        QuantLinear.from_linear(lin, "fp8_dynamic", input_scale=0.01)


def test_calibration_context_manager_and_errors(gen):
    model = nn.Sequential(_linear(gen, 32, 32), nn.ReLU(), _linear(gen, 32, 8))
    quantize_model(model, "fp8_static")
    with torch.no_grad(), calibration(model):
        model(torch.randn(4, 32, generator=gen))
    assert all(torch.isfinite(m.input_scale) for m in (model[0], model[2]))
    # An exception inside the block leaves scales untouched and stops recording.
    before = model[0].input_scale.clone()
    with pytest.raises(KeyError):
        with calibration(model):
            model(torch.randn(4, 32, generator=gen) * 100)
            raise KeyError("boom")
    assert torch.equal(model[0].input_scale, before) and model[0]._amax is None
    with pytest.raises(ValueError, match="no QuantLinear with static"):
        with calibration(quantize_model(nn.Sequential(_linear(gen, 16, 16)), "fp8_dynamic")):
            pass
    # A layer that never ran keeps no scale, with a warning naming it.
    model2 = quantize_model(nn.ModuleDict({"used": _linear(gen, 16, 16), "unused": _linear(gen, 16, 16)}),
                            "fp8_static")
    with pytest.warns(UserWarning, match="unused"):
        calibrate(model2, [torch.randn(2, 16, generator=gen)], forward=lambda m, b: m["used"](b))


def test_k_not_multiple_of_16_is_padded(gen):
    lin = _linear(gen, 40, 24)
    for scheme in ("fp8_dynamic", "int8_dynamic", "fp8_weight_only", "fp8_dynamic_tensor"):
        layer = QuantLinear.from_linear(lin, scheme)
        x = torch.randn(3, 40, generator=gen)
        y = layer(x)
        assert layer._prepared[torch.float32].pad_k == 8 and layer.weight.shape == (24, 40)
        assert layer._prepared[torch.float32].weight.K == 48
        assert torch.allclose(y.double(), _expected(layer, x), rtol=1e-3, atol=1e-3)


def test_drop_in_for_linear(gen):
    lin = _linear(gen, 48, 16, bias=False)
    layer = QuantLinear.from_linear(lin)
    assert (layer.in_features, layer.out_features, layer.bias) == (48, 16, None)
    assert layer.scheme.name == "fp8_dynamic"
    v = torch.randn(48, generator=gen)
    assert layer(v).shape == (16,)
    assert "scheme=fp8_dynamic" in repr(layer)
    with pytest.raises(ValueError, match="in_features=48"):
        layer(torch.randn(2, 47, generator=gen))


def test_dtype_moves_keep_quantized_buffers(gen):
    layer = QuantLinear.from_linear(_linear(gen, 32, 16), "fp8_static", input_scale=0.02)
    assert list(layer._prepared) == [torch.float32]
    layer.half()
    assert layer.weight.dtype == FP8 and layer.weight_scale.dtype == torch.float32
    assert layer.input_scale.dtype == torch.float32 and layer.bias.dtype == torch.float16
    assert list(layer._prepared) == [torch.float16]  # prepared again, for the new dtype
    assert list(layer.state_dict()) == ["bias", "weight", "weight_scale", "input_scale"]
    x = torch.randn(2, 32, generator=gen).half()
    assert layer(x).dtype == torch.float16
    layer.to(torch.bfloat16)
    assert layer.weight.dtype == FP8 and layer.bias.dtype == torch.bfloat16


def test_weight_prepared_once(gen, monkeypatch):
    layer = QuantLinear.from_linear(_linear(gen, 32, 16), "int8_dynamic")
    calls = []
    original = QuantizedWeight.from_float
    monkeypatch.setattr(QuantizedWeight, "from_float", lambda *a, **k: calls.append(1) or original(*a, **k))
    prepared = layer._prepared[torch.float32]
    prepare_weight = qbackend.prepare_weight
    monkeypatch.setattr(qbackend, "prepare_weight",
                        lambda *a, **k: calls.append(1) or prepare_weight(*a, **k))
    for _ in range(3):
        layer(torch.randn(2, 32, generator=gen))
    assert layer._prepared[torch.float32] is prepared and not calls
    # Another activation dtype is prepared once, on first use.
    for _ in range(2):
        layer(torch.randn(2, 32, generator=gen).bfloat16())
    assert len(calls) == 1 and set(layer._prepared) == {torch.float32, torch.bfloat16}


def test_state_dict_round_trip_and_refusals(gen):
    src = QuantLinear.from_linear(_linear(gen, 64, 32), "fp8_dynamic")
    dst = QuantLinear(64, 32, scheme="fp8_dynamic")
    dst.load_state_dict(src.state_dict())
    x = torch.randn(3, 64, generator=gen)
    assert torch.equal(dst(x), src(x))
    # [N] per-channel scales (as some checkpoints store them) are accepted.
    sd = dict(src.state_dict(), weight_scale=src.weight_scale.reshape(-1))
    dst.load_state_dict(sd)
    assert torch.equal(dst(x), src(x))
    # A float weight would be silently cast to fp8 without scaling: refused.
    with pytest.raises(RuntimeError, match="expects a quantized"):
        dst.load_state_dict(_linear(gen, 64, 32).state_dict(), strict=False)


def test_fnuz_device_reencodes_weights(gen, monkeypatch):
    """On an MI300-like device the prepared weight is e4m3fnuz with doubled scales."""
    lin = _linear(gen, 64, 32)
    ref = QuantLinear.from_linear(lin, "fp8_static", input_scale=0.01)
    x = torch.randn(4, 64, generator=gen)
    monkeypatch.setattr(qbackend, "native_fp8_dtype", lambda device=None: torch.float8_e4m3fnuz)
    layer = QuantLinear.from_linear(lin, "fp8_static", input_scale=0.01)
    p = layer._prepared[torch.float32]
    assert p.weight.dtype == torch.float8_e4m3fnuz and p.act_dtype == torch.float8_e4m3fnuz
    assert layer.weight.dtype == FP8  # the canonical weight stays as checkpoints store it
    assert torch.allclose(p.weight.scale, layer.weight_scale * 2)
    assert torch.allclose(p.input_scale, layer.input_scale * 2)
    # Same numbers: fnuz with doubled scales is an exact re-encoding.
    assert torch.allclose(layer(x), ref(x), rtol=1e-5, atol=1e-5)


def test_quantize_model_with_ignore_patterns(gen):
    model = nn.ModuleDict({
        "embed": nn.Embedding(10, 32),
        "layers": nn.ModuleList([nn.ModuleDict({"q_proj": _linear(gen, 32, 32), "up": _linear(gen, 32, 32)})
                                 for _ in range(2)]),
        "attn": nn.MultiheadAttention(32, 4),
        "lm_head": _linear(gen, 32, 10),
    })
    quantize_model(model, "fp8_dynamic", ignore=["lm_head", "re:layers\\.1\\..*"])
    assert isinstance(model["layers"][0]["q_proj"], QuantLinear)
    assert isinstance(model["layers"][0]["up"], QuantLinear)
    assert type(model["layers"][1]["q_proj"]) is nn.Linear
    assert type(model["lm_head"]) is nn.Linear
    # MultiheadAttention reads out_proj.weight directly: left alone.
    assert not isinstance(model["attn"].out_proj, QuantLinear)
    model2 = nn.ModuleDict({"a": nn.ModuleDict({"q_proj": _linear(gen, 32, 32)}), "b": _linear(gen, 32, 32)})
    quantize_model(model2, "int8_dynamic", ignore=["*.q_proj"])
    assert type(model2["a"]["q_proj"]) is nn.Linear and isinstance(model2["b"], QuantLinear)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        quantize_model(model2, "fp8_dynamic", ignore=["re:(unclosed"])
    with pytest.raises(ValueError, match="unknown quantization scheme 'fp4'"):
        quantize_model(model2, "fp4")
    assert isinstance(quantize_model(_linear(gen, 16, 16)), QuantLinear)


def test_pattern_rules():
    assert matches("model.lm_head", "lm_head") and matches("lm_head", "lm_head")
    assert not matches("model.lm_head_extra", "lm_head")
    assert matches("model.embed_tokens", "*embed*")
    assert matches("model.layers.3.mlp", "re:model\\.layers\\.\\d+")
    assert not matches("x.model.layers.3", "re:model")  # re: patterns anchor at the start


def test_scheme_validation():
    with pytest.raises(ValueError, match="static activation scales are per-tensor"):
        Scheme(FP8, "channel", "token", static_activations=True)
    with pytest.raises(ValueError, match="weight-only"):
        Scheme(torch.int8, "channel", None)
    for s in SCHEMES.values():
        assert s.name in s.describe()


def test_meta_layer_refuses_forward_and_from_linear():
    with torch.device("meta"):
        lin = nn.Linear(32, 16)
    with pytest.raises(ValueError, match="meta"):
        QuantLinear.from_linear(lin)
    layer = QuantLinear(32, 16, device="meta")
    with pytest.raises(RuntimeError, match="meta"):
        layer(torch.randn(2, 32, device="meta"))
