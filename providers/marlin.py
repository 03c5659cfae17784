"""The marlin provider: FP8 weight-only (W8A16) GEMMs, the only native W8A16 kernel, on every
NVIDIA GPU from sm_75 up.

1-byte e4m3 weights are streamed from memory and dequantized in registers; the math runs on
fp16/bf16 tensor cores with fp32 accumulation. The sm_80 family serves sm_80 and newer (on sm_89,
sm_90 and later through the driver's JIT of its compute_80 PTX); the sm_75 family serves Turing.
On sm_89+ a W8A8 call (activations quantized too) is faster at large M: that changes the math, so
it is the caller's choice (docs/selection.md), never made here.
The sm_75 path takes fp16 activations only (no bf16 tensor cores there): bf16 is refused with
that reason rather than silently converted.

Weights are repacked once by prepare_weight (qbackend.prepare_weight / QuantLinear). A plain
scaled_mm call with a column-major fp8 weight repacks it on every call (correct, but the repack
reads and writes the weight again): a one-time warning says so.
QBACKEND_MARLIN_VARIANT=80|75 forces a kernel family (verification of the PTX paths).
"""
from __future__ import annotations

import os
import warnings

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend import probe
from qbackend.problem import Op, Verdict
from qbackend.provider import Provider, Rule, granularities
from qbackend.weights import PreparedWeight

from . import marlin_native

CUDA = frozenset({"cuda"})
VARIANT_ENV = "QBACKEND_MARLIN_VARIANT"
# The kernel is built for small M: it streams the weights again for every 64 rows, and at M = 128 it
# is at x0.50 to x0.56 of bf16 torch.mm on every shape of bench/results/marlin_h200.json (H200). With
# more rows than this, the packed weight is unpacked to a dense [N, K] in the activation dtype (one
# pass: 1 byte read, 2 written per weight) and multiplied by cuBLAS, whose time grows with M far
# more slowly.
UNPACK_ABOVE_M = 128
# The packing follows the activation dtype (marlin_native.prepare), so the layout name does too.
LAYOUTS = {torch.float16: "marlin-128x128-f16", torch.bfloat16: "marlin-128x128-bf16"}


class MarlinProvider(Provider):
    def __init__(self):
        super().__init__(
            name="marlin", priority=90,
            description="Marlin-style FP8 weight-only GEMM (W8A16), dequantization in registers",
            rules=(
                Rule(Op.SCALED_MM, CUDA, frozenset({(torch.float16, qd.E4M3), (torch.bfloat16, qd.E4M3)}),
                     granularities("none"), granularities("tensor", "channel"),
                     frozenset({torch.float16, torch.bfloat16}), min_sm=75, k_align=16, n_align=8,
                     why_arch="fp16/bf16 tensor cores"),
            ))
        text = os.environ.get(VARIANT_ENV, "").strip()
        digits = "".join(ch for ch in text if ch.isdigit())
        self.variant = int(digits) if digits in ("75", "80") else 0
        if text and text.lower() != "auto" and not self.variant:
            raise ValueError(f"{VARIANT_ENV}={text!r}: expected 80 or 75 (or sm80 / sm75)")
        self._warned = False
        self._large_m_warned = False
        self._unpacks: dict = {}  # device index -> whether the unpack path runs there

    def _family(self, device) -> int:
        return self.variant or (80 if (device.sm or 0) >= 80 else 75)

    def runtime_verdict(self, device, problem):
        if problem.out_dtype != problem.a_dtype:
            return Verdict(False, "writes its output in the activation dtype "
                                  f"({qd.dtype_name(problem.a_dtype)}), not {qd.dtype_name(problem.out_dtype)}")
        family = self._family(device)
        if family == 75 and problem.a_dtype == torch.bfloat16:
            return Verdict(False, "the sm_75 path takes float16 activations only (no bf16 tensor cores)")
        if device.simulated:
            return None
        if marlin_native.load() is None:
            return Verdict(False, f"native library not available: {marlin_native.load_error()}")
        if not marlin_native.has_variant(family):
            return Verdict(False, f"library built without the sm_{family} marlin kernels")
        return None

    def prepare_weight(self, w_q, scale_b, problem):
        N, K = w_q.shape
        packed = marlin_native.prepare(w_q, problem.a_dtype)
        return PreparedWeight(self.name, LAYOUTS[problem.a_dtype], packed, scale_b, N, K, w_q.dtype, problem)

    def _unpack_here(self, device: torch.device) -> bool:
        """The unpack path needs the sm_80 family's kernel (not the forced sm_75 family) on sm_80+."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        found = self._unpacks.get(index)
        if found is None:
            found = self._unpacks[index] = (self.variant != 75 and marlin_native.has_unpack()
                                            and torch.cuda.get_device_capability(index) >= (8, 0))
        return found

    def _mm(self, a, packed, scale_b, bias, N, K):
        if a.shape[0] > UNPACK_ABOVE_M and self._unpack_here(a.device):
            if not self._large_m_warned:
                self._warn_large_m(a)
            w = marlin_native.unpack(packed, scale_b.reshape(-1), N, K)
            return torch.nn.functional.linear(a, w, bias)
        out = torch.empty((a.shape[0], N), dtype=a.dtype, device=a.device)
        return marlin_native.mm(a, packed, scale_b.reshape(-1).contiguous(), bias, out, N, K,
                                variant=self.variant)

    def _warn_large_m(self, a):
        """Once: W8A16 at large M on sm_89+ costs more than not quantizing; say so, and what is faster."""
        self._large_m_warned = True
        sm = probe.device_info(a.device).sm or 0
        if sm >= 89:
            warnings.warn(f"qbackend: marlin runs W8A16 with M = {a.shape[0]} rows on sm_{sm}: above "
                          f"{UNPACK_ABOVE_M} rows it unpacks the fp8 weight to {qd.dtype_name(a.dtype)} on every "
                          "call and runs a dense GEMM, slower than not quantizing until the GEMM dominates. "
                          "For prefill-heavy work on GPUs with fp8 tensor cores, W8A8 (activations quantized "
                          "per token) is several times faster; see docs/selection.md", stacklevel=5)

    def scaled_mm_prepared(self, a, weight, scale_a, out_dtype, bias, problem):
        if weight.layout == "nk":
            return self.scaled_mm(a, weight.data.t(), scale_a, weight.scale, out_dtype, bias, problem)
        if weight.layout != LAYOUTS.get(a.dtype):
            packed_for = {name: d for d, name in LAYOUTS.items()}.get(weight.layout)
            if packed_for is None:
                raise ValueError(f"qbackend.linear: weight: marlin does not know the layout {weight.layout!r}; "
                                 "prepare the weight again")
            raise ValueError(f"qbackend.linear: a: the weight was prepared for {qd.dtype_name(packed_for)} "
                             f"activations (marlin packs a weight for one activation dtype), got "
                             f"{qd.dtype_name(a.dtype)}: prepare it again with activation={a.dtype}")
        return self._mm(a, weight.data, weight.scale, bias, weight.N, weight.K)

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        if not self._warned:
            self._warned = True
            warnings.warn("qbackend: marlin repacks an unprepared fp8 weight on every scaled_mm "
                          "call; prepare it once with qbackend.prepare_weight (or use QuantLinear)",
                          stacklevel=4)
        K, N = b.shape
        packed = marlin_native.prepare(b.t(), a.dtype, check_nan=False)
        return self._mm(a, packed, scale_b, bias, N, K)

    def info(self):
        return {"variant": self.variant or "auto"}


@qbackend.hookimpl
def qbackend_providers():
    return [MarlinProvider()]
