"""grouped_scaled_mm and QuantMoE on a CUDA GPU: whichever provider serves there, against the
reference provider, and inside CUDA graphs whose replays see new routing.

Outputs are poisoned (NaN) before each call and checked NaN-free; tolerances are relative to the
output's magnitude (the torch provider's dequantized path rounds each operand to bf16 once).
"""
import pytest
import torch

import qbackend
from gpu_helpers import captured, poison, reference, rel_err
from qbackend import registry
from qbackend.nn import QuantMoE
from qbackend.validate_grouped import validate_grouped_scaled_mm

pytestmark = pytest.mark.gpu
DEV = "cuda"
F8 = torch.float8_e4m3fn
FAMILIES = ("tensor", "token_channel", "block")
# Both operands rounded to bf16 before one bf16 GEMM (fp32 accumulation), then bf16 out.
TOL = 3e-2


def sizes_for(dist, groups, g):
    if dist == "uniform":
        return torch.randint(0, 9, (groups,), generator=g).tolist()
    if dist == "skewed":
        sizes = torch.randint(0, 2, (groups,), generator=g)
        sizes[0] = 300
        return sizes.tolist()
    sizes = [0] * groups
    sizes[groups // 2] = 5
    return sizes


def operands(g, sizes, K, N, family, bias=False):
    groups, M = len(sizes), sum(sizes)
    a = (torch.randn(M, K, generator=g) * 40).to(F8).to(DEV)
    b = (torch.randn(groups, N, K, generator=g) * 40).to(F8).to(DEV).transpose(-2, -1)
    kb, nb = -(-K // 128), -(-N // 128)
    shapes = {"tensor": ((), (groups,)), "token_channel": ((M, 1), (groups, N)),
              "block": ((M, kb), (groups, kb, nb))}[family]
    sa, sb = ((torch.rand(s, generator=g) * 0.01 + 0.001).to(DEV) for s in shapes)
    offsets = torch.tensor(sizes).cumsum(0).to(torch.int32).to(DEV)
    bias_t = torch.randn(groups, N, generator=g).to(torch.bfloat16).to(DEV) if bias else None
    return a, b, sa, sb, offsets, bias_t


def served_path(a, b, sa, sb, offsets, bias):
    problem = validate_grouped_scaled_mm(a, b, sa, sb, offsets, None, bias)
    decision = qbackend.select(problem, a.device)
    provider = registry.get().providers[decision.name]
    return decision.name, (provider.plan(a.device, problem)[0] if hasattr(provider, "plan") else None)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dist", ["uniform", "skewed", "mostly_empty"])
@pytest.mark.parametrize("groups", [1, 8, 64, 128, 256])
def test_served_provider_against_reference(groups, dist, family):
    g = torch.Generator().manual_seed(groups * 7 + len(dist) + len(family))
    sizes = sizes_for(dist, groups, g)
    for K, N in ((2048, 768), (1408, 256)):
        args = operands(g, sizes, K, N, family, bias=groups == 8)
        poison()
        out = qbackend.grouped_scaled_mm(*args[:5], bias=args[5])
        ref = reference(qbackend.grouped_scaled_mm, *args[:5], bias=args[5])
        assert out.shape == ref.shape == (sum(sizes), N)
        if sum(sizes):
            assert rel_err(out.float(), ref.float()) < TOL, (served_path(*args), K, N)


def test_no_tokens_on_gpu():
    g = torch.Generator().manual_seed(1)
    args = operands(g, [0] * 16, 256, 256, "token_channel")
    assert qbackend.grouped_scaled_mm(*args[:5]).shape == (0, 256)


def _no_sync_path(args) -> bool:
    name, path = served_path(*args)
    return name != "reference" and path != "scaled_mm.per_group"


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_graph_replay_with_changing_routing(family):
    """Captured once, replayed after new offsets (and new activations) are written in place: each
    replay matches the reference for the routing of that moment."""
    g = torch.Generator().manual_seed(3)
    groups, M, K, N = 32, 96, 1024, 512
    a, b, sa, sb, offsets, bias = operands(g, [3] * groups, K, N, family, bias=True)
    if not _no_sync_path((a, b, sa, sb, offsets, bias)):
        pytest.skip(f"the provider serving {family} here reads offsets on the host: "
                    f"{served_path(a, b, sa, sb, offsets, bias)}")
    graph, out = captured(lambda: qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, bias=bias))
    for step in range(4):
        sizes = torch.multinomial(torch.ones(groups), M, replacement=True, generator=g).bincount(minlength=groups)
        offsets.copy_(sizes.cumsum(0).to(torch.int32))
        a.copy_((torch.randn(M, K, generator=g) * 40).to(F8))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(qbackend.grouped_scaled_mm, a, b, sa, sb, offsets, bias=bias)
        assert rel_err(out.float(), ref.float()) < TOL, step


def test_capture_of_a_host_reading_path_declines_by_name(monkeypatch):
    """N = 8 keeps the torch provider off its device-side paths: its per-group loop reads offsets on
    the host, so under capture it declines (as the reference does) and the error says why."""
    monkeypatch.setenv("QBACKEND_DISABLE", "cutlass")
    registry.reload()
    try:
        g = torch.Generator().manual_seed(4)
        a, b, sa, sb, offsets, _ = operands(g, [3, 0, 5], 256, 8, "token_channel")
        assert served_path(a, b, sa, sb, offsets, None) == ("torch", "scaled_mm.per_group")
        eager = qbackend.grouped_scaled_mm(a, b, sa, sb, offsets)
        ref = reference(qbackend.grouped_scaled_mm, a, b, sa, sb, offsets)
        assert rel_err(eager.float(), ref.float()) < TOL
        with pytest.raises(qbackend.NoProviderError, match="CUDA graph capture cannot do"):
            captured(lambda: qbackend.grouped_scaled_mm(a, b, sa, sb, offsets))
    finally:
        monkeypatch.delenv("QBACKEND_DISABLE")
        registry.reload()


@pytest.mark.parametrize("scheme", ["fp8_dynamic", "fp8_block"])
def test_quant_moe_on_gpu_and_in_a_graph(scheme):
    g = torch.Generator().manual_seed(5)
    E, H, INTER, k = 16, 512, 256, 4
    router = torch.randn(E, H, generator=g)
    w_gate, w_up = (torch.randn(E, INTER, H, generator=g) / H**0.5 for _ in range(2))
    w_down = torch.randn(E, H, INTER, generator=g) / INTER**0.5
    moe = QuantMoE.from_float(router, w_gate, w_up, w_down, k, scheme).to(DEV)
    x = torch.randn(24, H, generator=g).to(torch.bfloat16).to(DEV)
    eager = moe(x)
    ref = reference(moe, x)
    assert rel_err(eager.float(), ref.float()) < 5e-2
    probe_args = (torch.empty(1, H, dtype=F8, device=DEV), moe.w13.transpose(-2, -1),
                  torch.ones(1, 1 if scheme != "fp8_block" else H // 128, device=DEV),
                  moe._scale_b(moe.w13_scale), torch.ones(E, dtype=torch.int32, device=DEV), None)
    if not _no_sync_path(probe_args):
        pytest.skip("the provider serving QuantMoE here reads offsets on the host")
    graph, out = captured(lambda: moe(x))
    for _ in range(3):
        x.copy_(torch.randn(24, H, generator=g).to(torch.bfloat16))   # new routing
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out.float(), moe(x).float()) < 1e-2
