"""A minimal third-party provider: FP8 W8A8 with per-tensor scales on the CPU, computed in float64.

Its priority is below the reference provider's, so it is chosen only when forced
(QBACKEND_PROVIDER=demo) or by a selection hook: installing a plugin changes nothing by itself.
"""
import torch

import qbackend
from qbackend.problem import Op
from qbackend.provider import Provider, Rule, granularities

E4M3 = torch.float8_e4m3fn


class DemoProvider(Provider):
    calls = 0

    def __init__(self):
        super().__init__(
            name="demo", priority=-10, description="float64 FP8 GEMM on the CPU (plugin example)",
            rules=(Rule(Op.SCALED_MM, frozenset({"cpu"}), frozenset({(E4M3, E4M3)}),
                        granularities("tensor"), granularities("tensor"),
                        frozenset({torch.bfloat16, torch.float32}), bias=False),))

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        DemoProvider.calls += 1
        acc = a.double() @ b.double()
        return (acc * (scale_a.double() * scale_b.double()).reshape(())).to(out_dtype)


@qbackend.hookimpl
def qbackend_providers():
    return [DemoProvider()]
