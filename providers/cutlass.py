"""The cutlass provider: W8A8 FP8 (sm_89+) and INT8 (sm_75+) GEMMs with the scales and bias fused
into the epilogue, and the CUDA quantize kernels, all from libqbackend_cuda (csrc_cuda/).

QBACKEND_CUTLASS_VARIANT=90|89|80|75 forces a kernel family (for verifying the PTX-embedded older
families on a newer chip); unset, the library picks the best family built for the device.
"""
from __future__ import annotations

import os

import torch

import qbackend
from qbackend import dtypes as qd
from qbackend.problem import Op, Verdict
from qbackend.provider import Provider, Rule, granularities

from . import native

VARIANT_ENV = "QBACKEND_CUTLASS_VARIANT"
CUDA = frozenset({"cuda"})
_HALF_OUT = frozenset({torch.bfloat16, torch.float16})
_QUANT_OUT = (qd.E4M3, qd.E5M2, torch.int8)
_QUANT_PAIRS = frozenset((x, q) for x in qd.FLOAT_INPUT_DTYPES for q in _QUANT_OUT)

# Quantize modes of the C ABI (qb_quant_mode).
STATIC_TENSOR, DYNAMIC_TENSOR, DYNAMIC_TOKEN = 0, 1, 2


def whole_tile_tokens(M: int) -> int:
    """How many token rows the sm_90a FP8 GEMM should run for M tokens.

    Its kernels load a tile of tokens with one TMA copy, which fills the rows past the end of A with
    zeros, and that fill is slow: at M = 72 the 128-token tiles took x1.4 to x1.5 the time of the
    same GEMM run on 128 tokens, at M = 40 the 64-token tiles 5 to 10 % more than on 64
    (bench/results/scaled_mm_ab_h200.log, the partial token tiles sections), and the cost grows
    with the rows filled. Where 24 or more rows of the tile would be filled, the GEMM runs on the
    whole tile instead, reading rows past M from memory that quantize allocated for the purpose
    (see `_extend_rows`); their results are never returned. (With 16 rows filled, at M = 112, the
    whole tile gained 3 % on average over four shapes but lost up to 14 % on one.)
    """
    if 32 < M <= 40:
        return 64
    return 128 if 64 < M <= 104 else M


def _extend_rows(t: torch.Tensor, rows: int):
    """`t` viewed with `rows` rows instead of t.shape[0], when its storage holds them; else None.

    The extra rows are whatever the storage holds past t (quantize leaves them unwritten): a GEMM
    row depends only on its own row of A and of scale_a, so they change nothing in the first M rows
    of the output.
    """
    if t.dim() != 2 or rows <= t.shape[0]:
        return None
    last = t.storage_offset() + (rows - 1) * t.stride(0) + (t.shape[1] - 1) * t.stride(1)
    if last >= t.untyped_storage().nbytes() // t.element_size():
        return None
    return t.as_strided((rows, t.shape[1]), t.stride(), t.storage_offset())


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
    return (80, 75) if sm >= 80 else (75,)


class CutlassProvider(Provider):
    def __init__(self):
        scales_a, scales_b = granularities("tensor", "token"), granularities("tensor", "channel")
        super().__init__(
            name="cutlass", priority=100,
            description="CUTLASS W8A8 GEMMs (fp8 on sm_89+, int8 on sm_75+), CUDA quantize kernels",
            rules=(
                Rule(Op.SCALED_MM, CUDA, frozenset({(qd.E4M3, qd.E4M3)}), scales_a, scales_b,
                     _HALF_OUT, min_sm=89, k_align=16, n_align=16, why_arch="fp8 tensor cores"),
                Rule(Op.SCALED_MM, CUDA, frozenset({(torch.int8, torch.int8)}), scales_a, scales_b,
                     _HALF_OUT, min_sm=75, k_align=16, n_align=16, why_arch="int8 tensor cores"),
                Rule(Op.QUANTIZE, CUDA, _QUANT_PAIRS, granularities("tensor"), min_sm=75, n_align=16),
                Rule(Op.QUANTIZE, CUDA, _QUANT_PAIRS, granularities("token"), min_sm=75, n_align=16,
                     static=frozenset({False})),
            ))
        self.variant = _forced_variant(os.environ.get(VARIANT_ENV, ""))
        self._sm90_devices: dict = {}  # device index -> the sm_90a FP8 kernels serve it

    def _kernel_op(self, problem):
        """The library's op name for a problem, and the kernel families that can serve it."""
        if problem.op is Op.QUANTIZE:
            return "quantize", ()
        if problem.a_dtype == torch.int8:
            return "scaled_mm_int8", _int8_variants
        return "scaled_mm_fp8", _fp8_variants

    def runtime_verdict(self, device, problem):
        if device.simulated:
            return None
        if native.load() is None:
            return Verdict(False, f"native library not available: {native.load_error()}")
        op, variants_for = self._kernel_op(problem)
        if op == "quantize":
            return None if native.has_variant(op, 0) else Verdict(False, "library built without quantize kernels")
        wanted = (self.variant,) if self.variant else variants_for(device.sm)
        if not any(native.has_variant(op, v) for v in wanted):
            return Verdict(False, f"library has no {op} kernels for {device.arch} "
                                  f"(families {', '.join(f'sm_{v}' for v in wanted)} not built)")
        return None

    def _gemm_rows(self, M: int, dtype: torch.dtype, device: torch.device) -> int:
        """Token rows a GEMM of M rows of `dtype` activations runs on this device: whole_tile_tokens(M)
        where the sm_90a FP8 kernels serve it, else M. quantize allocates for it, scaled_mm uses it."""
        if dtype != qd.E4M3:
            return M
        index = device.index if device.index is not None else torch.cuda.current_device()
        sm90 = self._sm90_devices.get(index)
        if sm90 is None:
            sm90 = self._sm90_devices[index] = (
                self.variant in (0, 90) and native.has_variant("scaled_mm_fp8", 90)
                and torch.cuda.get_device_capability(index) == (9, 0))
        return whole_tile_tokens(M) if sm90 else M

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        M, N = a.shape[0], b.shape[1]
        # Per-row/column scales may arrive as strided views (w_scale.t()); the kernels read them
        # as contiguous vectors. A no-op for the usual contiguous scales.
        scale_a, scale_b = scale_a.contiguous(), scale_b.contiguous()
        rows = self._gemm_rows(M, a.dtype, a.device)
        if rows != M:
            a_rows = _extend_rows(a, rows)
            scale_rows = scale_a if scale_a.numel() == 1 else _extend_rows(scale_a.reshape(M, 1), rows)
            if a_rows is None or scale_rows is None:
                rows = M  # no spare rows in A's or scale_a's storage: the partial tile
            else:
                a, scale_a = a_rows, scale_rows
        out = torch.empty((rows, N), dtype=out_dtype, device=a.device)
        native.scaled_mm(a, b, scale_a, scale_b, bias, out, variant=self.variant)
        return out[:M] if rows != M else out

    def quantize(self, x, dtype, granularity, scale, scale_ub, group_size, block_size, problem):
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        M = x2.shape[0]
        # FP8 activations for the sm_90a GEMM get storage for whole token tiles (rows past M left
        # unwritten), so that the GEMM can run on whole tiles (whole_tile_tokens).
        rows = self._gemm_rows(M, dtype, x.device)
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
