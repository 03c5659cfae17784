"""Fusing layers stored separately (q/k/v, gate/up) into one weight along out_features.

Per-channel and block scales concatenate as they are. Per-tensor parts usually carry different
scales; kernels take one, so each part is requantized to the largest: q' = saturate(q * s_i / s_max)
(pcmoritz's rule in the seeds; exact when the scales are equal). Static input scales take the max,
so no part's activations saturate.
"""
from __future__ import annotations

import torch

import qbackend

from ..nn.weight import QuantizedWeight
from .errors import CheckpointError


def merge_quantized(parts: list[QuantizedWeight], names: list[str] | None = None) -> QuantizedWeight:
    names = names or [f"part {i}" for i in range(len(parts))]
    first = parts[0]
    for p, n in zip(parts, names):
        if p.scheme != first.scheme:
            raise CheckpointError(f"cannot merge: {n} is {p.scheme.describe()} but {names[0]} is "
                                  f"{first.scheme.describe()}", tensor=n)
        if p.in_features != first.in_features:
            raise CheckpointError(f"cannot merge: in_features {p.in_features} differs from "
                                  f"{names[0]}'s {first.in_features}", tensor=n)
    scheme = first.scheme
    input_scale = None
    if scheme.static_activations:
        input_scale = torch.stack([p.input_scale for p in parts]).amax()
    if scheme.weight_granularity == "tensor":
        scale = torch.stack([p.weight_scale for p in parts]).amax()
        weights = [p.weight if bool(p.weight_scale == scale) else _requantize(p, scale) for p in parts]
        return QuantizedWeight(torch.cat(weights), scale, scheme, input_scale)
    if scheme.weight_granularity == "block":
        bn = scheme.block_size[0]
        for p, n in zip(parts[:-1], names):
            if p.out_features % bn:
                raise CheckpointError(f"cannot merge block-quantized layers: out_features "
                                      f"{p.out_features} is not a multiple of the block ({bn})", tensor=n)
    return QuantizedWeight(torch.cat([p.weight for p in parts]),
                           torch.cat([p.weight_scale for p in parts]), scheme, input_scale)


def _requantize(part: QuantizedWeight, scale: torch.Tensor) -> torch.Tensor:
    # Dequantize in fp32 (exact for 8-bit values times an fp32 scale up to rounding of the product)
    # and quantize statically with the shared scale.
    w = part.weight.float() * part.weight_scale
    q, _ = qbackend.quantize(w, part.weight.dtype, granularity="tensor", scale=scale.reshape(()))
    return q


def merge_plain(tensors: list[torch.Tensor], names: list[str]) -> torch.Tensor:
    """Concatenate unquantized parts (weights or biases) along dim 0."""
    for t, n in zip(tensors, names):
        if t.shape[1:] != tensors[0].shape[1:] or t.dtype != tensors[0].dtype:
            raise CheckpointError(f"cannot merge: shape {list(t.shape)} {t.dtype} does not fit "
                                  f"{names[0]}'s {list(tensors[0].shape)} {tensors[0].dtype}", tensor=n)
    return torch.cat(tensors)
