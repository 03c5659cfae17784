"""accumulate="fast" | "precise" on the GPU: each mode's error against float64 at K up to 28672 with
fp16 and fp32 outputs stays within the bound docs/api.md ("Accumulation") states, and the provider
that serves each mode is the one the rules name.

The error is max|out - ref| / max|ref| over a [64, 1024] output of per-token x per-channel FP8 operands
(random normal data quantized as a model's would be), ref the float64 product of the dequantized
operands. The measured values are printed (pytest -s) for the docs' table."""
import pytest
import torch

import qbackend
from gpu_helpers import needs_sm, poison
from qbackend import registry

pytestmark = pytest.mark.gpu
DEV = "cuda"
E4M3 = torch.float8_e4m3fn
# Of max|ref|. fast: the tensor cores' reduced-precision accumulation grows with K (measured 3e-3 at
# K = 4096, 1.1e-2 to 1.3e-2 at 14336 and 28672 with a bf16 output); precise: partial sums promoted
# into fp32, so what remains is the output's rounding (fp16: 2^-11 of |out|) and fp32 rounding of
# the promoted sums.
BOUND = {"fast": {4096: 1e-2, 14336: 2e-2, 28672: 2e-2},
         "precise": {4096: 2e-3, 14336: 2e-3, 28672: 2e-3}}


def _error(mode, K, out_dtype, g):
    x = torch.randn(64, K, device=DEV, generator=g)
    w = torch.randn(1024, K, device=DEV, generator=g) / K ** 0.5
    qx, sx = qbackend.quantize(x, E4M3, "token")
    qw, sw = qbackend.quantize(w, E4M3, "channel")
    ref = (qx.double() * sx.double()) @ (qw.double() * sw.double()).t()
    poison()
    out = qbackend.scaled_mm(qx, qw.t(), sx, sw.t(), out_dtype=out_dtype, accumulate=mode)
    assert not torch.isnan(out).any()
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


@needs_sm((8, 9), "fp8 tensor cores")
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("K", [4096, 14336, 28672])
@pytest.mark.parametrize("mode", ["fast", "precise"])
def test_error_within_the_stated_bound(mode, K, out_dtype):
    g = torch.Generator(device=DEV).manual_seed(K)
    err = _error(mode, K, out_dtype, g)
    print(f"accumulate={mode} K={K} out={out_dtype}: max error {err:.2e} of max|ref|")
    assert err <= BOUND[mode][K], (mode, K, out_dtype, err)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="cutlass's promoting FP8 family is sm_90a")
@pytest.mark.parametrize("K", [4096, 28672])
def test_cutlass_promoting_family_when_forced(monkeypatch, K):
    """Forced, cutlass serves precise FP8 with its promoting family, within the precise bound (fp16
    output: its kernels write bf16 or fp16)."""
    monkeypatch.setenv("QBACKEND_PROVIDER", "cutlass")
    registry.reload()
    try:
        err = _error("precise", K, torch.float16, torch.Generator(device=DEV).manual_seed(K))
    finally:
        monkeypatch.delenv("QBACKEND_PROVIDER")
        registry.reload()
    print(f"cutlass precise K={K} out=fp16: max error {err:.2e} of max|ref|")
    assert err <= BOUND["precise"][K], (K, err)


@needs_sm((8, 9), "fp8 tensor cores")
def test_precise_is_served_by_a_promoting_provider():
    """By default torch._scaled_mm without fast accumulation (cuBLASLt's promoting kernels)."""
    from qbackend.validate import validate_scaled_mm
    qx, sx = qbackend.quantize(torch.randn(16, 4096, device=DEV), E4M3, "token")
    qw, sw = qbackend.quantize(torch.randn(1024, 4096, device=DEV), E4M3, "channel")
    for mode, expected in (("fast", "cutlass"), ("precise", "torch")):
        p = validate_scaled_mm(qx, qw.t(), sx, sw.t(), torch.bfloat16, None, 128, mode)
        assert qbackend.select(p, torch.device(DEV)).name == expected, mode
