"""Selection queries for people and tools: which provider would serve what, and why."""
from __future__ import annotations

import torch

from . import dtypes as qd
from . import probe, registry
from .problem import PROBLEM_KINDS, Op, Problem, representative

_ACCUMULATE_MEANING = {
    "fast": "fp8 products may be summed with the tensor cores' reduced-precision accumulator "
            "('precise' keeps fp32 throughout)",
    "precise": "fp32 accumulation throughout (providers with fast accumulation only decline)",
}


def _problem(device, kind_or_problem) -> Problem:
    if isinstance(kind_or_problem, Problem):
        return kind_or_problem
    fp8 = device.fp8_dtypes[0] if device.fp8_dtypes else qd.E4M3
    # Turing (sm_75) has no bf16 tensor cores: models there run in fp16.
    act = torch.float16 if device.sm is not None and device.sm < 80 else torch.bfloat16
    return representative(kind_or_problem, fp8, act)


def _device(device):
    return device if isinstance(device, probe.DeviceInfo) else probe.device_info(device)


def select(kind_or_problem, device=None):
    """The Decision (provider, how, verdicts) for a problem kind name (see PROBLEM_KINDS) or a
    Problem on a device (a torch device, a DeviceInfo, or None for the default device)."""
    info = _device(device)
    return registry.get().decide(info, _problem(info, kind_or_problem))


def explain(kind_or_problem, device=None) -> str:
    """Every provider's verdict for one problem, in priority order, and the choice."""
    info = _device(device)
    problem = _problem(info, kind_or_problem)
    decision = registry.get().decide(info, problem)
    lines = [f"{problem.describe()} on {info.arch} ({info.name}):"]
    if problem.op is Op.SCALED_MM:
        lines.append(f"  accumulate={problem.accumulate!r}: " + _ACCUMULATE_MEANING[problem.accumulate])
    for name, verdict in decision.verdicts:
        mark = "->" if name == decision.name else ("ok" if verdict.ok else "--")
        lines.append(f"  {mark} {name}: {verdict.reason}")
    lines.append(f"  chosen: {decision.name or 'none'} ({decision.how})")
    return "\n".join(lines)


def selection_table(device=None, kinds: tuple = PROBLEM_KINDS) -> dict:
    """{kind: (provider name or None, {provider: reason for each rejection})} for `kinds`
    (PROBLEM_KINDS by default; problem.ALL_KINDS adds the grouped ones)."""
    info = _device(device)
    table = {}
    for kind in kinds:
        decision = registry.get().decide(info, _problem(info, kind))
        table[kind] = (decision.name, {n: v.reason for n, v in decision.verdicts if not v.ok})
    return table
