"""What a GPU call that lands on the reference provider costs, and what would give it a fast path.

The reference provider is the oracle: exact, simple, and far slower on a GPU than any kernel
(fp32 or float64 GEMMs, per-block loops). The registry warns once per (device, problem) when a real
GPU call lands there by priority; this module writes that warning: the kind, the device, the cost
measured on an H200 (bench/results/selection_h200.json, the `reference` rows) and what to change.
"""
from __future__ import annotations

import torch

from .problem import Granularity as G
from .problem import Op

# How much slower the reference provider is than bf16 torch.mm on the same shapes: the range over
# M = 1 and 4096 on 4096 x 4096 and 28672 x 4096, H200, CUDA graphs (bench/results/selection_h200.json,
# the "reference" rows).
SLOWDOWN = {
    "fp8_w8a8_per_tensor": "6x to 16x slower than bf16 torch.mm",
    "fp8_w8a8_per_token_channel": "7x to 16x slower than bf16 torch.mm",
    "fp8_w8a16": "16x to 31x slower than bf16 torch.mm",
    "int8_w8a8": "8x to 15x slower than bf16 torch.mm (a float64 GEMM)",
    "fp8_block": "16x to 48x slower than bf16 torch.mm (one fp32 GEMM per 128-wide K block)",
    "grouped": "a host-synchronising loop over the groups, one fp32 GEMM each (not measured)",
    "quantize": "several times slower than a fused kernel (one torch op per step; not measured)",
}


def kind_of(problem) -> str:
    """The problem kind (qbackend.problem.PROBLEM_KINDS, "grouped" or "quantize") a problem belongs to."""
    if problem.op is Op.QUANTIZE:
        return "quantize"
    if problem.op is Op.GROUPED_SCALED_MM:
        return "grouped"
    if problem.weight_only:
        return "fp8_w8a16"
    if problem.scale_a is G.GROUP or problem.scale_b is G.BLOCK:
        return "fp8_block"
    if problem.a_dtype == torch.int8:
        return "int8_w8a8"
    if problem.scale_a is G.TENSOR and problem.scale_b is G.TENSOR:
        return "fp8_w8a8_per_tensor"
    return "fp8_w8a8_per_token_channel"


def fast_path_hints(verdicts) -> list:
    """What would let a faster provider serve: one hint per provider that declined for a reason
    the user can change (disabled, its native library or bindings missing)."""
    hints = []
    for name, verdict in verdicts:
        if name == "reference" or verdict.ok:
            continue
        reason = verdict.reason
        if reason.startswith("disabled by"):
            hints.append(f"remove {name} from QBACKEND_DISABLE")
        elif "native library not available" in reason or "library has no" in reason \
                or "library built without" in reason:
            hints.append(f"{name}: build the native library for this GPU (`qbackend build`, after "
                         "pip install 'qbackend[cuda]') or set QBACKEND_CUDA_LIB")
        elif "hipBLASLt not loaded" in reason:
            hints.append(f"{name}: install ROCm's hipBLASLt (libhipblaslt.so), or point QBACKEND_HIPBLASLT_LIB "
                         "or ROCM_PATH at it")
    return hints


def message(device, problem, decision) -> str:
    kind = kind_of(problem)
    hints = fast_path_hints(decision.verdicts)
    fix = ("For a fast path: " + "; ".join(hints) + ".") if hints else \
        "No faster provider can serve this problem here: " + decision.reason() + "."
    return (f"qbackend: {kind} on {device.arch} ({device.name}) runs on the reference provider: "
            f"correct, but {SLOWDOWN[kind]} (H200 measurement). The call: {problem.describe()}. {fix}")
