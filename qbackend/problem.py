"""What a call asks for, reduced to the facts that decide which provider can serve it.

A Problem is small, frozen and hashable: the registry caches its decision per (device, Problem), so
the per-call cost of selection is one dict lookup. Shapes enter only through their alignment class.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from . import dtypes as qd


class Granularity(str, enum.Enum):
    NONE = "none"          # no scale (W8A16 activations)
    TENSOR = "tensor"      # one scale
    TOKEN = "token"        # scale_a: one per row of A, [M, 1]
    CHANNEL = "channel"    # scale_b: one per output column, [1, N] or [N]
    GROUP = "group"        # scale_a: [M, K/g], groups of g along K (1 x g)
    BLOCK = "block"        # scale_b: [K/gk, N/gn] blocks (e.g. 128 x 128)

    def __str__(self) -> str:
        return self.value


class Op(str, enum.Enum):
    SCALED_MM = "scaled_mm"
    QUANTIZE = "quantize"
    # scaled_mm over groups of rows of `a` (the experts of a mixture of experts), each group with
    # its own weight, weight scale and bias: `qbackend.grouped_scaled_mm`.
    GROUPED_SCALED_MM = "grouped_scaled_mm"

    def __str__(self) -> str:
        return self.value


# scaled_mm's accumulate= values. "fast" (the default) is what vLLM's CUTLASS kernels and cuBLASLt with
# use_fast_accum run on Hopper and Ada; "precise" promotes partial sums into fp32 (every provider but
# the sm_89+ FP8 kernels of cutlass already does).
ACCUMULATE_MODES = ("fast", "precise")


@dataclass(frozen=True)
class Problem:
    """One kind of call. For scaled_mm: a/b/out dtypes and scale granularities; for quantize:
    a_dtype is the input dtype, b_dtype the quantized dtype, scale_a the granularity and
    static tells whether the scale is given."""
    op: Op
    a_dtype: torch.dtype
    b_dtype: torch.dtype
    out_dtype: torch.dtype | None = None
    scale_a: Granularity = Granularity.TENSOR
    scale_b: Granularity = Granularity.TENSOR
    has_bias: bool = False
    # Largest power of two (capped at 16) dividing K and N: what kernels' alignment rules look at.
    k_align: int = 16
    n_align: int = 16
    static: bool = False
    has_scale_ub: bool = False
    group: int = 0                  # scale group size along K (and N) for group/block scales, else 0
    # What the group/block scales' shapes cover: (columns of a per scale_a group, rows of b per scale_b
    # block, columns of b per scale_b block); () when neither is grouped. A count of 1 covers the
    # whole dimension, so e.g. [Kb, N] block scales give (.., .., 1).
    group_extents: tuple = ()
    # scaled_mm: "fast" lets a kernel sum fp8 products with the tensor cores' reduced-precision
    # accumulator before they reach fp32; "precise" asks for fp32 accumulation throughout (see
    # ACCUMULATE_MODES and docs/api.md, "Accumulation").
    accumulate: str = "fast"

    @property
    def weight_only(self) -> bool:
        return self.op is Op.SCALED_MM and self.a_dtype in qd.ACTIVATION_DTYPES

    def describe(self) -> str:
        if self.op is Op.QUANTIZE:
            mode = "static" if self.static else "dynamic"
            return (f"quantize {qd.dtype_name(self.a_dtype)} -> {qd.dtype_name(self.b_dtype)}, "
                    f"{mode} per-{self.scale_a}")
        if self.op is Op.GROUPED_SCALED_MM:
            bias = ", bias per group" if self.has_bias else ""
            return (f"grouped_scaled_mm W8A8 {qd.dtype_name(self.a_dtype)} x {qd.dtype_name(self.b_dtype)} -> "
                    f"{qd.dtype_name(self.out_dtype)}, scales {self.scale_a} x per-group {self.scale_b}{bias}")
        kind = "W8A16" if self.weight_only else "W8A8"
        bias = ", bias" if self.has_bias else ""
        precise = ", precise accumulation" if self.accumulate == "precise" else ""
        return (f"scaled_mm {kind} {qd.dtype_name(self.a_dtype)} x {qd.dtype_name(self.b_dtype)} -> "
                f"{qd.dtype_name(self.out_dtype)}, scales {self.scale_a} x {self.scale_b}{bias}{precise}")


@dataclass(frozen=True)
class Verdict:
    """A provider's answer to 'can you serve this problem on this device?'.

    forceable: the provider could run it but does not volunteer (e.g. marlin outside sm_75-sm_86);
    forcing the provider by name accepts such a verdict.
    """
    ok: bool
    reason: str
    forceable: bool = False

    def __bool__(self) -> bool:
        return self.ok


def alignment(n: int, cap: int = 16) -> int:
    a = 1
    while a < cap and n % (a * 2) == 0:
        a *= 2
    return a


# The problem kinds `qbackend info` reports, each as a representative problem for a device whose
# preferred fp8 dtype is `fp8`.
PROBLEM_KINDS = ("fp8_w8a8_per_tensor", "fp8_w8a8_per_token_channel", "fp8_w8a16", "int8_w8a8",
                 "fp8_block")
# The grouped (mixture-of-experts) kinds: the golden table and `explain` cover them; `qbackend info`
# and the benchmarks stay on PROBLEM_KINDS.
GROUPED_KINDS = ("fp8_grouped_per_tensor", "fp8_grouped_per_token_channel", "fp8_grouped_block")
ALL_KINDS = PROBLEM_KINDS + GROUPED_KINDS


def representative(kind: str, fp8: torch.dtype = qd.E4M3, act: torch.dtype = torch.bfloat16) -> Problem:
    """The problem a kind stands for; `act` is the half-precision activation dtype of W8A16."""
    G = Granularity
    mm = Op.SCALED_MM
    if kind == "fp8_w8a8_per_tensor":
        return Problem(mm, fp8, fp8, torch.bfloat16, G.TENSOR, G.TENSOR)
    if kind == "fp8_w8a8_per_token_channel":
        return Problem(mm, fp8, fp8, torch.bfloat16, G.TOKEN, G.CHANNEL)
    if kind == "fp8_w8a16":
        return Problem(mm, act, fp8, act, G.NONE, G.CHANNEL)
    if kind == "int8_w8a8":
        return Problem(mm, torch.int8, torch.int8, torch.bfloat16, G.TOKEN, G.CHANNEL)
    if kind == "fp8_block":
        return Problem(mm, fp8, fp8, torch.bfloat16, G.GROUP, G.BLOCK, group=128)
    gmm = Op.GROUPED_SCALED_MM
    if kind == "fp8_grouped_per_tensor":
        return Problem(gmm, fp8, fp8, torch.bfloat16, G.TENSOR, G.TENSOR)
    if kind == "fp8_grouped_per_token_channel":
        return Problem(gmm, fp8, fp8, torch.bfloat16, G.TOKEN, G.CHANNEL)
    if kind == "fp8_grouped_block":
        return Problem(gmm, fp8, fp8, torch.bfloat16, G.GROUP, G.BLOCK, group=128)
    raise ValueError(f"unknown problem kind {kind!r}; known: {', '.join(ALL_KINDS)}")
