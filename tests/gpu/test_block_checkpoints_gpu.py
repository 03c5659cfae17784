"""Block-scaled FP8 checkpoints on the GPU: a DeepSeek-style folder (quant_method fp8,
weight_block_size, weight_scale_inv) and a compressed-tensors one (block weights, per-group dynamic
activations) load into QuantLinear, run on the native block kernel where the device has one, and
agree with the dequantized weight."""
import pytest
import torch
from test_checkpoints import _ct_config, write_folder

import qbackend
from qbackend.formats import load_quantized
from qbackend.nn import QuantizedWeight, QuantLinear
from qbackend.nn.schemes import SCHEMES

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

FP8 = torch.float8_e4m3fn
# The native block kernels serve sm_90 when the library has them; elsewhere the torch provider does.
NATIVE = torch.cuda.get_device_capability() == (9, 0)


def _deepseek_folder(path, gen):
    w = torch.randn(2112, 1024, generator=gen) / 32
    q, s = qbackend.quantize(w, FP8, "block", block_size=(128, 128))
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    return write_folder(path, {"mlp.weight": q, "mlp.weight_scale_inv": s}, config), q, s


def _compressed_tensors_folder(path, gen):
    qw = QuantizedWeight.from_float(torch.randn(768, 512, generator=gen) / 23, SCHEMES["fp8_block"])
    config = _ct_config("float", "block", "group", block=[128, 128])
    return write_folder(path, {"a.weight": qw.weight, "a.weight_scale": qw.weight_scale}, config), \
        qw.weight, qw.weight_scale


@pytest.mark.parametrize("make", [_deepseek_folder, _compressed_tensors_folder], ids=["deepseek", "compressed"])
@pytest.mark.parametrize("M", [1, 17, 300])
def test_block_checkpoint_runs_on_the_block_kernel(tmp_path, make, M):
    gen = torch.Generator().manual_seed(M)
    folder, q, s = make(tmp_path / "m", gen)
    (name, got), = load_quantized(folder).items()
    assert got.scheme.name == "fp8_block"
    layer = QuantLinear.from_quantized(got, dtype=torch.bfloat16).cuda()
    x = torch.randn(M, q.shape[1], generator=gen).to(torch.bfloat16).cuda()
    y = layer(x)
    served = layer._prepared[torch.bfloat16].weight.provider
    if NATIVE:
        assert served == "cutlass", f"{name}: served by {served}"
    else:
        assert served != "reference", f"{name}: served by the reference provider"
    ref = x.float() @ qbackend.dequantize(q, s, torch.float32).cuda().t()
    assert torch.isfinite(y).all()
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < 0.03, (name, rel)  # activation quantization (1 x 128 groups) plus bf16 output
