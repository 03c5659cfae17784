"""Mixture-of-experts blocks from FP8 safetensors checkpoints, experts stacked into a QuantMoE.

The layouts: one quantized Linear per expert and projection, `{prefix}.experts.{i}.{gate,up,down}_proj`
(Qwen3-MoE, DeepSeek-V3; Mixtral names them w1, w3, w2: pass expert_names), with per-tensor or
per-channel `weight_scale` (quant_method fp8, compressed-tensors) or 128 x 128 `weight_scale_inv`
blocks (DeepSeek-V3), and a plain router weight `{prefix}.gate.weight` [E, H]. Each expert weight
is read and checked by QuantizedCheckpoint, as a dense layer is.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..nn.quant_moe import QuantMoE
from .checkpoint import QuantizedCheckpoint
from .errors import CheckpointError


def _expert_count(ckpt: QuantizedCheckpoint, prefix: str, first: str) -> int:
    pattern = re.compile(re.escape(f"{prefix}.experts.") + r"(\d+)" + re.escape(f".{first}") + "$")
    found = sorted(int(m.group(1)) for m in map(pattern.match, ckpt.quantized_layers()) if m)
    if not found:
        raise CheckpointError(f"no quantized expert layers {prefix}.experts.<i>.{first}", ckpt.folder)
    if found != list(range(len(found))):
        missing = sorted(set(range(found[-1] + 1)) - set(found))
        raise CheckpointError(f"expert layers must be numbered 0..E-1; missing {missing[:8]}", ckpt.folder,
                              f"{prefix}.experts.{missing[0]}.{first}.weight")
    return len(found)


def load_moe(folder: str | Path, prefix: str, top_k: int, device: str | torch.device = "cpu",
             expert_names: tuple = ("gate_proj", "up_proj", "down_proj"), router: str = "gate",
             renormalize: bool = True) -> QuantMoE:
    """The MoE block under `prefix` (e.g. "model.layers.3.mlp") as a QuantMoE on `device`.
    expert_names: the (gate, up, down) projection names; router: the router Linear's name."""
    with QuantizedCheckpoint(folder) as ckpt:
        gate_name, up_name, down_name = expert_names
        count = _expert_count(ckpt, prefix, gate_name)
        parts = {name: [] for name in expert_names}
        for i in range(count):
            for name in expert_names:
                layer = f"{prefix}.experts.{i}.{name}"
                if layer not in ckpt.quantized_layers():
                    raise CheckpointError("missing quantized expert layer", ckpt.folder, layer + ".weight")
                qw = ckpt.layer(layer, device)
                if qw.scheme.weight_dtype != torch.float8_e4m3fn or qw.scheme.activations is None:
                    raise CheckpointError("QuantMoE takes float8_e4m3fn weights with quantized activations "
                                          f"(scheme {qw.scheme.name})", ckpt.folder, layer + ".weight")
                parts[name].append(qw)
        # (a missing router weight raises CheckpointError naming it)
        router_weight = ckpt.tensor(f"{prefix}.{router}.weight", device)
        try:
            return QuantMoE.from_experts(router_weight, parts[gate_name], parts[up_name], parts[down_name],
                                         top_k, renormalize)
        except ValueError as e:
            raise CheckpointError(str(e), ckpt.folder, prefix) from None
