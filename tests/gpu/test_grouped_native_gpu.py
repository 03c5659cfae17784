"""The cutlass provider's grouped FP8 kernels forced, against float64 products of the same quantized
operands and against the reference provider: the sm89 family (mma.sync; through its PTX on Hopper)
and, on compute capability 9.0, the sm90 family (ptr-array TMA + WGMMA).

Every output is poisoned (NaN) before the call and checked NaN-free; each of the family's configs for
the scales at hand (narrow or swapped tiles for few rows per group, 128 x 128 and wider above) is
forced in turn. Also:
malformed offsets (never read on the host) fault nothing and leave rows past the last end NaN, and
a captured graph follows new routing.
"""
import pytest
import torch

import qbackend
from gpu_helpers import captured, check_within_bound, needs_sm, poison, reference, rel_err, with_provider
from qbackend.validate_grouped import validate_grouped_scaled_mm
from qbackend_providers import native

DEV = "cuda"
F8 = torch.float8_e4m3fn
pytestmark = [pytest.mark.gpu, needs_sm((8, 9), "e4m3 grouped kernels")]
FAMILIES = ("tensor", "token_channel", "block")
# fp32 accumulation (fast accumulation for row/column scales), one rounding to the output dtype.
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True, params=[89, 90], ids=["sm89", "sm90"])
def family_variant(request, monkeypatch):
    """The grouped family under test."""
    variant = request.param
    if not native.has_variant("grouped_scaled_mm_fp8", variant):
        pytest.skip(f"{native.library_path()} has no sm{variant} grouped kernels")
    if variant == 90 and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 grouped family runs on compute capability 9.0 only")
    with_provider(monkeypatch, "cutlass", QBACKEND_CUTLASS_VARIANT=str(variant))
    yield variant
    native.grouped_override(-1)


def family_config(variant, family, i):
    """The family's i-th config for these scales (sm90 lists block-scaled and other configs apart);
    skips the test where there is none."""
    names = native.grouped_config_names(variant)
    ids = [k for k, name in enumerate(names) if variant != 90 or ("_block_" in name) == (family == "block")]
    if i >= len(ids):
        pytest.skip(f"the sm{variant} family has {len(ids)} configs for {family} scales")
    return ids[i]


def assert_close(out, args, family, variant):
    """out against the float64 product: within TOL of the largest |ref|, and where the sm90 family
    sums fp8 products with the tensor cores' fast accumulation (tensor / row / column scales, the
    default accumulate="fast"), within the bounds tests/gpu/test_native_scaled_mm.py states for it:
    element-wise r_out |ref| + 2^-9 S, S = |scale_a scale_b| (|A| @ |B|), and 2e-2 norm-wise."""
    ref = exact(*args, family)
    if variant != 90 or family == "block":
        assert rel_err(out.double(), ref) < TOL[out.dtype]
        return
    a, b, sa, sb, offsets, _ = args
    s_abs = exact(a.double().abs(), b.double().abs(), sa, sb, offsets, None, family)
    r_out = 2.0 ** -7 if out.dtype == torch.bfloat16 else 2.0 ** -9
    check_within_bound(out, ref, s_abs, r_out, 2.0 ** -9, 2e-2, f"sm90 {family}")


def sizes_for(dist: str, groups: int, rows: int, g) -> list:
    """Rows per group: uniform routing, one hot expert, or all rows in three groups."""
    if dist == "uniform":
        return torch.multinomial(torch.ones(groups), rows, replacement=True, generator=g).bincount(
            minlength=groups).tolist()
    sizes = [0] * groups
    if dist == "skewed":
        sizes[groups // 3] = rows - rows // 4
        for i in torch.randint(0, groups, (rows // 4,), generator=g).tolist():
            sizes[i] += 1
        return sizes
    parts = (rows // 2, rows // 3, rows - rows // 2 - rows // 3)
    for i, r in zip(torch.randint(0, groups, (3,), generator=g).tolist(), parts):
        sizes[i] += r
    return sizes


def operands(g, sizes, K, N, family, out_dtype=torch.bfloat16, bias=False, row_pad=0):
    """Random operands drawn on the GPU (seeded from g), scales from 1e-4 to 1e-1 (log-uniform: their
    products span what checkpoints hold), offsets from `sizes`."""
    gd = torch.Generator(device=DEV).manual_seed(int(torch.randint(0, 1 << 30, (1,), generator=g)))
    groups, M = len(sizes), sum(sizes)
    a = (torch.randn(M, K + row_pad, generator=gd, device=DEV) * 30).to(F8)[:, :K]  # row_pad: a sliced view
    b = (torch.randn(groups, N, K, generator=gd, device=DEV) * 30).to(F8).transpose(-2, -1)
    kb, nb = -(-K // 128), -(-N // 128)
    shapes = {"tensor": ((), (groups,)), "token_channel": ((M, 1), (groups, N)),
              "block": ((M, kb), (groups, kb, nb))}[family]
    sa, sb = (torch.exp(torch.empty(s, device=DEV).uniform_(-9.2, -2.3, generator=gd)) for s in shapes)
    offsets = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(DEV)
    bias_t = torch.randn(groups, N, generator=gd, device=DEV).to(out_dtype) if bias else None
    return a, b, sa, sb, offsets, bias_t


def exact(a, b, sa, sb, offsets, bias, family):
    """float64 rows of each group from the same quantized operands and scales."""
    M, K = a.shape
    G, _, N = b.shape
    out = torch.zeros(M, N, dtype=torch.float64, device=DEV)
    start = 0
    for gi, end in enumerate(offsets.tolist()):
        if end > start:
            x, w = a[start:end].double(), b[gi].double()
            if family == "block":
                xs = sa[start:end].double().repeat_interleave(128, 1)[:, :K]
                ws = sb[gi].double().repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
                out[start:end] = (x * xs) @ (w * ws)
            else:
                s_a = sa.double().reshape(-1, 1)[start:end] if sa.numel() > 1 else sa.double()
                s_b = sb[gi].double().reshape(1, -1) if sb.dim() == 2 else sb[gi].double()
                out[start:end] = (x @ w) * s_a * s_b
            if bias is not None:
                out[start:end] += bias[gi].double()
        start = end
    return out


@pytest.mark.parametrize("config", [0, 1, 2])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dist", ["uniform", "skewed", "mostly_empty"])
@pytest.mark.parametrize("groups,rows", [(1, 37), (8, 200), (64, 130), (128, 513), (256, 64)])
def test_against_float64(groups, rows, dist, family, config, family_variant):
    g = torch.Generator().manual_seed(groups * 101 + rows + len(dist) * 7 + len(family) + config)
    native.grouped_override(family_config(family_variant, family, config))
    sizes = sizes_for(dist, groups, rows, g)
    # Partial last K and N blocks in the last two shapes; smaller ones where there are many experts.
    shapes = ((2048, 768), (1408, 2112), (7232, 520)) if groups <= 8 else ((2048, 256), (1408, 136))
    for K, N in shapes:
        args = operands(g, sizes, K, N, family, bias=groups == 8, row_pad=32 if groups == 64 else 0)
        poison()
        out = qbackend.grouped_scaled_mm(*args[:5], bias=args[5])
        assert out.shape == (sum(sizes), N) and not out.isnan().any(), (K, N)
        assert_close(out, args, family, family_variant)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_issue_shapes_and_outputs_against_reference(family, out_dtype, family_variant):
    """K and N of the issue's layers (7168, 2048, 4096, 1408, 768), both output dtypes and a bias,
    against the reference provider itself."""
    g = torch.Generator().manual_seed(11 + len(family))
    for K, N in ((7168, 4096), (2048, 7168), (4096, 1408), (768, 2048)):
        sizes = sizes_for("uniform", 16, 48, g)
        a, b, sa, sb, offsets, bias = operands(g, sizes, K, N, family, out_dtype, bias=True)
        poison()
        out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=out_dtype, bias=bias)
        ref = reference(qbackend.grouped_scaled_mm, a, b, sa, sb, offsets, out_dtype=out_dtype, bias=bias)
        assert out.dtype == out_dtype and not out.isnan().any()
        if family_variant == 90 and family != "block":  # fast accumulation: the element-wise bound
            assert_close(out, (a, b, sa, sb, offsets, bias), family, family_variant)
        else:
            assert rel_err(out.double(), ref.double()) < TOL[out_dtype], (K, N)


def test_as_many_groups_as_allowed():
    g = torch.Generator().manual_seed(5)
    sizes = sizes_for("uniform", 1024, 700, g)
    args = operands(g, sizes, 256, 128, "block")
    poison()
    out = qbackend.grouped_scaled_mm(*args[:5])
    assert rel_err(out.double(), exact(*args, "block")) < TOL[out.dtype]


@pytest.mark.parametrize("family", ["token_channel", "block"])
@pytest.mark.parametrize("bad", ["short", "decreasing", "past_the_end", "negative"])
def test_malformed_offsets_fault_nothing(bad, family, family_variant):
    """offsets are data the host never reads: wrong ones must not fault; rows past the clamped last
    end are NaN, and valid groups before the first bad end are still right."""
    g = torch.Generator().manual_seed(7)
    sizes = [5, 0, 7, 4]
    a, b, sa, sb, offsets, _ = operands(g, sizes, 512, 256, family)
    good = exact(a, b, sa, sb, offsets, None, family)
    wrong = {"short": [5, 5, 12, 13], "decreasing": [5, 3, 12, 16], "past_the_end": [5, 5, 12, 1 << 30],
             "negative": [-4, -4, 12, 16]}[bad]
    offsets.copy_(torch.tensor(wrong, dtype=torch.int32))
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets)
    torch.cuda.synchronize()  # a fault would surface here
    if bad == "short":
        assert out[13:].isnan().all() and not out[:13].isnan().any()
    else:
        assert not out.isnan().any()
    assert rel_err(out[:5].double(), good[:5]) < TOL[out.dtype] or bad == "negative"


@pytest.mark.parametrize("M", [256, 4096])
def test_graph_replay_follows_new_routing(M, family_variant):
    g = torch.Generator().manual_seed(9)
    groups, K, N = 64, 1024, 512
    a, b, sa, sb, offsets, bias = operands(g, sizes_for("uniform", groups, M, g), K, N, "block", bias=True)
    graph, out = captured(lambda: qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias))
    for step in range(4):
        sizes = sizes_for(("skewed", "uniform", "mostly_empty", "uniform")[step], groups, M, g)
        offsets.copy_(torch.tensor(sizes).cumsum(0).to(torch.int32))
        a.copy_((torch.randn(M, K, device=DEV) * 30).to(F8))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out.double(), exact(a, b, sa, sb, offsets, bias, "block")) < TOL[out.dtype], step


def test_sm90_family_is_the_automatic_choice(family_variant):
    """On compute capability 9.0 every grouped call wants the sm90 family's workspace (so the
    automatic choice takes it); forcing the sm89 family wants none."""
    if family_variant != 90:
        pytest.skip("about the sm90 family")
    M, N, K, G = 4096, 2048, 7168, 256
    for block in (True, False):
        for bias in (False, True):
            assert native.grouped_workspace_size(M, N, K, G, torch.bfloat16, block=block, bias=bias) > 0
    assert native.grouped_workspace_size(M, N, K, G, torch.bfloat16, block=True, variant=89) == 0


def test_a_config_for_other_scales_is_refused(family_variant):
    if family_variant != 90:
        pytest.skip("about the sm90 family")
    g = torch.Generator().manual_seed(17)
    args = operands(g, [3, 5], 256, 128, "token_channel")
    native.grouped_override(family_config(90, "block", 0))
    with pytest.raises(RuntimeError, match="takes block scales, this call has tensor / row / column ones"):
        qbackend.grouped_scaled_mm(*args[:5])


def test_unsupported_layouts_are_refused_by_name():
    """A forced cutlass on a problem its grouped kernels cannot take says which rule fails, and the
    call goes to the next provider that can (forcing is a preference, not a failure)."""
    g = torch.Generator().manual_seed(13)
    a, b, sa, sb, offsets, _ = operands(g, [4, 4], 256, 64, "token_channel")
    problem = validate_grouped_scaled_mm(a, b, sa, sb, offsets, torch.float32, None)
    decision = qbackend.select(problem, torch.device(DEV))
    assert decision.name != "cutlass"
    assert "float32" in dict(decision.verdicts)["cutlass"].reason
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert rel_err(out.double(), exact(a, b, sa, sb, offsets, None, "token_channel")) < 1e-2
