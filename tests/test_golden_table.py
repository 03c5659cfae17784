"""The golden selection table: simulated archs x problem kinds -> provider, with reasons.

The expected choices are written out here by hand (the rules of the design); the full table with
every rejection reason is also committed in docs/selection.md and must match the code."""
import re
from pathlib import Path

import pytest
import torch

import qbackend
from qbackend import golden, registry
from qbackend.problem import GROUPED_KINDS, PROBLEM_KINDS
from qbackend.validate import validate_quantize

R, C, M, H, T = "reference", "cutlass", "marlin", "hipblaslt", "torch"
# kinds: fp8_w8a8_per_tensor, fp8_w8a8_per_token_channel, fp8_w8a16, int8_w8a8, fp8_block
EXPECTED = {
    "sm_75": (T, T, M, C, T),
    "sm_80": (T, T, M, C, T),
    "sm_86": (T, T, M, C, T),
    "sm_89": (C, C, M, C, C),
    "sm_90": (C, C, C, C, C),
    "sm_100": (C, C, M, C, C),
    "gfx942": (H, H, T, T, T),
    "gfx950": (H, H, T, T, T),
    "cpu": (R, R, R, R, R),
}

# The grouped (MoE) kinds: fp8_grouped_per_tensor, fp8_grouped_per_token_channel, fp8_grouped_block.
# cutlass's grouped kernels serve Ada and Hopper (the sm_89 and sm_90a families), and block scales on
# every newer NVIDIA arch (torch has no grouped blockwise op there); torch the other GPUs, the
# reference the CPU.
GROUPED_EXPECTED = {arch: (R, R, R) if arch == "cpu" else (C, C, C) if arch in ("sm_89", "sm_90")
                    else (T, T, C) if arch == "sm_100" else (T, T, T) for arch in EXPECTED}


@pytest.fixture(scope="module")
def table():
    return golden.golden()


@pytest.mark.parametrize("arch", golden.ARCHS)
def test_choices(table, arch):
    got = tuple(table[arch][kind][0] for kind in PROBLEM_KINDS)
    assert got == EXPECTED[arch]
    assert tuple(table[arch][kind][0] for kind in GROUPED_KINDS) == GROUPED_EXPECTED[arch]


def test_grouped_paths_named():
    """explain names the torch path of each grouped kind: torch._scaled_grouped_mm for rowwise
    scales on sm_90 (where cutlass serves by default), torch._grouped_mm on dequantized
    operands for block scales on sm_100 (where cutlass serves by default),
    the per-group loop (a host sync) where neither torch op runs."""
    from qbackend import explain, probe

    sm90 = probe.simulated("sm_90")
    assert "torch: ok: torch._scaled_grouped_mm" in explain("fp8_grouped_per_token_channel", sm90)
    assert "torch: ok: operands dequantized to bfloat16, one torch._grouped_mm" in \
        explain("fp8_grouped_block", probe.simulated("sm_100"))
    assert "-> torch: ok: this provider's scaled_mm once per group" in \
        explain("fp8_grouped_per_tensor", probe.simulated("gfx942"))


def test_every_rejection_has_a_reason(table):
    for arch, row in table.items():
        for kind, (name, reasons) in row.items():
            for provider, reason in reasons.items():
                assert provider != name and len(reason) > 10, (arch, kind, provider, reason)


def test_specific_reasons(table):
    assert "sm_89+" in table["sm_80"]["fp8_w8a8_per_tensor"][1]["cutlass"]
    assert "fp8 tensor cores" in table["sm_86"]["fp8_w8a8_per_token_channel"][1]["cutlass"]
    assert "runs on cuda" in table["gfx942"]["fp8_w8a16"][1]["marlin"]
    assert "scale_a granularity group not supported" in table["gfx942"]["fp8_block"][1]["hipblaslt"]
    # Block-scaled FP8 is native from sm_89 (the sm_89 family's PTX runs on newer GPUs), not before.
    assert "sm_89+" in table["sm_86"]["fp8_block"][1]["cutlass"]
    # The torch provider is tried after every native one: where they serve, its verdict is ok too.
    assert "torch" not in table["sm_90"]["fp8_w8a16"][1]
    # On the CPU it runs only when forced.
    assert "force it with QBACKEND_PROVIDER" in table["cpu"]["fp8_block"][1]["torch"]


def test_torch_provider_names_its_path():
    """`explain` says which of torch's ops serves each kind on AMD (simulated), where the torch
    provider is the fast path for everything hipBLASLt does not take (on ROCm 6.2, per-token x
    per-channel scales; on gfx950 before ROCm 7.0, everything)."""
    from qbackend import explain, probe

    for arch in ("gfx942:rocm6.2", "gfx950:rocm6.4"):
        device = probe.simulated(arch)
        assert "-> torch: ok: torch._scaled_mm with per-row and per-column scales" in \
            explain("fp8_w8a8_per_token_channel", device)
        assert "-> torch: ok: torch._int_mm" in explain("int8_w8a8", device)
        assert "-> torch: ok: operands dequantized to bfloat16" in explain("fp8_w8a16", device)
        assert "-> torch: ok: operands dequantized to bfloat16" in explain("fp8_block", device)
    assert "torch: ok: torch.nn.functional.scaled_mm with 1x128 and 128x128 block scales" in \
        explain("fp8_block", probe.simulated("sm_90"))


def test_docs_embed_the_same_table(table):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "selection.md").read_text()
    start, stop = doc.index(golden.BEGIN), doc.index(golden.END) + len(golden.END)
    assert doc[start:stop] == golden.markdown(table), "docs/selection.md is stale: python tools/update_docs.py"


def test_the_info_sample_in_the_docs_is_the_real_output():
    """docs/getting-started.md shows `qbackend info --simulate sm_89` as tools/update_docs.py makes it
    from the real command (the torch version in its first line aside: it is the one the docs were
    made with)."""
    import importlib.util

    tool = Path(__file__).resolve().parent.parent / "tools" / "update_docs.py"
    spec = importlib.util.spec_from_file_location("update_docs", tool)
    update_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(update_docs)
    doc = update_docs.GETTING_STARTED.read_text()
    start, stop = update_docs.sample_span(doc)
    unversioned = lambda text: re.sub(r"\(torch [^)]*\)", "(torch)", text)
    assert unversioned(doc[start:stop]) == unversioned(update_docs.info_sample()), \
        "docs/getting-started.md is stale: python tools/update_docs.py"


def test_w8a16_on_every_nvidia_arch(table):
    """W8A16 has a native kernel on every NVIDIA arch from sm_75: marlin's, except on sm_90 where
    the cutlass provider's mixed-input WGMMA kernels (sm_90a machine code only) rank first. There
    marlin is the next in line, and forcing it gives marlin."""
    import qbackend
    from qbackend import probe, registry

    for arch in ("sm_75", "sm_80", "sm_86", "sm_89", "sm_100"):
        assert table[arch]["fp8_w8a16"][0] == "marlin", arch
        assert "sm_90 only" in table[arch]["fp8_w8a16"][1]["cutlass"], arch
    assert table["sm_90"]["fp8_w8a16"][0] == "cutlass"
    registry.reload()
    sm90 = probe.simulated("sm_90")
    assert qbackend.select("fp8_w8a16", sm90).how == "priority"
    decision = qbackend.select("fp8_w8a16", sm90)
    order = [name for name, verdict in decision.verdicts if verdict.ok]
    assert order[:2] == ["cutlass", "marlin"], order


def test_forcing_keeps_the_problem_rules(monkeypatch):
    """A forced provider must still take the problem: forcing marlin once let N not a multiple of 8
    reach the kernel (an error from the library) and a block scale_b of N values be read as
    per-channel scales (a wrong result). Such problems go on to normal selection, with the rule that
    refuses them as reason."""
    import torch

    import qbackend
    from qbackend import probe, registry
    from qbackend.problem import Granularity as G
    from qbackend.problem import Op, Problem

    monkeypatch.setenv("QBACKEND_PROVIDER", "marlin")
    registry.reload()
    sm90 = probe.simulated("sm_90")
    E4M3, BF16 = torch.float8_e4m3fn, torch.bfloat16
    fits = Problem(Op.SCALED_MM, BF16, E4M3, BF16, G.NONE, G.CHANNEL, False, 16, 16)
    assert qbackend.select(fits, sm90).name == "marlin"
    # marlin cannot run W8A8 at all, so forcing it leaves W8A8 problems to normal selection.
    assert qbackend.select("fp8_w8a8_per_tensor", sm90).name == "cutlass"
    for problem, why in ((Problem(Op.SCALED_MM, BF16, E4M3, BF16, G.NONE, G.CHANNEL, False, 16, 4),
                          "N to be a multiple of 8"),
                         (Problem(Op.SCALED_MM, BF16, E4M3, BF16, G.NONE, G.BLOCK, False, 16, 16, group=128),
                          "scale_b granularity block"),
                         (Problem(Op.SCALED_MM, BF16, E4M3, torch.float16, G.NONE, G.CHANNEL, False, 16, 16),
                          "output in the activation dtype")):
        decision = qbackend.select(problem, sm90)
        assert decision.name == "torch" and decision.how == "priority", problem
        verdict = dict(decision.verdicts)["marlin"]
        assert not verdict.forceable and why in verdict.reason, verdict


def test_forcing_lifts_the_backend_range_only(monkeypatch):
    """The torch provider serves GPUs; forced, it runs on the CPU too (how its paths are tested),
    with every other rule still holding."""
    import torch

    import qbackend
    from qbackend import probe, registry

    cpu = probe.cpu_info()
    registry.reload()
    decision = qbackend.select("fp8_block", cpu)
    assert decision.name == "reference" and dict(decision.verdicts)["torch"].forceable
    monkeypatch.setenv("QBACKEND_PROVIDER", "torch")
    registry.reload()
    assert qbackend.select("fp8_block", cpu).how == "forced"
    x = torch.randn(4, 256)
    q, s = qbackend.quantize(x, torch.float8_e4m3fn, "group")
    assert q.dtype == torch.float8_e4m3fn and s.shape == (4, 2)


def test_runtime_refusals_are_kept():
    """A provider's run-time refusal (library missing, a path it declines) must reach the verdict."""
    import torch

    import qbackend
    from qbackend import probe
    from qbackend.problem import Granularity as G
    from qbackend.problem import Op, Problem, Verdict
    from qbackend.provider import Provider, Rule, granularities

    class Declines(Provider):
        def runtime_verdict(self, device, problem):
            return Verdict(False, "library not built")

    rule = Rule(Op.SCALED_MM, frozenset({"cpu"}), frozenset({(torch.int8, torch.int8)}),
                granularities("tensor"), granularities("tensor"), frozenset({torch.bfloat16}))
    verdict = Declines(name="declines", rules=(rule,)).supports(
        probe.cpu_info(), Problem(Op.SCALED_MM, torch.int8, torch.int8, torch.bfloat16, G.TENSOR, G.TENSOR))
    assert not verdict.ok and verdict.reason == "library not built"
    bf16_on_t4 = Problem(Op.SCALED_MM, torch.bfloat16, torch.float8_e4m3fn, torch.bfloat16, G.NONE, G.CHANNEL)
    decision = qbackend.select(bf16_on_t4, probe.simulated("sm_75"))
    assert decision.name == "torch"
    assert "float16 activations only" in dict(decision.verdicts)["marlin"].reason


def test_reasons_name_the_rules_for_the_device():
    """A provider with one rule per arch explains a refusal with the rule written for the device's
    arch (gfx950's OCP pairs, not gfx942's fnuz ones), and a device in none of its archs hears all
    of them."""
    import dataclasses

    import qbackend
    from qbackend import probe, registry

    registry.reload()
    on_950 = dict(qbackend.select("fp8_w8a16", probe.simulated("gfx950")).verdicts)["hipblaslt"].reason
    assert on_950.startswith("takes float8_e4m3fn x float8_e4m3fn, ") and "fnuz" not in on_950
    gfx1100 = dataclasses.replace(probe.simulated("gfx942"), arch="gfx1100", fp8_dtypes=())
    reason = dict(qbackend.select("fp8_w8a8_per_tensor", gfx1100).verdicts)["hipblaslt"].reason
    assert reason == ("needs gfx942 (fnuz fp8 matrix cores) or gfx950 (OCP fp8 matrix cores); "
                      "device is gfx1100")
    on_942 = dict(qbackend.select(representative_e4m3fn(), probe.simulated("gfx942")).verdicts)["hipblaslt"]
    assert on_942.reason == "needs gfx950 (OCP fp8 matrix cores); device is gfx942"


def representative_e4m3fn():
    import torch

    from qbackend.problem import representative

    return representative("fp8_w8a8_per_tensor", torch.float8_e4m3fn)


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_89", "sm_90"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_activation_quantize_runs_on_the_cuda_kernels(monkeypatch, arch, x_dtype):
    """Dynamic per-tensor, per-token and per-group quantize of 16- and 32-bit activations go to the
    cutlass provider's CUDA kernels on every NVIDIA arch it builds for (the W8A16 rule of its GEMMs,
    which also takes 16-bit inputs, must not refuse them)."""
    monkeypatch.setenv("QBACKEND_SIMULATE", arch)
    registry.reload()
    try:
        x = torch.empty(9, 7232, dtype=x_dtype)
        for granularity in ("tensor", "token", "group"):
            problem = validate_quantize(x, torch.float8_e4m3fn, granularity, None, None, 128, (128, 128))
            assert qbackend.select(problem).name == "cutlass", (arch, x_dtype, granularity)
    finally:
        monkeypatch.delenv("QBACKEND_SIMULATE")
        registry.reload()
