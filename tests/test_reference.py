"""The reference provider against float64 math: fresh random inputs, odd shapes, sliced views,
every scale granularity and output dtype."""
import itertools

import pytest
import torch

import qbackend
from helpers import assert_close, oracle_scaled_mm, rand_q, rand_scale

RTOL = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 2e-5}
W8A8_DTYPES = [(torch.float8_e4m3fn, torch.float8_e4m3fn), (torch.float8_e5m2, torch.float8_e4m3fn),
               (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz), (torch.int8, torch.int8)]


def scale_for(kind, M, K, N, gen, side):
    if kind == "tensor":
        return rand_scale((), gen)
    if side == "a":
        return rand_scale((M, 1), gen) if kind == "token" else rand_scale((M, K // 32), gen)
    if kind == "channel":
        return rand_scale((1, N), gen)
    return rand_scale((K // 32, (N + 31) // 32), gen)  # 32 x 32 blocks, the last N block partial


@pytest.mark.parametrize("a_dtype,b_dtype", W8A8_DTYPES)
@pytest.mark.parametrize("sa_kind,sb_kind", [("tensor", "tensor"), ("token", "channel"),
                                             ("tensor", "channel"), ("token", "tensor"),
                                             ("group", "block")])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_w8a8_matches_float64(a_dtype, b_dtype, sa_kind, sb_kind, out_dtype, gen):
    M, K, N = 37, 96, 200  # odd M, N not a multiple of 128
    a = rand_q((M, K), a_dtype, gen)
    b = rand_q((N, K), b_dtype, gen).t()
    sa, sb = scale_for(sa_kind, M, K, N, gen, "a"), scale_for(sb_kind, M, K, N, gen, "b")
    bias = torch.randn(N, generator=gen).to(out_dtype)
    out = qbackend.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, bias=bias, group_size=32)
    assert out.dtype == out_dtype and out.shape == (M, N)
    assert_close(out, oracle_scaled_mm(a, b, sa, sb, bias, g=32), RTOL[out_dtype], f"{sa_kind}x{sb_kind}")


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sb_kind", ["tensor", "channel", "block"])
def test_w8a16_matches_float64(act, sb_kind, gen):
    M, K, N = 5, 256, 48
    a = torch.randn(M, K, generator=gen).to(act)
    b = rand_q((N, K), torch.float8_e4m3fn, gen).t()
    sb = {"tensor": rand_scale((), gen), "channel": rand_scale((N,), gen),
          "block": rand_scale((2, N), gen)}[sb_kind]
    out = qbackend.scaled_mm(a, b, None, sb)
    assert out.dtype == act
    assert_close(out, oracle_scaled_mm(a, b, None, sb), RTOL[act])


def test_sliced_views_and_batch_dims(gen):
    """Row-strided A (a column slice of a wider buffer), B with padded columns, leading batch dims."""
    M, K, N = 24, 64, 48
    wide = rand_q((M, K + 32), torch.float8_e4m3fn, gen)
    a = wide[:, 16:16 + K]                      # row stride K + 32, 16-byte aligned start
    wpad = rand_q((N, K + 16), torch.float8_e4m3fn, gen)
    b = wpad[:, :K].t()                         # column stride K + 16
    assert not a.is_contiguous() and b.stride(1) == K + 16
    sa, sb = rand_scale((M, 1), gen), rand_scale((N,), gen)
    out = qbackend.scaled_mm(a, b, sa, sb)
    assert_close(out, oracle_scaled_mm(a, b, sa, sb), RTOL[torch.bfloat16], "sliced")
    out3 = qbackend.scaled_mm(a.reshape(4, 6, K), b, sa.reshape(4, 6, 1), sb)
    assert out3.shape == (4, 6, N)
    torch.testing.assert_close(out3.reshape(M, N), out, rtol=0, atol=0)


def test_m_zero_returns_empty():
    a = torch.empty(0, 32, dtype=torch.float8_e4m3fn)
    b = torch.zeros(16, 32, dtype=torch.float8_e4m3fn).t()
    out = qbackend.scaled_mm(a, b, torch.ones(()), torch.ones(()))
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16
    a3 = torch.empty(2, 0, 32, dtype=torch.float8_e4m3fn)
    assert qbackend.scaled_mm(a3, b, torch.ones(2, 0, 1), torch.ones(16)).shape == (2, 0, 16)


def test_int8_accumulation_is_exact(gen):
    """Worst-case int8 magnitudes over a long K: float32 accumulation would round, int32 would not."""
    M, K, N = 4, 8192, 16
    a = torch.full((M, K), -128, dtype=torch.int8)
    a[:, ::2] = 127
    b = torch.full((N, K), 127, dtype=torch.int8).t()
    out = qbackend.scaled_mm(a, b, torch.ones(()), torch.ones(()), out_dtype=torch.float32)
    exact = (a.long() @ b.long()).double()
    assert torch.equal(out.double(), exact.float().double())


# --- quantize -------------------------------------------------------------------------------

QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0, torch.float8_e4m3fnuz: 240.0,
        torch.float8_e5m2fnuz: 57344.0, torch.int8: 127.0}


def oracle_quantize_rows(x, dtype, scale_ub=None):
    """Per-row dynamic quantization written out element by element in float64 terms."""
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub)
    scale = torch.maximum(amax / torch.full_like(amax, QMAX[dtype]), torch.tensor(1.0 / (QMAX[dtype] * 512)))
    v = xf / scale
    if dtype == torch.int8:
        return torch.round(v).clamp(-128, 127).to(torch.int8), scale
    return v.clamp(-QMAX[dtype], QMAX[dtype]).to(dtype), scale


@pytest.mark.parametrize("dtype", list(QMAX))
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dynamic_per_token(dtype, x_dtype, gen):
    x = (torch.randn(7, 3, 48, generator=gen) * 10).to(x_dtype)
    x[0, 0] = 0  # an all-zero row takes the minimum scale
    q, s = qbackend.quantize(x, dtype, "token")
    assert q.dtype == dtype and s.shape == (7, 3, 1) and s.dtype == torch.float32
    ref_q, ref_s = oracle_quantize_rows(x, dtype)
    assert torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    back = qbackend.dequantize(q, s, torch.float32)
    assert (back - x.float()).abs().max() <= s.max() * (QMAX[dtype] / 8 if dtype != torch.int8 else 0.51)


def test_per_tensor_static_and_scale_ub(gen):
    x = torch.randn(16, 64, generator=gen) * 5
    q, s = qbackend.quantize(x, torch.float8_e4m3fn, "tensor")
    assert s.shape == () and torch.equal(s, (x.abs().max() / 448).clamp_min(1 / (448 * 512)))
    static = torch.tensor(0.001)
    q2, s2 = qbackend.quantize(x, torch.float8_e4m3fn, scale=static)
    assert s2 is static
    assert q2.float().abs().max() == 448  # saturated, not inf/NaN
    ub = torch.tensor([1.0])
    q3, s3 = qbackend.quantize(x, torch.float8_e4m3fn, "token", scale_ub=ub)
    ref_q, ref_s = oracle_quantize_rows(x, torch.float8_e4m3fn, ub)
    assert torch.equal(s3, ref_s) and torch.equal(q3.view(torch.uint8), ref_q.view(torch.uint8))


def test_int8_rounds_half_to_even():
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, 127.0, 300.0, -300.0]])
    q, _ = qbackend.quantize(x, torch.int8, "tensor", scale=torch.tensor(1.0))
    assert q.tolist() == [[0, 2, 2, 0, -2, 127, 127, -128]]


def test_group_block_channel_shapes_and_roundtrip(gen):
    w = torch.randn(300, 256, generator=gen)
    for gran, shape in [("channel", (300, 1)), ("group", (300, 2)), ("block", (3, 2))]:
        q, s = qbackend.quantize(w, torch.float8_e4m3fn, gran)
        assert s.shape == shape, gran
        back = qbackend.dequantize(q, s, torch.float32)
        rel = ((back - w).abs().max() / w.abs().max()).item()
        assert rel < 0.07, (gran, rel)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_quantize_then_scaled_mm_end_to_end(dtype, gen):
    x = torch.randn(33, 128, generator=gen)
    w = torch.randn(80, 128, generator=gen)
    qx, sx = qbackend.quantize(x, dtype, "token")
    qw, sw = qbackend.quantize(w, dtype, "channel")
    y = qbackend.scaled_mm(qx, qw.t(), sx, sw.t(), out_dtype=torch.float32)
    ref = x @ w.t()
    rel = ((y - ref).abs().max() / ref.abs().max()).item()
    assert rel < (0.08 if dtype != torch.int8 else 0.03), rel


def test_every_quant_combination_runs(gen):
    x = torch.randn(8, 256, generator=gen).to(torch.bfloat16)
    for dtype, gran in itertools.product(QMAX, ["tensor", "token", "group"]):
        q, s = qbackend.quantize(x, dtype, gran, group_size=64)
        assert not torch.isnan(qbackend.dequantize(q, s, torch.float32, group_size=64)).any()


@pytest.mark.parametrize("dtype", list(QMAX))
def test_group_quantize_with_a_shorter_last_group(dtype, gen):
    """K = 7232 = 56 x 128 + 64 (DeepSeek's K with a 64-wide tail): ceil(K/128) scales per row, the
    last over 64 columns; each group quantized on its own must give the same bytes and scale."""
    x = (torch.randn(5, 7232, generator=gen) * torch.logspace(-3, 3, 5).reshape(5, 1)).to(torch.bfloat16)
    q, s = qbackend.quantize(x, dtype, "group", group_size=128)
    assert q.shape == x.shape and s.shape == (5, 57)
    for g in range(57):
        part = x[:, g * 128:(g + 1) * 128]
        qg, sg = qbackend.quantize(part, dtype, "token")
        assert torch.equal(sg.reshape(5), s[:, g]), g
        assert torch.equal(qg.view(torch.uint8), q[:, g * 128:(g + 1) * 128].view(torch.uint8)), g
    back = qbackend.dequantize(q, s, torch.float32, group_size=128)
    rel = ((back - x.float()).abs() / x.float().abs().amax(dim=1, keepdim=True)).max().item()
    # half a step of the format's mantissa, relative to the row's largest value
    assert rel <= 1.01 * {torch.int8: 0.5 / 127}.get(dtype, 2.0 ** -4 if "e4m3" in str(dtype) else 2.0 ** -3), rel


def test_group_size_is_never_guessed(gen):
    """Scales carry no group size: a count that fits only another size is an error, not a guess."""
    x = torch.randn(4, 240, generator=gen)
    q, s = qbackend.quantize(x, torch.float8_e4m3fn, "group", group_size=120)
    assert s.shape == (4, 2)
    back = qbackend.dequantize(q, s, torch.float32, group_size=120)
    assert ((back - x).abs().max() / x.abs().max()).item() < 0.07
    w = torch.randn(200, 200, generator=gen)
    qw, sw = qbackend.quantize(w, torch.float8_e4m3fn, "block", block_size=(64, 64))
    assert sw.shape == (4, 4)
    with pytest.raises(ValueError, match="blocks of"):
        qbackend.dequantize(qw, sw)  # 4 blocks do not fit 128-wide blocks of 200
    back = qbackend.dequantize(qw, sw, torch.float32, block_size=(64, 64))
    assert ((back - w).abs().max() / w.abs().max()).item() < 0.07
    qa, sa = qbackend.quantize(torch.randn(3, 240, generator=gen), torch.float8_e4m3fn, "group", group_size=120)
    b = rand_q((16, 240), torch.float8_e4m3fn, gen).t()
    out = qbackend.scaled_mm(qa, b, sa, torch.ones(()), out_dtype=torch.float32, group_size=120)
    assert_close(out, oracle_scaled_mm(qa, b, sa, torch.ones(()), g=120), RTOL[torch.float32])
    with pytest.raises(ValueError, match="group_size=64"):
        qbackend.scaled_mm(qa, b, sa, torch.ones(()), group_size=64)  # 64 needs 4 groups, not 2


def test_empty_dynamic_quantize_scale_is_defined():
    q, s = qbackend.quantize(torch.empty(0, 16), torch.float8_e4m3fn, "tensor")
    assert q.shape == (0, 16) and s.item() == pytest.approx(1 / (448 * 512), rel=1e-6)
