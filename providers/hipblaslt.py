"""The hipblaslt provider: W8A8 FP8 GEMMs through hipBLASLt on AMD Instinct GPUs.

gfx942 (MI300) computes the fnuz formats (e4m3fnuz / e5m2fnuz); gfx950 (MI350) the OCP formats.
Checkpoints in e4m3fn are re-encoded for gfx942 at load time (qbackend.fp8.to_fnuz).

Status: selection rules only. The hipBLASLt call sequence is not implemented yet, so on a real
AMD device this provider declines with that reason and the reference provider serves the call.
Under QBACKEND_SIMULATE=gfx942 / gfx950 the rules answer as if it were built.
"""
from __future__ import annotations

import qbackend
from qbackend import dtypes as qd
from qbackend.problem import Op, Verdict
from qbackend.provider import Provider, Rule, granularities

HIP = frozenset({"hip"})
_OUT = frozenset(qd.OUT_DTYPES)
_FNUZ = frozenset({(qd.E4M3_FNUZ, qd.E4M3_FNUZ), (qd.E4M3_FNUZ, qd.E5M2_FNUZ), (qd.E5M2_FNUZ, qd.E4M3_FNUZ)})
_OCP = frozenset({(qd.E4M3, qd.E4M3), (qd.E4M3, qd.E5M2), (qd.E5M2, qd.E4M3)})


class HipBlasLtProvider(Provider):
    def __init__(self):
        tensor = granularities("tensor")
        super().__init__(
            name="hipblaslt", priority=80,
            description="hipBLASLt W8A8 FP8 GEMMs on AMD Instinct (gfx942 fnuz, gfx950 OCP)",
            rules=(
                Rule(Op.SCALED_MM, HIP, _FNUZ, tensor, tensor, _OUT, archs=frozenset({"gfx942"}),
                     k_align=16, n_align=16, why_arch="fnuz fp8 matrix cores"),
                Rule(Op.SCALED_MM, HIP, _OCP, tensor, tensor, _OUT, archs=frozenset({"gfx950"}),
                     k_align=16, n_align=16, why_arch="OCP fp8 matrix cores"),
            ))

    def runtime_verdict(self, device, problem):
        if device.simulated:
            return None
        return Verdict(False, "the hipBLASLt call path is not implemented in this release")


@qbackend.hookimpl
def qbackend_providers():
    return [HipBlasLtProvider()]
