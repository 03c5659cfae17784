"""libqbackend_cuda's scaled_mm (FP8 SM90 / SM89, INT8 SM80 / SM75) against a float64 oracle, on a GPU.

Every family the library reports (has_variant) is forced in turn, so the PTX-only families (SM89,
SM80, SM75: JIT-compiled on an H200) are checked on real silicon too. For each (N, K) and M we draw
fresh random operands, compute A @ B once in float64, and check all 4 scale combinations (per-tensor
/ per-token A x per-tensor / per-channel B), bias on and off, and bf16 and fp16 output, each into an
output poisoned with NaN; plus one run with sliced A (row stride > K) into a sliced output
(row stride > N).

Oracle: ref = (scale_a * scale_b) * (A.double() @ B.double()) + bias, in float64.
Tolerance, element-wise:  |out - ref| <= r_out * |ref| + r_acc * S,  S = |scale_a scale_b| (|A| @ |B|)
  r_out = 2^-7 (bf16) / 2^-9 (fp16): the final rounding to the output type (half an ulp is 2^-9 /
          2^-12 relative) with room for the fp32 epilogue's own roundings.
  r_acc = 2^-9 for fp8: Hopper's FP8 "fast accumulation" adds products in the tensor core with a
          reduced-precision (about 14-bit) accumulator, so the error scales with the sum of |a b|
          terms, not with |ref|; 2^-9 S is several times what that produces at K = 28672, yet a
          wrong element, scale or missing bias is off by O(|ref|) and fails.
          1e-6 for int8: the int32 accumulation is exact (K * 127^2 < 2^31), only fp32 epilogue
          rounding remains.
Plus, per output, the global relative error ||out - ref|| / ||ref|| <= 2e-2 (fp8) / 1e-2 (int8), and
no NaN anywhere (every element written).
"""

import pytest
import torch

from gpu_helpers import check_within_bound
from qbackend_providers import native

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if native.load() is None:
    pytest.skip(f"native library unavailable: {native.load_error()}", allow_module_level=True)

DEV = "cuda"
F8 = torch.float8_e4m3fn
MS = [1, 2, 3, 15, 16, 17, 63, 64, 127, 128, 255, 1000, 4096]
# (N, K): a long-K projection (K = 28672), a down projection (K = 14336), an LLM layer, and odd
# sizes whose N and K are multiples of 16 but not of any tile.
SHAPES = [(512, 28672), (4096, 14336), (6144, 4096), (2064, 1040), (16, 16)]
FP8_VARIANTS = [v for v in (90, 89) if native.has_variant("scaled_mm_fp8", v)]
INT8_VARIANTS = [v for v in (90, 80, 75) if native.has_variant("scaled_mm_int8", v)
                 and (v != 90 or torch.cuda.get_device_capability() == (9, 0))]
OUT_DTYPES = [torch.bfloat16, torch.float16]
SM90_ONLY = pytest.mark.skipif(90 not in FP8_VARIANTS or torch.cuda.get_device_capability() != (9, 0),
                               reason="programmatic launches are used by the sm_90a kernels only")
R_OUT = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -9}


def _gen(seed_extra=0):
    g = torch.Generator(device=DEV)
    g.seed()
    return g


def _operands(M, N, K, dtype, g):
    """A [M, K] (row-major) and B [K, N] (column-major view of a row-major [N, K] weight)."""
    if dtype == F8:
        a = (torch.randn(M, K, device=DEV, generator=g) * 2).to(F8)
        w = (torch.randn(N, K, device=DEV, generator=g) * 2).to(F8)
    else:
        a = torch.randint(-127, 128, (M, K), device=DEV, generator=g, dtype=torch.int8)
        w = torch.randint(-127, 128, (N, K), device=DEV, generator=g, dtype=torch.int8)
    return a, w.t()


def _scales(M, N, g, unit=1.0):
    """The 4 combinations (tensor/token x tensor/channel); values in [0.5, 1.5) * unit."""
    sa_tok = (torch.rand(M, 1, device=DEV, generator=g) + 0.5) * unit
    sb_ch = (torch.rand(1, N, device=DEV, generator=g) + 0.5) * unit
    sa_t = (torch.rand((), device=DEV, generator=g) + 0.5) * unit
    sb_t = (torch.rand((), device=DEV, generator=g) + 0.5) * unit
    return [(sa_t, sb_t), (sa_tok, sb_t), (sa_t, sb_ch), (sa_tok, sb_ch)]


def _run_case(M, N, K, dtype, variant):
    g = _gen()
    a, b = _operands(M, N, K, dtype, g)
    prod = a.double() @ b.double()
    absprod = a.double().abs() @ b.double().abs()
    r_acc, rel_max = (2.0 ** -9, 2e-2) if dtype == F8 else (1e-6, 1e-2)
    # int8 codes are +-127: scales of ~1/127 keep outputs inside fp16's range, as real ones do.
    unit = 1.0 if dtype == F8 else 1.0 / 127
    typical = prod.abs().mean().item() * unit * unit + 1.0  # bias as large as the outputs
    for out_dtype in OUT_DTYPES:
        bias_full = (torch.randn(N, device=DEV, generator=g) * typical).to(out_dtype)
        for sa, sb in _scales(M, N, g, unit):
            sab = sa.double() * sb.double()
            for bias in (None, bias_full):
                ref = sab * prod + (bias.double() if bias is not None else 0.0)
                out = torch.full((M, N), float("nan"), device=DEV, dtype=out_dtype)
                native.scaled_mm(a, b, sa, sb, bias, out, variant=variant)
                what = (f"v{variant} M={M} N={N} K={K} {out_dtype} sa={tuple(sa.shape)} sb={tuple(sb.shape)} "
                        f"bias={bias is not None}")
                check_within_bound(out, ref, sab.abs() * absprod, R_OUT[out_dtype], r_acc, rel_max, what)
    # Sliced A (row stride K + 64, 32-byte offset) into a sliced output (row stride N + 16).
    a_big = torch.zeros(M, K + 64, device=DEV, dtype=a.dtype)
    a_big[:, 32:32 + K] = a
    a_s = a_big[:, 32:32 + K]
    out_big = torch.full((M, N + 16), float("nan"), device=DEV, dtype=torch.bfloat16)
    out_s = out_big[:, :N]
    sa, sb = _scales(M, N, g, unit)[3]
    native.scaled_mm(a_s, b, sa, sb, bias_full.to(torch.bfloat16), out_s, variant=variant)
    ref = sa.double() * sb.double() * prod + bias_full.to(torch.bfloat16).double()
    check_within_bound(out_s, ref, (sa.double() * sb.double()).abs() * absprod, R_OUT[torch.bfloat16], r_acc, rel_max,
                       f"v{variant} M={M} N={N} K={K} sliced A/out")
    assert torch.isnan(out_big[:, N:].float()).all(), "wrote past the output slice"


@pytest.mark.parametrize("variant", FP8_VARIANTS)
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", MS)
def test_fp8_scaled_mm(M, N, K, variant):
    _run_case(M, N, K, F8, variant)


@pytest.mark.parametrize("variant", INT8_VARIANTS)
@pytest.mark.parametrize("N,K", [(512, 28672), (4096, 14336), (2064, 1040)])
@pytest.mark.parametrize("M", [1, 3, 16, 17, 64, 127, 255, 1000])
def test_int8_scaled_mm(M, N, K, variant):
    _run_case(M, N, K, torch.int8, variant)


def test_auto_variant_matches_forced():
    """AUTO picks a built family and computes the same thing."""
    M, N, K = 33, 4096, 4096
    g = _gen()
    a, b = _operands(M, N, K, F8, g)
    sa, sb = _scales(M, N, g)[3]
    out = torch.full((M, N), float("nan"), device=DEV, dtype=torch.bfloat16)
    native.scaled_mm(a, b, sa, sb, None, out)
    ref = sa.double() * sb.double() * (a.double() @ b.double())
    s_abs = (sa.double() * sb.double()) * (a.double().abs() @ b.double().abs())
    check_within_bound(out, ref, s_abs, 2.0 ** -7, 2.0 ** -9, 2e-2, "auto")


PRECISE = 90 | native.ACCUMULATE_PRECISE  # the sm90 family's precise-accumulation FP8 kernels
PRECISE_VARIANTS = [PRECISE] if native.has_variant("scaled_mm_fp8_precise", 90) and 90 in INT8_VARIANTS else []


@pytest.mark.parametrize("variant", PRECISE_VARIANTS)
@pytest.mark.parametrize("M,N,K", [(M, N, K) for M in MS for (N, K) in SHAPES])
def test_precise_fp8_scaled_mm(M, N, K, variant):
    _run_case(M, N, K, F8, variant)


@pytest.mark.parametrize("dtype,variant", [(F8, v) for v in FP8_VARIANTS + PRECISE_VARIANTS]
                         + [(torch.int8, 90)] * (90 in INT8_VARIANTS))
def test_every_config_and_decomposition(dtype, variant):
    """Each compiled config, forced, under each work decomposition: the tuning knobs stay correct."""
    names = native.config_names(dtype, variant)
    assert names
    g = _gen()
    try:
        for M, N, K in [(5, 4096, 4096), (200, 1024, 14336), (1000, 6144, 1040)]:
            a, b = _operands(M, N, K, dtype, g)
            sa, sb = _scales(M, N, g, 1.0 if dtype == F8 else 1.0 / 127)[3]  # as in _run_case
            bias = torch.randn(N, device=DEV, generator=g).to(torch.bfloat16)
            prod = a.double() @ b.double()
            ref = sa.double() * sb.double() * prod + bias.double()
            s_abs = sa.double() * sb.double() * (a.double().abs() @ b.double().abs())
            for cfg, name in enumerate(names):
                for decomp, splits, swizzle in [(0, 1, 1), (1, 3, 2), (2, 1, 8), (3, 1, 1)]:
                    native.override(cfg, decomp, splits, swizzle)
                    out = torch.full((M, N), float("nan"), device=DEV, dtype=torch.bfloat16)
                    native.scaled_mm(a, b, sa, sb, bias, out, variant=variant)
                    r_acc, rel_max = (2.0 ** -9, 2e-2) if dtype == F8 else (1e-6, 1e-2)  # as in _run_case
                    what = f"v{variant} {dtype} config {name} decomp {decomp}/{splits}/sw{swizzle} M={M} N={N} K={K}"
                    check_within_bound(out, ref, s_abs, 2.0 ** -7, r_acc, rel_max, what)
    finally:
        native.override()


# The wave-fit configs whose tiles are 80, 160 and 224 channels wide (extended wgmma shapes), the
# swapped 96-token tiles (64 < M <= 96), and 64-token tiles in pairs (96 < M <= 128), forced, at
# shapes where the dispatcher picks them on 132 SMs, with N not a multiple of the tile width and a
# partial last token tile: every scale combination, bias, both output dtypes, sliced A.
WIDE_TILES = [("128x160x128_ping_c2x1", 250, 10224, 1040), ("128x160x128_ping_c2x1", 1000, 10240, 1056),
              ("128x224x128_coop", 90, 28656, 1040), ("64x80x128_ping", 48, 10224, 1040),
              ("swap_64x96x128_ping", 72, 4096, 14336), ("swap_64x96x128_ping", 93, 2064, 1040),
              ("swap_64x64x128_ping_c1x2", 128, 4096, 14336), ("swap_64x64x128_ping_c1x2", 113, 4080, 1040),
              ("64x96x128_ping_c2x1", 113, 6096, 1040), ("64x160x128_ping_c2x1", 120, 10224, 1040),
              ("64x224x128_ping_c2x1", 100, 28656, 1040), ("swap_64x192x128_ping", 150, 6128, 1040),
              ("swap_64x192x128_ping", 129, 8192, 1056), ("swap_64x192x128_ping", 192, 28656, 1040)]


@pytest.mark.skipif(90 not in FP8_VARIANTS, reason="sm_90a family not built")
@pytest.mark.parametrize("name,M,N,K", WIDE_TILES)
def test_wide_tile_configs(name, M, N, K):
    assert native.auto_config(M, N, K, sm_count=132)["config"] == name
    native.override(native.config_names(F8, 90).index(name), 0, 1, 1)
    try:
        _run_case(M, N, K, F8, 90)
    finally:
        native.override()


SMALL_M_CONFIGS = [n for n in native.config_names(F8, 90) if n.startswith("stream")] if 90 in FP8_VARIANTS else []


@pytest.mark.skipif(not SMALL_M_CONFIGS, reason="sm_90a family not built")
@pytest.mark.parametrize("name", SMALL_M_CONFIGS or ["none"])
@pytest.mark.parametrize("splits", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (9, 2064, 1040), (17, 528, 16), (40, 1040, 14336),
                                   (64, 4096, 1024), (65, 1024, 1040), (130, 272, 4096), (300, 1040, 4112)])
def test_small_m_kernel(name, splits, M, N, K):
    """The small-M kernel forced, at every cluster split: every token tile (8 to 64, and several of
    them), N that is not a multiple of the tile rows, K that is not a multiple of the 128-wide K tile
    (or smaller than one tile, so the split is cut to 1), with all the checks of the main test."""
    native.override(native.config_names(F8, 90).index(name), 1, splits, -1)
    try:
        _run_case(M, N, K, F8, 90)
    finally:
        native.override()


@pytest.mark.skipif(not SMALL_M_CONFIGS, reason="sm_90a family not built")
@pytest.mark.parametrize("name", SMALL_M_CONFIGS or ["none"])
@pytest.mark.parametrize("splits,whole", [(1, 1), (1, 3), (2, 1), (3, 2), (4, 1), (8, 2)])
@pytest.mark.parametrize("M,N,K", [(1, 2064, 1040), (17, 1040, 4096), (40, 4096, 1040), (64, 528, 16),
                                   (8, 10240, 8192)])
def test_small_m_kernel_several_tiles_per_cta(name, splits, whole, M, N, K):
    """The small-M kernel with `whole` tiles per CTA before the cluster's shared tile (the plans for
    more tiles than SMs), forced on shapes whose last cluster is cut short (its own tiles or its shared
    tile past N), and where K is one tile (the split then cut to 1): every tile written, exactly once."""
    native.override(native.config_names(F8, 90).index(name), 1, splits, whole)
    try:
        _run_case(M, N, K, F8, 90)
    finally:
        native.override()


@pytest.mark.skipif(not SMALL_M_CONFIGS, reason="sm_90a family not built")
@pytest.mark.parametrize("M,N,K", [(1, 10240, 8192), (16, 28672, 4096), (32, 57344, 1024)])
def test_small_m_automatic_plans_for_many_tiles(M, N, K):
    """The automatic choice where 64-row tiles outnumber the SMs (several tiles per CTA), and the small-M
    configs forced with splits < 1 (their own automatic split and tiles per CTA)."""
    _run_case(M, N, K, F8, 90)
    for name in SMALL_M_CONFIGS:
        native.override(native.config_names(F8, 90).index(name), 1, -1, -1)
        try:
            _run_case(M, N, K, F8, 90)
        finally:
            native.override()


@pytest.mark.skipif(not SMALL_M_CONFIGS, reason="sm_90a family not built")
def test_small_m_split_k_is_deterministic():
    """Partial sums of a cluster are added in a fixed order: repeated calls agree bit for bit."""
    M, N, K = 16, 4096, 14336
    g = _gen()
    a, b = _operands(M, N, K, F8, g)
    sa, sb = _scales(M, N, g)[3]
    outs = []
    for splits, whole in [(8, -1), (4, 1), (3, 2)]:
        native.override(native.config_names(F8, 90).index(SMALL_M_CONFIGS[0]), 1, splits, whole)
        try:
            outs = [native.scaled_mm(a, b, sa, sb, None, torch.empty(M, N, device=DEV, dtype=torch.bfloat16))
                    for _ in range(5)]
        finally:
            native.override()
        for o in outs[1:]:
            assert torch.equal(o.view(torch.int16), outs[0].view(torch.int16)), (splits, whole)


@pytest.mark.parametrize("variant", FP8_VARIANTS)
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (128, 4096, 4096), (1000, 8192, 8192)])
def test_no_workspace_path(M, N, K, variant):
    """qb_scaled_mm without workspace: SM90 falls back to a data-parallel plan and gives the same
    result; the CUTLASS 2.x families may insist on a (small) workspace and then say so."""
    g = _gen()
    a, b = _operands(M, N, K, F8, g)
    sa, sb = _scales(M, N, g)[3]
    out = torch.full((M, N), float("nan"), device=DEV, dtype=torch.bfloat16)
    try:
        native.scaled_mm(a, b, sa, sb, None, out, variant=variant,
                         workspace=torch.empty(0, dtype=torch.uint8, device=DEV))
    except RuntimeError as e:
        assert variant != 90 and "workspace" in str(e), str(e)
        return
    ref = sa.double() * sb.double() * (a.double() @ b.double())
    s_abs = (sa.double() * sb.double()) * (a.double().abs() @ b.double().abs())
    check_within_bound(out, ref, s_abs, 2.0 ** -7, 2.0 ** -9, 2e-2, f"no workspace v{variant}")


def test_cuda_graph_quantize_then_mm():
    """quantize (dynamic per-token) + scaled_mm captured in a CUDA graph replay correctly on new data."""
    M, N, K = 16, 4096, 4096
    g = _gen()
    x = torch.randn(M, K, device=DEV, generator=g, dtype=torch.bfloat16)
    w = (torch.randn(N, K, device=DEV, generator=g) * 2).to(F8)
    sb = torch.rand(1, N, device=DEV, generator=g) + 0.5
    q = torch.empty(M, K, device=DEV, dtype=F8)
    s = torch.empty(M, 1, device=DEV)
    out = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)

    def step():
        native.quantize(x, q, s, native.DYNAMIC_TOKEN)
        native.scaled_mm(q, w.t(), s, sb, None, out)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    x.copy_(torch.randn(M, K, device=DEV, generator=g, dtype=torch.bfloat16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    amax = x.float().abs().amax(dim=1, keepdim=True)
    s_ref = torch.div(amax, torch.full_like(amax, 448.0)).clamp_min(1.0 / (448.0 * 512.0))
    q_ref = torch.div(x.float(), s_ref).clamp(-448, 448).to(F8)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    ref = s_ref.double() * sb.double() * (q_ref.double() @ w.double().t())
    check_within_bound(out, ref, s_ref.double() * sb.double() * (q_ref.double().abs() @ w.double().abs().t()),
                       2.0 ** -7, 2.0 ** -9, 2e-2, "graph replay")


def _chain_outputs(chain, steps, shape, graphs, programmatic):
    """chain(outs) run with programmatic launches on or off, eagerly or replayed from a CUDA graph,
    into `steps` NaN-poisoned bf16 outputs of `shape`; returns them."""
    native.set_programmatic_launch(programmatic)
    try:
        outs = [torch.full(shape, float("nan"), device=DEV, dtype=torch.bfloat16) for _ in range(steps)]
        if graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                chain(outs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain(outs)
            for out in outs:
                out.fill_(float("nan"))
            graph.replay()
        else:
            chain(outs)
        torch.cuda.synchronize()
        return outs
    finally:
        native.set_programmatic_launch(True)


def _programmatic_outputs(chain, steps, shape, graphs):
    """chain's outputs with programmatic launches, after checking that they are bit-identical to
    those of plain stream-ordered launches."""
    plain = _chain_outputs(chain, steps, shape, graphs, False)
    overlapped = _chain_outputs(chain, steps, shape, graphs, True)
    for i, (p, o) in enumerate(zip(plain, overlapped)):
        assert torch.equal(p.view(torch.int16), o.view(torch.int16)), f"step {i}: differs with programmatic launch"
    return overlapped


def _per_token_fp8(x):
    """The oracle of dynamic per-token e4m3 quantization of x (float32): (scales [rows, 1], codes)."""
    s = (x.abs().amax(dim=1, keepdim=True) / 448.0).clamp_min(1.0 / (448.0 * 512.0))
    return s, (x / s).clamp(-448, 448).to(F8)


@SM90_ONLY
@pytest.mark.parametrize("graphs", [False, True])
def test_programmatic_launch_waits_for_the_previous_kernel(graphs):
    """SM90 kernels launched as programmatic dependents must not read their inputs before the kernel
    before them has written them: a chain of quantize -> scaled_mm steps sharing one quantized buffer
    gives bit-identical results with programmatic launches on and off (and matches the oracle)."""
    M, N, K, steps = 48, 4096, 14336, 6
    g = _gen()
    xs = [torch.randn(M, K, device=DEV, generator=g, dtype=torch.bfloat16) * (i + 1) for i in range(steps)]
    w = (torch.randn(N, K, device=DEV, generator=g) * 2).to(F8)
    sb = torch.rand(1, N, device=DEV, generator=g) + 0.5
    q = torch.empty(M, K, device=DEV, dtype=F8)   # shared by every step: a stale read shows
    s = torch.empty(M, 1, device=DEV)

    def chain(outs):
        for x, out in zip(xs, outs):
            native.quantize(x, q, s, native.DYNAMIC_TOKEN)
            native.scaled_mm(q, w.t(), s, sb, None, out)

    overlapped = _programmatic_outputs(chain, steps, (M, N), graphs)
    s_ref, q_ref = _per_token_fp8(xs[-1].float())
    ref = s_ref.double() * sb.double() * (q_ref.double() @ w.double().t())
    s_abs = s_ref.double() * sb.double() * (q_ref.double().abs() @ w.double().abs().t())
    check_within_bound(overlapped[-1], ref, s_abs, 2.0 ** -7, 2.0 ** -9, 2e-2, "last step")


@SM90_ONLY
@pytest.mark.parametrize("graphs", [False, True])
def test_programmatic_launch_sees_a_weight_written_just_before(graphs):
    """The small-M kernel asks L2 for its weight before the kernel ahead of it has finished. What it
    reads must still be what that kernel wrote: here each GEMM's weight is quantized, into one shared
    buffer, by the kernel just before it (which lets its dependents start early)."""
    M, N, K, steps = 8, 4096, 4096, 6
    g = _gen()
    ws = [torch.randn(N, K, device=DEV, generator=g, dtype=torch.bfloat16) * (i + 1) for i in range(steps)]
    a = (torch.randn(M, K, device=DEV, generator=g) * 2).to(F8)
    sa = torch.ones((), device=DEV)
    wq = torch.empty(N, K, device=DEV, dtype=F8)   # shared by every step: a stale read shows
    sw = torch.empty(N, 1, device=DEV)

    def chain(outs):
        for w, out in zip(ws, outs):
            native.quantize(w, wq, sw, native.DYNAMIC_TOKEN)
            native.scaled_mm(a, wq.t(), sa, sw.view(1, N), None, out)

    overlapped = _programmatic_outputs(chain, steps, (M, N), graphs)
    s_ref, q_ref = _per_token_fp8(ws[-1].float())
    ref = (a.double() @ q_ref.double().t()) * s_ref.double().t()
    check_within_bound(overlapped[-1], ref, (a.double().abs() @ q_ref.double().abs().t()) * s_ref.double().t(),
                       2.0 ** -7, 2.0 ** -9, 2e-2, "last step")


@SM90_ONLY
def test_programmatic_launch_after_a_host_copy():
    """A programmatic launch relaxes only kernel-to-kernel order: a GEMM right after an asynchronous
    host-to-device copy of its input (a copy-engine operation, no kernel) must still see the copy."""
    M, N, K = 16, 4096, 8192
    g = _gen()
    w = (torch.randn(N, K, device=DEV, generator=g) * 2).to(F8)
    sa, sb = torch.ones((), device=DEV), torch.ones((), device=DEV)
    a = torch.empty(M, K, device=DEV, dtype=F8)
    host = [(torch.randn(M, K) * (i + 1)).to(F8).pin_memory() for i in range(8)]
    outs = [torch.full((M, N), float("nan"), device=DEV, dtype=torch.bfloat16) for _ in host]
    for h, out in zip(host, outs):
        a.copy_(h, non_blocking=True)          # cudaMemcpyAsync on the current stream
        native.scaled_mm(a, w.t(), sa, sb, None, out)
    torch.cuda.synchronize()
    for i, (h, out) in enumerate(zip(host, outs)):
        hd = h.to(DEV)
        ref = hd.double() @ w.double().t()
        check_within_bound(out, ref, hd.double().abs() @ w.double().abs().t(), 2.0 ** -7, 2.0 ** -9, 2e-2, f"copy {i}")


def _expect_error(fn, *needles):
    with pytest.raises(RuntimeError) as ei:
        fn()
    msg = str(ei.value)
    for n in needles:
        assert n in msg, msg


def test_errors_are_exceptions_not_faults():
    M, N, K = 4, 64, 64
    a = torch.zeros(M, K + 16, device=DEV, dtype=F8)
    w = torch.zeros(N, K, device=DEV, dtype=F8)
    one = torch.ones(1, device=DEV)
    out = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    lib = native.load()
    buf = native._errbuf()
    # K not a multiple of 16 (call the C ABI directly: the Python wrapper derives K from shapes).
    st = lib.qb_scaled_mm(a.data_ptr(), K, w.data_ptr(), K, out.data_ptr(), N, M, N, 40, 3, 3, 2,
                          one.data_ptr(), 0, one.data_ptr(), 0, None, 0, None, buf, 1024)
    assert st == 1 and b"multiple of 16" in buf.value
    # misaligned A (1-byte offset)
    _expect_error(lambda: native.scaled_mm(a[:, 1:1 + K - 16], w[:, :K - 16].t(), one, one, None, out),
                  "aligned")
    # NULL scale
    st = lib.qb_scaled_mm(a.data_ptr(), K, w.data_ptr(), K, out.data_ptr(), N, M, N, K, 3, 3, 2,
                          None, 0, one.data_ptr(), 0, None, 0, None, buf, 1024)
    assert st == 1 and b"non-NULL" in buf.value
    # bad dtype codes, e5m2, mixed operand types
    st = lib.qb_scaled_mm(a.data_ptr(), K, w.data_ptr(), K, out.data_ptr(), N, M, N, K, 4, 4, 2,
                          one.data_ptr(), 0, one.data_ptr(), 0, None, 0, None, buf, 1024)
    assert st == 2
    st = lib.qb_scaled_mm(a.data_ptr(), K, w.data_ptr(), K, out.data_ptr(), N, M, N, K, 3, 5, 2,
                          one.data_ptr(), 0, one.data_ptr(), 0, None, 0, None, buf, 1024)
    assert st == 2
    # lda < K
    st = lib.qb_scaled_mm(a.data_ptr(), 32, w.data_ptr(), K, out.data_ptr(), N, M, N, K, 3, 3, 2,
                          one.data_ptr(), 0, one.data_ptr(), 0, None, 0, None, buf, 1024)
    assert st == 1 and b"lda" in buf.value
    # unknown / unbuilt variant
    st = lib.qb_scaled_mm(a.data_ptr(), K, w.data_ptr(), K, out.data_ptr(), N, M, N, K, 3, 3, 2,
                          one.data_ptr(), 0, one.data_ptr(), 0, None, 77, None, buf, 1024)
    assert st == 1
    st = lib.qb_scaled_mm(a.data_ptr(), K, w.data_ptr(), K, out.data_ptr(), N, M, N, K, 3, 3, 2,
                          one.data_ptr(), 0, one.data_ptr(), 0, None, 75, None, buf, 1024)
    assert st == 3
    # M == 0: nothing to do, even with NULL pointers
    st = lib.qb_scaled_mm(None, K, None, K, None, N, 0, N, K, 3, 3, 2, None, 0, None, 0, None, 0, None,
                          buf, 1024)
    assert st == 0
    # the device is still healthy
    torch.cuda.synchronize()


def test_build_info_and_variants():
    info = native.build_info()
    assert info["abi"] == 1 and info["archs"]
    assert FP8_VARIANTS, "no fp8 family built"
    for v in FP8_VARIANTS:
        assert v in info["variants"]["scaled_mm_fp8"]
    assert native.has_variant("scaled_mm_fp8", 0)
    assert not native.has_variant("no_such_op", 0)
