"""The marlin provider: FP8 weight-only (W8A16) GEMMs for GPUs without fp8 tensor cores.

1-byte e4m3 weights are streamed from memory and dequantized in registers; the math runs on
fp16/bf16 tensor cores with fp32 accumulation. It serves sm_75 to sm_86 and can be forced
(QBACKEND_PROVIDER=marlin) on newer chips, where its PTX runs through the driver's JIT.
"""
from __future__ import annotations

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend.problem import Op, Verdict
from qbackend.provider import Provider, Rule, granularities

from . import native

CUDA = frozenset({"cuda"})
NEWEST = 10**3  # forceable on every newer chip


class MarlinProvider(Provider):
    def __init__(self):
        none, wscale = granularities("none"), granularities("tensor", "channel")
        common = dict(min_sm=75, max_sm=86, forceable_max_sm=NEWEST, k_align=16, n_align=16,
                      why_arch="no fp8 tensor cores: W8A16")
        super().__init__(
            name="marlin", priority=90,
            description="Marlin-style FP8 weight-only GEMM (W8A16), dequantization in registers",
            rules=(
                Rule(Op.SCALED_MM, CUDA, frozenset({(torch.float16, qd.E4M3), (torch.bfloat16, qd.E4M3)}),
                     none, wscale, frozenset({torch.float16, torch.bfloat16}), **common),
            ))

    def runtime_verdict(self, device, problem):
        if problem.out_dtype != problem.a_dtype:
            return Verdict(False, "writes its output in the activation dtype "
                                  f"({qd.dtype_name(problem.a_dtype)}), not {qd.dtype_name(problem.out_dtype)}")
        if device.simulated:
            return None
        if native.load() is None:
            return Verdict(False, f"native library not available: {native.load_error()}")
        if not (native.has_variant("marlin", 80) or native.has_variant("marlin", 75)):
            return Verdict(False, "library built without marlin kernels")
        return None

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        raise NotImplementedError("marlin scaled_mm needs a prepared weight; not wired yet")


@qbackend.hookimpl
def qbackend_providers():
    return [MarlinProvider()]
