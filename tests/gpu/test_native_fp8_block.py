"""The block-scaled FP8 kernels (1 x 128 activation groups, 128 x 128 weight blocks), the sm_90a
family and the sm_89 one (its compute_89 PTX on newer GPUs): every config (and, on sm_90a, every
decomposition) through the C ABI, odd shapes (partial last K group and N block), strided
activations, bias, both output dtypes, CUDA graphs and the argument checks; then the public API,
which must choose them on sm_90 and route the scale shapes they do not take elsewhere. Outputs are
poisoned with NaN before each call and compared with a float64 product of the dequantized operands."""
import pytest
import torch

import gpu_helpers
import qbackend
from qbackend.validate import validate_scaled_mm
from qbackend_providers import native

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if native.load() is None:
    pytest.skip(f"native library unavailable: {native.load_error()}", allow_module_level=True)
CC = torch.cuda.get_device_capability()
# Each family this library has that this GPU runs: sm_90a machine code on 9.0 only, sm_89 from 8.9.
VARIANTS = [v for v, runs in ((90, CC == (9, 0)), (89, CC >= (8, 9)))
            if runs and native.has_variant("scaled_mm_fp8_block", v)]
if not VARIANTS:
    pytest.skip("no block-scaled family built for this GPU (sm90 on 9.0, sm89 on 8.9+)", allow_module_level=True)

DEV = "cuda"
F8 = torch.float8_e4m3fn
OUTS = [torch.bfloat16, torch.float16]
# Exact e4m3 products summed in fp32 per 128-deep block, scaled and summed in fp32, one rounding of
# the output: the error is that rounding (2^-8 / 2^-11 relative) plus fp32 summation.
TOL = {torch.bfloat16: 8e-3, torch.float16: 2e-3}
SHAPES = [(1, 4096, 4096), (5, 520, 8192), (37, 200, 272), (64, 2112, 7168 + 64), (130, 2112, 1024),
          (300, 136, 16), (16, 8, 32), (1000, 4096, 2048), (4096, 1024, 1024)]


def cdiv(a, b):
    return -(-a // b)


def operands(M, N, K, g, bias=None, lda_pad=32):
    a = (torch.randn(M, K + lda_pad, device=DEV, generator=g) * 4).to(F8)[:, 16:16 + K]  # strided rows
    w = (torch.randn(N, K, device=DEV, generator=g) * 4).to(F8)
    sa = torch.rand(M, cdiv(K, 128), device=DEV, generator=g) * 0.05 + 1e-3
    sb = torch.rand(cdiv(K, 128), cdiv(N, 128), device=DEV, generator=g) * 0.05 + 1e-3
    b = torch.randn(N, device=DEV, generator=g).to(bias) if bias is not None else None
    return a, w, sa, sb, b


def reference(a, w, sa, sb, bias):
    M, K = a.shape
    N = w.shape[0]
    a64 = a.double() * sa.double().repeat_interleave(128, 1)[:, :K]
    w64 = w.double() * sb.double().t().repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    y = a64 @ w64.t()
    return y if bias is None else y + bias.double()


def run(a, w, sa, sb, bias, out_dtype, config=-1, decomposition=-1, splits=-1, variant=VARIANTS[0]):
    M, N, K = a.shape[0], w.shape[0], a.shape[1]
    out = torch.full((M, N), float("nan"), dtype=out_dtype, device=DEV)
    native.override(config, decomposition, splits)
    try:
        need = native.block_workspace_size(M, N, K, out_dtype, variant)
        work = torch.empty(max(need, 1), dtype=torch.uint8, device=DEV)
        native.scaled_mm(a, w.t(), sa, sb, bias, out, variant, work, block=True)
    finally:
        native.override()
    return out


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


CONFIGS = {v: native.block_config_names(v) for v in VARIANTS}
CONFIG_CASES = [(v, c) for v in VARIANTS for c in range(len(CONFIGS[v]))]


def test_configs_listed():
    prefix = {90: "block_", 89: "sm89_block_"}
    for v in VARIANTS:
        assert CONFIGS[v] and all(c.startswith(prefix[v]) for c in CONFIGS[v])
    assert "scaled_mm_fp8_block" in native.build_info()["variants"]


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"sm{v}" for v in VARIANTS])
@pytest.mark.parametrize("out_dtype", OUTS, ids=["bf16", "fp16"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_automatic_choice(M, N, K, out_dtype, variant):
    g = torch.Generator(device=DEV).manual_seed(M * 7 + N + K)
    a, w, sa, sb, bias = operands(M, N, K, g, bias=out_dtype if M % 2 else None)
    out = run(a, w, sa, sb, bias, out_dtype, variant=variant)
    assert not out.isnan().any()
    assert rel_err(out, reference(a, w, sa, sb, bias)) < TOL[out_dtype]


@pytest.mark.parametrize("out_dtype", OUTS, ids=["bf16", "fp16"])
@pytest.mark.parametrize("variant,config", CONFIG_CASES, ids=[CONFIGS[v][c] for v, c in CONFIG_CASES])
def test_every_config_and_decomposition(variant, config, out_dtype):
    g = torch.Generator(device=DEV).manual_seed(config)
    # The sm_89 kernels are data-parallel only: they ignore a decomposition.
    decompositions = [(0, -1), (1, 3), (2, -1), (3, -1)] if variant == 90 else [(0, -1)]
    for M, N, K in [(3, 520, 8192), (77, 2064, 1040), (300, 136, 16), (129, 4096, 7168 + 64)]:
        a, w, sa, sb, bias = operands(M, N, K, g, bias=out_dtype if M != 77 else None)
        ref = reference(a, w, sa, sb, bias)
        for decomposition, splits in decompositions:
            out = run(a, w, sa, sb, bias, out_dtype, config, decomposition, splits, variant)
            what = (CONFIGS[variant][config], decomposition, splits, M, N, K)
            assert not out.isnan().any(), what
            assert rel_err(out, ref) < TOL[out_dtype], what


@pytest.mark.skipif(90 not in VARIANTS, reason="stream-K is the sm_90a family's")
def test_stream_k_is_deterministic():
    g = torch.Generator(device=DEV).manual_seed(1)
    a, w, sa, sb, bias = operands(9, 4096, 14336, g, bias=torch.bfloat16)
    first = run(a, w, sa, sb, bias, torch.bfloat16, 1, 2)
    assert rel_err(first, reference(a, w, sa, sb, bias)) < TOL[torch.bfloat16]
    for _ in range(3):  # stream-K partial tiles are summed in a fixed order
        assert torch.equal(run(a, w, sa, sb, bias, torch.bfloat16, 1, 2), first)


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"sm{v}" for v in VARIANTS])
def test_block_scales_are_not_folded_into_one(variant):
    """Scales that differ by orders of magnitude between K blocks: a kernel that applied one
    scale per tile, or the scales after the whole K sum, would be far off."""
    g = torch.Generator(device=DEV).manual_seed(2)
    a, w, sa, sb, _ = operands(33, 384, 1024, g)
    sa *= torch.logspace(-3, 3, sa.shape[1], device=DEV)
    sb *= torch.logspace(2, -2, sb.shape[0], device=DEV).reshape(-1, 1)
    out = run(a, w, sa, sb, None, torch.float16, variant=variant)
    assert rel_err(out, reference(a, w, sa, sb, None)) < TOL[torch.float16]


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"sm{v}" for v in VARIANTS])
@pytest.mark.parametrize("M", [1, 48, 512])
def test_cuda_graph_replay(M, variant):
    g = torch.Generator(device=DEV).manual_seed(M)
    a, w, sa, sb, bias = operands(M, 2048, 4096, g, bias=torch.bfloat16)
    out = torch.empty(M, 2048, dtype=torch.bfloat16, device=DEV)
    work = torch.empty(max(native.block_workspace_size(M, 2048, 4096, torch.bfloat16, variant), 1),
                       dtype=torch.uint8, device=DEV)
    step = lambda: native.scaled_mm(a, w.t(), sa, sb, bias, out, variant, work, block=True)  # noqa: E731
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        a.copy_((torch.randn(a.shape, device=DEV, generator=g) * 4).to(F8))
        sa.copy_(torch.rand(sa.shape, device=DEV, generator=g) * 0.05 + 1e-3)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference(a, w, sa, sb, bias)) < TOL[torch.bfloat16]


def test_argument_checks():
    M, N, K = 4, 64, 256
    a = torch.zeros(M, K, device=DEV, dtype=F8)
    w = torch.zeros(N, K, device=DEV, dtype=F8)
    sa = torch.ones(M, 2, device=DEV)
    sb = torch.ones(2, 1, device=DEV)
    out = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    lib, buf = native.load(), native._errbuf()
    BF16, E4M3, I8, BLOCK, ROW = 2, 3, 5, 2, 1

    def call(a_dtype=E4M3, kind_a=BLOCK, kind_b=BLOCK, n=N, k=K):
        return lib.qb_scaled_mm(a.data_ptr(), K, w.data_ptr(), K, out.data_ptr(), N, M, n, k, a_dtype, a_dtype,
                                BF16, sa.data_ptr(), kind_a, sb.data_ptr(), kind_b, None, 0, None, buf, 1024)

    assert call() == 0
    torch.cuda.synchronize()
    assert call(kind_b=ROW) == 1 and b"both scale kinds" in buf.value
    assert call(a_dtype=I8) == 2 and b"e4m3" in buf.value
    assert call(n=60) == 1 and b"multiple of 8" in buf.value
    assert call(k=40) == 1 and b"multiple of 16" in buf.value
    with pytest.raises(ValueError, match="scale_a as a contiguous float32"):
        native.scaled_mm(a, w.t(), sa[:, :1], sb, None, out, block=True)
    with pytest.raises(ValueError, match="scale_b as a contiguous float32"):
        native.scaled_mm(a, w.t(), sa, sb.t(), None, out, block=True)


# --- the public API --------------------------------------------------------------------------------


def api_operands(M, N, K, g, group=128):
    x = torch.randn(M, K, device=DEV, generator=g, dtype=torch.bfloat16)
    weight = torch.randn(N, K, device=DEV, generator=g, dtype=torch.bfloat16)
    x_q, x_s = qbackend.quantize(x, F8, granularity="group", group_size=group)
    w_q, w_s = qbackend.quantize(weight, F8, granularity="block", block_size=(group, group))
    return x_q, x_s, w_q, w_s


def chosen(a, b, scale_a, scale_b, group=128):
    problem = validate_scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, None, group)
    return qbackend.select(problem, a.device).name


@pytest.mark.parametrize("M,N,K", [(1, 2112, 7168), (16, 4096, 4096), (333, 1000, 512), (2048, 576, 7168)])
def test_public_api_selects_the_kernel_and_matches_the_reference(M, N, K):
    g = torch.Generator(device=DEV).manual_seed(M + N)
    x_q, x_s, w_q, w_s = api_operands(M, N, K, g)
    assert chosen(x_q, w_q.t(), x_s, w_s.t()) == "cutlass"
    gpu_helpers.poison()
    got = qbackend.scaled_mm(x_q, w_q.t(), x_s, w_s.t(), out_dtype=torch.bfloat16)
    want = gpu_helpers.reference(qbackend.scaled_mm, x_q, w_q.t(), x_s, w_s.t(), out_dtype=torch.bfloat16)
    assert not got.isnan().any()
    assert rel_err(got, want) < TOL[torch.bfloat16]
    pw = qbackend.prepare_weight(w_q, w_s, F8, "group")
    assert pw.provider == "cutlass"
    gpu_helpers.poison()
    lin = qbackend.linear(x_q, pw, x_s, out_dtype=torch.bfloat16)
    assert not lin.isnan().any()
    assert rel_err(lin, want) < TOL[torch.bfloat16]


def test_public_api_routes_other_block_shapes_elsewhere():
    """group_size 64 and [Kb, N] per-column block scales are not what the kernels read: another
    provider serves them."""
    g = torch.Generator(device=DEV).manual_seed(3)
    x_q, x_s, w_q, w_s = api_operands(8, 256, 512, g, group=64)
    assert chosen(x_q, w_q.t(), x_s, w_s.t(), group=64) != "cutlass"
    x_q, x_s, w_q, _ = api_operands(8, 256, 512, g)
    per_column = torch.rand(4, 256, device=DEV, generator=g) + 0.5
    assert chosen(x_q, w_q.t(), x_s, per_column) != "cutlass"
