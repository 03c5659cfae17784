"""The torch provider: on a GPU, the fastest way torch itself offers for every kind that no native
provider serves there, with the reference provider's semantics within a stated tolerance.

It sits after the native providers and before `reference` (the oracle, kept exact and simple), so
that a problem a native kernel does not take lands on cuBLASLt / hipBLASLt through torch rather
than on an fp32 (or float64) GEMM. The path for each (device, problem) comes from
`torch_paths.path` and is named by `explain`:
- W8A8 fp8 through torch._scaled_mm (per-tensor or rowwise scaling where the device and the
  installed torch take it; else unit scales into fp32 and the scales applied after), and block
  scales through torch.nn.functional.scaled_mm's 1x128 / 128x128 modes on sm_90;
- INT8 through torch._int_mm (exact int32 accumulation), the scales and bias applied after;
- a call cuBLASLt declines although torch's rules allow it is computed on the dequantized weight
  instead, with a warning;
- grouped_scaled_mm through torch._scaled_grouped_mm, else torch._grouped_mm on dequantized
  operands, else its scaled_mm once per group (torch_grouped.py);
- the rest (W8A16, fp8 without fp8 matrix units, unaligned K or N) dequantized to a 16-bit compute
  dtype (the activation dtype for W8A16) and one GEMM in it: fp8 and int8 values are exact there,
  the per-element scaling rounds to 8 (bf16) or 11 (fp16) significant bits, the GEMM accumulates
  in fp32.
Prepared weights (`prepare_weight`) of the dequantized path are held dequantized, scales folded in:
2 bytes per weight instead of 1, and one GEMM per call at the speed of the unquantized model. An
unprepared weight on that path is dequantized on every call (a one-time warning says so).

Quantize is the reference's math, vectorised: scales broadcast over views instead of being expanded
to the input's shape, bit for bit the reference's result.

CUDA and HIP only by default; on the CPU it runs when forced (QBACKEND_PROVIDER=torch), which is how
its paths are tested without a GPU.
"""
from __future__ import annotations

import warnings

import torch

import qbackend
from qbackend import bounded, probe
from qbackend import dtypes as qd
from qbackend.problem import Granularity as G
from qbackend.problem import Op, Verdict
from qbackend.provider import Provider, Rule, granularities
from qbackend.scales import expand, group_size
from qbackend.weights import PreparedWeight

from . import torch_grouped
from . import torch_paths as tp
from .reference import W8A8_PAIRS, W8A16_PAIRS, checked_scale, dynamic_scale, saturate_cast

GPU = frozenset({"cuda", "hip"})
CPU = frozenset({"cpu"})
_QUANT = frozenset((x, q) for x in qd.FLOAT_INPUT_DTYPES for q in qd.QUANT_DTYPES)


def _scale_view(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor or per-row scale as a [] or [rows, 1] fp32 view."""
    return scale.reshape(()) if scale.numel() == 1 else scale.reshape(rows, 1)


def _col_scale_view(scale: torch.Tensor, cols: int) -> torch.Tensor:
    return scale.reshape(()) if scale.numel() == 1 else scale.reshape(1, cols)


def dequantize_rows(a: torch.Tensor, scale_a, problem, compute: torch.dtype) -> torch.Tensor:
    """a [M, K] times its scale ([], [M, 1] or [M, G] groups along K), in `compute`, rounded once."""
    M, K = a.shape
    if scale_a is None:
        return a if a.dtype == compute else a.to(compute)
    # fp8 takes no part in arithmetic type promotion: widen it first (exactly).
    src = a.to(compute) if qd.is_fp8(a.dtype) else a
    if problem.scale_a is not G.GROUP:
        return torch.mul(src, _scale_view(scale_a, M), out=torch.empty((M, K), dtype=compute, device=a.device))
    groups = scale_a.shape[1]
    if groups * problem.group == K:  # whole groups: broadcast the scales over a [M, G, g] view
        out = torch.empty((M, groups, problem.group), dtype=compute, device=a.device)
        torch.mul(src.reshape(M, groups, problem.group), scale_a.reshape(M, groups, 1), out=out)
        return out.reshape(M, K)
    full = expand(scale_a, M, K, (1, problem.group))
    return torch.mul(src, full, out=torch.empty((M, K), dtype=compute, device=a.device))


def dequantize_weight(w: torch.Tensor, scale_b: torch.Tensor, problem, compute: torch.dtype) -> torch.Tensor:
    """A row-major [N, K] weight times its scale_b-form scale ([], [1, N] or [Kb, Nb] blocks), as a
    contiguous [N, K] in `compute`, each element rounded once. Done in slices of rows so that the
    fp32 temporaries stay small next to the weight itself."""
    N, K = w.shape
    g = problem.group or 128
    out = torch.empty((N, K), dtype=compute, device=w.device)
    step = g * max(1, (1 << 24) // max(K * g, 1))  # whole blocks of rows, about 16 M elements
    for n0 in range(0, N, step):
        n1 = min(N, n0 + step)
        if scale_b.numel() == 1:
            s = scale_b.float().reshape(())
        elif scale_b.numel() == N and (scale_b.dim() <= 1 or scale_b.shape[0] == 1):
            s = scale_b.float().reshape(N, 1)[n0:n1]
        else:  # blocks: the scale columns over this slice of rows of w (columns of b)
            per = group_size(N, scale_b.shape[1], g)
            s = expand(scale_b[:, n0 // per:-(-n1 // per)], K, n1 - n0, (g, g)).t()
        torch.mul(w[n0:n1].float(), s, out=out[n0:n1])
    return out


def epilogue(acc: torch.Tensor, scale_a, scale_b, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """(scale_a * scale_b) * acc + bias in fp32, rounded once to out_dtype; acc is int32 or fp32.
    Two kernels: the [M, N] scale, then one multiply (and add) that writes out_dtype."""
    M, N = acc.shape
    scale = _scale_view(scale_a, M).float() * _col_scale_view(scale_b, N).float()
    out = torch.empty((M, N), dtype=out_dtype, device=acc.device)
    if bias is None:
        return torch.mul(acc, scale, out=out)
    return torch.addcmul(bias, acc, scale, out=out)


def scaled_mm_call(a, b, scale_a, scale_b, bias, out_dtype, fast: bool = False) -> torch.Tensor:
    """torch._scaled_mm (fast: cuBLASLt's fast accumulation); torch 2.4 returned (out, amax)."""
    out = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype,
                           use_fast_accum=fast)
    return out[0] if isinstance(out, tuple) else out


def with_bias(call, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """call(bias) with the bias fused into torch's scaled GEMM, except with an fp32 output, where
    torch takes none: then call(None) and the bias added after, in fp32."""
    if bias is not None and out_dtype == torch.float32:
        return call(None).add_(bias)
    return call(bias)


def padded_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t [M, C] as the first M rows of a new [rows, C] tensor; the rows past M are left unwritten:
    each output row of a GEMM depends on its own row of A only, and those rows are cut off."""
    out = torch.empty((rows, t.shape[1]), dtype=t.dtype, device=t.device)
    out[:t.shape[0]].copy_(t)
    return out


def blockwise_scale_b(scale_b: torch.Tensor) -> torch.Tensor:
    """[Kb, Nb] 128 x 128 block scales in the layout torch.nn.functional.scaled_mm reads: Kb padded
    to a multiple of 4, that dimension contiguous ([Kb4, Nb] with strides (1, Kb4))."""
    kb, nb = scale_b.shape
    kb4 = -(-kb // 4) * 4
    buf = torch.zeros((nb, kb4), dtype=torch.float32, device=scale_b.device)
    buf[:, :kb].copy_(scale_b.t())
    return buf.t()


def blockwise_mm(a, b, scale_a, scale_b_layout, bias, out_dtype, per_column: bool = False) -> torch.Tensor:
    """DeepSeek-style block-scaled GEMM through torch.nn.functional.scaled_mm (cuBLASLt): a [M, K]
    with [M, Kb] group scales, b [K, N] column-major with blockwise_scale_b's layout, or with
    per_column, [Kb, N] scales (one per column and 128 rows) as a [N, Kb] view of their memory."""
    F = torch.nn.functional
    M = a.shape[0]
    # cuBLASLt takes 1 x 128 activation scales for M a multiple of 4, read M-major.
    rows = -(-M // 4) * 4
    a_in = padded_rows(a, rows) if rows != M else a
    sa = torch.empty((scale_a.shape[1], rows), dtype=torch.float32, device=a.device).t()
    sa[:M].copy_(scale_a)
    recipe_b = F.ScalingType.BlockWise1x128 if per_column else F.ScalingType.BlockWise128x128
    return with_bias(lambda fused: F.scaled_mm(a_in, b, sa, F.ScalingType.BlockWise1x128, scale_b_layout,
                                               recipe_b, bias=fused, output_dtype=out_dtype)[:M], bias, out_dtype)


def int_mm(a, b) -> torch.Tensor:
    """torch._int_mm, int32 out; cuBLASLt's path in torch takes more than 16 rows, so fewer are
    padded (the extra rows' results are cut off)."""
    M = a.shape[0]
    rows = 17 if a.device.type == "cuda" and M <= 16 else M
    acc = torch._int_mm(padded_rows(a, rows) if rows != M else a, b)
    return acc[:M] if rows != M else acc


def _broadcast_divide(xf: torch.Tensor, scale: torch.Tensor, granularity: str, group: int, block: tuple):
    """xf / scale with the scale broadcast over xf's granules (views, no expanded copy)."""
    if granularity == "tensor":
        return xf / scale.reshape(())
    if granularity in ("token", "channel"):
        return xf / scale
    if granularity == "group":
        lead, cols = xf.shape[:-1], xf.shape[-1]
        if cols % group:  # a shorter last group
            return xf / scale.repeat_interleave(group, dim=-1)[..., :cols]
        return (xf.reshape(*lead, cols // group, group) / scale.unsqueeze(-1)).reshape(xf.shape)
    rows, cols = xf.shape
    (br, bc), (R, C) = block, scale.shape
    if rows == R * br and cols == C * bc:
        return (xf.reshape(R, br, C, bc) / scale.reshape(R, 1, C, 1)).reshape(rows, cols)
    return xf / expand(scale, rows, cols, block)


class TorchProvider(Provider):
    def __init__(self):
        every_a = granularities("tensor", "token", "group")
        every_b = granularities("tensor", "channel", "block")
        out = frozenset(qd.OUT_DTYPES)
        super().__init__(
            name="torch", priority=10,
            description="torch's own fast ops (torch._scaled_mm, torch._int_mm, 16-bit GEMMs) where no "
                        "native provider serves",
            rules=(
                Rule(Op.SCALED_MM, GPU, frozenset(W8A8_PAIRS), every_a, every_b, out, forceable_backends=CPU),
                Rule(Op.SCALED_MM, GPU, frozenset(W8A16_PAIRS), granularities("none"), every_b, out,
                     forceable_backends=CPU),
                Rule(Op.GROUPED_SCALED_MM, GPU, frozenset(W8A8_PAIRS), every_a, every_b, out,
                     forceable_backends=CPU),
                Rule(Op.QUANTIZE, GPU, _QUANT, granularities("tensor", "token", "channel", "group", "block"),
                     forceable_backends=CPU),
            ))
        self._paths = bounded.cache("torch.paths", 4096)   # (device key, problem) -> (path, compute dtype)
        self._ones: dict = {}        # device -> a 1.0 fp32 scalar for unit-scale calls (one per device)
        self._warned = False

    def runtime_verdict(self, device, problem):
        if problem.op is Op.QUANTIZE:
            return Verdict(True, "ok: vectorised torch, scales broadcast over views")
        return Verdict(True, f"ok: {tp.describe(device, problem)}")

    def plan(self, device: torch.device, problem) -> tuple:
        """(path, compute dtype) for a problem on a torch device; cached."""
        info = probe.device_info(device)
        key = (info.key, problem)
        found = self._paths.get(key)
        if found is None:
            choose = tp.grouped_path if problem.op is Op.GROUPED_SCALED_MM else tp.path
            found = (choose(info, problem), tp.compute_dtype(info, problem))
            self._paths.put(key, found)
        return found

    def _one(self, device: torch.device) -> torch.Tensor:
        one = self._ones.get(device)
        if one is None:
            one = torch.ones((), dtype=torch.float32, device=device)
            # A tensor made during a CUDA-graph capture lives in the graph's pool: not kept.
            if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
                self._ones[device] = one
        return one

    # --- scaled_mm ------------------------------------------------------------------------------

    def _dequant_mm(self, a, scale_a, w_dq, bias, out_dtype, problem, compute):
        a_dq = dequantize_rows(a, scale_a, problem, compute)
        if out_dtype == compute:
            return torch.nn.functional.linear(a_dq, w_dq, bias)
        out = torch.mm(a_dq, w_dq.t()).to(out_dtype)
        return out if bias is None else out.add_(bias)

    def _dequantized_now(self, a, b, scale_a, scale_b, out_dtype, bias, problem, compute):
        """The dequantized path on a weight given quantized: dequantized for this call only."""
        w_dq = dequantize_weight(b.t(), scale_b, problem, compute)
        return self._dequant_mm(a, scale_a, w_dq, bias, out_dtype, problem, compute)

    def _scaled_mm_fp8(self, a, b, scale_a, scale_b, out_dtype, bias, problem, path, scale_b_layout=None):
        M, N = a.shape[0], b.shape[1]
        if path == tp.BLOCKWISE:
            return self._blockwise(a, b, scale_a, scale_b, out_dtype, bias, problem, scale_b_layout)
        fast = problem.accumulate == "fast"  # (the paths of tp.FAST_ACCUM_PATHS)
        if path == tp.UNSCALED:
            one = self._one(a.device)
            return epilogue(scaled_mm_call(a, b, one, one, None, torch.float32, fast), scale_a, scale_b, bias,
                            out_dtype)
        if path == tp.TENSORWISE:
            sa, sb = scale_a.float().reshape(()), scale_b.float().reshape(())
        else:  # rowwise: [M, 1] and [1, N], contiguous
            sa = scale_a.float().reshape(-1, 1).expand(M, 1).contiguous()
            sb = scale_b.float().reshape(1, -1).expand(1, N).contiguous()
        return with_bias(lambda fused: scaled_mm_call(a, b, sa, sb, fused, out_dtype, fast), bias, out_dtype)

    def _blockwise(self, a, b, scale_a, scale_b, out_dtype, bias, problem, scale_b_layout):
        K, N = a.shape[1], b.shape[1]
        kb, nb = -(-K // 128), -(-N // 128)
        if scale_a.shape[1] == kb and tuple(scale_b.shape) == (kb, nb):
            layout = scale_b_layout if scale_b_layout is not None else blockwise_scale_b(scale_b.float())
            return blockwise_mm(a, b, scale_a.float(), layout, bias, out_dtype)
        if scale_a.shape[1] == kb and tuple(scale_b.shape) == (kb, N):
            return blockwise_mm(a, b, scale_a.float(), scale_b.float().contiguous().t(), bias, out_dtype,
                                per_column=True)
        # Group scales of another size (one per element): the dequantized path, whose operands
        # take any scale shape.
        compute = tp.compute_dtype(probe.device_info(a.device), problem)
        return self._dequantized_now(a, b, scale_a, scale_b, out_dtype, bias, problem, compute)

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
        path, compute = self.plan(a.device, problem)
        if path == tp.DEQUANT:
            if not self._warned:
                self._warned = True
                warnings.warn("qbackend: the torch provider dequantizes an unprepared weight on every "
                              "scaled_mm call; prepare it once with qbackend.prepare_weight (or use "
                              "QuantLinear)", stacklevel=4)
            return self._dequantized_now(a, b, scale_a, scale_b, out_dtype, bias, problem, compute)
        return self._quantized_mm(a, b, scale_a, scale_b, out_dtype, bias, problem, path)

    def _quantized_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem, path, scale_b_layout=None):
        """The torch op of the path on the quantized operands. cuBLASLt declines some calls its
        documented rules allow (CUBLAS_STATUS_NOT_SUPPORTED, seen on the H200 for some row counts
        and strides): such a call is computed on the dequantized path instead, with a warning."""
        try:
            if path == tp.INT_MM:
                return epilogue(int_mm(a, b), scale_a, scale_b, bias, out_dtype)
            return self._scaled_mm_fp8(a, b, scale_a, scale_b, out_dtype, bias, problem, path, scale_b_layout)
        except RuntimeError as exc:
            if "CUBLAS_STATUS" not in str(exc):
                raise
            compute = tp.compute_dtype(probe.device_info(a.device), problem)
            warnings.warn(f"qbackend: torch's {path} declined a [{a.shape[0]}, {a.shape[1]}] x [{b.shape[0]}, "
                          f"{b.shape[1]}] call ({str(exc).splitlines()[0][:160]}); it ran on the weight "
                          f"dequantized to {qd.dtype_name(compute)} instead", stacklevel=5)
            return self._dequantized_now(a, b, scale_a, scale_b, out_dtype, bias, problem, compute)

    def prepare_weight(self, w_q, scale_b, problem):
        path, compute = self.plan(w_q.device, problem)
        N, K = w_q.shape
        if path == tp.BLOCKWISE:  # the quantized weight as it is, its scales in torch's layout
            return PreparedWeight(self.name, "nk", w_q, scale_b, N, K, w_q.dtype, problem,
                                  aux=blockwise_scale_b(scale_b.float()))
        if path != tp.DEQUANT:
            return None  # the canonical layout: torch's ops read the quantized weight as it is
        data = dequantize_weight(w_q, scale_b, problem, compute)
        return PreparedWeight(self.name, dequant_layout(compute), data, scale_b, N, K, w_q.dtype, problem)

    def scaled_mm_prepared(self, a, weight, scale_a, out_dtype, bias, problem):
        path, compute = self.plan(a.device, problem)
        if weight.layout == "nk":
            if path == tp.BLOCKWISE and weight.aux is not None:
                return self._quantized_mm(a, weight.data.t(), scale_a, weight.scale, out_dtype, bias, problem,
                                          path, scale_b_layout=weight.aux)
            return self.scaled_mm(a, weight.data.t(), scale_a, weight.scale, out_dtype, bias, problem)
        if weight.layout != dequant_layout(compute) or path != tp.DEQUANT:
            raise ValueError(f"qbackend.linear: weight: prepared in the layout {weight.layout!r}, but "
                             f"this call takes the torch path {path} in {qd.dtype_name(compute)}: "
                             "prepare the weight again for this call's activation and output dtypes")
        return self._dequant_mm(a, scale_a, weight.data, bias, out_dtype, problem, compute)

    # --- grouped_scaled_mm ----------------------------------------------------------------------

    def grouped_scaled_mm(self, a, b, scale_a, scale_b, offsets, out_dtype, bias, problem):
        path, compute = self.plan(a.device, problem)
        if b.shape[0] > tp.GROUPED_MAX_GROUPS:
            path = tp.GROUPED_LOOP
        if path == tp.GROUPED_SCALED:
            return torch_grouped.scaled_grouped_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, problem)
        if path == tp.GROUPED_DEQUANT:
            return torch_grouped.dequant_grouped_mm(a, b, scale_a, scale_b, offsets, out_dtype, bias, problem,
                                                    compute)
        return torch_grouped.per_group_loop(self.scaled_mm, a, b, scale_a, scale_b, offsets, out_dtype, bias,
                                            problem)

    # --- quantize -------------------------------------------------------------------------------

    def quantize(self, x, dtype, granularity, scale, scale_ub, group_size, block_size, problem):
        xf = x.float()
        if scale is None:
            scale = divisor = dynamic_scale(xf, dtype, granularity, scale_ub, group_size, block_size)
        else:
            divisor = checked_scale(scale.float())
        q = saturate_cast(_broadcast_divide(xf, divisor, granularity, group_size, block_size), dtype)
        return q, scale

    def info(self):
        return {"torch": torch.__version__, "cuda runtime": torch.version.cuda or "none"}


def dequant_layout(compute: torch.dtype) -> str:
    return f"dequant-{qd.dtype_name(compute)}"


@qbackend.hookimpl
def qbackend_providers():
    return [TorchProvider()]
