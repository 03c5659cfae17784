"""prepare_weight + linear: weights laid out once per provider, used per call."""
import pytest
import torch

import qbackend
from helpers import assert_close, oracle_scaled_mm


@pytest.mark.parametrize("act,gran,wgran", [
    (torch.float8_e4m3fn, "token", "channel"), (torch.float8_e4m3fn, "tensor", "tensor"),
    (torch.int8, "token", "channel"), (torch.bfloat16, "tensor", "channel"),
    (torch.float8_e4m3fn, "group", "block")])
def test_linear_matches_scaled_mm(act, gran, wgran, gen):
    N, K = 96, 256
    w = torch.randn(N, K, generator=gen)
    wdtype = torch.int8 if act == torch.int8 else torch.float8_e4m3fn
    qw, sw = qbackend.quantize(w, wdtype, wgran)
    pw = qbackend.prepare_weight(qw, sw, act, gran, bias=True,
                                 out_dtype=torch.float16 if act != torch.bfloat16 else None)
    assert pw.provider == "reference" and pw.layout == "nk" and (pw.N, pw.K) == (N, K)
    x = torch.randn(3, 7, K, generator=gen)
    if act in (torch.bfloat16,):
        a, sa = x.to(act), None
        bias = torch.randn(N, generator=gen).to(act)
        out = qbackend.linear(a, pw, None, bias)
    else:
        a, sa = qbackend.quantize(x, act, gran)
        bias = torch.randn(N, generator=gen).half()
        out = qbackend.linear(a, pw, sa, bias, out_dtype=torch.float16)
    direct = qbackend.scaled_mm(a, qw.t(), sa, pw.scale, out_dtype=out.dtype, bias=bias)
    torch.testing.assert_close(out, direct, rtol=0, atol=0)
    assert out.shape == (3, 7, N)
    assert_close(out.reshape(21, N), oracle_scaled_mm(a.reshape(21, K), qw.t(),
                 None if sa is None else (sa.reshape(21, -1) if sa.numel() > 1 else sa), pw.scale, bias),
                 8e-3 if out.dtype == torch.bfloat16 else 1e-3)


def test_linear_errors(gen):
    qw, sw = qbackend.quantize(torch.randn(32, 64, generator=gen), torch.float8_e4m3fn, "channel")
    pw = qbackend.prepare_weight(qw, sw, torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="weight: must be a PreparedWeight"):
        qbackend.linear(torch.zeros(2, 64, dtype=torch.float8_e4m3fn), qw)
    with pytest.raises(ValueError, match="K rows"):
        qbackend.linear(torch.zeros(2, 32, dtype=torch.float8_e4m3fn), pw, torch.ones(2, 1))
    with pytest.raises(ValueError, match="w_scale: shape"):
        qbackend.prepare_weight(qw, torch.ones(3, 3, 3), torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="activation"):
        qbackend.prepare_weight(qw, sw, torch.float32)


def test_linear_compiles(gen):
    qw, sw = qbackend.quantize(torch.randn(32, 64, generator=gen), torch.float8_e4m3fn, "channel")
    pw = qbackend.prepare_weight(qw, sw, torch.float8_e4m3fn)

    def f(x):
        qx, sx = qbackend.quantize(x, torch.float8_e4m3fn, "token")
        return qbackend.linear(qx, pw, sx)

    x = torch.randn(4, 64, generator=gen)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x), rtol=0, atol=0)


@pytest.mark.parametrize("act", [torch.float8_e4m3fn, torch.int8, torch.bfloat16])
def test_prepare_weight_pads_rows_that_are_not_16_byte_multiples(act, gen):
    """A K whose 8-bit rows are not whole 16-byte units (K = 40) used to fail inside
    prepare_weight with an error about a stand-in activation; the weight is now copied into rows
    padded to 16 bytes, the layout scaled_mm takes, and a weight whose rows already are so (a window
    of a wider tensor) is kept as it is."""
    N, K = 24, 40
    wdtype = torch.int8 if act == torch.int8 else torch.float8_e4m3fn
    qw, sw = qbackend.quantize(torch.randn(N, K, generator=gen), wdtype, "channel")
    pw = qbackend.prepare_weight(qw, sw, act)
    assert pw.data.shape == (N, K) and pw.data.stride() == (48, 1)
    assert torch.equal(pw.data.view(torch.uint8), qw.view(torch.uint8))
    x = torch.randn(5, 48, generator=gen)[:, :K]          # an activation with 16-byte rows
    if act == torch.bfloat16:
        a, sa = x.to(act), None
    else:
        a, sa = qbackend.quantize(torch.randn(5, 48, generator=gen), act, "token")
        a = a[:, :K]
    out = qbackend.linear(a, pw, sa)
    assert_close(out, oracle_scaled_mm(a, qw.t(), sa, pw.scale), 8e-3)
    wide, _ = qbackend.quantize(torch.randn(N, 48, generator=gen), wdtype, "channel")
    window = wide[:, :K]
    assert qbackend.prepare_weight(window, sw, act).data.data_ptr() == window.data_ptr()
