"""Mixture-of-experts blocks from FP8 safetensors checkpoints, experts stacked into a QuantMoE.

The layouts: one quantized Linear per expert and projection, `{prefix}.experts.{i}.{gate,up,down}_proj`
(Qwen3-MoE, DeepSeek-V3; Mixtral names them w1, w3, w2: pass expert_names), with per-tensor or
per-channel `weight_scale` (quant_method fp8, compressed-tensors) or 128 x 128 `weight_scale_inv`
blocks (DeepSeek-V3), and a plain router weight `{prefix}.gate.weight` [E, H]. Each expert weight
is read and checked by QuantizedCheckpoint, as a dense layer is.

The routing comes from config.json, as the models' own code reads it: scoring_func (softmax unless
"sigmoid"), norm_topk_prob (Mixtral has none and renormalizes), topk_method with n_group and
topk_group (DeepSeek's group-limited choice), routed_scaling_factor, num_experts_per_tok, and the
router's `e_score_correction_bias` where the checkpoint has one (DeepSeek-V3's noaux_tc).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..nn.quant_moe import QuantMoE, Routing
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


# topk_method -> how groups of experts are ranked (None: no group limit).
_GROUP_SCORE = {"greedy": None, "group_limited_greedy": "max", "noaux_tc": "top2_sum"}


def routing_from_config(config: dict, where: Path, renormalize: bool | None = None) -> Routing:
    """The Routing a model's config.json describes; `renormalize` overrides its norm_topk_prob."""
    scoring = config.get("scoring_func", "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise CheckpointError(f"config.json: scoring_func {scoring!r} is not supported (softmax, sigmoid)", where)
    method = config.get("topk_method", "greedy")
    if method not in _GROUP_SCORE:
        raise CheckpointError(f"config.json: topk_method {method!r} is not supported ({', '.join(_GROUP_SCORE)})",
                              where)
    group_score = _GROUP_SCORE[method]
    n_group = int(config.get("n_group") or 1) if group_score else 1
    topk_group = int(config.get("topk_group") or 1) if group_score else 1
    if renormalize is None:
        renormalize = bool(config.get("norm_topk_prob", True))
    try:
        return Routing(scoring=scoring, renormalize=renormalize, n_group=n_group, topk_group=topk_group,
                       group_score=group_score or "top2_sum",
                       scaling=float(config.get("routed_scaling_factor") or 1.0))
    except ValueError as e:
        raise CheckpointError(f"config.json: {e}", where) from None


def load_moe(folder: str | Path, prefix: str, top_k: int | None = None, device: str | torch.device = "cpu",
             expert_names: tuple = ("gate_proj", "up_proj", "down_proj"), router: str = "gate",
             renormalize: bool | None = None, routing: Routing | None = None) -> QuantMoE:
    """The MoE block under `prefix` (e.g. "model.layers.3.mlp") as a QuantMoE on `device`.
    expert_names: the (gate, up, down) projection names; router: the router Linear's name.
    top_k, renormalize, routing: from config.json unless given (routing overrides renormalize)."""
    with QuantizedCheckpoint(folder) as ckpt:
        config_path = ckpt.folder / "config.json"
        if top_k is None:
            top_k = ckpt.config.get("num_experts_per_tok")
            if top_k is None:
                raise CheckpointError("config.json has no num_experts_per_tok: pass top_k", config_path)
        if routing is None:
            routing = routing_from_config(ckpt.config, config_path, renormalize)
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
        bias_name = f"{prefix}.{router}.e_score_correction_bias"
        score_bias = ckpt.tensor(bias_name, device) if bias_name in ckpt.files else None
        try:
            return QuantMoE.from_experts(router_weight, parts[gate_name], parts[up_name], parts[down_name],
                                         top_k, routing=routing, score_bias=score_bias)
        except ValueError as e:
            raise CheckpointError(str(e), ckpt.folder, prefix) from None
