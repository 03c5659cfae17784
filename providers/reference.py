"""The reference provider: qbackend's semantics in plain torch, on any device, CPU included.

It is the oracle every other provider is tested against, and the fallback where nothing native fits.
fp8 products are exact in fp32, so fp8 GEMMs accumulate in fp32 (as the kernels do, in a different
order); int8 GEMMs accumulate in float64, which is exact for every K validation admits, i.e. equal
to int32 accumulation.
"""
from __future__ import annotations

import math

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend import grouped
from qbackend.problem import Granularity as G
from qbackend.problem import Op
from qbackend.provider import Provider, Rule, granularities
from qbackend.scales import expand, group_size

ANY_BACKEND = frozenset({"cpu", "cuda", "hip"})
W8A8_PAIRS = [(a, b) for a in qd.FP8_OCP for b in qd.FP8_OCP] + \
        [(a, b) for a in qd.FP8_FNUZ for b in qd.FP8_FNUZ] + [(torch.int8, torch.int8)]
W8A16_PAIRS = [(a, b) for a in qd.ACTIVATION_DTYPES for b in qd.FP8_DTYPES]
_QUANT = [(x, q) for x in qd.FLOAT_INPUT_DTYPES for q in qd.QUANT_DTYPES]


def _a_scale_at(scale_a, problem, M: int, K: int, k: int) -> torch.Tensor:
    """scale_a over rows for the K-group holding column k: a scalar or [M, 1]."""
    s = scale_a.float()
    if problem.scale_a is G.GROUP:
        return s[:, k // group_size(K, s.shape[1], problem.group)].reshape(M, 1)
    return s.reshape(()) if s.numel() == 1 else s.reshape(M, 1)


def _b_scale_at(scale_b, problem, K: int, N: int, k: int) -> torch.Tensor:
    """scale_b over columns for the K-group holding row k: a scalar or [1, N]."""
    s = scale_b.float()
    if problem.scale_b is G.BLOCK:
        row = s[k // group_size(K, s.shape[0], problem.group)]
        return row.repeat_interleave(group_size(N, s.shape[1], problem.group))[:N].reshape(1, N)
    return s.reshape(()) if s.numel() == 1 else s.reshape(1, N)


def _k_step(scale_a, scale_b, problem, K: int) -> int:
    """Length of the K-chunks over which both scales are constant (K when neither is grouped)."""
    g = K
    if problem.scale_a is G.GROUP:
        g = math.gcd(g, group_size(K, scale_a.shape[-1], problem.group))
    if problem.scale_b is G.BLOCK:
        g = math.gcd(g, group_size(K, scale_b.shape[0], problem.group))
    return g


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.int8:
        return (a.double() @ b.double()).float()
    return a.float() @ b.float()


def reference_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, problem) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    if problem.weight_only:
        # Dequantize the weight exactly (fp8 * fp32 scale in fp32), then one fp32 GEMM.
        g = problem.group or 128
        out = a.float() @ (b.float() * expand(scale_b, K, N, (g, g)))
    else:
        step = _k_step(scale_a, scale_b, problem, K)
        out = None
        for k0 in range(0, K, step):
            k1 = min(k0 + step, K)
            scale = _a_scale_at(scale_a, problem, M, K, k0) * _b_scale_at(scale_b, problem, K, N, k0)
            part = scale * _matmul(a[:, k0:k1], b[k0:k1, :])
            out = part if out is None else out + part
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def reference_grouped_scaled_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, problem) -> torch.Tensor:
    """scaled_mm once per group, exactly as reference_scaled_mm. The row ranges are read on the host
    (a device sync on a GPU): the oracle stays a plain loop; the other providers avoid the sync."""
    ends = grouped.check_offsets(offsets, a.shape[0])
    N = b.shape[2]
    out = torch.empty((a.shape[0], N), dtype=out_dtype, device=a.device)
    per_group = grouped.per_group_problem(problem)
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            out[start:end] = reference_scaled_mm(
                a[start:end], b[g], grouped.group_scale_a(scale_a, problem, start, end),
                grouped.group_scale_b(scale_b, problem, g), out_dtype,
                None if bias is None else bias[g], per_group)
        start = end
    return out


def _amax(xf: torch.Tensor, granularity: str, group: int, block: tuple) -> torch.Tensor:
    a = xf.abs()
    if granularity == "tensor":
        return a.amax()
    if granularity in ("token", "channel"):
        return a.amax(dim=-1, keepdim=True)
    if granularity == "group":  # the last group is shorter when group does not divide K: pad it with zeros
        cols = a.shape[-1]
        padded = torch.nn.functional.pad(a, (0, -(-cols // group) * group - cols))
        return padded.reshape(*a.shape[:-1], -1, group).amax(dim=-1)
    rows, cols = a.shape
    br, bc = block
    pr, pc = -(-rows // br) * br, -(-cols // bc) * bc
    padded = torch.nn.functional.pad(a, (0, pc - cols, 0, pr - rows))
    return padded.reshape(pr // br, br, pc // bc, bc).amax(dim=(1, 3))


def _expand_like(scale: torch.Tensor, x: torch.Tensor, granularity: str, group: int, block: tuple) -> torch.Tensor:
    if granularity == "tensor":
        return scale.reshape(())
    if granularity in ("token", "channel"):
        return scale
    if granularity == "group":
        return scale.repeat_interleave(group, dim=-1)[..., :x.shape[-1]]
    rows, cols = x.shape
    return scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]


def saturate_cast(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 -> dtype: fp8 rounds to nearest even after clamping to +-qmax; int8 rounds half to
    even and saturates to [-128, 127]. A NaN becomes the format's NaN with the sign bit clear
    (0x7F in e4m3fn and e5m2, 0x80 in the fnuz formats) and 0 in int8 (which has no NaN): the
    sign of a NaN quotient is not the same on every device, so it is dropped."""
    nan = torch.isnan(v)
    if dtype == torch.int8:
        return torch.round(v).clamp(qd.INT8_MIN, qd.INT8_MAX).masked_fill(nan, 0.0).to(torch.int8)
    qmax = qd.qmax(dtype)
    return v.clamp(-qmax, qmax).masked_fill(nan, math.nan).to(dtype)


def checked_scale(scale: torch.Tensor) -> torch.Tensor:
    """A static scale (or scale_ub) with every value that is not positive and finite replaced by
    NaN. On the host such scales are refused before this point; on a device, where checking
    would cost a sync, the NaN makes the q they give NaN (0 in int8), as the CUDA kernels do."""
    return torch.where((scale > 0) & torch.isfinite(scale), scale, math.nan)


def dynamic_scale(xf, dtype, granularity, scale_ub, group, block) -> torch.Tensor:
    """max(min(amax, scale_ub) / qmax, min_scale) over each granule of the fp32 input. NaN
    propagates: torch's amax, minimum and clamp keep it, so a granule holding a NaN (or a
    scale_ub that is NaN) gets a NaN scale; an inf gives an inf scale."""
    amax = _amax(xf, granularity, group, block)
    if scale_ub is not None:
        amax = torch.minimum(amax, checked_scale(scale_ub.float().reshape(())))
    # Tensor / tensor division: IEEE-rounded on every device (torch turns division by a
    # Python scalar into multiplication by its reciprocal on CUDA, which can differ by 1 ulp).
    qmax = torch.full_like(amax, qd.qmax(dtype))
    return torch.clamp(amax / qmax, min=qd.min_scale(dtype))


def reference_quantize(x, dtype, granularity, scale, scale_ub, group, block):
    xf = x.float()
    if scale is None:
        scale = divisor = dynamic_scale(xf, dtype, granularity, scale_ub, group, block)
    else:
        divisor = checked_scale(scale.float())
    q = saturate_cast(xf / _expand_like(divisor, xf, granularity, group, block), dtype)
    return q, scale


class ReferenceProvider(Provider):
    def __init__(self):
        every_a = granularities("none", "tensor", "token", "group")
        super().__init__(
            name="reference", priority=0,
            description="plain torch, any device: the exact semantics, the oracle for every test",
            rules=(
                Rule(Op.SCALED_MM, ANY_BACKEND, frozenset(W8A8_PAIRS), every_a - {G.NONE},
                     granularities("tensor", "channel", "block"), frozenset(qd.OUT_DTYPES)),
                Rule(Op.SCALED_MM, ANY_BACKEND, frozenset(W8A16_PAIRS), frozenset({G.NONE}),
                     granularities("tensor", "channel", "block"), frozenset(qd.OUT_DTYPES)),
                Rule(Op.GROUPED_SCALED_MM, ANY_BACKEND, frozenset(W8A8_PAIRS), every_a - {G.NONE},
                     granularities("tensor", "channel", "block"), frozenset(qd.OUT_DTYPES)),
                Rule(Op.QUANTIZE, ANY_BACKEND, frozenset(_QUANT),
                     granularities("tensor", "token", "channel", "group", "block")),
            ))

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        return reference_scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, problem)

    def grouped_scaled_mm(self, a, b, scale_a, scale_b, offsets, out_dtype, bias, problem):
        return reference_grouped_scaled_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, problem)

    def quantize(self, x, dtype, granularity, scale, scale_ub, group_size, block_size, problem):
        return reference_quantize(x, dtype, granularity, scale, scale_ub, group_size, block_size)


@qbackend.hookimpl
def qbackend_providers():
    return [ReferenceProvider()]
