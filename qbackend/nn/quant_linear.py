"""QuantLinear: a drop-in for torch.nn.Linear that runs through qbackend's prepared-weight GEMM.

The layer keeps its weight in canonical form (see weight.py) as buffers named like a
compressed-tensors checkpoint (`weight`, `weight_scale`, `input_scale`), so `state_dict()` is a
loadable quantized checkpoint and `load_state_dict()` takes one. What the kernels need is derived
by `_prepare()` through `qbackend.prepare_weight` (the chosen provider's own layout, e.g. Marlin's
tiles), after the two things only the layer knows: fnuz re-encoding on MI300 (doubled scales) and
zero padding of K to a multiple of 16. It is cached per activation dtype on the weight's device
(the provider may depend on the output dtype); forward does no weight work. Moving the module
(`.to()`, `.cuda()`, `.half()`) or loading new weights drops the cache and prepares again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import qbackend
from qbackend.dtypes import qmax
from qbackend.problem import ACCUMULATE_MODES

from .schemes import Scheme, get_scheme
from .weight import QuantizedWeight, weight_scale_shape

# 8-bit operands need rows of a multiple of 16 bytes: K is zero-padded up to this.
K_ALIGN = 16
_QUANT_BUFFERS = ("weight", "weight_scale", "input_scale")
_HALF_DTYPES = (torch.bfloat16, torch.float16)


@dataclass
class _Prepared:
    """What forward needs for one activation dtype on the weight's device."""
    weight: "qbackend.PreparedWeight"  # the provider's layout of the (padded, re-encoded) weight
    act_dtype: torch.dtype            # what activations become: fp8/int8, or bf16/fp16 for W8A16
    input_scale: torch.Tensor | None  # static activation scale in act_dtype's units
    pad_k: int


class QuantLinear(nn.Module):
    """y = x @ dequant(W).T + bias with an 8-bit weight, computed by qbackend.linear.

    Build one with `QuantLinear.from_linear(linear, scheme)` or
    `QuantLinear.from_quantized(QuantizedWeight, bias)`; the constructor makes an empty layer of
    the right shape (zero weight, unit scales, an uncalibrated NaN input_scale for static schemes)
    for `load_state_dict`. Inference only: nothing here has a gradient. `accumulate` is scaled_mm's
    ("fast" or "precise"); setting it later prepares the weight again on the next call.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 scheme: str | Scheme = "fp8_dynamic", device=None, dtype=None, accumulate: str = "fast"):
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.scheme = get_scheme(scheme)
        self.register_buffer("weight", torch.zeros(
            (self.out_features, self.in_features), dtype=self.scheme.weight_dtype, device=device))
        self.register_buffer("weight_scale", torch.ones(
            weight_scale_shape(self.scheme, self.out_features, self.in_features),
            dtype=torch.float32, device=device))
        # NaN marks "not calibrated yet": forward refuses to run a static layer without a scale.
        self.register_buffer("input_scale", torch.full((), float("nan"), device=device)
                             if self.scheme.static_activations else None)
        self.bias = (nn.Parameter(torch.zeros(self.out_features, device=device, dtype=dtype),
                                  requires_grad=False) if bias else None)
        # The activation dtype the layer expects (the model's): what gets prepared eagerly.
        self._dtype = dtype or torch.get_default_dtype()
        self._prepared: dict[torch.dtype, _Prepared] = {}
        self._amax: torch.Tensor | None = None  # running max |input| while calibrating
        self.accumulate = accumulate

    @property
    def accumulate(self) -> str:
        return self._accumulate

    @accumulate.setter
    def accumulate(self, mode: str) -> None:
        if mode not in ACCUMULATE_MODES:
            raise ValueError(f"QuantLinear: accumulate: must be 'fast' or 'precise'; got {mode!r}")
        self._accumulate = mode
        self._prepared = {}  # prepared for the old mode's provider

    # ----------------------------------------------------------------------------- construction

    @classmethod
    def from_quantized(cls, qweight: QuantizedWeight, bias: torch.Tensor | None = None,
                       dtype: torch.dtype | None = None, accumulate: str = "fast") -> "QuantLinear":
        """A layer holding `qweight` (no copy) and `bias`. dtype: the activations' dtype (default:
        the bias's, else torch's default); others work too, prepared on first use."""
        dtype = dtype or (bias.dtype if bias is not None else None)
        layer = cls(qweight.in_features, qweight.out_features, bias=bias is not None,
                    scheme=qweight.scheme, device="meta", dtype=dtype, accumulate=accumulate)
        device = qweight.weight.device
        # 8-bit kernels need 16-byte aligned operands; a fresh allocation is.
        layer.weight = qweight.weight if qweight.weight.data_ptr() % 16 == 0 else qweight.weight.clone()
        layer.weight_scale = qweight.weight_scale.to(device)
        if qweight.scheme.static_activations:
            layer.input_scale = (qweight.input_scale.to(device) if qweight.input_scale is not None
                                 else torch.full((), float("nan"), device=device))
        if bias is not None:
            if bias.device.type == "meta":  # a model built on meta: the real bias is loaded later
                bias = torch.zeros(bias.shape, dtype=bias.dtype, device=device)
            layer.bias = nn.Parameter(bias.detach().to(device), requires_grad=False)
        layer._prepare()
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: str | Scheme = "fp8_dynamic",
                    input_scale: torch.Tensor | float | None = None, accumulate: str = "fast") -> "QuantLinear":
        """Quantize an nn.Linear's weight (round-to-nearest with amax scales) into a new layer.

        input_scale: the static activation scale for static schemes (else calibrate later).
        """
        scheme = get_scheme(scheme)
        if linear.weight.device.type == "meta":
            raise ValueError("QuantLinear.from_linear: the linear layer's weight is on the meta "
                             "device; load real weights first (or use qbackend.load_checkpoint)")
        if input_scale is not None:
            if not scheme.static_activations:
                raise ValueError(f"QuantLinear.from_linear: scheme {scheme.name} has no static "
                                 "input scale")
            input_scale = torch.as_tensor(input_scale, dtype=torch.float32,
                                          device=linear.weight.device).reshape(())
        qweight = QuantizedWeight.from_float(linear.weight, scheme, input_scale)
        return cls.from_quantized(qweight, linear.bias, dtype=linear.weight.dtype, accumulate=accumulate)

    def quantized_weight(self) -> QuantizedWeight:
        """The layer's canonical weight (shares storage with the buffers)."""
        return QuantizedWeight(self.weight, self.weight_scale, self.scheme,
                               self.input_scale if self.scheme.static_activations else None)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, scheme={self.scheme.name}"
                + (f", accumulate={self.accumulate}" if self.accumulate != "fast" else ""))

    # ------------------------------------------------------------------------------ preparation

    def _prepare(self, dtype: torch.dtype | None = None) -> _Prepared | None:
        """Prepare the weight for activations of `dtype` (default: the layer's) and cache it.
        Without an argument, the cache is first dropped (the weights changed or moved)."""
        if dtype is None:
            self._prepared = {}
            dtype = self._dtype
        w, s = self.weight, self.weight_scale
        if w.device.type == "meta":
            return None
        scheme = self.scheme
        input_scale = self.input_scale if scheme.static_activations else None
        if input_scale is not None and not bool(torch.isfinite(input_scale) & (input_scale > 0)):
            input_scale = None  # uncalibrated: forward will say so
        if scheme.weight_only:
            # W8A16 kernels take bf16/fp16 activations; an fp32 model runs them in bf16.
            act_dtype = dtype if dtype in _HALF_DTYPES else torch.bfloat16
        else:
            act_dtype = scheme.weight_dtype
        if scheme.weight_dtype == torch.float8_e4m3fn:
            fp8 = qbackend.native_fp8_dtype(w.device)
            if fp8 == torch.float8_e4m3fnuz:
                # MI300: same bits mean half the value, so scales double (activations' too).
                w, s = qbackend.to_fnuz(w, s)
                if input_scale is not None:
                    input_scale = input_scale * 2
            if not scheme.weight_only:
                act_dtype = fp8
        pad_k = -self.in_features % K_ALIGN
        if pad_k:
            w = F.pad(w.view(torch.uint8) if w.dtype != torch.int8 else w, (0, pad_k)).view(w.dtype)
        elif w.data_ptr() % 16:
            w = w.clone()  # kernels need 16-byte aligned operands; a fresh allocation is
        weight = qbackend.prepare_weight(
            w, s, activation=act_dtype, activation_granularity=scheme.activations or "tensor",
            out_dtype=dtype, bias=self.bias is not None, accumulate=self.accumulate)
        prepared = self._prepared[dtype] = _Prepared(weight, act_dtype, input_scale, pad_k)
        return prepared

    def _apply(self, fn, recurse=True):
        # nn.Module._apply would also cast the 8-bit weight and fp32 scales on .half()/.to(dtype):
        # move them to the new device only, and let the bias follow the model's dtype.
        order = list(self._buffers)
        quantized = {n: self._buffers.pop(n) for n in _QUANT_BUFFERS if n in self._buffers}
        try:
            super()._apply(fn, recurse)
        finally:
            others = dict(self._buffers)
            self._buffers.clear()
            for name in order:
                t = quantized.get(name, others.get(name))
                if name in quantized and t is not None:
                    t = t.to(fn(torch.empty(0, device=t.device)).device)
                self._buffers[name] = t
        # The activation dtype follows the model's casts (.half(), .to(torch.bfloat16)).
        self._dtype = fn(torch.empty(0, dtype=self._dtype)).dtype
        self._prepare()
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        w = state_dict.get(prefix + "weight")
        if w is not None and w.dtype != self.scheme.weight_dtype:
            error_msgs.append(
                f"{prefix}weight: QuantLinear ({self.scheme.name}) expects a quantized "
                f"{self.scheme.weight_dtype} weight with its weight_scale, got {w.dtype}; quantize "
                "float weights with QuantLinear.from_linear or load through qbackend.load_checkpoint")
            return
        # Checkpoints store per-tensor scales as [] or [1] and per-channel ones as [N] or [N, 1].
        for name in ("weight_scale", "input_scale"):
            mine, theirs = getattr(self, name), state_dict.get(prefix + name)
            if (mine is not None and theirs is not None and theirs.shape != mine.shape
                    and theirs.numel() == mine.numel()):
                state_dict[prefix + name] = theirs.reshape(mine.shape).float()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._prepare()

    # ---------------------------------------------------------------------------------- forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self._prepared.get(x.dtype) or self._prepare(x.dtype)
        if p is None:
            raise RuntimeError(f"{self._name()}: the weight is on the meta device; load it first")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self._name()}: input's last dimension is {x.shape[-1]}, expected "
                             f"in_features={self.in_features}")
        vector = x.dim() == 1
        if vector:
            x = x.unsqueeze(0)
        out_dtype = x.dtype
        bias = self.bias
        if bias is not None and bias.dtype != out_dtype:
            bias = bias.to(out_dtype)
        calibrating = self._amax is not None
        if calibrating:
            self._amax = torch.maximum(self._amax, x.detach().abs().amax().float())
        if p.pad_k:
            x = F.pad(x, (0, p.pad_k))

        scheme = self.scheme
        if scheme.weight_only:
            y = qbackend.linear(x.to(p.act_dtype), p.weight, None, bias=bias, out_dtype=out_dtype)
        else:
            if scheme.static_activations and not calibrating:
                if p.input_scale is None:
                    raise RuntimeError(
                        f"{self._name()}: scheme {scheme.name} needs a static input_scale and this "
                        "layer has none (NaN or <= 0): run qbackend.calibrate(model, batches) or "
                        "load a checkpoint with input_scale")
                qa, sa = qbackend.quantize(x, p.act_dtype, granularity="tensor", scale=p.input_scale)
            elif calibrating:
                # While recording amax, run as dynamic per-tensor: the closest dynamic stand-in.
                qa, sa = qbackend.quantize(x, p.act_dtype, granularity="tensor")
            elif scheme.activations == "group":
                qa, sa = qbackend.quantize(x, p.act_dtype, granularity="group",
                                           group_size=scheme.activation_group_size)
            else:
                qa, sa = qbackend.quantize(x, p.act_dtype, granularity=scheme.activations)
            y = qbackend.linear(qa, p.weight, sa, bias=bias, out_dtype=out_dtype)
        return y.squeeze(0) if vector else y

    def _name(self) -> str:
        return f"QuantLinear({self.extra_repr()})"

    # ------------------------------------------------------------------------------ calibration

    def start_calibration(self) -> None:
        """Record max |input| over the following forwards (static schemes)."""
        self._amax = torch.zeros((), device=self.weight.device)

    def finish_calibration(self) -> bool:
        """Set input_scale = amax / qmax from what was recorded; False if nothing was seen."""
        amax, self._amax = self._amax, None
        if amax is None or not bool(amax > 0):
            return False
        self.input_scale = (amax / qmax(self.scheme.weight_dtype)).float().reshape(()).to(self.weight.device)
        self._prepare()
        return True

    def abort_calibration(self) -> None:
        self._amax = None
