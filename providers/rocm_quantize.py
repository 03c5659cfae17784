"""The rocm provider: dynamic per-tensor, per-token and per-token-group, and static per-tensor,
FP8 and INT8 quantize on AMD Instinct GPUs (gfx942, gfx950), from libqbackend_rocm (csrc_rocm/).

Every FP8 format is served on both targets: the kernels encode in software (bit-identical to the
reference provider), so e4m3fnuz / e5m2fnuz (what gfx942's matrix cores compute) and the OCP e4m3fn /
e5m2 (gfx950's) come out the same way. GEMMs are the hipblaslt provider's.

Status: the kernels are checked on every CI run without an AMD GPU (compiled for gfx942 and gfx950
with registers, LDS and spills inspected; run on the CPU under HIP-CPU and compared with the
reference bit for bit), but have not run on AMD silicon (csrc_rocm/README.md).
"""
from __future__ import annotations

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend.problem import Granularity, Op, Verdict
from qbackend.provider import Provider, Rule, granularities

from . import rocm_build, rocm_native

HIP = frozenset({"hip"})
ARCHS = frozenset(rocm_build.ALL_ARCHS)
_PAIRS = frozenset((x, q) for x in qd.FLOAT_INPUT_DTYPES for q in rocm_native.Q_CODES)


class RocmQuantizeProvider(Provider):
    def __init__(self):
        # Dynamic per-tensor, per-token and per-group, and static per-tensor. n_align=16: the last
        # dimension contiguous (what the kernels read).
        super().__init__(
            name="rocm", priority=85,
            description="HIP quantize kernels (csrc_rocm) on AMD Instinct: FP8 (fnuz and OCP) and INT8, "
                        "per-tensor, per-token, per-token-group",
            rules=(
                Rule(Op.QUANTIZE, HIP, _PAIRS, granularities("tensor", "token", "group"), archs=ARCHS,
                     n_align=16, static=frozenset({False})),
                Rule(Op.QUANTIZE, HIP, _PAIRS, granularities("tensor"), archs=ARCHS, n_align=16,
                     static=frozenset({True})),
            ))

    def runtime_verdict(self, device, problem):
        if device.simulated:
            return None
        lib = rocm_native.load()
        if lib is None:
            return Verdict(False, f"native library not available: {rocm_native.load_error()}")
        if device.arch not in lib.archs:
            return Verdict(False, f"libqbackend_rocm was built for {', '.join(lib.archs)}, not {device.arch} "
                                  f"(qbackend build --rocm --archs {device.arch})")
        return None

    def quantize(self, x, dtype, granularity, scale, scale_ub, group_size, block_size, problem):
        lib = rocm_native.load()
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        rows, cols = x2.shape
        if rows > 1 and x2.stride(0) < cols:  # rows that overlap (an expanded tensor): the ABI wants ldx >= cols
            x2 = x2.contiguous()
        q = torch.empty((rows, cols), dtype=dtype, device=x.device)
        if problem.scale_a is Granularity.GROUP:
            # [rows, ceil(K/group)] row-major: the scale_a layout block-scaled GEMMs read.
            groups = -(-cols // group_size)
            out_scale = torch.empty((rows, groups), dtype=torch.float32, device=x.device)
            lib.quantize_group(x2, q, out_scale, group_size)
            return q.reshape(x.shape), out_scale.reshape(x.shape[:-1] + (groups,))
        workspace = None
        if scale is not None:
            mode, out_scale = rocm_native.STATIC_TENSOR, scale
        elif granularity == "tensor":
            mode, out_scale = rocm_native.DYNAMIC_TENSOR, torch.empty((), dtype=torch.float32, device=x.device)
            workspace = torch.empty(lib.workspace_size(rows, cols, mode), dtype=torch.uint8, device=x.device)
        else:
            mode, out_scale = rocm_native.DYNAMIC_TOKEN, torch.empty((rows, 1), dtype=torch.float32, device=x.device)
        lib.quantize(x2, q, out_scale, mode, scale_ub, workspace)
        if mode == rocm_native.DYNAMIC_TOKEN:
            out_scale = out_scale.reshape(x.shape[:-1] + (1,))
        return q.reshape(x.shape), out_scale


@qbackend.hookimpl
def qbackend_providers():
    return [RocmQuantizeProvider()]


@qbackend.hookimpl
def qbackend_native_libraries():
    return [rocm_native.describe()] if rocm_native.relevant() else []
