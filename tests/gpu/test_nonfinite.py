"""The non-finite rule (docs/api.md, "Non-finite values") on a GPU: the native providers against the
reference provider on the CPU, bit for bit, NaN positions included.

- quantize: the corpus of tests/nonfinite_corpus.py (inf, -inf, NaN, all-NaN and all-zero rows,
  subnormals, values at and past each format's maximum), bf16/fp16/fp32 input, e4m3fn/e5m2/int8,
  every granularity (the cutlass kernels serve dynamic tensor and token and static tensor; the others
  go to the torch provider on the GPU, which is checked too), static scales, scale_ub;
- invalid static scales and scale_ub on the device: q all NaN (0 in int8), NaN scales, no error;
- the kernels directly (native.quantize), for each of their modes and both the 16-byte and the
  scalar path (odd column counts);
- scaled_mm (cutlass fp8 and int8, marlin and cutlass W8A16) with NaN and infinite scales: NaN rows
  and columns where the reference has them, non-finite outputs under infinite scales, the same bits
  elsewhere.
"""
import math

import pytest
import torch
from nonfinite_corpus import DYNAMIC, FP8_NAN_BYTE, QUANT_DTYPES, X_DTYPES, check_rule, corpus, same_bits, static_scales

import qbackend
from qbackend import registry

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from qbackend_providers import native  # noqa: E402

DEV = "cuda"
E4M3 = torch.float8_e4m3fn


def _use(monkeypatch, name):
    monkeypatch.setenv("QBACKEND_PROVIDER", name)
    registry.reload()


def _reference_cpu(monkeypatch, x, dtype, granularity, **kw):
    _use(monkeypatch, "reference")
    cpu_kw = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return qbackend.quantize(x.cpu(), dtype, granularity, **cpu_kw)


@pytest.mark.parametrize("provider", ["cutlass", "torch"])
@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("dtype", QUANT_DTYPES)
def test_quantize_corpus_bit_equal(monkeypatch, gen, provider, x_dtype, dtype):
    x = corpus(gen).to(x_dtype)
    xg = x.to(DEV)
    cases = [(g, kw) for g, kw in DYNAMIC if not (isinstance(kw.get("scale_ub"), float)
                                                  and math.isinf(kw["scale_ub"]))]
    cases += [("tensor" if s.numel() == 1 else "token", {"scale": s}) for _, s in static_scales(x.shape[0])]
    for granularity, kw in cases:
        kw = {k: (torch.tensor(v) if isinstance(v, float) else v) for k, v in kw.items()}
        q_r, s_r = _reference_cpu(monkeypatch, x, dtype, granularity, **kw)
        _use(monkeypatch, provider)
        gkw = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        q_g, s_g = qbackend.quantize(xg, dtype, granularity, **gkw)
        what = f"{provider} {granularity} {sorted(kw)} {x_dtype} -> {dtype}"
        same_bits(q_g, q_r, what + ": q")
        same_bits(s_g, s_r, what + ": scale")
        if granularity in ("token", "channel") and not kw:
            check_rule(x, q_g, s_g, granularity)


@pytest.mark.parametrize("provider", ["cutlass", "torch"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_invalid_device_scales_poison_q(monkeypatch, provider, bad):
    """No host check on the device (it would sync): every q is the format's NaN (0 in int8), and a
    bad scale_ub gives NaN scales."""
    _use(monkeypatch, provider)
    x = torch.randn(5, 272, device=DEV, dtype=torch.bfloat16)
    for dtype in QUANT_DTYPES:
        nan_byte = 0 if dtype == torch.int8 else FP8_NAN_BYTE
        q, s = qbackend.quantize(x, dtype, "tensor", scale=torch.tensor(bad, device=DEV))
        assert (q.view(torch.uint8) == nan_byte).all(), (provider, bad, dtype)
        for granularity in ("tensor", "token"):
            q, s = qbackend.quantize(x, dtype, granularity, scale_ub=torch.tensor(bad, device=DEV))
            assert torch.isnan(s).all() and (q.view(torch.uint8) == nan_byte).all(), (provider, bad, dtype)


@pytest.mark.skipif(native.load() is None, reason="native library unavailable")
@pytest.mark.parametrize("cols", [256, 255])      # the 16-byte path and the scalar path
@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("dtype", QUANT_DTYPES)
def test_kernel_modes_directly(monkeypatch, gen, cols, x_dtype, dtype):
    x = corpus(gen)[:, :cols].to(x_dtype).contiguous()
    xg = x.to(DEV)
    rows = x.shape[0]
    for mode, granularity in ((native.DYNAMIC_TOKEN, "token"), (native.DYNAMIC_TENSOR, "tensor")):
        for ub in (None, 3.0):
            kw = {} if ub is None else {"scale_ub": torch.tensor(ub)}
            q_r, s_r = _reference_cpu(monkeypatch, x, dtype, granularity, **kw)
            q = torch.full((rows, cols), 0x55, dtype=torch.uint8, device=DEV).view(dtype)
            s = torch.empty(s_r.shape, dtype=torch.float32, device=DEV)
            native.quantize(xg, q, s, mode, None if ub is None else torch.tensor(ub, device=DEV), None)
            same_bits(q, q_r, f"mode {mode} ub {ub} {x_dtype} -> {dtype}: q")
            same_bits(s, s_r, f"mode {mode} ub {ub} {x_dtype} -> {dtype}: scale")
    q_r, _ = _reference_cpu(monkeypatch, x, dtype, "tensor", scale=torch.tensor(0.5))
    q = torch.empty((rows, cols), dtype=dtype, device=DEV)
    native.quantize(xg, q, torch.tensor(0.5, device=DEV), native.STATIC_TENSOR, None, None)
    same_bits(q, q_r, f"static {x_dtype} -> {dtype}")


def _exact(dtype, M, K, N):
    """Small integers (exact products and sums) and power-of-two scales: every provider's bits agree."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-4, 5, (M, K), generator=g).float()
    w = torch.randint(-4, 5, (N, K), generator=g).float().to(E4M3 if dtype != torch.int8 else torch.int8)
    a[1] = 0  # a zero row: inf * 0 = NaN
    return a.to(dtype), w


def _scales(M, N):
    sa = torch.tensor([0.5, math.inf, math.nan, 2.0, -math.inf, 1.0, 0.25, 1.0] * (M // 8)).reshape(M, 1)
    sb = torch.full((1, N), 0.5)
    sb[0, 3], sb[0, 9], sb[0, 17] = math.nan, math.inf, -math.inf
    return sa, sb


def _compare(out, ref, scale_a, scale_b, what):
    M, N = ref.shape
    rows = torch.isinf(scale_a.reshape(-1, 1).expand(M, 1)) if scale_a is not None else torch.zeros(M, 1, dtype=bool)
    inf = rows | torch.isinf(scale_b.reshape(1, -1).expand(1, N))
    out = out.cpu()
    same_bits(out[~inf], ref[~inf], what)
    assert not torch.isfinite(out[inf]).any() and not torch.isfinite(ref[inf]).any(), what


@pytest.mark.parametrize("provider,dtype", [("cutlass", E4M3), ("cutlass", torch.int8), ("torch", E4M3),
                                            ("torch", torch.int8), ("cutlass", torch.bfloat16),
                                            ("marlin", torch.bfloat16), ("marlin", torch.float16)])
def test_scaled_mm_non_finite_scales(monkeypatch, provider, dtype):
    M, K, N = 16, 128, 64
    a, w = _exact(dtype, M, K, N)
    sa, sb = _scales(M, N)
    w16 = dtype in (torch.bfloat16, torch.float16)
    out_dtype = dtype if w16 else torch.bfloat16
    cases = [(sb, None)] if w16 else [(sb, sa), (torch.tensor(1.0), torch.tensor(math.nan)),
                                      (torch.tensor(math.inf), torch.tensor(1.0)), (torch.tensor(0.5), sa)]
    for scale_b, scale_a in cases:
        _use(monkeypatch, "reference")
        ref = qbackend.scaled_mm(a, w.t(), scale_a, scale_b, out_dtype=out_dtype)
        _use(monkeypatch, provider)
        d = {"scale_a": None if scale_a is None else scale_a.to(DEV), "scale_b": scale_b.to(DEV)}
        decision = qbackend.select(_problem(a, w, scale_a, scale_b, out_dtype), DEV)
        if decision.name != provider:
            pytest.skip(f"{provider} does not serve this call here: {decision.reason()}")
        out = qbackend.scaled_mm(a.to(DEV), w.to(DEV).t(), d["scale_a"], d["scale_b"], out_dtype=out_dtype)
        _compare(out, ref, scale_a, scale_b, f"{provider} {dtype} scales {scale_a} x {list(scale_b.shape)}")


def _problem(a, w, scale_a, scale_b, out_dtype):
    from qbackend.validate import validate_scaled_mm
    return validate_scaled_mm(a.to(DEV), w.to(DEV).t(), None if scale_a is None else scale_a.to(DEV),
                              scale_b.to(DEV), out_dtype, None)
