"""Loading FP8/INT8 safetensors checkpoints: the three layouts, sharding, merged layers, and every
way a checkpoint can be wrong (each error names the file and the tensor)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import qbackend
from qbackend.formats import (
    CheckpointError,
    QuantizedCheckpoint,
    load_checkpoint,
    load_quantized,
    save_quantized,
)
from qbackend.nn import QuantizedWeight, QuantLinear, calibrate, quantize_model
from qbackend.nn.schemes import SCHEMES

FP8 = torch.float8_e4m3fn
FP8_STATIC = {"quant_method": "fp8", "activation_scheme": "static"}
FP8_DYNAMIC = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def write_folder(folder: Path, tensors: dict, quantization_config: dict | None = None,
                 shards: int = 1) -> Path:
    """A model folder: config.json and the tensors, split over `shards` files with an index."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "toy"}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    if shards == 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n].contiguous() for n in part}, str(folder / fname))
        weight_map.update({n: fname for n in part})
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def fp8_layer(gen, n, k, granularity="tensor"):
    w = torch.randn(n, k, generator=gen) / k**0.5
    q, s = qbackend.quantize(w, FP8, granularity)
    return q, s


class Toy(nn.Module):
    """A decoder-ish block with separate q/k/v and gate/up, plus an embedding and head."""

    def __init__(self, d=64, ff=96, vocab=50):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, 32), nn.Linear(d, 32)
        self.gate_proj, self.up_proj = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)


class FusedToy(nn.Module):
    def __init__(self, d=64, ff=96, vocab=50):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.qkv_proj = nn.Linear(d, d + 64)
        self.gate_up_proj = nn.Linear(d, 2 * ff, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)


def toy_checkpoint(gen, granularity="tensor", static=False, scale_shape=None, input_name="input_scale"):
    """An fp8 checkpoint of Toy in the vLLM layout; returns (tensors, float reference weights)."""
    tensors, ref = {}, {}
    tensors["embed_tokens.weight"] = torch.randn(50, 64, generator=gen)
    tensors["lm_head.weight"] = torch.randn(50, 64, generator=gen)
    for name, n in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32), ("gate_proj", 96), ("up_proj", 96)):
        # Different magnitudes per part so that per-tensor scales differ.
        w = torch.randn(n, 64, generator=gen) * (0.5 + torch.rand((), generator=gen))
        q, s = qbackend.quantize(w, FP8, granularity)
        tensors[f"{name}.weight"] = q
        tensors[f"{name}.weight_scale"] = s if scale_shape is None else s.reshape(scale_shape(s))
        if static:
            tensors[f"{name}.{input_name}"] = torch.rand((), generator=gen) * 0.05 + 0.01
        if name in ("q_proj", "k_proj", "v_proj"):
            tensors[f"{name}.bias"] = torch.randn(n, generator=gen)
        ref[name] = qbackend.dequantize(q, s, torch.float32)
    return tensors, ref


# ------------------------------------------------------------------------------------- layouts

@pytest.mark.parametrize("shape", [None, lambda s: (1,)], ids=["scalar", "[1]"])
def test_fp8_static_layout(tmp_path, gen, shape):
    tensors, ref = toy_checkpoint(gen, static=True, scale_shape=shape)
    folder = write_folder(tmp_path / "m", tensors, FP8_STATIC)
    loaded = load_quantized(folder)
    q = loaded["q_proj"]
    assert isinstance(q, QuantizedWeight) and q.scheme.name == "fp8_static"
    assert q.weight_scale.shape == () and q.input_scale.shape == ()
    assert torch.equal(q.input_scale, tensors["q_proj.input_scale"])
    assert torch.equal(q.dequantize(), ref["q_proj"])
    assert loaded["lm_head.weight"].dtype == torch.float32 and "q_proj.bias" in loaded


def test_act_scale_name_from_the_first_vllm_layout(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen, static=True, input_name="act_scale")
    loaded = load_quantized(write_folder(tmp_path / "m", tensors, FP8_STATIC))
    assert torch.equal(loaded["v_proj"].input_scale, tensors["v_proj.act_scale"])
    assert "v_proj.act_scale" not in loaded


@pytest.mark.parametrize("shape", [None, lambda s: (s.shape[0],)], ids=["[N,1]", "[N]"])
def test_fp8_dynamic_per_channel(tmp_path, gen, shape):
    tensors, ref = toy_checkpoint(gen, granularity="channel", scale_shape=shape)
    loaded = load_quantized(write_folder(tmp_path / "m", tensors, FP8_DYNAMIC))
    g = loaded["gate_proj"]
    assert g.scheme.name == "fp8_dynamic" and g.weight_scale.shape == (96, 1)
    assert torch.equal(g.dequantize(), ref["gate_proj"])


def test_sharded_checkpoint_with_index(tmp_path, gen):
    tensors, ref = toy_checkpoint(gen, static=True)
    folder = write_folder(tmp_path / "m", tensors, FP8_STATIC, shards=3)
    with QuantizedCheckpoint(folder) as ckpt:
        assert sorted(ckpt.quantized_layers()) == ["gate_proj", "k_proj", "q_proj", "up_proj", "v_proj"]
        assert len({ckpt.files.file_of(n) for n in ckpt.files.keys()}) == 3
        assert torch.equal(ckpt.layer("up_proj").dequantize(), ref["up_proj"])


def _ct_config(wtype="float", wstrategy="channel", acts="token", dynamic=True, block=None, fmt=None):
    args = {"num_bits": 8, "type": wtype, "symmetric": True, "strategy": wstrategy, "dynamic": False,
            "block_structure": block}
    inputs = None if acts is None else {"num_bits": 8, "type": wtype, "symmetric": True,
                                        "strategy": acts, "dynamic": dynamic,
                                        "group_size": block[1] if acts == "group" else None}
    return {"quant_method": "compressed-tensors", "format": fmt or f"{wtype}-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args,
                                          "input_activations": inputs}},
            "ignore": ["lm_head"]}


@pytest.mark.parametrize("case", ["fp8_dynamic", "fp8_static", "fp8_weight_only", "int8_dynamic",
                                  "fp8_dynamic_tensor"])
def test_compressed_tensors_layouts(tmp_path, gen, case):
    scheme = SCHEMES[case]
    config = _ct_config("float" if scheme.weight_dtype == FP8 else "int", scheme.weight_granularity,
                        scheme.activations, not scheme.static_activations)
    w = torch.randn(48, 64, generator=gen)
    qw = QuantizedWeight.from_float(w, scheme, torch.tensor(0.02) if scheme.static_activations else None)
    tensors = {"layer.weight": qw.weight, "layer.weight_scale": qw.weight_scale,
               "layer.bias": torch.randn(48, generator=gen),
               "lm_head.weight": torch.randn(10, 64, generator=gen)}
    if scheme.static_activations:
        tensors["layer.input_scale"] = qw.input_scale
    loaded = load_quantized(write_folder(tmp_path / "m", tensors, config))
    got = loaded["layer"]
    assert got.scheme == scheme and got.scheme.name == case
    assert torch.equal(got.weight, qw.weight) and torch.equal(got.weight_scale, qw.weight_scale)


def test_block_quantized_weight_scale_inv(tmp_path, gen):
    """DeepSeek-style: quant_method fp8 with weight_block_size and weight_scale_inv [ceil(N/128), K/128]."""
    w = torch.randn(320, 256, generator=gen)
    q, s = qbackend.quantize(w, FP8, "block", block_size=(128, 128))
    assert s.shape == (3, 2)
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    folder = write_folder(tmp_path / "m", {"mlp.weight": q, "mlp.weight_scale_inv": s}, config)
    got = load_quantized(folder)["mlp"]
    assert got.scheme.name == "fp8_block"
    layer = QuantLinear.from_quantized(got)
    x = torch.randn(4, 256, generator=gen)
    ref = x @ qbackend.dequantize(q, s, torch.float32).t()
    assert (layer(x) - ref).norm() / ref.norm() < 0.05


def test_compressed_tensors_block_and_name_targets(tmp_path, gen):
    config = _ct_config("float", "block", "group", block=[128, 128])
    config["config_groups"]["group_1"] = {
        "targets": ["re:.*special$"],
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"},
        "input_activations": None}
    qb = QuantizedWeight.from_float(torch.randn(256, 128, generator=gen), SCHEMES["fp8_block"])
    qt, st = qbackend.quantize(torch.randn(32, 64, generator=gen), FP8, "tensor")
    folder = write_folder(tmp_path / "m", {"a.weight": qb.weight, "a.weight_scale": qb.weight_scale,
                                           "b.special.weight": qt, "b.special.weight_scale": st}, config)
    loaded = load_quantized(folder)
    assert loaded["a"].scheme.name == "fp8_block"
    s = loaded["b.special"].scheme
    assert (s.weight_granularity, s.weight_only) == ("tensor", True)


# -------------------------------------------------------------------------------- merged layers

def test_merged_per_tensor_layers_requantize_to_largest_scale(tmp_path, gen):
    tensors, ref = toy_checkpoint(gen, static=True)
    folder = write_folder(tmp_path / "m", tensors, FP8_STATIC)
    merged = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    loaded = load_quantized(folder, merged=merged)
    assert "q_proj" not in loaded and "q_proj.bias" not in loaded
    qkv = loaded["qkv_proj"]
    scales = [tensors[f"{p}.weight_scale"] for p in ("q_proj", "k_proj", "v_proj")]
    assert torch.equal(qkv.weight_scale, torch.stack(scales).max())
    assert torch.equal(qkv.input_scale, torch.stack([tensors[f"{p}.input_scale"]
                                                     for p in ("q_proj", "k_proj", "v_proj")]).max())
    want = torch.cat([ref["q_proj"], ref["k_proj"], ref["v_proj"]])
    got = qkv.dequantize()
    # Requantizing to a larger scale loses at most half a step of the coarser grid (plus saturation
    # never happens since the scale only grows): relative error stays at fp8 rounding level.
    assert (got - want).norm() / want.norm() < 0.05
    # The part that already had the largest scale is unchanged bit for bit.
    biggest = max(range(3), key=lambda i: scales[i].item())
    rows = [(0, 64), (64, 96), (96, 128)][biggest]
    original = tensors[["q_proj", "k_proj", "v_proj"][biggest] + ".weight"]
    assert torch.equal(qkv.weight[rows[0]:rows[1]], original)
    assert torch.equal(loaded["qkv_proj.bias"],
                       torch.cat([tensors[f"{p}.bias"] for p in ("q_proj", "k_proj", "v_proj")]))
    # Into a model with fused modules:
    model = FusedToy()
    result = load_checkpoint(model, folder, merged=merged)
    assert sorted(result.quantized) == ["gate_up_proj", "qkv_proj"] and not result.missing_keys
    x = torch.randn(3, 64, generator=gen)
    y = model.qkv_proj(x)
    y_ref = x @ want.t() + loaded["qkv_proj.bias"]
    assert (y - y_ref).norm() / y_ref.norm() < 0.08


def test_merged_equal_scales_and_per_channel_are_exact(tmp_path, gen):
    tensors, ref = toy_checkpoint(gen, granularity="channel")
    loaded = load_quantized(write_folder(tmp_path / "m", tensors, FP8_DYNAMIC),
                            merged={"gate_up_proj": ["gate_proj", "up_proj"]})
    gu = loaded["gate_up_proj"]
    assert gu.weight_scale.shape == (192, 1)
    assert torch.equal(gu.dequantize(), torch.cat([ref["gate_proj"], ref["up_proj"]]))
    # Per-tensor parts sharing one scale (vLLM's "shared scales" checkpoints): no requantization.
    q1, s = fp8_layer(gen, 32, 64)
    q2 = qbackend.quantize(torch.randn(32, 64, generator=gen) * 0.01, FP8, "tensor", scale=s)[0]
    folder = write_folder(tmp_path / "s", {"a.weight": q1, "a.weight_scale": s, "b.weight": q2,
                                           "b.weight_scale": s.clone()}, FP8_DYNAMIC)
    ab = load_quantized(folder, merged={"ab": ["a", "b"]})["ab"]
    assert torch.equal(ab.weight, torch.cat([q1, q2]))


def test_merge_refusals(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    del tensors["v_proj.weight"], tensors["v_proj.weight_scale"], tensors["v_proj.bias"]
    folder = write_folder(tmp_path / "m", tensors, FP8_DYNAMIC)
    with pytest.raises(CheckpointError, match="v_proj.weight"):
        load_quantized(folder, merged={"qkv_proj": ["q_proj", "k_proj", "v_proj"]})


# -------------------------------------------------------------------------- loading into models

def test_load_checkpoint_into_meta_model_and_real_model(tmp_path, gen):
    tensors, ref = toy_checkpoint(gen, static=True)
    folder = write_folder(tmp_path / "m", tensors, FP8_STATIC, shards=2)
    with torch.device("meta"):
        meta_model = Toy()
    real_model = Toy()
    for model in (meta_model, real_model):
        result = load_checkpoint(model, folder)
        assert not result.missing_keys and not result.unexpected_keys
        assert isinstance(model.k_proj, QuantLinear) and model.k_proj.scheme.name == "fp8_static"
        assert type(model.lm_head) is nn.Linear
        assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])
        assert torch.equal(model.k_proj.bias, tensors["k_proj.bias"])
        x = torch.randn(2, 64, generator=gen)
        want = QuantLinear.from_quantized(
            QuantizedWeight(tensors["k_proj.weight"], tensors["k_proj.weight_scale"], SCHEMES["fp8_static"],
                            tensors["k_proj.input_scale"]), tensors["k_proj.bias"])
        assert torch.equal(model.k_proj(x), want(x))


def test_load_checkpoint_model_mismatches(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    folder = write_folder(tmp_path / "m", tensors, FP8_DYNAMIC)

    class Wrong(Toy):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Embedding(64, 64)
    with pytest.raises(CheckpointError, match="q_proj.weight.*is a Embedding"):
        load_checkpoint(Wrong(), folder)

    class Narrow(Toy):
        def __init__(self):
            super().__init__()
            self.k_proj = nn.Linear(64, 16)
    with pytest.raises(CheckpointError, match=r"k_proj.weight.*\[32, 64\] does not fit"):
        load_checkpoint(Narrow(), folder)

    class Extra(Toy):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(64)
    with pytest.raises(CheckpointError, match="missing from the checkpoint: norm.weight, norm.bias"):
        load_checkpoint(Extra(), folder)
    result = load_checkpoint(Extra(), folder, strict=False)
    assert result.missing_keys == ["norm.weight", "norm.bias"]


def test_online_quantization_while_loading_plain_checkpoint(tmp_path, gen):
    model = Toy()
    folder = write_folder(tmp_path / "m", {k: v for k, v in model.state_dict().items()})
    with torch.device("meta"):
        target = Toy()
    result = load_checkpoint(target, folder, scheme="int8_dynamic")
    assert sorted(result.quantized) == ["gate_proj", "k_proj", "q_proj", "up_proj", "v_proj"]
    assert type(target.lm_head) is nn.Linear  # default ignore
    expected = quantize_model(model, "int8_dynamic", ignore=["lm_head"])
    x = torch.randn(3, 64, generator=gen)
    assert torch.equal(target.q_proj(x), expected.q_proj(x))


def test_save_quantized_round_trip_static(tmp_path, gen):
    model = quantize_model(Toy(), "fp8_static", ignore=["lm_head"])
    calibrate(model, [torch.randn(4, 64, generator=gen)],
              forward=lambda m, x: [getattr(m, n)(x)
                                    for n in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")])
    save_quantized(model, tmp_path / "out", max_shard_size="8KB")
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    fresh = Toy()
    load_checkpoint(fresh, tmp_path / "out")
    x = torch.randn(2, 64, generator=gen)
    assert torch.equal(fresh.up_proj(x), model.up_proj(x))
    with pytest.raises(FileExistsError, match="--force"):
        save_quantized(model, tmp_path / "out")
    with pytest.raises(ValueError, match="calibrated"):
        save_quantized(quantize_model(Toy(), "fp8_static"), tmp_path / "x")


# ------------------------------------------------------------------------------ bad checkpoints

def _error(folder, *, file: str | None, tensor: str | None, match: str, **kwargs):
    with pytest.raises(CheckpointError, match=match) as info:
        load_quantized(folder, **kwargs)
    err = info.value
    if file is not None:
        assert err.file is not None and Path(err.file).name == file, str(err)
        assert file in str(err)
    if tensor is not None:
        assert err.tensor == tensor and tensor in str(err)
    return err


def test_error_missing_weight_scale(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen, static=True)
    del tensors["k_proj.weight_scale"]
    folder = write_folder(tmp_path / "m", tensors, FP8_STATIC, shards=2)
    shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["k_proj.weight"]
    _error(folder, file=shard, tensor="k_proj.weight", match="missing scale 'k_proj.weight_scale'")


def test_error_missing_input_scale_for_static(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen, static=True)
    del tensors["up_proj.input_scale"]
    _error(write_folder(tmp_path / "m", tensors, FP8_STATIC), file="model.safetensors",
           tensor="up_proj.input_scale", match="missing static activation scale")


@pytest.mark.parametrize("bad", ["nan", "inf", "zero", "negative"])
def test_error_bad_scale_values(tmp_path, gen, bad):
    tensors, _ = toy_checkpoint(gen, granularity="channel")
    s = tensors["v_proj.weight_scale"].clone()
    s[3] = {"nan": float("nan"), "inf": float("inf"), "zero": 0.0, "negative": -1.0}[bad]
    tensors["v_proj.weight_scale"] = s
    _error(write_folder(tmp_path / "m", tensors, FP8_DYNAMIC), file="model.safetensors",
           tensor="v_proj.weight_scale", match="finite and positive")


def test_error_nan_input_scale(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen, static=True)
    tensors["q_proj.input_scale"] = torch.tensor(float("nan"))
    _error(write_folder(tmp_path / "m", tensors, FP8_STATIC), file="model.safetensors",
           tensor="q_proj.input_scale", match="finite and positive")


def test_error_scale_wrong_shape(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen, granularity="channel")
    tensors["gate_proj.weight_scale"] = tensors["gate_proj.weight_scale"][:50]
    _error(write_folder(tmp_path / "m", tensors, FP8_DYNAMIC), file="model.safetensors",
           tensor="gate_proj.weight_scale", match=r"\[50, 1\] is neither per-tensor")
    # compressed-tensors declares the strategy: a per-tensor scale for a channel config is wrong.
    w = QuantizedWeight.from_float(torch.randn(48, 64, generator=gen), SCHEMES["fp8_dynamic_tensor"])
    folder = write_folder(tmp_path / "ct", {"l.weight": w.weight, "l.weight_scale": w.weight_scale},
                          _ct_config("float", "channel", "token"))
    _error(folder, file="model.safetensors", tensor="l.weight_scale",
           match=r"scale shape \[\] does not match the expected \[48, 1\]")


def test_error_block_scale_transposed(tmp_path, gen):
    q, s = qbackend.quantize(torch.randn(384, 256, generator=gen), FP8, "block", block_size=(128, 128))
    config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    folder = write_folder(tmp_path / "m", {"l.weight": q, "l.weight_scale_inv": s.t().contiguous()}, config)
    _error(folder, file="model.safetensors", tensor="l.weight_scale_inv",
           match=r"scale shape \[2, 3\] does not match the expected \[3, 2\]")


def test_error_scale_wrong_dtype(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    tensors["q_proj.weight_scale"] = torch.tensor(3, dtype=torch.int32)
    _error(write_folder(tmp_path / "m", tensors, FP8_DYNAMIC), file="model.safetensors",
           tensor="q_proj.weight_scale", match="scale dtype must be float32.*int32")


def test_bf16_scales_are_accepted(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen, granularity="channel")
    tensors["q_proj.weight_scale"] = tensors["q_proj.weight_scale"].bfloat16()
    got = load_quantized(write_folder(tmp_path / "m", tensors, FP8_DYNAMIC))["q_proj"]
    assert got.weight_scale.dtype == torch.float32


def test_error_weight_dtype_not_matching_config(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    tensors["k_proj.weight"] = torch.zeros(32, 64, dtype=torch.int8)
    _error(write_folder(tmp_path / "a", tensors, FP8_DYNAMIC), file="model.safetensors",
           tensor="k_proj.weight", match="weight dtype int8 does not match the config.*float8_e4m3fn")
    tensors, _ = toy_checkpoint(gen)
    tensors["k_proj.weight"] = torch.randn(32, 64, generator=gen).bfloat16()
    _error(write_folder(tmp_path / "b", tensors, FP8_DYNAMIC), file="model.safetensors",
           tensor="k_proj.weight", match="weight dtype bfloat16 does not match")
    w = QuantizedWeight.from_float(torch.randn(48, 64, generator=gen), SCHEMES["fp8_dynamic"])
    folder = write_folder(tmp_path / "c", {"l.weight": w.weight, "l.weight_scale": w.weight_scale},
                          _ct_config("int", "channel", "token"))
    _error(folder, file="model.safetensors", tensor="l.weight", match="float8_e4m3fn does not match.*int8")


def test_error_quantized_weight_without_config(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    _error(write_folder(tmp_path / "m", tensors, None), file="model.safetensors", tensor=None,
           match="no quantization_config")


def test_error_quantized_layer_in_ignore_list(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    _error(write_folder(tmp_path / "m", tensors, dict(FP8_DYNAMIC, ignored_layers=["q_proj"])),
           file="model.safetensors", tensor="q_proj.weight", match="leaves it unquantized")


@pytest.mark.parametrize("config, match", [
    ({"quant_method": "awq", "bits": 4}, "unknown quant_method 'awq'"),
    ({"quant_method": "fp8", "activation_scheme": "sometimes"}, "activation_scheme"),
    (_ct_config(fmt="pack-quantized"), "format 'pack-quantized' is not supported"),
    (dict(_ct_config(), config_groups={"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}), "only 8-bit"),
    (dict(_ct_config(), config_groups={"g": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "int", "symmetric": False, "strategy": "channel"}}}), "asymmetric"),
    (_ct_config("float", "channel", "token", dynamic=False), "static activation scales must be per-tensor"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be two"),
])
def test_error_unsupported_configs(tmp_path, gen, config, match):
    tensors, _ = toy_checkpoint(gen)
    _error(write_folder(tmp_path / "m", tensors, config), file="config.json", tensor=None, match=match)


def test_error_truncated_file(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    folder = write_folder(tmp_path / "m", tensors, FP8_DYNAMIC, shards=2)
    shard = folder / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    _error(folder, file=shard.name, tensor=None, match="truncated")


def test_error_not_a_safetensors_file(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\x00" * 3)
    _error(folder, file="model.safetensors", tensor=None, match="cannot read safetensors header")


def test_error_index_problems(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen)
    folder = write_folder(tmp_path / "m", tensors, FP8_DYNAMIC, shards=2)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    _error(folder, file="model-00001-of-00002.safetensors", tensor="ghost.weight",
           match="missing from the shard")
    index["weight_map"]["ghost.weight"] = "model-00009-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    _error(folder, file="model-00009-of-00002.safetensors", tensor=None, match="does not exist")
    index_path.write_text("{not json")
    _error(folder, file="model.safetensors.index.json", tensor=None, match="unreadable index")


def test_error_pickle_only_folder_and_missing_folder(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"not loaded, ever")
    _error(folder, file=None, tensor=None, match="pytorch_model.bin: pickled checkpoints are never loaded")
    _error(tmp_path / "nope", file=None, tensor=None, match="not a directory")


def test_error_fp8_weight_wrong_rank(tmp_path, gen):
    q, s = fp8_layer(gen, 4, 64)
    folder = write_folder(tmp_path / "m", {"conv.weight": q.reshape(4, 4, 4, 4), "conv.weight_scale": s},
                          FP8_DYNAMIC)
    _error(folder, file="model.safetensors", tensor="conv.weight", match="must be 2-D")


def test_loaded_layers_are_prepared_for_the_models_dtype(tmp_path, gen):
    tensors, _ = toy_checkpoint(gen, granularity="channel")
    folder = write_folder(tmp_path / "m", tensors, FP8_DYNAMIC)
    with torch.device("meta"):
        model = Toy().to(torch.bfloat16)
    load_checkpoint(model, folder)
    assert list(model.gate_proj._prepared) == [torch.bfloat16]  # no bias to infer it from
    assert model.q_proj.bias.dtype == torch.bfloat16
    y = model.gate_proj(torch.randn(2, 64, generator=gen).bfloat16())
    assert y.dtype == torch.bfloat16 and list(model.gate_proj._prepared) == [torch.bfloat16]
    assert model.lm_head.weight.dtype == torch.bfloat16  # fp32 in the checkpoint, cast on assignment
    assert model.lm_head.weight.device.type == "cpu"


def test_opening_reads_no_tensor_data_and_items_stream(tmp_path, gen, monkeypatch):
    """Headers only at open; then one tensor read at a time, in the order items() yields."""
    from qbackend.formats.safetensors_folder import SafetensorsFolder
    tensors, _ = toy_checkpoint(gen, static=True)
    folder = write_folder(tmp_path / "m", tensors, FP8_STATIC, shards=2)
    reads = []
    original = SafetensorsFolder.get
    monkeypatch.setattr(SafetensorsFolder, "get", lambda self, name, device="cpu": reads.append(name)
                        or original(self, name, device))
    with QuantizedCheckpoint(folder) as ckpt:
        assert reads == []
        items = ckpt.items()
        name, value = next(items)
        assert isinstance(value, QuantizedWeight)
        assert sorted(reads) == sorted([f"{name}.weight", f"{name}.weight_scale", f"{name}.input_scale"])
        rest = dict(items)
    assert len(reads) == len(tensors) and 1 + len(rest) == len(tensors) - 2 * 5
