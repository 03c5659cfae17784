"""The non-finite rule (docs/api.md, "Non-finite values") on the CPU: the reference provider and the
torch provider give the same bits for inf, NaN, all-NaN and all-zero granules, subnormals and values
at and past each format's maximum, in every quantize granularity; invalid static scales are refused
on the host and poison q on a device; scaled_mm propagates non-finite scales."""
import math

import pytest
import torch
from nonfinite_corpus import DYNAMIC, FP8_NAN_BYTE, QUANT_DTYPES, X_DTYPES, check_rule, corpus, same_bits, static_scales

import qbackend
from qbackend import registry

E4M3 = torch.float8_e4m3fn


def _forced(monkeypatch, name):
    monkeypatch.setenv("QBACKEND_PROVIDER", name)
    registry.reload()


def _quantize_both(monkeypatch, x, dtype, granularity, **kw):
    out = {}
    for name in ("reference", "torch"):
        _forced(monkeypatch, name)
        out[name] = qbackend.quantize(x, dtype, granularity, **kw)
    return out["reference"], out["torch"]


@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("dtype", QUANT_DTYPES)
def test_dynamic_corpus_reference_equals_torch(monkeypatch, gen, x_dtype, dtype):
    x = corpus(gen).to(x_dtype)
    for granularity, kw in DYNAMIC:
        kw = {k: (torch.tensor(v) if k == "scale_ub" else v) for k, v in kw.items()}
        if kw.get("scale_ub") is not None and math.isinf(kw["scale_ub"].item()):
            with pytest.raises(ValueError, match="scale_ub: must be positive and finite"):
                qbackend.quantize(x, dtype, granularity, **kw)
            continue
        (q_r, s_r), (q_t, s_t) = _quantize_both(monkeypatch, x, dtype, granularity, **kw)
        what = f"{granularity} {kw} {x_dtype} -> {dtype}"
        same_bits(q_t, q_r, what + ": q")
        same_bits(s_t, s_r, what + ": scale")
        if granularity in ("token", "channel") and "scale_ub" not in kw:
            check_rule(x, q_r, s_r, granularity)
        # each row alone as a tensor: its own amax decides
        if granularity == "tensor" and not kw:
            for r in range(x.shape[0]):
                (q1, s1), (q2, s2) = _quantize_both(monkeypatch, x[r:r + 1], dtype, "tensor")
                same_bits(q2, q1, f"{what} row {r}: q")
                same_bits(s2, s1, f"{what} row {r}: scale")
                check_rule(x[r:r + 1], q1, s1.reshape(1, 1), "token")


@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("dtype", QUANT_DTYPES)
def test_static_corpus_reference_equals_torch(monkeypatch, gen, x_dtype, dtype):
    x = corpus(gen).to(x_dtype)
    for name, scale in static_scales(x.shape[0]):
        granularity = "tensor" if scale.numel() == 1 else "token"
        (q_r, s_r), (q_t, _) = _quantize_both(monkeypatch, x, dtype, granularity, scale=scale)
        assert s_r is scale
        same_bits(q_t, q_r, f"static {name} {x_dtype} -> {dtype}")
        # NaN -> the format's NaN (0 in int8); everything else saturates
        nan_byte = 0 if dtype == torch.int8 else FP8_NAN_BYTE
        assert (q_r.view(torch.uint8)[torch.isnan(x)] == nan_byte).all()
        assert not torch.isnan(q_r.float()[~torch.isnan(x)]).any()


def test_nan_quantizes_to_the_positive_nan_byte():
    x = torch.tensor([[math.nan, -math.nan, 1.0]])
    for dtype, byte in ((E4M3, 0x7F), (torch.float8_e5m2, 0x7F), (torch.int8, 0),
                        (torch.float8_e4m3fnuz, 0x80), (torch.float8_e5m2fnuz, 0x80)):
        q, s = qbackend.quantize(x, dtype, scale=torch.tensor(1.0))
        assert q.view(torch.uint8)[0, :2].tolist() == [byte, byte], dtype


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_invalid_static_scales_are_refused_on_the_host(bad):
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match=r"qbackend.quantize: scale: must be positive and finite"):
        qbackend.quantize(x, E4M3, "tensor", scale=torch.tensor(bad))
    per_row = torch.ones(4, 1)
    per_row[2] = bad
    with pytest.raises(ValueError, match=r"scale: must be positive and finite"):
        qbackend.quantize(x, torch.int8, "token", scale=per_row)
    with pytest.raises(ValueError, match=r"qbackend.quantize: scale_ub: must be positive and finite"):
        qbackend.quantize(x, E4M3, "token", scale_ub=torch.tensor(bad))


@pytest.mark.parametrize("name", ["reference", "torch"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_invalid_device_scales_poison_q(name, bad):
    """What a provider does with a scale validation could not read (on a GPU): the same as the
    CUDA kernels, q all NaN (0 in int8), checked here by calling the provider directly."""
    provider = registry.get().providers[name]
    x = torch.randn(4, 32)
    for dtype in QUANT_DTYPES:
        nan_byte = 0 if dtype == torch.int8 else FP8_NAN_BYTE
        q, s = provider.quantize(x, dtype, "tensor", torch.tensor(bad), None, 128, (128, 128), None)
        assert (q.view(torch.uint8) == nan_byte).all(), (name, bad, dtype)
        q, s = provider.quantize(x, dtype, "token", None, torch.tensor(bad), 128, (128, 128), None)
        assert torch.isnan(s).all() and (q.view(torch.uint8) == nan_byte).all(), (name, bad, dtype)


def _exact_operands(dtype, M=8, K=64, N=32):
    """Small integers: every product and sum is exact, so providers agree to the bit."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-4, 5, (M, K), generator=g).float().to(dtype)
    w = torch.randint(-4, 5, (N, K), generator=g).float().to(dtype)
    a[1] = 0  # a zero row: inf * 0 = NaN
    return a, w


def inf_scaled(scale_a, scale_b, M, N) -> torch.Tensor:
    """[M, N] mask of the outputs an infinite scale multiplies."""
    rows = torch.isinf(scale_a.reshape(-1, 1).expand(M, 1))
    cols = torch.isinf(scale_b.reshape(1, -1).expand(1, N))
    return rows | cols


@pytest.mark.parametrize("dtype", [E4M3, torch.int8])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scaled_mm_non_finite_scales(monkeypatch, dtype, out_dtype):
    """The scales multiply the fp32 accumulator as given: a NaN scale makes its row (column) NaN on
    every provider; an inf scale makes it non-finite: +-inf, NaN where the accumulator is 0 in the
    reference, and NaN where a provider applies the scale to the operands first (torch's CPU
    _scaled_mm: inf * a zero element). Elsewhere the bits are the same."""
    a, w = _exact_operands(dtype)
    M, N = a.shape[0], w.shape[0]
    sa = torch.tensor([0.5, math.inf, math.nan, 2.0, -math.inf, 1.0, 0.25, 1.0]).reshape(M, 1)
    sb = torch.full((1, N), 0.5)
    sb[0, 3], sb[0, 9], sb[0, 17] = math.nan, math.inf, -math.inf
    cases = [(sa, sb), (torch.tensor(math.nan), torch.tensor(1.0)), (torch.tensor(1.0), torch.tensor(math.inf)),
             (sa, torch.tensor(0.5)), (torch.tensor(2.0), sb)]
    for scale_a, scale_b in cases:
        outs = {}
        for name in ("reference", "torch"):
            _forced(monkeypatch, name)
            outs[name] = qbackend.scaled_mm(a, w.t(), scale_a, scale_b, out_dtype=out_dtype)
        ref = outs["reference"]
        inf = inf_scaled(scale_a, scale_b, M, N)
        what = f"scaled_mm {dtype} -> {out_dtype}, scales {list(scale_a.shape)} x {list(scale_b.shape)}"
        same_bits(outs["torch"][~inf], ref[~inf], what)
        assert not torch.isfinite(outs["torch"][inf]).any() and not torch.isfinite(ref[inf]).any(), what
        acc = a.float() @ w.float().t()
        want = (scale_a.reshape(-1, 1) if scale_a.numel() > 1 else scale_a) * \
               (scale_b.reshape(1, -1) if scale_b.numel() > 1 else scale_b) * acc
        same_bits(ref, want.to(out_dtype), "reference against the rule")
