"""`qbackend convert`: float model folder -> compressed-tensors checkpoint that loads back."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from test_checkpoints import write_folder
from torch import nn

from qbackend.cli import main
from qbackend.convert import convert_checkpoint
from qbackend.formats import CheckpointError, load_checkpoint, load_quantized
from qbackend.formats.writer import parse_size
from qbackend.nn import QuantizedWeight, QuantLinear, quantize_model


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(40, 64)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"q_proj": nn.Linear(64, 64), "down_proj": nn.Linear(128, 64),
                           "norm": nn.LayerNorm(64)}) for _ in range(2))
        self.lm_head = nn.Linear(64, 40, bias=False)


def float_folder(path, gen, dtype=torch.float32, shards=1):
    model = Tiny()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model = model.to(dtype)
    folder = write_folder(path, dict(model.state_dict()), shards=shards)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text("{}")
    return model, folder


def test_cli_convert_shards_config_and_load_back(tmp_path, gen, capsys):
    model, src = float_folder(tmp_path / "src", gen, shards=2)
    dst = tmp_path / "dst"
    assert main(["convert", str(src), str(dst), "--scheme", "fp8_dynamic", "--max-shard-size", "20KB"]) == 0
    out = capsys.readouterr()
    assert "4 layers quantized (fp8_dynamic)" in out.out
    assert out.err == ""  # not a terminal: no progress bar
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((dst / s).exists() for s in shards)
    assert (dst / "tokenizer.json").exists() and (dst / "1_Pooling" / "config.json").exists()

    config = json.loads((dst / "config.json").read_text())
    assert config["model_type"] == "toy"
    from compressed_tensors.quantization import QuantizationConfig
    qc = QuantizationConfig.model_validate(config["quantization_config"])
    group = qc.config_groups["group_0"]
    assert (group.weights.strategy, group.input_activations.strategy) == ("channel", "token")
    assert group.input_activations.dynamic is True
    assert sorted(qc.ignore) == ["embed_tokens", "lm_head"]

    # lm_head and embeddings untouched, byte for byte.
    loaded = load_quantized(dst)
    assert torch.equal(loaded["lm_head.weight"], model.lm_head.weight)
    assert torch.equal(loaded["embed_tokens.weight"], model.embed_tokens.weight)
    assert isinstance(loaded["layers.1.down_proj"], QuantizedWeight)

    # Loads back and matches quantizing in memory exactly.
    fresh = Tiny()
    result = load_checkpoint(fresh, dst)
    assert not result.missing_keys and not result.unexpected_keys
    in_memory = quantize_model(model, "fp8_dynamic", ignore=["lm_head"])
    x = torch.randn(3, 128, generator=gen)
    assert torch.equal(fresh.layers[0].down_proj(x), in_memory.layers[0].down_proj(x))


@pytest.mark.parametrize("scheme", ["fp8_dynamic_tensor", "fp8_weight_only", "int8_dynamic", "fp8_block"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_convert_each_scheme_from_half_precision(tmp_path, gen, scheme, dtype):
    model, src = float_folder(tmp_path / "src", gen, dtype=dtype)
    report = convert_checkpoint(src, tmp_path / "dst", scheme, progress=False)
    # fp8_block needs K % 128 == 0: only down_proj (K=128) qualifies.
    expected = 2 if scheme == "fp8_block" else 4
    assert len(report.quantized) == expected
    fresh = Tiny().to(dtype)
    load_checkpoint(fresh, tmp_path / "dst")
    ignore = ["lm_head", "*q_proj"] if scheme == "fp8_block" else ["lm_head"]
    in_memory = quantize_model(model, scheme, ignore=ignore)
    x = torch.randn(2, 128, generator=gen).to(dtype)
    assert isinstance(fresh.layers[1].down_proj, QuantLinear)
    assert fresh.layers[1].down_proj.scheme.name == scheme
    assert torch.equal(fresh.layers[1].down_proj(x), in_memory.layers[1].down_proj(x))


def test_convert_ignore_replaces_defaults(tmp_path, gen):
    _, src = float_folder(tmp_path / "src", gen)
    report = convert_checkpoint(src, tmp_path / "dst", ignore=["*embed*", "re:layers\\.0\\."], progress=False)
    assert sorted(report.quantized) == ["layers.1.down_proj", "layers.1.q_proj", "lm_head"]
    with safe_open(str(tmp_path / "dst" / "model.safetensors"), "pt") as f:
        assert f.get_slice("lm_head.weight").get_dtype() == "F8_E4M3"
        assert f.get_slice("layers.0.q_proj.weight").get_dtype() == "F32"


def test_convert_refuses_to_overwrite_without_force(tmp_path, gen, capsys):
    _, src = float_folder(tmp_path / "src", gen)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "config.json").write_text("{}")
    assert main(["convert", str(src), str(dst)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert main(["convert", str(src), str(dst), "--force"]) == 0
    assert "quantization_config" in json.loads((dst / "config.json").read_text())
    # --force never deletes a folder that is not a model folder.
    other = tmp_path / "home"
    other.mkdir()
    (other / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="does not look like a model folder"):
        convert_checkpoint(src, other, force=True)
    assert (other / "notes.txt").read_text() == "precious"
    with pytest.raises(ValueError, match="must not be the source folder"):
        convert_checkpoint(src, src, force=True)


def test_convert_refusals(tmp_path, gen):
    _, src = float_folder(tmp_path / "src", gen)
    with pytest.raises(ValueError, match="fp8_static needs activation scales from calibration"):
        convert_checkpoint(src, tmp_path / "a", "fp8_static")
    with pytest.raises(SystemExit):  # argparse: not a --scheme choice
        main(["convert", str(src), str(tmp_path / "a"), "--scheme", "fp8_static"])
    convert_checkpoint(src, tmp_path / "q", progress=False)
    with pytest.raises(CheckpointError, match="already quantized"):
        convert_checkpoint(tmp_path / "q", tmp_path / "qq")
    with pytest.raises(ValueError, match="nothing to quantize"):
        convert_checkpoint(src, tmp_path / "b", ignore=["*"])
    with pytest.raises(FileNotFoundError):
        convert_checkpoint(tmp_path / "missing", tmp_path / "c")
    with pytest.raises(ValueError, match="not a number"):
        convert_checkpoint(src, tmp_path / "d", max_shard_size="lots")


def test_failed_convert_leaves_no_output(tmp_path, gen, monkeypatch):
    _, src = float_folder(tmp_path / "src", gen)
    import qbackend.convert as conv

    def boom(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(conv, "write_shards", boom)
    with pytest.raises(OSError, match="disk full"):
        convert_checkpoint(src, tmp_path / "dst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_pickles_are_not_copied(tmp_path, gen):
    _, src = float_folder(tmp_path / "src", gen)
    (src / "training_args.bin").write_bytes(b"pickle")
    report = convert_checkpoint(src, tmp_path / "dst", progress=False)
    assert report.skipped_files == ["training_args.bin"]
    assert not (tmp_path / "dst" / "training_args.bin").exists()


def test_progress_bar_when_asked(tmp_path, gen, capsys):
    _, src = float_folder(tmp_path / "src", gen)
    convert_checkpoint(src, tmp_path / "dst", progress=True)
    assert "convert" in capsys.readouterr().err


def test_parse_size():
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("1.5 kb") == 1500
    assert parse_size(123) == 123
    for bad in ("", "GB", "-1GB", "2 parsecs", 0):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_convert_refuses_a_folder_without_config_json(tmp_path, gen, capsys):
    """Its help says a model folder with config.json: one without is an error, not a checkpoint
    written with a made-up config."""
    _, src = float_folder(tmp_path / "src", gen)
    (src / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        convert_checkpoint(src, tmp_path / "dst", "fp8_dynamic")
    assert main(["convert", str(src), str(tmp_path / "dst2"), "--scheme", "fp8_dynamic"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert not (tmp_path / "dst").exists() and not (tmp_path / "dst2").exists()
