"""The sm_90a W8A16 kernels through the C ABI (qb_scaled_mm with bf16/fp16 activations and an e4m3
weight): every config, the small-M kernel's cluster splits, odd shapes, strided activations, bias,
both activation dtypes, CUDA graphs, and the argument checks. Outputs are poisoned with NaN before
each call and compared with a float64 product of the same operands."""
import pytest
import torch

from qbackend_providers import native

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if native.load() is None:
    pytest.skip(f"native library unavailable: {native.load_error()}", allow_module_level=True)
if not native.has_variant("scaled_mm_w8a16", 90) or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the sm_90a W8A16 kernels need an sm_90 device and the sm90 family", allow_module_level=True)

DEV = "cuda"
F8 = torch.float8_e4m3fn
ACTS = [torch.bfloat16, torch.float16]
# Products in the activation dtype of exact e4m3 values, fp32 sums, one rounding of the output:
# the error is that rounding (2^-8 / 2^-11 relative) plus fp32 summation.
TOL = {torch.bfloat16: 8e-3, torch.float16: 2e-3}
SHAPES = [(1, 4096, 4096), (5, 520, 8192), (37, 200, 272), (64, 2112, 7168 + 64), (130, 2112, 1024),
          (300, 136, 16), (16, 8, 32), (1000, 4096, 2048)]


def operands(M, N, K, act, g, bias=True, lda_pad=24):
    w = (torch.randn(N, K, device=DEV, generator=g) * 3).to(F8)
    s = torch.rand(N, device=DEV, generator=g) * 0.02 + 1e-3
    a = torch.randn(M, K + lda_pad, device=DEV, generator=g).to(act)[:, 8:8 + K]  # strided rows, 16-byte offset
    b = torch.randn(N, device=DEV, generator=g).to(act) if bias else None
    return a, w, s, b


def reference(a, w, s, bias):
    y = a.double() @ (w.double() * s.double().reshape(-1, 1)).t()
    return y if bias is None else y + bias.double()


def run(a, w, s, bias, config=-1, decomposition=-1, splits=-1):
    M, N, K = a.shape[0], w.shape[0], a.shape[1]
    out = torch.full((M, N), float("nan"), dtype=a.dtype, device=DEV)
    native.override(config, decomposition, splits)
    try:
        need = native.scaled_mm_workspace_size(M, N, K, a.dtype, a.dtype, 90)
        work = torch.empty(max(need, 1), dtype=torch.uint8, device=DEV)
        native.scaled_mm(a, w.t(), None, s, bias, out, native.VARIANT_SM90, work)
    finally:
        native.override()
    return out


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


CONFIGS = native.config_names(torch.bfloat16, 90)


def test_configs_listed():
    assert CONFIGS[-1] == "w8a16_stream_64" and all(c.startswith("w8a16_") for c in CONFIGS)
    assert native.config_names(torch.float16, 90) == CONFIGS


@pytest.mark.parametrize("act", ACTS, ids=["bf16", "fp16"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_automatic_choice(M, N, K, act):
    g = torch.Generator(device=DEV).manual_seed(M * 7 + N + K)
    a, w, s, bias = operands(M, N, K, act, g)
    out = run(a, w, s, bias)
    assert not out.isnan().any()
    assert rel_err(out, reference(a, w, s, bias)) < TOL[act]


@pytest.mark.parametrize("act", ACTS, ids=["bf16", "fp16"])
@pytest.mark.parametrize("config", range(len(CONFIGS)), ids=CONFIGS)
def test_every_config(config, act):
    g = torch.Generator(device=DEV).manual_seed(config)
    variants = [(2, -1), (0, -1)] if CONFIGS[config].endswith("coop") else [(-1, -1)]
    if CONFIGS[config].endswith("stream_64"):
        variants = [(-1, c) for c in (1, 2, 3, 8)]
    for M, N, K in [(3, 520, 8192), (77, 2064, 1040), (300, 136, 16)]:
        a, w, s, bias = operands(M, N, K, act, g, bias=M != 77)
        ref = reference(a, w, s, bias)
        for decomposition, splits in variants:
            out = run(a, w, s, bias, config, decomposition, splits)
            what = (CONFIGS[config], decomposition, splits, M, N, K)
            assert not out.isnan().any(), what
            assert rel_err(out, ref) < TOL[act], what


def test_tensor_scale_and_deterministic_split():
    g = torch.Generator(device=DEV).manual_seed(1)
    a, w, s, bias = operands(9, 4096, 14336, torch.bfloat16, g)
    s = s[:1].clone()
    ref = reference(a, w, s, bias)
    first = run(a, w, s, bias, len(CONFIGS) - 1, -1, 4)
    assert rel_err(first, ref) < TOL[torch.bfloat16]
    for _ in range(3):  # the cluster reduction sums in a fixed order
        assert torch.equal(run(a, w, s, bias, len(CONFIGS) - 1, -1, 4), first)


@pytest.mark.parametrize("M", [1, 48, 512])
def test_cuda_graph_replay(M):
    g = torch.Generator(device=DEV).manual_seed(M)
    a, w, s, bias = operands(M, 2048, 4096, torch.bfloat16, g)
    out = torch.empty(M, 2048, dtype=torch.bfloat16, device=DEV)
    step = lambda: native.scaled_mm(a, w.t(), None, s, bias, out, native.VARIANT_SM90)  # noqa: E731
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        a.copy_(torch.randn(a.shape, device=DEV, generator=g))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference(a, w, s, bias)) < TOL[torch.bfloat16]


def test_argument_checks():
    M, N, K = 4, 64, 64
    a = torch.zeros(M, K + 8, device=DEV, dtype=torch.bfloat16)
    w = torch.zeros(N, K, device=DEV, dtype=F8)
    one = torch.ones(1, device=DEV)
    out = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    lib, buf = native.load(), native._errbuf()
    BF16, F16, E4M3 = 2, 1, 3

    def call(a_ptr=a.data_ptr(), lda=K + 8, a_dtype=BF16, b_dtype=E4M3, out_dtype=BF16, scale_a=None, n=N):
        return lib.qb_scaled_mm(a_ptr, lda, w.data_ptr(), K, out.data_ptr(), N, M, n, K, a_dtype, b_dtype,
                                out_dtype, scale_a, 0, one.data_ptr(), 0, None, 0, None, buf, 1024)

    assert call() == 0
    torch.cuda.synchronize()
    assert call(scale_a=one.data_ptr()) == 1 and b"no scale_a" in buf.value
    assert call(out_dtype=F16) == 2 and b"a's dtype" in buf.value
    assert call(b_dtype=BF16) == 2 and b"must be e4m3" in buf.value
    assert call(lda=K + 4) == 1 and b"16 bytes" in buf.value
    assert call(a_ptr=a.data_ptr() + 2) == 1 and b"aligned" in buf.value
    assert call(n=60) == 1 and b"multiple of 8" in buf.value
    with pytest.raises(ValueError, match="scale_a must be None"):
        native.scaled_mm(a[:, :K], w.t(), one, one, None, out)
    torch.cuda.synchronize()
