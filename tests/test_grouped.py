"""grouped_scaled_mm on the CPU: the reference against a float64 loop over groups, the torch
provider's paths (forced) against the reference, torch.compile, and every validation rule."""
from __future__ import annotations

import pytest
import torch

import qbackend
from helpers import oracle_scaled_mm, rand_q, rand_scale, rel_err
from qbackend import ops, registry
from qbackend.problem import Granularity as G
from qbackend.problem import Op
from qbackend.validate_grouped import validate_grouped_scaled_mm

FP8 = torch.float8_e4m3fn
FAMILIES = ("tensor", "token_channel", "block")


def group_sizes(dist: str, groups: int, gen) -> list:
    """Rows per group: uniform (random around a mean), skewed (one hot group takes most rows) or
    mostly empty (a few groups hold every row)."""
    if dist == "uniform":
        return torch.randint(0, 5, (groups,), generator=gen).tolist()
    if dist == "skewed":
        sizes = torch.randint(0, 2, (groups,), generator=gen)
        sizes[torch.randint(0, groups, (), generator=gen)] = 40
        return sizes.tolist()
    sizes = torch.zeros(groups, dtype=torch.int64)
    for g in torch.randint(0, groups, (min(3, groups),), generator=gen).tolist():
        sizes[g] += int(torch.randint(1, 7, (), generator=gen))
    return sizes.tolist()


def operands(gen, sizes, K=256, N=160, family="token_channel", dtype=FP8, bias_dtype=None):
    """(a, b, scale_a, scale_b, offsets, bias) for groups of the given row counts."""
    groups, M = len(sizes), sum(sizes)
    a = rand_q((M, K), dtype, gen)
    b = rand_q((groups, N, K), dtype, gen).transpose(-2, -1)
    kb, nb = -(-K // 128), -(-N // 128)
    if family == "tensor":
        sa, sb = rand_scale((), gen), rand_scale((groups,), gen)
    elif family == "token_channel":
        sa, sb = rand_scale((M, 1), gen), rand_scale((groups, N), gen)
    else:
        sa, sb = rand_scale((M, kb), gen), rand_scale((groups, kb, nb), gen)
    offsets = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)
    bias = None if bias_dtype is None else torch.randn(groups, N, generator=gen).to(bias_dtype)
    return a, b, sa, sb, offsets, bias


def oracle(a, b, sa, sb, offsets, bias=None):
    """float64, one group at a time, with the scales written out in scaled_mm's forms."""
    out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64)
    start = 0
    for g, end in enumerate(offsets.tolist()):
        if end > start:
            sa_g = sa if sa.numel() == 1 else sa[start:end]
            sb_g = sb[g] if sb.dim() != 2 else sb[g].reshape(1, -1)
            out[start:end] = oracle_scaled_mm(a[start:end], b[g], sa_g, sb_g,
                                              None if bias is None else bias[g])
        start = end
    return out


def force(monkeypatch, name):
    monkeypatch.setenv("QBACKEND_PROVIDER", name)
    registry.reload()


# ------------------------------------------------------------------------------ the reference

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dist", ["uniform", "skewed", "mostly_empty"])
@pytest.mark.parametrize("groups", [1, 8, 64, 256])
def test_reference_against_float64_loop(gen, groups, dist, family):
    sizes = group_sizes(dist, groups, gen)
    a, b, sa, sb, offsets, _ = operands(gen, sizes, family=family)
    assert qbackend.select(validate_grouped_scaled_mm(a, b, sa, sb, offsets, torch.float32, None)).name \
        == "reference"
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=torch.float32)
    assert out.shape == (sum(sizes), 160) and out.dtype == torch.float32
    if sum(sizes):
        # fp32 accumulation of exact fp8 products against float64.
        assert rel_err(out, oracle(a, b, sa, sb, offsets)) < 1e-5


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", FAMILIES)
def test_half_outputs_and_bias(gen, out_dtype, family):
    sizes = group_sizes("uniform", 8, gen) + [1, 0, 1]  # one-row and empty groups at the end
    a, b, sa, sb, offsets, bias = operands(gen, sizes, family=family, bias_dtype=out_dtype)
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=out_dtype, bias=bias)
    assert out.dtype == out_dtype
    ref = oracle(a, b, sa, sb, offsets, bias)
    assert rel_err(out, ref) < 2 ** -7
    # The bias is each group's own: dropping it changes exactly the rows of non-empty groups.
    plain = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=out_dtype)
    assert rel_err(plain, oracle(a, b, sa, sb, offsets)) < 2 ** -7


def test_int8_groups(gen):
    a, b, sa, sb, offsets, _ = operands(gen, [3, 0, 5, 2], family="token_channel", dtype=torch.int8)
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=torch.float32)
    assert rel_err(out, oracle(a, b, sa, sb, offsets)) < 1e-6


def test_each_group_uses_its_own_weight(gen):
    """Swapping two groups' weights changes their rows and no others."""
    a, b, sa, sb, offsets, _ = operands(gen, [4, 4, 4], family="tensor")
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=torch.float32)
    swapped = b[[1, 0, 2]]
    out2 = qbackend.grouped_scaled_mm(a, swapped, sa, sb[[1, 0, 2]], offsets, out_dtype=torch.float32)
    assert not torch.equal(out[:8], out2[:8])
    assert torch.equal(out[8:], out2[8:])


def test_one_block_per_group_is_a_per_group_scale(gen):
    """scale_b [G, 1, 1] (the block form when K and N fit one 128 x 128 block) is one scale per group."""
    a, b, sa, sb, offsets, _ = operands(gen, [3, 0, 5], K=128, N=96, family="tensor")
    sb = rand_scale((3,), gen)
    blocks = qbackend.grouped_scaled_mm(a, b, sa, sb.reshape(3, 1, 1), offsets, out_dtype=torch.float32)
    assert torch.equal(blocks, qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=torch.float32))


@pytest.mark.parametrize("family", FAMILIES)
def test_no_tokens(gen, family):
    a, b, sa, sb, offsets, _ = operands(gen, [0] * 8, family=family)
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets)
    assert out.shape == (0, 160) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("offsets, match", [([3, 2, 8], "non-decreasing"), ([3, 5, 7], "must equal a's row count")])
def test_reference_checks_offsets_values(gen, offsets, match):
    a, b, sa, sb, _, _ = operands(gen, [3, 2, 3])
    with pytest.raises(ValueError, match=f"offsets: .*{match}"):
        qbackend.grouped_scaled_mm(a, b, sa, sb, torch.tensor(offsets, dtype=torch.int32))


# --------------------------------------------------------------------------- the torch provider

@pytest.mark.parametrize("family", FAMILIES)
def test_torch_dequant_path_in_chunks_of_groups(gen, monkeypatch, family):
    """The dequantizing path builds the bf16 weights a few groups at a time: with chunks of one
    group the result is the same as with the whole layer at once."""
    from qbackend_providers import torch_grouped

    a, b, sa, sb, offsets, bias = operands(gen, group_sizes("uniform", 6, gen), family=family,
                                           bias_dtype=torch.bfloat16)
    force(monkeypatch, "torch")
    whole = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias)
    monkeypatch.setattr(torch_grouped, "_DEQUANT_CHUNK", 1)
    assert torch.equal(qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias), whole)


def test_torch_provider_past_torchs_group_limit_loops(gen, monkeypatch):
    """torch's CUDA grouped GEMMs refuse 1024 groups: past GROUPED_MAX_GROUPS the provider takes its
    per-group loop (here with the limit lowered to 4, and the grouped ops made to fail if called)."""
    from qbackend_providers import torch_grouped, torch_paths

    a, b, sa, sb, offsets, bias = operands(gen, group_sizes("uniform", 6, gen), family="token_channel",
                                           bias_dtype=torch.bfloat16)
    ref = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias)
    force(monkeypatch, "torch")
    monkeypatch.setattr(torch_paths, "GROUPED_MAX_GROUPS", 4)

    def refuse(*args, **kwargs):
        raise AssertionError("torch's grouped op called past the group limit")
    monkeypatch.setattr(torch_grouped, "dequant_grouped_mm", refuse)
    monkeypatch.setattr(torch_grouped, "scaled_grouped_mm", refuse)
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias)
    assert rel_err(out, ref.float()) < 2 ** -7


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("N", [160, 136])   # 136: not a multiple of 16, the per-group loop
def test_torch_provider_against_reference(gen, monkeypatch, family, N):
    sizes = group_sizes("skewed", 16, gen) + [0, 1]
    a, b, sa, sb, offsets, bias = operands(gen, sizes, N=N, family=family, bias_dtype=torch.bfloat16)
    ref = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias)
    force(monkeypatch, "torch")
    problem = validate_grouped_scaled_mm(a, b, sa, sb, offsets, None, bias)
    path = "grouped_mm.dequant" if N == 160 else "scaled_mm.per_group"
    assert registry.get().providers["torch"].plan(a.device, problem)[0] == path
    out = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias)
    # Both round once to bf16 from fp32 sums taken in different orders.
    assert rel_err(out, ref.float()) < 2 ** -7


# ------------------------------------------------------------------------------ torch.compile

@pytest.mark.parametrize("provider", ["reference", "torch"])
def test_compile_fullgraph(gen, monkeypatch, provider):
    force(monkeypatch, provider)
    a, b, sa, sb, offsets, bias = operands(gen, [5, 0, 9, 2], family="token_channel", bias_dtype=torch.bfloat16)

    def moe_matmul(a, b, sa, sb, offsets, bias):
        return qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias).float() * 2

    compiled = torch.compile(moe_matmul, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(a, b, sa, sb, offsets, bias), moe_matmul(a, b, sa, sb, offsets, bias),
                               rtol=0, atol=0)
    # New routing, same shapes: the same graph, the new offsets honoured.
    offsets2 = torch.tensor([1, 1, 16, 16], dtype=torch.int32)
    torch.testing.assert_close(compiled(a, b, sa, sb, offsets2, bias), moe_matmul(a, b, sa, sb, offsets2, bias),
                               rtol=0, atol=0)


def test_opcheck_and_fake_shapes(gen):
    # opcheck's schema test does arithmetic torch's CPU kernels lack for float8 (as for scaled_mm,
    # tests/test_torch_integration.py): float8 runs the other tests, int8 runs them all.
    fp8_utils = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")
    a, b, sa, sb, offsets, bias = operands(gen, [2, 3], family="block", bias_dtype=torch.float16)
    torch.library.opcheck(ops.grouped_scaled_mm_op, (a, b, sa, sb, offsets, torch.float16, bias, 128),
                          test_utils=fp8_utils)
    a, b, sa, sb, offsets, bias = operands(gen, [0, 3], dtype=torch.int8, bias_dtype=torch.float32)
    torch.library.opcheck(ops.grouped_scaled_mm_op, (a, b, sa, sb, offsets, torch.float32, bias, 128))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = ops.grouped_scaled_mm_op(torch.empty(7, 256, dtype=FP8),
                                       torch.empty(4, 96, 256, dtype=FP8).transpose(-2, -1),
                                       torch.empty(7, 1), torch.empty(4, 96), torch.empty(4, dtype=torch.int32),
                                       torch.float16, None)
        assert out.shape == (7, 96) and out.dtype == torch.float16


def test_selection_kinds():
    table = qbackend.selection_table(None, qbackend.problem.ALL_KINDS)
    assert table["fp8_grouped_block"][0] == "reference"
    problem = qbackend.problem.representative("fp8_grouped_per_token_channel")
    assert problem.op is Op.GROUPED_SCALED_MM and (problem.scale_a, problem.scale_b) == (G.TOKEN, G.CHANNEL)
    text = qbackend.explain("fp8_grouped_per_token_channel")
    assert "grouped_scaled_mm W8A8" in text and "cutlass: runs on cuda, not cpu" in text


# ------------------------------------------------------------------------------------ validation

def _bad(gen, **change):
    a, b, sa, sb, offsets, bias = operands(gen, [2, 3, 1], K=256, N=128, family="token_channel",
                                           bias_dtype=torch.bfloat16)
    args = dict(a=a, b=b, scale_a=sa, scale_b=sb, offsets=offsets, bias=bias, out_dtype=None)
    args.update({k: (v(args) if callable(v) else v) for k, v in change.items()})
    return args


BAD = [
    ({"a": lambda x: x["a"].float()}, TypeError, "a: dtype must be float8"),
    ({"a": lambda x: x["a"][None]}, ValueError, "a: must have rank 2"),
    ({"b": lambda x: x["b"][0]}, ValueError, "b: must have rank 3"),
    ({"b": lambda x: x["b"].contiguous()}, ValueError, "b: must be column-major per group"),
    ({"b": lambda x: x["b"][:, :128]}, ValueError, "b: must be \\[G, K, N\\] with K matching"),
    ({"b": lambda x: x["b"].to(torch.float8_e4m3fnuz)}, TypeError, "a, b: float8 formats cannot mix"),
    ({"b": lambda x: x["b"].view(torch.int8)}, TypeError, "a, b: int8 pairs only with int8"),
    ({"offsets": lambda x: x["offsets"].long()}, TypeError, "offsets: must be an int32 tensor"),
    ({"offsets": lambda x: x["offsets"][:2]}, ValueError, "offsets: shape must be \\[G\\] = \\[3\\]"),
    ({"offsets": [2, 5, 6]}, TypeError, "offsets: must be a torch.Tensor"),
    ({"offsets": lambda x: x["offsets"].to("meta")}, ValueError, "offsets: must be on the same device as a"),
    ({"scale_a": None}, ValueError, "scale_a: is required"),
    ({"scale_a": lambda x: x["scale_a"].double()}, TypeError, "scale_a: must be a float32 tensor"),
    ({"scale_a": lambda x: x["scale_a"][:3]}, ValueError, "scale_a: shape must be"),
    ({"scale_b": lambda x: x["scale_b"][:2]}, ValueError, "scale_b: shape must be"),
    ({"scale_b": lambda x: x["scale_b"][:, :64]}, ValueError, "scale_b: shape must be"),
    ({"bias": lambda x: x["bias"].float()}, TypeError, "bias: dtype must equal out_dtype"),
    ({"bias": lambda x: x["bias"][0]}, ValueError, "bias: shape must be \\[G, N\\]"),
    ({"out_dtype": torch.int32}, ValueError, "out_dtype: must be one of"),
]


@pytest.mark.parametrize("change, exc, match", BAD, ids=[m for _, _, m in BAD])
def test_validation_errors(gen, change, exc, match):
    args = _bad(gen, **change)
    with pytest.raises(exc, match="qbackend.grouped_scaled_mm: " + match):
        qbackend.grouped_scaled_mm(**args)


def test_validation_group_count_and_group_size(gen):
    args = _bad(gen)
    with pytest.raises(ValueError, match="group_size: must be a positive int"):
        qbackend.grouped_scaled_mm(**args, group_size=0)
    a = args["a"]
    b = torch.empty(1025, 16, 256, dtype=FP8).transpose(-2, -1)
    with pytest.raises(ValueError, match="b: must hold 1 to 1024 groups"):
        qbackend.grouped_scaled_mm(a, b, args["scale_a"], torch.ones(1025), torch.zeros(1025, dtype=torch.int32))
