"""Quantization schemes: what a QuantLinear stores and how it quantizes its input.

A scheme fixes the weight format (8-bit dtype and scale granularity) and the activation treatment
(dynamic per-token / per-tensor / per-group, static per-tensor, or none for weight-only W8A16).
The five named schemes are what `quantize_model` and `qbackend convert` accept by name; checkpoint
loading builds a Scheme from whatever the checkpoint's config describes (e.g. DeepSeek-style
128x128 blocks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

FP8 = torch.float8_e4m3fn
WEIGHT_GRANULARITIES = ("tensor", "channel", "block")
ACTIVATION_GRANULARITIES = ("token", "tensor", "group")


@dataclass(frozen=True)
class Scheme:
    """How one linear layer is quantized.

    weight_dtype: canonical storage dtype (float8_e4m3fn or int8). On MI300 the prepared copy is
        re-encoded to e4m3fnuz; the canonical one is what checkpoints hold.
    weight_granularity: "tensor" (one scale), "channel" (one per output row, [N, 1]) or "block"
        (one per block_size tile, [ceil(N/bn), ceil(K/bk)]).
    activations: "token", "tensor" or "group" (groups of block_size[1] along K), or None for
        weight-only (W8A16: activations stay bf16/fp16).
    static_activations: the activation scale is a stored per-tensor `input_scale` (calibrated or
        loaded), not computed per call.
    """
    weight_dtype: torch.dtype
    weight_granularity: str
    activations: str | None
    static_activations: bool = False
    block_size: tuple[int, int] | None = None
    name: str = field(default="custom", compare=False)

    def __post_init__(self):
        if self.weight_dtype not in (FP8, torch.int8):
            raise ValueError(f"scheme {self.name}: weight dtype must be float8_e4m3fn or int8, "
                             f"got {self.weight_dtype}")
        if self.weight_granularity not in WEIGHT_GRANULARITIES:
            raise ValueError(f"scheme {self.name}: weight granularity must be one of "
                             f"{WEIGHT_GRANULARITIES}, got {self.weight_granularity!r}")
        if self.activations is not None and self.activations not in ACTIVATION_GRANULARITIES:
            raise ValueError(f"scheme {self.name}: activations must be one of "
                             f"{ACTIVATION_GRANULARITIES} or None, got {self.activations!r}")
        if (self.weight_granularity == "block") != (self.block_size is not None):
            raise ValueError(f"scheme {self.name}: block_size goes with block weights only")
        if self.static_activations and self.activations != "tensor":
            raise ValueError(f"scheme {self.name}: static activation scales are per-tensor only")
        if self.activations == "group" and self.block_size is None:
            raise ValueError(f"scheme {self.name}: per-group activations need block weights")
        if self.activations is None and self.weight_dtype == torch.int8:
            raise ValueError(f"scheme {self.name}: weight-only (W8A16) needs fp8 weights")

    @property
    def weight_only(self) -> bool:
        return self.activations is None

    @property
    def activation_group_size(self) -> int | None:
        """Per-group activations use the weight block's K extent (DeepSeek: 1 x 128)."""
        return self.block_size[1] if self.activations == "group" else None

    def describe(self) -> str:
        w = f"{str(self.weight_dtype).replace('torch.', '')} per-{self.weight_granularity}"
        if self.block_size:
            w += f" {self.block_size[0]}x{self.block_size[1]}"
        if self.weight_only:
            a = "activations unquantized (W8A16)"
        else:
            a = f"{'static' if self.static_activations else 'dynamic'} per-{self.activations} activations"
        return f"{self.name}: weights {w}, {a}"


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    # Per-channel weights, per-token dynamic activations: the most accurate W8A8, no calibration.
    Scheme(FP8, "channel", "token", name="fp8_dynamic"),
    # Per-tensor weights, one calibrated activation scale: the seeds' "static" checkpoints.
    Scheme(FP8, "tensor", "tensor", static_activations=True, name="fp8_static"),
    # Per-tensor weights, per-tensor dynamic activations: what an engine does with an fp16
    # checkpoint quantized online.
    Scheme(FP8, "tensor", "tensor", name="fp8_dynamic_tensor"),
    # FP8 weights, bf16/fp16 activations (Marlin on pre-Ada GPUs).
    Scheme(FP8, "channel", None, name="fp8_weight_only"),
    # Per-channel INT8 weights, per-token dynamic INT8 activations.
    Scheme(torch.int8, "channel", "token", name="int8_dynamic"),
    # DeepSeek-style 128x128 weight blocks with dynamic 1x128 activation groups.
    Scheme(FP8, "block", "group", block_size=(128, 128), name="fp8_block"),
)}


def get_scheme(scheme: str | Scheme) -> Scheme:
    """A Scheme from its name (or the Scheme itself)."""
    if isinstance(scheme, Scheme):
        return scheme
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"unknown quantization scheme {scheme!r}; known: "
                         f"{', '.join(SCHEMES)}") from None


def named(scheme: Scheme) -> Scheme:
    """The named scheme equal to `scheme` (so that loaded layers report 'fp8_dynamic'), or it."""
    for known in SCHEMES.values():
        if known == scheme:
            return known
    return scheme
