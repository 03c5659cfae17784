"""Weights prepared once, at load time, in the layout of the provider that will multiply them.

    pw = qbackend.prepare_weight(w_q, w_scale, activation=torch.float8_e4m3fn)   # [N, K] weight
    y = qbackend.linear(x_q, pw, scale_a=x_s, bias=b)                          # per call

Providers may keep their own layout (marlin's permuted tiles) or re-encode (fnuz with doubled
scales on MI300); the per-call path then does no repacking. The canonical layout "nk" is the plain
row-major [N, K] weight, i.e. the column-major b = data.t() that scaled_mm takes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bounded, probe, registry
from . import dtypes as qd
from .problem import Problem
from .validate import WeightSpec, _fail, validate_scaled_mm

CANONICAL = "nk"


@dataclass(frozen=True)
class PreparedWeight:
    provider: str            # the provider whose layout `data` is in
    layout: str              # "nk" (canonical) or a provider-specific name
    data: torch.Tensor       # the weight in that layout
    scale: torch.Tensor      # fp32, in scale_b form: [] per-tensor, [1, N] per-channel, [Kb, Nb] blocks
    N: int
    K: int
    dtype: torch.dtype       # the quantized dtype the kernel reads (e.g. after fnuz re-encoding)
    problem: Problem         # the problem it was prepared for
    aux: torch.Tensor | None = None   # provider-specific extra tensor (e.g. scales in another form)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def spec(self) -> WeightSpec:
        return WeightSpec(self.K, self.N, self.dtype, self.data.device)


def _aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """t itself where it is row-major with 16-byte aligned rows (a data pointer and a row stride
    in whole 16-byte units, as scaled_mm requires of a and b), else a copy laid out so: its rows
    padded to a multiple of 16 bytes, which a K that is not one (K = 40 in fp8) needs."""
    unit = 16 // t.element_size()
    if t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % unit == 0):
        return t
    rows, cols = t.shape
    padded = torch.empty((rows, -(-cols // unit) * unit), dtype=t.dtype, device=t.device)[:, :cols]
    return padded.copy_(t)


def weight_scale_to_b(w_scale: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """A weight's own scale ([] / [1], [N, 1], [ceil(N/bn), ceil(K/bk)]) in scale_b form."""
    if w_scale.numel() == 1:
        return w_scale.reshape(())
    if tuple(w_scale.shape) in ((N, 1), (N,)) or (tuple(w_scale.shape) == (1, N) and -(-K // 128) != N):
        return w_scale.reshape(1, N)  # per-channel, given as the weight's [N, 1] or already as [1, N]
    if w_scale.dim() == 2:
        return w_scale.t().contiguous()
    _fail("prepare_weight", "w_scale", f"shape must be [], [{N}, 1] or [N blocks, K blocks]",
          list(w_scale.shape))


def prepare_weight(w_q: torch.Tensor, w_scale: torch.Tensor, activation: torch.dtype,
                   activation_granularity: str = "token", out_dtype: torch.dtype | None = None,
                   bias: bool = False, group_size: int = 128, accumulate: str = "fast") -> PreparedWeight:
    """Prepare a quantized row-major [N, K] weight for calls whose activations are `activation`
    (an fp8/int8 dtype for W8A8, bf16/fp16 for W8A16) with `activation_granularity` scales
    ("tensor", "token" or "group"; ignored for W8A16), on the weight's device; `accumulate` as in
    scaled_mm (the provider is chosen for it, and linear() calls keep it)."""
    fn = "prepare_weight"
    if not isinstance(w_q, torch.Tensor) or w_q.dim() != 2:
        _fail(fn, "w_q", "must be a 2-D [N, K] tensor", type(w_q).__name__, TypeError)
    w_q = _aligned_rows(w_q)
    N, K = (int(d) for d in w_q.shape)
    scale_b = weight_scale_to_b(w_scale.float().to(w_q.device), N, K)
    weight_only = activation in qd.ACTIVATION_DTYPES
    if activation not in qd.ACTIVATION_DTYPES + qd.QUANT_DTYPES:
        _fail(fn, "activation", "must be a float8/int8 dtype (W8A8) or bfloat16/float16 (W8A16)",
              qd.dtype_name(activation), TypeError)
    if activation_granularity not in ("tensor", "token", "group"):
        _fail(fn, "activation_granularity", "must be tensor, token or group", repr(activation_granularity))
    a_gran = "tensor" if weight_only else activation_granularity
    # A two-row stand-in activation with the right dtype, K and scales: validation and the
    # Problem come from the same code as a real call's.
    a = _aligned_rows(torch.empty((2, K), dtype=activation, device=w_q.device))
    scale_a = None if weight_only else torch.empty(
        {"tensor": (), "token": (2, 1), "group": (2, -(-K // group_size))}[a_gran], device=w_q.device)
    bias_t = torch.empty(N, dtype=out_dtype or (activation if weight_only else torch.bfloat16),
                         device=w_q.device) if bias else None
    problem = validate_scaled_mm(a, w_q.t(), scale_a, scale_b, out_dtype, bias_t, group_size, accumulate)
    device = probe.device_info(w_q.device)
    provider = registry.get().select(device, problem)
    prepared = provider.prepare_weight(w_q, scale_b, problem)
    if prepared is None:
        prepared = PreparedWeight(provider.name, CANONICAL, w_q, scale_b, N, K, w_q.dtype, problem)
    return prepared


# (device key, problem, provider name, registry id) -> Verdict: the per-call check is a lookup
_verdicts = bounded.cache("linear.verdicts", 4096)


def linear_impl(a, pw_data, pw_scale, pw_aux, scale_a, bias, provider_name, layout, N, K, dtype,
                out_dtype, group_size=128, accumulate="fast"):
    pw = PreparedWeight(provider_name, layout, pw_data, pw_scale, N, K, dtype, None, pw_aux)
    problem = validate_scaled_mm(a, pw.spec(), scale_a, pw_scale, out_dtype, bias, group_size, accumulate)
    lead = tuple(a.shape[:-1])
    if a.numel() == 0:
        return a.new_empty(lead + (N,), dtype=problem.out_dtype)
    reg = registry.get()
    provider = reg.providers.get(provider_name)
    if provider is None or provider_name in reg.disabled:
        state = "disabled by QBACKEND_DISABLE" if provider is not None else "not loaded"
        raise registry.NoProviderError(f"qbackend.linear: the weight was prepared for provider "
                                       f"{provider_name!r}, which is {state}: prepare it again")
    device = probe.device_info(a.device)
    key = (device.key, problem, provider_name, id(reg))
    verdict = _verdicts.get(key)
    if verdict is None:
        verdict = provider.supports(device, problem)
        _verdicts.put(key, verdict)
    if not (verdict.ok or verdict.forceable):
        raise ValueError(f"qbackend.linear: the weight was prepared for {provider_name}, which "
                         f"cannot serve {problem.describe()}: {verdict.reason}")
    a2 = a.reshape(-1, K) if a.dim() != 2 else a
    if scale_a is not None and scale_a.dim() == a.dim() and a.dim() != 2:
        scale_a = scale_a.reshape(-1, scale_a.shape[-1])
    out = provider.scaled_mm_prepared(a2, pw, scale_a, problem.out_dtype, bias, problem)
    return out.reshape(lead + (N,))

