"""QuantizedWeight: one linear layer's 8-bit weight with its scales, in canonical form.

Canonical form is what checkpoints store and what `QuantLinear` keeps as buffers:
  weight        [N, K] row-major, float8_e4m3fn or int8
  weight_scale  float32; 0-dim (per-tensor), [N, 1] (per-channel) or [ceil(N/bn), ceil(K/bk)]
                (block); dequantized weight = weight * scale (broadcast per block)
  input_scale   float32 0-dim static activation scale, or None (dynamic / weight-only)
Provider layouts (column-major b, transposed scales, fnuz re-encoding, K padding) are derived from
it per device by QuantLinear; they are never stored in checkpoints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import qbackend

from .schemes import Scheme


def weight_scale_shape(scheme: Scheme, out_features: int, in_features: int) -> tuple[int, ...]:
    """The canonical weight_scale shape of an [N, K] weight under `scheme`."""
    if scheme.weight_granularity == "tensor":
        return ()
    if scheme.weight_granularity == "channel":
        return (out_features, 1)
    bn, bk = scheme.block_size
    return (math.ceil(out_features / bn), math.ceil(in_features / bk))


@dataclass
class QuantizedWeight:
    weight: torch.Tensor
    weight_scale: torch.Tensor
    scheme: Scheme
    input_scale: torch.Tensor | None = None

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise ValueError(f"QuantizedWeight: {problem}")

    def problem(self) -> str | None:
        """What is inconsistent about this weight, or None. Checks shapes and dtypes only."""
        w, s, scheme = self.weight, self.weight_scale, self.scheme
        if w.dim() != 2:
            return f"weight must be 2-D [N, K], got shape {list(w.shape)}"
        if w.dtype != scheme.weight_dtype:
            return f"weight dtype {w.dtype} does not match scheme {scheme.name} ({scheme.weight_dtype})"
        want = weight_scale_shape(scheme, *w.shape)
        if tuple(s.shape) != want:
            return (f"weight_scale shape {list(s.shape)} does not match {list(want)} for "
                    f"per-{scheme.weight_granularity} scales of a {list(w.shape)} weight")
        if s.dtype != torch.float32:
            return f"weight_scale must be float32, got {s.dtype}"
        if self.input_scale is not None:
            if not scheme.static_activations:
                return f"scheme {scheme.name} has dynamic activations but an input_scale was given"
            if self.input_scale.dim() != 0 or self.input_scale.dtype != torch.float32:
                return (f"input_scale must be a 0-dim float32 tensor, got shape "
                        f"{list(self.input_scale.shape)} {self.input_scale.dtype}")
        return None

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @classmethod
    def from_float(cls, weight: torch.Tensor, scheme: Scheme,
                   input_scale: torch.Tensor | None = None) -> "QuantizedWeight":
        """Quantize a float [N, K] weight (round-to-nearest, amax scales) under `scheme`."""
        w = weight.detach()
        if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            w = w.float()
        kwargs = {"block_size": tuple(scheme.block_size)} if scheme.block_size else {}
        q, s = qbackend.quantize(w, scheme.weight_dtype, granularity=scheme.weight_granularity,
                                 **kwargs)
        return cls(q, s.float().reshape(weight_scale_shape(scheme, *q.shape)), scheme, input_scale)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight this represents."""
        return qbackend.dequantize(self.weight, self.weight_scale, dtype=dtype)

    def to(self, device) -> "QuantizedWeight":
        move = (lambda t: None if t is None else t.to(device))
        return QuantizedWeight(move(self.weight), move(self.weight_scale), self.scheme,
                               move(self.input_scale))
