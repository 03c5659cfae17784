"""The fnuz formats of gfx942 (MI300): e4m3fn checkpoints loaded there become e4m3fnuz with the
scale doubled, the NaN and -0 encodings handled, and quantize maps amax to the formats' own
maxima (240 for e4m3fnuz, 57344 for e5m2fnuz)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import qbackend
from qbackend import dtypes as qd
from qbackend import fp8 as qfp8
from qbackend import probe
from qbackend.probe import DeviceInfo

E4M3, FZ4, FZ5 = torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_every_e4m3fn_pattern_maps_as_stated():
    """Same bits, half the value, doubled scale; -0 (0x80) becomes 0x00 (0x80 is fnuz's NaN), and
    e4m3fn's NaNs (0x7F, 0xFF) become fnuz NaN (0x80)."""
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(E4M3)
    scale = torch.tensor([0.75])
    qz, s2 = qbackend.to_fnuz(q, scale)
    assert qz.dtype == FZ4 and torch.equal(s2, scale * 2)
    out = bits(qz).long()
    expected = torch.arange(256)
    expected[0x80] = 0x00
    expected[0x7F] = expected[0xFF] = 0x80
    assert torch.equal(out, expected)
    finite = ~torch.isnan(q.float())
    assert torch.equal((qz.float() * s2)[finite], (q.float() * scale)[finite])   # the values, exactly
    assert qz.float()[0x7E].item() == 224.0 and qz.float()[0xFE].item() == -224.0  # 448 -> 224 x 2


def test_to_fnuz_refuses_other_dtypes():
    with pytest.raises(TypeError, match=r"qbackend.to_fnuz: q: dtype must be float8_e4m3fn; got float8_e5m2"):
        qbackend.to_fnuz(torch.zeros(4, dtype=torch.float8_e5m2), torch.tensor(1.0))


@pytest.mark.parametrize("dtype,qmax", [(FZ4, 240.0), (FZ5, 57344.0)])
def test_quantize_maps_amax_to_the_format_maximum(dtype, qmax, gen):
    assert qd.qmax(dtype) == qmax
    x = torch.randn(4, 64, generator=gen)
    x[1, 3] = -7.5                      # the largest magnitude of row 1
    q, s = qbackend.quantize(x, dtype, "token")
    assert torch.equal(s, (x.abs().amax(-1, keepdim=True) / qmax).clamp_min(1 / (qmax * 512)))
    assert q[1, 3].float().item() == -qmax and q.float().abs().max().item() == qmax
    # Static: values past qmax * scale saturate to qmax, and no -0 or NaN pattern appears.
    q, _ = qbackend.quantize(torch.tensor([[1e6, -1e6, -0.0]]), dtype, scale=torch.tensor(1.0))
    assert q.float().tolist() == [[qmax, -qmax, 0.0]] and bits(q)[0, 2].item() == 0


def _mi300_for_cpu(monkeypatch):
    """Make CPU tensors look like they live on a gfx942 for the fp8 format choice only (selection
    still sees the CPU, where the reference provider computes)."""
    mi300 = DeviceInfo(backend="hip", index=0, name="AMD Instinct MI300X", arch="gfx942",
                       fp8_dtypes=probe.native_fp8("gfx942"))
    monkeypatch.setattr(qfp8, "device_info", lambda device=None: mi300)


def _checkpoint(folder, gen, static):
    """An FP8 checkpoint of one 64 -> 32 linear layer, e4m3fn weight with a -0 (0x80) in it."""
    w = torch.randn(32, 64, generator=gen) / 8
    q, s = qbackend.quantize(w, E4M3)
    q = q.clone()
    bits(q)[0, :4] = 0x80
    tensors = {"proj.weight": q, "proj.weight_scale": s.reshape(1), "proj.bias": torch.randn(32, generator=gen)}
    if static:
        tensors["proj.input_scale"] = torch.tensor([0.02])
    folder.mkdir()
    config = {"quantization_config": {"quant_method": "fp8", "activation_scheme": "static" if static else "dynamic"}}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return q, s


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32)

    def forward(self, x):
        return self.proj(x)


@pytest.mark.parametrize("static", [False, True])
def test_e4m3fn_checkpoint_loaded_on_gfx942(tmp_path, gen, monkeypatch, static):
    q, s = _checkpoint(tmp_path / "ckpt", gen, static)
    x = torch.randn(5, 64, generator=gen)
    on_cpu = Model()
    qbackend.load_checkpoint(on_cpu, tmp_path / "ckpt")
    _mi300_for_cpu(monkeypatch)
    on_mi300 = Model()
    qbackend.load_checkpoint(on_mi300, tmp_path / "ckpt")
    layer = on_mi300.proj
    prepared = layer._prepared[torch.float32]
    # The checkpoint's bits stay in the layer (state_dict is still the checkpoint) ...
    assert layer.weight.dtype == E4M3 and torch.equal(bits(layer.weight), bits(q))
    # ... and what the kernels read is e4m3fnuz with the scales doubled, -0 now 0x00.
    assert prepared.weight.dtype == FZ4 and prepared.act_dtype == FZ4
    w_fnuz = prepared.weight.data if prepared.weight.layout == "nk" else None
    assert w_fnuz is not None and bits(w_fnuz)[0, :4].tolist() == [0, 0, 0, 0]
    assert torch.equal(bits(w_fnuz)[:, 4:], bits(q)[:, 4:]) and torch.equal(bits(w_fnuz)[1:], bits(q)[1:])
    assert torch.equal(prepared.weight.scale.reshape(()), s.reshape(()) * 2)
    if static:
        assert prepared.input_scale.item() == pytest.approx(0.04)
    # The weight's values are exactly the checkpoint's.
    assert torch.equal(w_fnuz.float() * prepared.weight.scale.reshape(()), q.float() * s.reshape(()))
    # Only the activations' rounding differs (fnuz steps are those of e4m3fn at half the range).
    ref = on_cpu(x)
    assert (on_mi300(x) - ref).abs().max() <= 0.05 * ref.abs().max()
