"""GGUF reading: files written with the gguf package's own writer and quantizer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qbackend.formats import CheckpointError, load_gguf
from qbackend.nn import QuantizedWeight, QuantLinear

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def write_gguf(path, tensors: dict[str, tuple[np.ndarray, object]]):
    """tensors: name -> (float32 array in torch [rows, cols] order, GGML type)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (data, qtype) in tensors.items():
        if qtype == Q.F32:
            w.add_tensor(name, data.astype(np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def arrays(gen):
    def make(*shape):
        return torch.randn(*shape, generator=gen).numpy().astype(np.float32)
    return make


def test_float_types_and_q8_0_to_int8(tmp_path, arrays):
    attn, norm, emb, emb16 = arrays(96, 128), arrays(128), arrays(50, 128), arrays(50, 64)
    bf = arrays(16, 64)
    path = write_gguf(tmp_path / "m.gguf", {
        "blk.0.attn_q.weight": (attn, Q.Q8_0), "blk.0.attn_norm.weight": (norm, Q.F32),
        "token_embd.weight": (emb, Q.F16), "extra.weight": (emb16, Q.F16), "bf.weight": (bf, Q.BF16)})
    m = load_gguf(path)  # default: Q8_0 -> int8_dynamic
    assert m.architecture == "llama"
    assert m.types == {"blk.0.attn_q.weight": "Q8_0", "blk.0.attn_norm.weight": "F32",
                       "token_embd.weight": "F16", "extra.weight": "F16", "bf.weight": "BF16"}
    assert torch.equal(m.tensors["blk.0.attn_norm.weight"], torch.from_numpy(norm))
    assert m.tensors["token_embd.weight"].dtype == torch.float16
    assert torch.equal(m.tensors["token_embd.weight"], torch.from_numpy(emb).half())
    assert m.tensors["bf.weight"].dtype == torch.bfloat16
    assert torch.equal(m.tensors["bf.weight"], torch.from_numpy(bf).bfloat16())

    q = m.tensors["blk.0.attn_q.weight"]
    assert isinstance(q, QuantizedWeight) and q.scheme.name == "int8_dynamic"
    assert q.weight.shape == (96, 128) and q.weight.dtype == torch.int8 and q.weight_scale.shape == (96, 1)
    # The reported error is measured against the exact Q8_0 values (gguf's own dequantizer).
    exact = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(attn, Q.Q8_0), Q.Q8_0))
    diff = q.dequantize() - exact
    err = m.requantization_error["blk.0.attn_q.weight"]
    assert err.relative == pytest.approx(float(diff.norm() / exact.norm()), rel=1e-5)
    assert err.max_abs == pytest.approx(float(diff.abs().max()), rel=1e-5)
    assert 0 < err.relative < 0.02  # int8 per channel of int8 blocks: close
    assert set(m.requantization_error) == {"blk.0.attn_q.weight"}

    layer = QuantLinear.from_quantized(q)
    x = torch.randn(4, 128)
    ref = x @ exact.t()
    assert (layer(x) - ref).norm() / ref.norm() < 0.02


def test_q8_0_dequantized_exactly_without_scheme(tmp_path, arrays):
    w = arrays(64, 96)
    path = write_gguf(tmp_path / "m.gguf", {"w": (w, Q.Q8_0)})
    got = load_gguf(path, scheme=None).tensors["w"]
    want = gguf.quants.dequantize(gguf.quants.quantize(w, Q.Q8_0), Q.Q8_0)
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("scheme", ["fp8_dynamic", "fp8_weight_only"])
def test_q8_0_to_fp8(tmp_path, arrays, scheme):
    path = write_gguf(tmp_path / "m.gguf", {"w": (arrays(64, 128), Q.Q8_0)})
    m = load_gguf(path, scheme=scheme)
    q = m.tensors["w"]
    assert q.weight.dtype == torch.float8_e4m3fn and q.scheme.name == scheme
    # FP8 keeps ~3 mantissa bits: a few percent, worse than INT8 and reported as such.
    assert 0.005 < m.requantization_error["w"].relative < 0.06
    assert m.requantization_error["w"].relative > load_gguf(path).requantization_error["w"].relative


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_1])
def test_unsupported_type_is_refused_by_name(tmp_path, arrays, qtype):
    path = write_gguf(tmp_path / "m.gguf", {"ok": (arrays(32, 64), Q.F32),
                                            "blk.3.ffn_up.weight": (arrays(32, 64), qtype)})
    with pytest.raises(CheckpointError, match=f"unsupported GGUF type {qtype.name}") as info:
        load_gguf(path)
    assert info.value.tensor == "blk.3.ffn_up.weight" and "m.gguf" in str(info.value)


def test_bad_files(tmp_path, arrays):
    path = write_gguf(tmp_path / "m.gguf", {"w": (arrays(64, 64), Q.Q8_0)})
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated or not a GGUF file") as info:
        load_gguf(tmp_path / "cut.gguf")
    assert info.value.file.endswith("cut.gguf")
    (tmp_path / "text.gguf").write_bytes(b"hello " * 20)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load_gguf(tmp_path / "text.gguf")
    with pytest.raises(CheckpointError, match="no such GGUF file"):
        load_gguf(tmp_path / "absent.gguf")
    with pytest.raises(ValueError, match="calibrated"):
        load_gguf(path, scheme="fp8_static")
