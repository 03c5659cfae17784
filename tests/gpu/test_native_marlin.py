"""The marlin W8A16 kernels of libqbackend_cuda against a float64 oracle, on a real GPU.

Each forced family (80: compute_80 PTX / sm_80 SASS, 75: compute_75 PTX / sm_75 SASS) is checked
over the LLM shapes and odd sizes, M in {1, 2, 7, 16, 17, 33, 64, 128, 1000}, fp16 and bf16
activations, per-channel and per-tensor weight scales, bias on and off, NaN-poisoned outputs.

Oracle: out_ref = a.double() @ (w.double() * scale[:, None]).t() + bias, in float64.
Tolerance, element-wise: |out - ref| <= 2^-7 |ref| + 1e-4 max|ref| (bf16) and
2^-9 |ref| + 1e-4 max|ref| (fp16). The first term is the final rounding to the output dtype (half
an ulp is 2^-9 / 2^-12 relative; twice that leaves room for the fp32 value being off by its own
rounding); the second covers fp32 accumulation-order differences over K <= 28672 terms, which stay
below 1e-5 of the largest output for these inputs. Weights are random e4m3fn codes (every code but
NaN, subnormals and -0 included), so the decoding is exercised everywhere; a separate test checks
the decoding bit-exactly.
"""
import math

import pytest
import torch

from qbackend_providers import marlin_native as mn

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if mn.load() is None:
    pytest.skip(f"native library unavailable: {mn.load_error()}", allow_module_level=True)

DEV = "cuda"
LLM_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192),
              (57344, 8192), (8192, 28672)]
# odd sizes the rules allow (N % 8 == 0, K % 8 == 0): partial tiles in n and k, single tiles
ODD_SHAPES = [(8, 8), (72, 4104), (200, 136), (1000, 1000), (4160, 3080)]
MS = [1, 2, 7, 16, 17, 33, 64, 128, 1000]
VARIANTS = [80, 75]


def _need_variant(v):
    if not mn.has_variant(v):
        pytest.skip(f"marlin variant {v} not compiled into the library")


def random_e4m3(N, K, gen):
    """Random e4m3fn codes, all 254 non-NaN codes equally likely."""
    codes = torch.randint(0, 256, (N, K), dtype=torch.uint8, device=DEV, generator=gen)
    nan = (codes & 0x7F) == 0x7F
    codes = torch.where(nan, codes ^ 0x01, codes)  # 0x7F -> 0x7E, 0xFF -> 0xFE
    return codes.view(torch.float8_e4m3fn)


def check(out, ref, dtype, what):
    assert not torch.isnan(out).any(), f"{what}: NaN in output (unwritten or bad element)"
    o, r = out.double(), ref
    rel = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -9
    tol = rel * r.abs() + 1e-4 * r.abs().max()
    err = (o - r).abs()
    bad = err > tol
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} elements off, first at {i}: got {o[tuple(i)].item()}, "
                             f"want {r[tuple(i)].item()} (tol {tol[tuple(i)].item():.3g}); "
                             f"normwise rel err {(err.norm() / r.norm()).item():.3g}")


def assert_counters_reset(ws, N):
    """Every launch leaves the workspace's per-column counters at zero for the next one (its tail:
    one int per 128 rows of N, 256-byte aligned)."""
    nt = (N + 127) // 128
    counters = ws[ws.numel() - ((4 * nt + 255) // 256) * 256:][: 4 * nt].view(torch.int32)
    assert int(counters.abs().sum()) == 0, "tile counters not reset"


@pytest.fixture(scope="module")
def gen():
    g = torch.Generator(device=DEV)
    g.seed()
    return g


def output_scales(n, K, gen):
    """n per-channel weight scales in [0.5, 1.5) / (130 sqrt(K)): |w| over random codes has a standard
    deviation near 130, so outputs are O(1)."""
    return (torch.rand(n, device=DEV, generator=gen) + 0.5) / (130.0 * math.sqrt(K))


def run_shape(variant, dtype, N, K, gen, ms=MS):
    _need_variant(variant)
    w = random_e4m3(N, K, gen)
    packed = mn.prepare(w, dtype)
    wd = w.double()
    s_row = output_scales(N, K, gen)
    s_ten = s_row[:1].clone()
    bias = torch.randn(N, device=DEV, generator=gen).to(dtype)
    for M in ms:
        a = torch.randn(M, K, device=DEV, generator=gen).to(dtype)
        base = a.double() @ wd.t()
        for per_col in (True, False):
            scale = s_row if per_col else s_ten
            for use_bias in (False, True):
                out = torch.full((M, N), float("nan"), device=DEV, dtype=dtype)
                mn.mm(a, packed, scale, bias if use_bias else None, out, N, K, variant=variant)
                ref = base * scale.double()[None, :] if per_col else base * scale.double().item()
                if use_bias:
                    ref = ref + bias.double()[None, :]
                check(out, ref, dtype, f"sm{variant} {dtype} N={N} K={K} M={M} per_col={per_col} bias={use_bias}")
        del base


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", LLM_SHAPES + ODD_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matches_float64_oracle(variant, dtype, shape, gen):
    if variant == 75 and dtype == torch.bfloat16:
        _need_variant(75)
        N, K = shape
        w = random_e4m3(N, K, gen)
        a = torch.randn(3, K, device=DEV, dtype=dtype)
        out = torch.empty(3, N, device=DEV, dtype=dtype)
        with pytest.raises(RuntimeError, match="sm75.*bf16|bf16.*sm75|does not take bf16"):
            mn.mm(a, mn.prepare(w, dtype), torch.ones(1, device=DEV), None, out, N, K, variant=75)
        return
    run_shape(variant, dtype, *shape, gen)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_decoding_is_exact(variant, dtype):
    """Every non-NaN code decodes to its exact value: out[m, n] = w[n, m] with a = identity rows."""
    if variant == 75 and dtype == torch.bfloat16:
        pytest.skip("sm75 refuses bf16 (tested above)")
    _need_variant(variant)
    N, K, M = 256, 256, 64
    n = torch.arange(N, device=DEV)[:, None]
    k = torch.arange(K, device=DEV)[None, :]
    codes = ((n + 37 * k) % 256).to(torch.uint8)
    codes = torch.where((codes & 0x7F) == 0x7F, torch.zeros_like(codes), codes)
    w = codes.view(torch.float8_e4m3fn)
    a = torch.zeros(M, K, device=DEV, dtype=dtype)
    a[torch.arange(M), torch.arange(M) * 3] = 1  # row m selects k = 3m
    out = torch.full((M, N), float("nan"), device=DEV, dtype=dtype)
    mn.mm(a, mn.prepare(w, dtype), torch.ones(1, device=DEV), None, out, N, K, variant=variant)
    want = w.float()[:, torch.arange(M, device=DEV) * 3].t().to(dtype)
    # value equality (the fp32 sum turns a -0 weight times 1 plus +0 terms into +0)
    assert torch.equal(out.float(), want.float()), "decoding is not exact"


@pytest.mark.parametrize("variant", VARIANTS)
def test_strided_inputs_and_outputs(variant, gen):
    """Row strides larger than the row (padded / sliced tensors) read and write the right elements."""
    _need_variant(variant)
    dtype = torch.float16
    N, K, M = 392, 520, 37
    w = random_e4m3(N, K, gen)
    packed = mn.prepare(w, dtype)
    big_a = torch.randn(M, K + 24, device=DEV, generator=gen).to(dtype)
    a = big_a[:, 8:8 + K]  # 16-byte aligned start, lda = K + 24
    big_o = torch.full((M, N + 40), float("nan"), device=DEV, dtype=dtype)
    out = big_o[:, :N]
    scale = output_scales(N, K, gen)
    mn.mm(a, packed, scale, None, out, N, K, variant=variant)
    ref = (a.double() @ w.double().t()) * scale.double()
    check(out, ref, dtype, "strided")
    assert torch.isnan(big_o[:, N:]).all(), "wrote outside out's columns"


@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_graph_replay_and_workspace_reset(variant, gen):
    _need_variant(variant)
    dtype = torch.float16
    N, K, M = 4096, 4096, 5  # split-K: 1024 tiles over ~132 blocks
    w = random_e4m3(N, K, gen)
    packed = mn.prepare(w, dtype)
    scale = torch.full((1,), 1.0 / (130.0 * 64), device=DEV)
    a = torch.randn(M, K, device=DEV, generator=gen).to(dtype)
    out = torch.empty(M, N, device=DEV, dtype=dtype)
    ws = mn.new_workspace(N, K, DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mn.mm(a, packed, scale, None, out, N, K, variant=variant, workspace=ws)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            mn.mm(a, packed, scale, None, out, N, K, variant=variant, workspace=ws)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        a.copy_(torch.randn(M, K, device=DEV, generator=gen).to(dtype))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check(out, (a.double() @ w.double().t()) * scale.double(), dtype, "graph replay")
    assert_counters_reset(ws, N)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(4096, 4096), (6144, 4096), (1000, 1000), (4160, 3080)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_work_split(variant, shape, gen):
    """Forced grid sizes and blocks per multiprocessor deal the tiles in every pattern the kernel
    handles: runs inside one column (split-K with 2 to 16+ contributors), runs that start in one
    column and end in the next (two partial slots and two counters per block), runs of whole
    columns, runs that end in a column's middle after whole columns, one block for everything."""
    _need_variant(variant)
    dtype = torch.bfloat16 if variant == 80 else torch.float16
    N, K = shape
    w = random_e4m3(N, K, gen)
    packed = mn.prepare(w, dtype)
    # per-column and per-tensor scales, bias on and off, and views 4 bytes into their buffers
    scale_buf = output_scales(N + 1, K, gen)
    bias_buf = torch.randn(N + 2, device=DEV, generator=gen).to(dtype)
    operands = [(scale_buf[:N], bias_buf[:N]), (scale_buf[1:], bias_buf[2:]), (scale_buf[:1], None),
                (scale_buf[:N], None)]
    ws = mn.new_workspace(N, K, DEV)
    case = 0
    for M in (1, 16, 17, 64):
        a = torch.randn(M, K, device=DEV, generator=gen).to(dtype)
        base = a.double() @ w.double().t()
        for max_blocks in (0, 1, 3, 7, 29, 64, 100, 263):
            for bps in (0, 1, 2):
                scale, bias = operands[case % len(operands)]
                case += 1
                ref = base * (scale.double()[None, :] if scale.numel() == N else scale.double().item())
                if bias is not None:
                    ref = ref + bias.double()[None, :]
                out = torch.full((M, N), float("nan"), device=DEV, dtype=dtype)
                mn.mm(a, packed, scale, bias, out, N, K, variant=variant, workspace=ws, max_blocks=max_blocks,
                      blocks_per_sm=bps)
                check(out, ref, dtype, f"sm{variant} N={N} K={K} M={M} max_blocks={max_blocks} blocks_per_sm={bps} "
                      f"scale {scale.numel()} at +{scale.storage_offset()} bias {bias is not None}")
    assert_counters_reset(ws, N)


def test_every_ring_depth(gen):
    """Every cp.async ring depth the SM80 family takes (2..12; the automatic choice uses 3 to 6), with
    one and two resident blocks, on partial tiles in n and k, fp16 and bf16, one to four m16 tiles."""
    _need_variant(80)
    N, K = 1000, 3080
    w = random_e4m3(N, K, gen)
    scale = output_scales(N, K, gen)
    ws = mn.new_workspace(N, K, DEV)
    for dtype in (torch.float16, torch.bfloat16):
        packed = mn.prepare(w, dtype)
        for M in (1, 9, 40, 64):
            a = torch.randn(M, K, device=DEV, generator=gen).to(dtype)
            ref = (a.double() @ w.double().t()) * scale.double()[None, :]
            for stages in range(2, 13):
                for bps in (1, 2):
                    out = torch.full((M, N), float("nan"), device=DEV, dtype=dtype)
                    mn.mm(a, packed, scale, None, out, N, K, variant=80, workspace=ws, stages=stages,
                          blocks_per_sm=bps)
                    check(out, ref, dtype, f"{dtype} M={M} stages={stages} blocks_per_sm={bps}")
    assert_counters_reset(ws, N)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rows_do_not_depend_on_m(variant, gen):
    """A row's result has the same bits whatever the other rows of the call (M = 1, 2, 4, 5 against
    the same rows of M = 16), with split columns summed by 4 and by 8 contributors and with runs that
    cross column boundaries midway."""
    _need_variant(variant)
    dtype = torch.bfloat16 if variant == 80 else torch.float16
    N, K = 4096, 4096
    w = random_e4m3(N, K, gen)
    packed = mn.prepare(w, dtype)
    scale = output_scales(N, K, gen)
    bias = torch.randn(N, device=DEV, generator=gen).to(dtype)
    ws = mn.new_workspace(N, K, DEV)
    a = torch.randn(16, K, device=DEV, generator=gen).to(dtype)
    for max_blocks in (0, 29, 263):
        outs = {}
        for M in (1, 2, 4, 5, 16):
            out = torch.full((M, N), float("nan"), device=DEV, dtype=dtype)
            mn.mm(a[:M], packed, scale, bias, out, N, K, variant=variant, workspace=ws, max_blocks=max_blocks)
            outs[M] = out
        for M in (1, 2, 4, 5):
            assert torch.equal(outs[M].view(torch.int16), outs[16][:M].view(torch.int16)), \
                f"max_blocks={max_blocks}: the {M} rows differ from the same rows of M=16"
        ref = (a.double() @ w.double().t()) * scale.double() + bias.double()
        check(outs[16], ref, dtype, f"max_blocks={max_blocks}")
    assert_counters_reset(ws, N)


def test_m_zero_is_a_no_op():
    _need_variant(0)
    N, K = 64, 64
    packed = mn.prepare(torch.zeros(N, K, device=DEV).to(torch.float8_e4m3fn), torch.float16)
    out = torch.empty(0, N, device=DEV, dtype=torch.float16)
    mn.mm(torch.empty(0, K, device=DEV, dtype=torch.float16), packed, torch.ones(1, device=DEV), None, out, N, K)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_prepare_refuses_nan(dtype):
    _need_variant(0)
    w = torch.zeros(64, 64, device=DEV).to(torch.float8_e4m3fn)
    w.view(torch.uint8)[5, 7] = 0xFF
    with pytest.raises(ValueError, match="NaN"):
        mn.prepare(w, dtype)


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_inputs_give_clear_errors(variant):
    _need_variant(variant)
    dt = torch.float16
    N, K, M = 256, 256, 4
    zeros = torch.zeros(N, K, device=DEV).to(torch.float8_e4m3fn)
    packed = mn.prepare(zeros, dt)
    one = torch.ones(1, device=DEV)
    a = torch.randn(M, K, device=DEV, dtype=dt)
    out = torch.empty(M, N, device=DEV, dtype=dt)

    def err(match, **kw):
        args = dict(a=a, packed=packed, w_scale=one, bias=None, out=out, N=N, K=K, variant=variant)
        args.update(kw)
        with pytest.raises((RuntimeError, ValueError), match=match):
            mn.mm(**args)

    # rules the C library checks (Python passes these through)
    big = torch.randn(M, K + 8, device=DEV, dtype=dt)
    err("a must be 16-byte aligned", a=big[:, 4:4 + K])
    err("lda must be a multiple of 8", a=torch.randn(M, K + 4, device=DEV, dtype=dt)[:, :K])
    bigo = torch.empty(M, N + 8, device=DEV, dtype=dt)
    err("out must be 16-byte aligned", out=bigo[:, 4:4 + N])
    err("ldo must be a multiple of 8", out=torch.empty(M, N + 4, device=DEV, dtype=dt)[:, :N])
    err("packed_w holds", packed=packed[: packed.numel() // 2])
    err("variant must be", variant=89)
    err("workspace holds", workspace=torch.zeros(64, dtype=torch.uint8, device=DEV))
    p12 = mn.prepare(torch.zeros(12, 16, device=DEV).to(torch.float8_e4m3fn), dt)
    err("N must be a multiple of 8", packed=p12, N=12, K=16, a=torch.randn(M, 16, device=DEV, dtype=dt),
        out=torch.empty(M, 12, device=DEV, dtype=dt))
    p20 = mn.prepare(torch.zeros(16, 20, device=DEV).to(torch.float8_e4m3fn), dt)
    err("K must be a multiple of 8", packed=p20, N=16, K=20, a=torch.randn(M, 24, device=DEV, dtype=dt)[:, :20],
        out=torch.empty(M, 16, device=DEV, dtype=dt))
    # rules the Python wrapper checks first
    err("float16 or bfloat16", a=a.float())
    err("must be \\[M, K", a=a[:, :128])
    err("out must have a's dtype", out=out.bfloat16())
    err("w_scale must hold 1 or N", w_scale=torch.ones(3, device=DEV))
    err("w_scale must be float32", w_scale=one.half())
    err("bias must have a's dtype", bias=torch.zeros(N, device=DEV))
    err("bias must be a contiguous", bias=torch.zeros(N + 1, device=DEV, dtype=dt))
    err("must be on a CUDA device", a=a.cpu())
    # a weight packed for the other activation dtype (its bits are placed for the other decode)
    err("prepared for torch.bfloat16 activations", packed=mn.prepare(zeros, torch.bfloat16))
    err("prepared for torch.float16 activations", packed=packed, a=a.bfloat16(), out=out.bfloat16())
    err("packed must be the 1-D tensor", packed=packed.view(torch.int16))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        mn.prepare(torch.zeros(N, K, device=DEV), dt)
    with pytest.raises(ValueError, match="act_dtype must be torch.float16 or torch.bfloat16"):
        mn.prepare(zeros, torch.float32)


@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("N,K", [(4096, 4096), (200, 144), (8, 16), (4160, 3088)])
@pytest.mark.parametrize("per_channel", [True, False])
def test_unpack_is_the_dequantized_weight_bit_for_bit(act, N, K, per_channel):
    """unpack (the large-M path) gives w * scale rounded once to the activation dtype, every element
    written (the output is poisoned first), for every non-NaN code and both packings."""
    if not mn.has_unpack():
        pytest.skip("library built without qb_marlin_unpack")
    g = torch.Generator(device=DEV).manual_seed(N * 7 + K)
    w = random_e4m3(N, K, g)
    scale = (torch.rand(N if per_channel else 1, device=DEV, generator=g) + 0.5) * 10.0 ** -3
    packed = mn.prepare(w, act)
    torch.empty(2 * N * K + (1 << 20), dtype=act, device=DEV).fill_(float("nan"))  # poison the pool
    got = mn.unpack(packed, scale, N, K)
    want = (w.float() * scale.reshape(-1, 1)).to(act)
    assert got.shape == (N, K) and got.dtype == act and got.is_contiguous()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (act, N, K, per_channel)


def test_unpack_refuses_what_it_cannot_do():
    if not mn.has_unpack():
        pytest.skip("library built without qb_marlin_unpack")
    w = random_e4m3(64, 64, torch.Generator(device=DEV).manual_seed(1))
    packed = mn.prepare(w, torch.bfloat16)
    with pytest.raises(ValueError, match="1 or N=64 values"):
        mn.unpack(packed, torch.ones(3, device=DEV), 64, 64)
    with pytest.raises(RuntimeError, match="K a positive multiple of 16"):
        mn.unpack(packed, torch.ones(1, device=DEV), 64, 40)
