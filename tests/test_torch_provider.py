"""The torch provider on the CPU (forced: by default it serves GPUs only), against the reference.

Each case draws fresh random inputs, often as windows of larger tensors, and runs one call through
the public API with the torch provider forced, then the same call with the reference forced. The
path the torch provider took (torch._scaled_mm tensorwise / rowwise / unit scales, torch._int_mm,
or dequantize + one GEMM) is recorded; the last test prints which paths ran and says which of
torch's ops this torch build lacks on the CPU.
"""
from __future__ import annotations

import collections
import random
from contextlib import nullcontext

import pytest
import torch

import qbackend
from helpers import rel_err, window
from qbackend import probe, registry
from qbackend.validate import validate_scaled_mm
from qbackend_providers import torch_paths as tp

# The one-time note about unprepared weights on the dequantized path: asserted once, below.
pytestmark = pytest.mark.filterwarnings("ignore:qbackend. the torch provider dequantizes:UserWarning")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
PATHS_RUN: collections.Counter = collections.Counter()


@pytest.fixture
def forced(monkeypatch):
    """Run a call with a provider forced: forced(name, fn, *args, **kw)."""
    def run(name, fn, *args, **kw):
        monkeypatch.setenv("QBACKEND_PROVIDER", name)
        registry.reload()
        try:
            return fn(*args, **kw)
        finally:
            monkeypatch.delenv("QBACKEND_PROVIDER")
            registry.reload()
    return run


def tolerance(out_dtype, path, problem) -> float:
    """Of max|ref|: the output's rounding, and for the dequantized path the compute dtype's (fp32
    on the CPU, the activation dtype for W8A16)."""
    bits = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}
    tol = bits[out_dtype]
    if path == tp.DEQUANT:
        tol = max(tol, bits[tp.compute_dtype(probe.cpu_info(), problem)])
    return tol


def quantized(g, r, rows, cols, dtype, granularity, **kw):
    (R, C), (r0, c0) = window(r, rows, cols, dtype.itemsize)
    x = torch.randn(R, C, generator=g) * (10.0 ** r.uniform(-2, 2))
    q, s = qbackend.quantize(x, dtype, granularity, **kw)
    q = q[r0:r0 + rows, c0:c0 + cols]
    if granularity in ("token", "channel"):
        s = s[r0:r0 + rows]
    return q, s


# (a dtype, b dtype, activation granularity, weight granularity)
W8A8_KINDS = [
    (E4M3, E4M3, "tensor", "tensor"), (E4M3, E4M3, "token", "channel"), (E4M3, E4M3, "tensor", "channel"),
    (E4M3, E4M3, "token", "tensor"), (E4M3, E5M2, "token", "channel"), (E5M2, E5M2, "tensor", "tensor"),
    (torch.int8, torch.int8, "token", "channel"), (torch.int8, torch.int8, "tensor", "tensor"),
    (E4M3, E4M3, "group", "block"), (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz, "token", "channel"),
]


def draw_case(i: int):
    r = random.Random(f"torch-provider:{i}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    a_dtype, b_dtype, ga, gb = W8A8_KINDS[i % len(W8A8_KINDS)]
    aligned = r.random() < 0.75
    M = r.choice([1, 2, 5, 16, 17, 33, 64, 130])
    N = 16 * r.randint(1, 24) if aligned else r.randint(1, 300)
    K = 128 * r.randint(1, 4) + (0 if aligned else 16 * r.randint(1, 7))
    if ga == "group":
        K = 128 * r.randint(1, 4) + (0 if r.random() < 0.6 else 64)
        N = 128 * r.randint(1, 3) + (0 if r.random() < 0.6 else 64)
    return r, g, a_dtype, b_dtype, ga, gb, M, N, K


def operands(r, g, a_dtype, b_dtype, ga, gb, M, N, K):
    if ga == "group":
        x = torch.randn(M, K, generator=g)
        pad = -(-K // 128) * 128
        xp = torch.nn.functional.pad(x, (0, pad - K))
        qa, sa = qbackend.quantize(xp, a_dtype, "group")
        a = torch.empty(M, pad, dtype=a_dtype).copy_(qa)[:, :K]  # a window with a 16-byte row stride
        w = torch.randn(N, K, generator=g)
        qw, sw = qbackend.quantize(w, b_dtype, "block")
        return a, sa, qw, sw.t().contiguous()
    a, sa = quantized(g, r, M, K, a_dtype, ga)
    qw, sw = quantized(g, r, N, K, b_dtype, "channel" if gb == "channel" else "tensor")
    return a, sa, qw, (sw.t() if gb == "channel" else sw)


@pytest.mark.parametrize("i", range(60), ids=lambda i: f"w8a8-{i}")
def test_w8a8_against_the_reference(forced, i):
    r, g, a_dtype, b_dtype, ga, gb, M, N, K = draw_case(i)
    a, sa, qw, sb = operands(r, g, a_dtype, b_dtype, ga, gb, M, N, K)
    out_dtype = r.choice([torch.bfloat16, torch.float16, torch.float32])
    bias = torch.randn(N, generator=g).to(out_dtype) if r.random() < 0.5 else None
    problem = validate_scaled_mm(a, qw.t(), sa, sb, out_dtype, bias)
    path = tp.path(probe.cpu_info(), problem)
    PATHS_RUN[path] += 1
    out = forced("torch", qbackend.scaled_mm, a, qw.t(), sa, sb, out_dtype=out_dtype, bias=bias)
    ref = forced("reference", qbackend.scaled_mm, a, qw.t(), sa, sb, out_dtype=torch.float32,
                 bias=None if bias is None else bias.float())
    what = dict(a=a_dtype, b=b_dtype, scales=(ga, gb), M=M, N=N, K=K, out=out_dtype, bias=bias is not None, path=path)
    assert out.shape == (M, N) and out.dtype == out_dtype, what
    assert rel_err(out, ref) < tolerance(out_dtype, path, problem), what


@pytest.mark.parametrize("i", range(16), ids=lambda i: f"w8a16-{i}")
def test_w8a16_against_the_reference(forced, i):
    r = random.Random(f"torch-provider-w8a16:{i}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    act = r.choice([torch.bfloat16, torch.float16])
    M, N, K = r.choice([1, 3, 16, 40]), r.randint(1, 200), 16 * r.randint(1, 20)
    (R, C), (r0, c0) = window(r, M, K, act.itemsize)
    x = (torch.randn(R, C, generator=g).to(act))[r0:r0 + M, c0:c0 + K]
    qw, sw = quantized(g, r, N, K, E4M3, "channel")
    sb = sw.t() if r.random() < 0.7 else sw.max()
    bias = torch.randn(N, generator=g).to(act) if r.random() < 0.5 else None
    PATHS_RUN[tp.DEQUANT] += 1
    with pytest.warns(UserWarning, match="dequantizes an unprepared weight") if i == 0 else nullcontext():
        out = forced("torch", qbackend.scaled_mm, x, qw.t(), None, sb, bias=bias)
    ref = forced("reference", qbackend.scaled_mm, x, qw.t(), None, sb, out_dtype=torch.float32,
                 bias=None if bias is None else bias.float())
    assert out.dtype == act
    assert rel_err(out, ref) < (1e-2 if act == torch.bfloat16 else 2e-3), (M, N, K, act)


@pytest.mark.parametrize("activation", [torch.bfloat16, E4M3, torch.int8, E5M2])
def test_prepared_weights_match_the_unprepared_call(forced, monkeypatch, activation):
    """prepare_weight + linear on the torch provider: the dequantized path holds the weight
    dequantized (scales folded in) and gives the same result as scaled_mm; the other paths keep the
    quantized weight as it is."""
    g = torch.Generator().manual_seed(7)
    N, K, M = 96, 256, 9
    wdtype = E5M2 if activation == E5M2 else (torch.int8 if activation == torch.int8 else E4M3)
    qw, sw = qbackend.quantize(torch.randn(N, K, generator=g), wdtype, "channel")
    x = torch.randn(M, K, generator=g)
    if activation in (torch.bfloat16,):
        a, sa, gran = x.to(activation), None, "tensor"
    else:
        (a, sa), gran = qbackend.quantize(x, activation, "token"), "token"
    monkeypatch.setenv("QBACKEND_PROVIDER", "torch")
    registry.reload()
    pw = qbackend.prepare_weight(qw, sw, activation, gran)
    assert pw.provider == "torch"
    problem = validate_scaled_mm(a, qw.t(), sa, sw.t(), None, None)
    path = tp.path(probe.cpu_info(), problem)
    if path == tp.DEQUANT:
        assert pw.layout.startswith("dequant-") and pw.data.dtype == tp.compute_dtype(probe.cpu_info(), problem)
    else:
        assert pw.layout == "nk" and pw.data.dtype == wdtype
    y = qbackend.linear(a, pw, sa)
    y_direct = qbackend.scaled_mm(a, qw.t(), sa, sw.t())
    ref = forced("reference", qbackend.scaled_mm, a, qw.t(), sa, sw.t(), out_dtype=torch.float32)
    assert rel_err(y, ref) < 1e-2 and rel_err(y_direct, ref) < 1e-2


@pytest.mark.parametrize("i", range(40), ids=lambda i: f"quantize-{i}")
def test_quantize_is_bit_exact(forced, i):
    r = random.Random(f"torch-provider-quantize:{i}")
    g = torch.Generator().manual_seed(r.getrandbits(62))
    granularity = ["tensor", "token", "channel", "group", "block"][i % 5]
    dtype = r.choice([E4M3, E5M2, torch.int8, torch.float8_e4m3fnuz])
    x_dtype = r.choice([torch.bfloat16, torch.float16, torch.float32])
    rows, cols = r.randint(1, 300), 64 * r.randint(1, 6) + (0 if granularity in ("group",) else r.randint(0, 63))
    x = (torch.randn(rows, cols, generator=g) * 10.0 ** r.uniform(-3, 3)).to(x_dtype)
    kw = dict(granularity=granularity, group_size=64, block_size=(64, 128) if r.random() < 0.5 else (128, 128))
    if granularity in ("tensor", "token") and r.random() < 0.3:
        kw["scale_ub"] = torch.tensor(float(x.float().abs().max()) / 2)
    if r.random() < 0.2:
        x[r.randrange(rows)] = 0
    q, s = forced("torch", qbackend.quantize, x, dtype, **kw)
    rq, rs = forced("reference", qbackend.quantize, x, dtype, **kw)
    assert torch.equal(s, rs), kw
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), kw


def test_which_paths_ran(capsys):
    """Runs last: the paths the cases took on this CPU, and which of torch's ops it lacks here."""
    if sum(PATHS_RUN.values()) < 76:
        pytest.skip("counts every case of the file: run it whole")
    cpu = probe.cpu_info()
    lacking = []
    if not tp.scaled_mm_pairs(cpu):
        lacking.append("torch._scaled_mm (fp8 paths ran dequantized)")
    if not tp.rowwise_out_dtypes(cpu):
        lacking.append("rowwise scaling (ran with unit scales into fp32)")
    if not tp.int_mm_ok(cpu):
        lacking.append("torch._int_mm (int8 ran dequantized)")
    lacking.append("blockwise scaling (CUDA sm_90 only: fp8_block ran dequantized)")
    with capsys.disabled():
        print(f"\ntorch {torch.__version__} on the CPU: paths run {dict(PATHS_RUN)}; "
              f"lacking here: {'; '.join(lacking)}")
    expected = {tp.DEQUANT} | ({tp.TENSORWISE, tp.UNSCALED} if tp.scaled_mm_pairs(cpu) else set()) \
        | ({tp.ROWWISE} if tp.rowwise_out_dtypes(cpu) else set()) | ({tp.INT_MM} if tp.int_mm_ok(cpu) else set())
    assert expected <= set(PATHS_RUN), dict(PATHS_RUN)


def test_a_call_cublaslt_declines_runs_dequantized(forced, monkeypatch):
    """cuBLASLt declines some calls within torch's documented rules (CUBLAS_STATUS_NOT_SUPPORTED,
    seen on the H200): the torch provider then computes the call on the dequantized weight, with a
    warning, instead of failing. Other errors still raise."""
    if not tp.scaled_mm_pairs(probe.cpu_info()):
        pytest.skip("this torch has no torch._scaled_mm on the CPU")
    g = torch.Generator().manual_seed(3)
    qa, sa = qbackend.quantize(torch.randn(5, 256, generator=g), E4M3, "token")
    qw, sw = qbackend.quantize(torch.randn(48, 256, generator=g), E4M3, "channel")
    ref = forced("reference", qbackend.scaled_mm, qa, qw.t(), sa, sw.t(), out_dtype=torch.float32)

    def declines(*args, **kw):
        raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul")

    monkeypatch.setattr(torch, "_scaled_mm", declines)
    with pytest.warns(UserWarning, match="declined .* dequantized to float32 instead"):
        out = forced("torch", qbackend.scaled_mm, qa, qw.t(), sa, sw.t())
    assert rel_err(out, ref) < 1e-2

    def broken(*args, **kw):
        raise RuntimeError("some other failure")

    monkeypatch.setattr(torch, "_scaled_mm", broken)
    with pytest.raises(RuntimeError, match="some other failure"):
        forced("torch", qbackend.scaled_mm, qa, qw.t(), sa, sw.t())
