"""The cutlass provider: W8A8 FP8 (sm_89+) and INT8 (sm_75+) GEMMs with the scales and bias fused
into the epilogue, W8A16 (e4m3 weights, bf16/fp16 activations) on sm_90, and the CUDA quantize
kernels, all from libqbackend_cuda (csrc_cuda/).

The sm_90 W8A16 kernels read the checkpoint's own [N, K] e4m3 weight (no repacking, prepared or
not) and convert it exactly to the activation dtype in registers before each WGMMA.

Block-scaled FP8 (1 x 128 activation groups, 128 x 128 weight blocks, DeepSeek-style) runs on sm_90
(WGMMA) and sm_89+ (mma.sync) with two-level accumulation: each 128-deep K block's fp32 partial
sums are scaled and added into a second fp32 accumulator. Scales are read as scaled_mm receives
them ([M, Kb] and [Kb, Nb], the prepared layout), the last group or block may be partial.

Grouped FP8 (the expert layers of a mixture of experts, grouped_scaled_mm): on sm_90 the sm_90a
family (CUTLASS's ptr-array TMA + WGMMA kernels; a small kernel turns the device offsets into each
group's sizes and pointers first, in a workspace taken from torch's allocator); elsewhere the sm_89
family's mma.sync kernels (natively on Ada, through their PTX on newer GPUs), each CTA finding its
group from the offsets on the device. Neither syncs with the host: both capture in CUDA graphs.
Block scales by default from sm_89 up (the torch provider has no grouped blockwise op and would
dequantize every expert per call); per-tensor / per-token x per-channel scales by default on sm_89,
where torch has no grouped FP8 GEMM, and on sm_90, where the sm_90a kernels are faster than
torch._scaled_grouped_mm at most sizes (docs/performance.md); on newer GPUs torch serves those.
QBACKEND_CUTLASS_VARIANT=89 or 90 forces the grouped family too.

QBACKEND_CUTLASS_VARIANT=90|89|80|75 forces a kernel family (for verifying the PTX-embedded older
families on a newer chip); unset, the library picks the best family built for the device.
"""
from __future__ import annotations

import os

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend.problem import Granularity, Op, Verdict
from qbackend.provider import Provider, Rule, granularities

from . import native

VARIANT_ENV = "QBACKEND_CUTLASS_VARIANT"
CUDA = frozenset({"cuda"})
_HALF_OUT = frozenset({torch.bfloat16, torch.float16})
_W8A16_PAIRS = frozenset({(torch.bfloat16, qd.E4M3), (torch.float16, qd.E4M3)})
_QUANT_OUT = (qd.E4M3, qd.E5M2, torch.int8)
_QUANT_PAIRS = frozenset((x, q) for x in qd.FLOAT_INPUT_DTYPES for q in _QUANT_OUT)

# Quantize modes of the C ABI (qb_quant_mode).
STATIC_TENSOR, DYNAMIC_TENSOR, DYNAMIC_TOKEN = 0, 1, 2


def _rows_held(t: torch.Tensor) -> int:
    """How many rows (t.shape[0] or more) a 2-D view could have, with its strides and offset, within
    its storage."""
    if t.dim() != 2 or t.stride(0) <= 0 or t.shape[0] == 0:
        return t.shape[0] if t.dim() else 0
    room = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset() - (t.shape[1] - 1) * t.stride(1)
    return max(t.shape[0], (room - 1) // t.stride(0) + 1)


def _extend_rows(t: torch.Tensor, rows: int):
    """`t` viewed with `rows` rows instead of t.shape[0], when its storage holds them; else None.

    The extra rows are whatever the storage holds past t (quantize leaves them unwritten): a GEMM
    row depends only on its own row of A and of scale_a, so they change nothing in the first M rows
    of the output.
    """
    if t.dim() != 2 or rows <= t.shape[0] or _rows_held(t) < rows:
        return None
    return t.as_strided((rows, t.shape[1]), t.stride(), t.storage_offset())


# Precise FP8 (accumulate="precise") on sm_90: the promoting family serves it when cutlass is forced;
# by default it goes to the torch provider's cuBLASLt promoting kernels, which ran x0.98 to x1.19 of
# the fast kernels' time at M = 4096 on an H100 where this family's first large-M tiles (ping-pong,
# which spill the promoted accumulator) ran x3.4 to x4.4; its cooperative large-M tiles are not yet
# timed (bench/results/accumulate_h100_torch.log, accumulate_h100_pingpong.log). At M = 16 this family
# was the faster of the two.
_PRECISE_BY_FORCE = ("precise fp8 runs on the torch provider (cuBLASLt's promoting kernels) unless cutlass is "
                     "forced (QBACKEND_PROVIDER=cutlass: its sm_90a promoting family)")


def _forced_variant(text: str) -> int:
    """'90', 'sm90', 'sm_90a' -> 90; '' or 'auto' -> 0 (the library picks)."""
    digits = "".join(ch for ch in text if ch.isdigit())
    if text.strip().lower() in ("", "auto", "0") or not digits:
        if text.strip().lower() not in ("", "auto", "0"):
            raise ValueError(f"{VARIANT_ENV}={text!r}: expected 90, 89, 80 or 75")
        return 0
    variant = int(digits)
    if variant not in (90, 89, 80, 75):
        raise ValueError(f"{VARIANT_ENV}={text!r}: expected 90, 89, 80 or 75")
    return variant


def _fp8_variants(sm: int) -> tuple:
    """Kernel families that can run fp8 GEMMs on compute capability `sm`, best first."""
    return (90, 89) if sm == 90 else (89,)


def _int8_variants(sm: int) -> tuple:
    """Kernel families that can run int8 GEMMs on compute capability `sm`, best first."""
    return (90, 80, 75) if sm == 90 else (80, 75) if sm >= 80 else (75,)


def _sm90_only(sm: int) -> tuple:
    return (90,)


def _block_mismatch(problem) -> str | None:
    """Why the block kernels cannot read this problem's group/block scales, or None. They take
    groups of exactly 128 along K (1 x 128 for a, 128 x 128 for b); other shapes (a K or N of at most
    128 covered by one scale, [Kb, N] per-column blocks) go to the next provider."""
    if problem.group != 128:
        return f"block scaling takes group_size 128, not {problem.group}"
    if not problem.group_extents:  # a representative problem: the standard shapes
        return None
    a_k, b_k, b_n = problem.group_extents
    if a_k != 128 or b_k != 128 or b_n != 128:
        return ("block scaling takes scale_a [M, ceil(K/128)] and scale_b [ceil(K/128), ceil(N/128)]; "
                f"these scales cover {a_k} x {b_k} x {b_n} (K per a group, K x N per b block)")
    return None


class CutlassProvider(Provider):
    def __init__(self):
        scales_a, scales_b = granularities("tensor", "token"), granularities("tensor", "channel")
        super().__init__(
            name="cutlass", priority=100,
            description="CUTLASS W8A8 GEMMs (fp8 and block-scaled fp8 on sm_89+, int8 on sm_75+, W8A16 "
                        "on sm_90), grouped fp8 GEMMs (MoE) on sm_89+, CUDA quantize kernels",
            rules=(
                # The sm_89 and sm_90a FP8 families use CUTLASS's fast-accumulation mainloops; on
                # sm_90 the plain-mainloop family promotes partial sums into fp32 (accumulate="precise").
                Rule(Op.SCALED_MM, CUDA, frozenset({(qd.E4M3, qd.E4M3)}), scales_a, scales_b,
                     _HALF_OUT, min_sm=89, k_align=16, n_align=16, why_arch="fp8 tensor cores",
                     fast_accumulation=True),
                Rule(Op.SCALED_MM, CUDA, frozenset({(qd.E4M3, qd.E4M3)}), scales_a, scales_b,
                     _HALF_OUT, min_sm=90, max_sm=90, k_align=16, n_align=16,
                     why_arch="sm_90a FP8 kernels with fp32 promotion"),
                Rule(Op.SCALED_MM, CUDA, frozenset({(torch.int8, torch.int8)}), scales_a, scales_b,
                     _HALF_OUT, min_sm=75, k_align=16, n_align=16, why_arch="int8 tensor cores"),
                Rule(Op.SCALED_MM, CUDA, _W8A16_PAIRS, granularities("none"), scales_b, _HALF_OUT,
                     min_sm=90, max_sm=90, k_align=16, n_align=8, why_arch="sm_90a mixed-input WGMMA kernels"),
                Rule(Op.SCALED_MM, CUDA, frozenset({(qd.E4M3, qd.E4M3)}), granularities("group"),
                     granularities("block"), _HALF_OUT, min_sm=89, k_align=16, n_align=8,
                     why_arch="fp8 tensor cores"),
                Rule(Op.GROUPED_SCALED_MM, CUDA, frozenset({(qd.E4M3, qd.E4M3)}), granularities("group"),
                     granularities("block"), _HALF_OUT, min_sm=89, k_align=16, n_align=8,
                     why_arch="fp8 tensor cores"),
                Rule(Op.GROUPED_SCALED_MM, CUDA, frozenset({(qd.E4M3, qd.E4M3)}), scales_a, scales_b, _HALF_OUT,
                     min_sm=89, max_sm=90, forceable_max_sm=120, k_align=16, n_align=8,
                     why_arch="fp8 tensor cores; on newer GPUs torch._scaled_grouped_mm", fast_accumulation=True),
                Rule(Op.QUANTIZE, CUDA, _QUANT_PAIRS, granularities("tensor"), min_sm=75, n_align=16),
                Rule(Op.QUANTIZE, CUDA, _QUANT_PAIRS, granularities("token"), min_sm=75, n_align=16,
                     static=frozenset({False})),
                Rule(Op.QUANTIZE, CUDA, _QUANT_PAIRS, granularities("group"), min_sm=75,
                     static=frozenset({False})),
            ))
        self.variant = _forced_variant(os.environ.get(VARIANT_ENV, ""))
        self._sm90_devices: dict = {}  # device index -> its SM count where the sm_90a FP8 kernels serve it, else None

    def _kernel_op(self, problem):
        """The library's op name for a problem, and the kernel families that can serve it."""
        if problem.op is Op.QUANTIZE:
            return ("quantize_group" if problem.scale_a is Granularity.GROUP else "quantize"), ()
        if problem.op is Op.GROUPED_SCALED_MM:
            return "grouped_scaled_mm_fp8", _fp8_variants
        if problem.a_dtype in (torch.bfloat16, torch.float16):
            return "scaled_mm_w8a16", _sm90_only
        if problem.scale_b is Granularity.BLOCK:
            return "scaled_mm_fp8_block", _fp8_variants
        if problem.a_dtype == torch.int8:
            return "scaled_mm_int8", _int8_variants
        if problem.accumulate == "precise":
            return "scaled_mm_fp8_precise", _sm90_only
        return "scaled_mm_fp8", _fp8_variants

    def runtime_verdict(self, device, problem):
        if (problem.op is Op.SCALED_MM and problem.a_dtype in (torch.bfloat16, torch.float16)
                and problem.out_dtype != problem.a_dtype):
            return Verdict(False, "W8A16 writes its output in the activation dtype "
                                  f"({qd.dtype_name(problem.a_dtype)}), not {qd.dtype_name(problem.out_dtype)}")
        if problem.scale_b is Granularity.BLOCK:
            why = _block_mismatch(problem)
            if why is not None:
                return Verdict(False, why)
        op, variants_for = self._kernel_op(problem)
        by_force = Verdict(False, _PRECISE_BY_FORCE, forceable=True) if op == "scaled_mm_fp8_precise" else None
        if device.simulated:
            return by_force
        if native.load() is None:
            return Verdict(False, f"native library not available: {native.load_error()}")
        if op.startswith("quantize"):
            return None if native.has_variant(op, 0) else Verdict(False, f"library built without {op} kernels")
        wanted = (self.variant,) if self.variant and op != "grouped_scaled_mm_fp8" else variants_for(device.sm)
        if not any(native.has_variant(op, v) for v in wanted):
            return Verdict(False, f"library has no {op} kernels for {device.arch} "
                                  f"(families {', '.join(f'sm_{v}' for v in wanted)} not built)")
        return by_force

    def _sm90(self, device: torch.device):
        """The multiprocessor count of `device` when the sm_90a FP8 kernels serve it, else None."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._sm90_devices:
            serves = (self.variant in (0, 90) and native.has_variant("scaled_mm_fp8", 90)
                      and torch.cuda.get_device_capability(index) == (9, 0))
            self._sm90_devices[index] = (
                torch.cuda.get_device_properties(index).multi_processor_count if serves else None)
        return self._sm90_devices[index]

    def _gemm_rows(self, a, scale_a, N: int) -> int:
        """Token rows to run this FP8 GEMM on: more than M where A and a per-token scale_a have
        storage for whole token tiles past M and the library asks for them (native.token_rows),
        as they have when they come from this provider's quantize."""
        M, K = a.shape
        if a.dtype != qd.E4M3 or native.token_rows(M) == M:
            return M
        sms = self._sm90(a.device)
        if sms is None:
            return M
        available = _rows_held(a)
        if scale_a.numel() != 1:
            available = min(available, _rows_held(scale_a.reshape(M, 1)))
        return native.token_rows(M, N, K, sms, available) if available > M else M

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        M, N = a.shape[0], b.shape[1]
        if scale_a is None:  # W8A16
            out = torch.empty((M, N), dtype=a.dtype, device=a.device)
            return native.scaled_mm(a, b, None, scale_b.contiguous(), bias, out, variant=self.variant)
        if problem.scale_b is Granularity.BLOCK:
            # [M, Kb] and [Kb, Nb] row-major: no copy for quantize's and prepare_weight's scales.
            out = torch.empty((M, N), dtype=out_dtype, device=a.device)
            return native.scaled_mm(a, b, scale_a.contiguous(), scale_b.contiguous(), bias, out,
                                    variant=self.variant, block=True)
        # Per-row/column scales may arrive as strided views (w_scale.t()); the kernels read them
        # as contiguous vectors. A no-op for the usual contiguous scales.
        scale_a, scale_b = scale_a.contiguous(), scale_b.contiguous()
        # The promoting family runs its own tiles on M rows (whole token tiles are the fast family's).
        precise = problem.accumulate == "precise" and a.dtype == qd.E4M3
        variant = self.variant | (native.ACCUMULATE_PRECISE if precise else 0)
        rows = M if precise else self._gemm_rows(a, scale_a, N)
        if rows != M:
            a_rows = _extend_rows(a, rows)
            scale_rows = scale_a if scale_a.numel() == 1 else _extend_rows(scale_a.reshape(M, 1), rows)
            if a_rows is None or scale_rows is None:
                rows = M  # (the library asked for more rows than the storage holds: never expected)
            else:
                a, scale_a = a_rows, scale_rows
        out = torch.empty((rows, N), dtype=out_dtype, device=a.device)
        native.scaled_mm(a, b, scale_a, scale_b, bias, out, variant=variant)
        return out[:M] if rows != M else out

    def grouped_scaled_mm(self, a, b, scale_a, scale_b, offsets, out_dtype, bias, problem):
        M, (G, _, N) = a.shape[0], b.shape
        block = problem.scale_b is Granularity.BLOCK
        if block:
            scale_a, scale_b = scale_a.contiguous(), scale_b.contiguous()
        else:
            # The kernels read scale_a as 1 or M values and scale_b as G (one per group) or [G, N].
            scale_a = scale_a.reshape(-1).contiguous()
            scale_b = (scale_b.reshape(-1).expand(G) if scale_b.numel() == 1 else scale_b.reshape(G, -1)).contiguous()
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
        variant = self.variant if self.variant in (89, 90) else 0
        return native.grouped_scaled_mm(a, b, scale_a, scale_b, offsets.contiguous(),
                                        None if bias is None else bias.contiguous(), out, block=block,
                                        variant=variant)

    def _token_storage_rows(self, M: int, dtype, device) -> int:
        """FP8 activations for the sm_90a GEMM get storage for whole token tiles (rows past M left
        unwritten), so that the GEMM can run on whole tiles (native.token_rows)."""
        rows = native.token_rows(M) if dtype == qd.E4M3 else M
        return M if rows != M and self._sm90(device) is None else rows

    def _dynamic_outputs(self, M: int, K: int, dtype, granularity: str, group_size: int, device):
        """(q, scale, the scale view the kernel writes, group) for a fused dynamic quantize of M rows."""
        if granularity == "group":
            q = torch.empty((M, K), dtype=dtype, device=device)
            scale = torch.empty((M, -(-K // group_size)), dtype=torch.float32, device=device)
            return q, scale, scale, group_size
        rows = self._token_storage_rows(M, dtype, device)
        q = torch.empty((rows, K), dtype=dtype, device=device)[:M]
        scale = torch.empty((rows, 1), dtype=torch.float32, device=device)[:M]
        return q, scale, scale.view(-1), 0

    def quantize_gather(self, x, index, dtype, granularity, group_size, problem):
        """quantize(x[index]) in one kernel (token or group granularity); None where this library
        predates it, and the caller gathers first."""
        if not native.has_quantize_gather() or (x.stride(1) != 1 and x.shape[1] > 1):
            return None
        q, scale, written, group = self._dynamic_outputs(index.numel(), x.shape[1], dtype, granularity, group_size,
                                                         x.device)
        native.quantize_gather(x, index, q, written, group)
        return q, scale

    def quantize_silu_mul(self, h, dtype, granularity, group_size, problem):
        """quantize(SiLU(h[:, :I]) * h[:, I:]) in one kernel for 16-bit h; None where this library
        predates it (or h is fp32), and the caller computes the activation first."""
        if not native.has_quantize_silu_mul() or h.dtype == torch.float32 or (h.stride(1) != 1 and h.shape[1] > 1):
            return None
        q, scale, written, group = self._dynamic_outputs(h.shape[0], h.shape[1] // 2, dtype, granularity,
                                                         group_size, h.device)
        native.quantize_silu_mul(h, q, written, group)
        return q, scale

    def quantize(self, x, dtype, granularity, scale, scale_ub, group_size, block_size, problem):
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        M = x2.shape[0]
        if granularity == "group":
            # [M, ceil(K/group)] row-major: the layout the block-scaled GEMM reads, no copy there.
            q = torch.empty(x2.shape, dtype=dtype, device=x.device)
            groups = -(-x2.shape[1] // group_size)
            out_scale = torch.empty((M, groups), dtype=torch.float32, device=x.device)
            native.quantize_group(x2, q, out_scale, group_size)
            return q.reshape(x.shape), out_scale.reshape(x.shape[:-1] + (groups,))
        rows = self._token_storage_rows(M, dtype, x.device)
        q = torch.empty((rows, x2.shape[1]), dtype=dtype, device=x.device)[:M]
        workspace = None
        if scale is not None:
            mode, out_scale = STATIC_TENSOR, scale
        elif granularity == "tensor":
            mode, out_scale = DYNAMIC_TENSOR, torch.empty((), dtype=torch.float32, device=x.device)
            workspace = torch.empty(native.quantize_workspace_size(M, x2.shape[1], mode),
                                    dtype=torch.uint8, device=x.device)
        else:
            mode = DYNAMIC_TOKEN
            out_scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)[:M]
        native.quantize(x2, q, out_scale, mode, scale_ub, workspace)
        if mode == DYNAMIC_TOKEN:
            out_scale = out_scale.reshape(x.shape[:-1] + (1,))
        return q.reshape(x.shape), out_scale

    def info(self):
        return {"variant": self.variant or "auto"}


@qbackend.hookimpl
def qbackend_providers():
    return [CutlassProvider()]


@qbackend.hookimpl
def qbackend_native_libraries():
    return [native.describe()]
