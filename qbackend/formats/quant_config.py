"""`quantization_config` in config.json: read the three FP8/INT8 layouts, write compressed-tensors.

Read:
  quant_method "fp8" (vLLM / HF FineGrainedFP8): {"activation_scheme": "static"|"dynamic",
      "weight_block_size": [128, 128] (optional), "ignored_layers" / "modules_to_not_convert"}.
      Weights F8_E4M3 with `weight_scale` (per-tensor or per-channel, read off its shape) or, with
      weight_block_size, `weight_scale_inv` blocks (DeepSeek). Static checkpoints add `input_scale`
      (`act_scale` in the first vLLM layout).
  quant_method "compressed-tensors" (llm-compressor), formats float-quantized / int-quantized /
      naive-quantized: config_groups of {targets, weights, input_activations}, plus `ignore`.
      Weights 8-bit with `weight_scale`; tensor / channel / block strategies; activations dynamic
      per-token / per-tensor / per-group, static per-tensor (`input_scale`), or none (W8A16).
Write: `compressed_tensors_config(scheme, ignore)`, the config `qbackend convert` puts in config.json.
Parsing is plain dict work (no compressed-tensors import at run time); tests check the written
config with the compressed-tensors package itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..nn.patterns import matches, matches_any
from ..nn.schemes import FP8, Scheme, named
from .errors import CheckpointError

SUPPORTED_METHODS = ("fp8", "compressed-tensors")
CT_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")


@dataclass
class CheckpointQuantization:
    """What a checkpoint's quantization_config says about each layer.

    groups: (targets, scheme) pairs; a scheme with weight_granularity None-equivalent is decided
    per layer from the scale's shape (the "fp8" method does not say tensor vs channel).
    """
    method: str
    groups: list[tuple[list[str], "LayerRule"]]
    ignore: list[str] = field(default_factory=list)
    source: str = "config.json"

    def rule_for(self, module: str) -> "LayerRule | None":
        """The rule for a module, or None when the config leaves it unquantized."""
        if matches_any(module, self.ignore):
            return None
        # compressed-tensors precedence: an exact or regex name target beats a class target.
        for targets, rule in self.groups:
            if any(_is_name_target(t) and matches(module, t) for t in targets):
                return rule
        for targets, rule in self.groups:
            if any(not _is_name_target(t) for t in targets):
                return rule
        return None


@dataclass(frozen=True)
class LayerRule:
    """A config group's promise about a layer's tensors.

    weight_granularity None: "tensor" or "channel", read off weight_scale's shape ("fp8" method).
    """
    weight_dtype: torch.dtype
    weight_granularity: str | None
    activations: str | None
    static_activations: bool
    block_size: tuple[int, int] | None = None
    scale_name: str = "weight_scale"

    def scheme(self, weight_granularity: str | None = None) -> Scheme:
        return named(Scheme(self.weight_dtype, weight_granularity or self.weight_granularity,
                            self.activations, self.static_activations, self.block_size))


def _is_name_target(target: str) -> bool:
    # Class targets are bare CamelCase names ("Linear"); anything else names modules.
    return target.startswith("re:") or "." in target or not target[:1].isupper()


def parse_quantization_config(config: dict, source: str | Path = "config.json"
                              ) -> CheckpointQuantization | None:
    """The checkpoint's quantization rules, or None for an unquantized checkpoint."""
    qc = config.get("quantization_config", config.get("compression_config"))
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise CheckpointError("quantization_config must be a JSON object", source)
    method = qc.get("quant_method")
    if method == "fp8":
        return _parse_fp8(qc, str(source))
    if method == "compressed-tensors":
        return _parse_compressed_tensors(qc, str(source))
    raise CheckpointError(f"unknown quant_method {method!r} in quantization_config (supported: "
                          f"{', '.join(SUPPORTED_METHODS)})", source)


def _parse_fp8(qc: dict, source: str) -> CheckpointQuantization:
    act = qc.get("activation_scheme", "dynamic")
    if act not in ("static", "dynamic"):
        raise CheckpointError(f"quantization_config.activation_scheme must be 'static' or 'dynamic', "
                              f"got {act!r}", source)
    block = qc.get("weight_block_size")
    ignore = list(qc.get("ignored_layers") or []) + list(qc.get("modules_to_not_convert") or [])
    if block is not None:
        block = _block_size(block, source, "quantization_config.weight_block_size")
        if act == "static":
            raise CheckpointError("block-quantized (weight_block_size) checkpoints with static "
                                  "activation scales are not supported", source)
        rule = LayerRule(FP8, "block", "group", False, block, scale_name="weight_scale_inv")
    elif act == "static":
        rule = LayerRule(FP8, None, "tensor", True)
    else:
        rule = LayerRule(FP8, None, "token", False)
    return CheckpointQuantization("fp8", [(["Linear"], rule)], ignore, source)


def _block_size(value, source: str, where: str) -> tuple[int, int]:
    if isinstance(value, str) and "x" in value:  # older compressed-tensors wrote "128x128"
        value = value.split("x")
    try:
        bn, bk = (int(v) for v in value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{where} must be two positive ints, got {value!r}", source) from None
    if bn <= 0 or bk <= 0:
        raise CheckpointError(f"{where} must be two positive ints, got {value!r}", source)
    return bn, bk


def _parse_compressed_tensors(qc: dict, source: str) -> CheckpointQuantization:
    fmt = qc.get("format")
    if fmt is not None and fmt not in CT_FORMATS:
        raise CheckpointError(f"compressed-tensors format {fmt!r} is not supported (supported: "
                              f"{', '.join(CT_FORMATS)}: 8-bit weights stored as int8/float8)", source)
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError("compressed-tensors quantization_config has no config_groups", source)
    parsed = []
    for gname, group in groups.items():
        where = f"quantization_config.config_groups.{gname}"
        if not isinstance(group, dict):
            raise CheckpointError(f"{where} must be an object", source)
        if group.get("format") not in (None, *CT_FORMATS):
            raise CheckpointError(f"{where}.format {group.get('format')!r} is not supported", source)
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise CheckpointError(f"{where}.targets must be a list of strings", source)
        parsed.append((targets, _ct_rule(group, where, source)))
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise CheckpointError("quantization_config.ignore must be a list of strings", source)
    return CheckpointQuantization("compressed-tensors", parsed, ignore, source)


def _ct_rule(group: dict, where: str, source: str) -> LayerRule:
    w = group.get("weights")
    if not isinstance(w, dict):
        raise CheckpointError(f"{where}.weights is missing (activation-only quantization is not "
                              "supported)", source)
    wtype = _ct_type(w, f"{where}.weights", source)
    if w.get("symmetric", True) is not True:
        raise CheckpointError(f"{where}.weights: asymmetric (zero-point) weights are not supported",
                              source)
    if w.get("dynamic", False):
        raise CheckpointError(f"{where}.weights: dynamic weight quantization is not supported", source)
    strategy = w.get("strategy", "tensor")
    block = None
    if strategy == "block":
        block = _block_size(w.get("block_structure"), source, f"{where}.weights.block_structure")
    elif strategy not in ("tensor", "channel"):
        raise CheckpointError(f"{where}.weights.strategy {strategy!r} is not supported (supported: "
                              "tensor, channel, block)", source)
    acts = group.get("input_activations")
    if group.get("output_activations") is not None:
        raise CheckpointError(f"{where}.output_activations: output quantization is not supported",
                              source)
    if acts is None:
        if wtype != FP8:
            raise CheckpointError(f"{where}: weight-only int8 (W8A16) is not supported; only FP8 "
                                  "weight-only", source)
        return LayerRule(wtype, strategy, None, False, block)
    if not isinstance(acts, dict):
        raise CheckpointError(f"{where}.input_activations must be an object or null", source)
    if _ct_type(acts, f"{where}.input_activations", source) != wtype:
        raise CheckpointError(f"{where}: activations and weights must have the same 8-bit type",
                              source)
    if acts.get("symmetric", True) is not True:
        raise CheckpointError(f"{where}.input_activations: asymmetric activations are not supported",
                              source)
    a_strategy = acts.get("strategy", "tensor")
    dynamic = acts.get("dynamic", False)
    if dynamic in ("local", True):
        if a_strategy not in ("token", "tensor", "group"):
            raise CheckpointError(f"{where}.input_activations.strategy {a_strategy!r} is not "
                                  "supported for dynamic activations (token, tensor, group)", source)
        if a_strategy == "group":
            if block is None or acts.get("group_size") != block[1]:
                raise CheckpointError(f"{where}.input_activations: per-group activations are "
                                      "supported with block weights and group_size equal to the "
                                      "block's K extent", source)
        return LayerRule(wtype, strategy, a_strategy, False, block)
    if a_strategy != "tensor":
        raise CheckpointError(f"{where}.input_activations: static activation scales must be "
                              f"per-tensor, got strategy {a_strategy!r}", source)
    return LayerRule(wtype, strategy, "tensor", True, block)


def _ct_type(args: dict, where: str, source: str) -> torch.dtype:
    bits, kind = args.get("num_bits"), args.get("type")
    if bits != 8 or kind not in ("float", "int"):
        raise CheckpointError(f"{where}: only 8-bit float or int quantization is supported, got "
                              f"num_bits={bits!r} type={kind!r}", source)
    return FP8 if kind == "float" else torch.int8


def compressed_tensors_config(scheme: Scheme | list[tuple[list[str], Scheme]], ignore: list[str]) -> dict:
    """A compressed-tensors quantization_config. `scheme`: one Scheme for every Linear, or
    (targets, scheme) groups; `ignore`: modules left in full precision."""
    groups = [(["Linear"], scheme)] if isinstance(scheme, Scheme) else list(scheme)
    kinds = {"float" if s.weight_dtype == FP8 else "int" for _, s in groups}
    if len(kinds) != 1:
        raise ValueError("compressed_tensors_config: mixing int8 and fp8 layers in one checkpoint "
                         "is not supported")
    return {
        "quant_method": "compressed-tensors",
        "format": f"{kinds.pop()}-quantized",
        "quantization_status": "compressed",
        "config_groups": {f"group_{i}": _ct_group(targets, s) for i, (targets, s) in enumerate(groups)},
        "ignore": list(ignore),
        "kv_cache_scheme": None,
    }


def _ct_group(targets: list[str], scheme: Scheme) -> dict:
    kind = "float" if scheme.weight_dtype == FP8 else "int"
    weights = {"num_bits": 8, "type": kind, "symmetric": True, "strategy": scheme.weight_granularity,
               "dynamic": False, "group_size": None, "observer": "minmax",
               "block_structure": list(scheme.block_size) if scheme.block_size else None}
    acts = None
    if not scheme.weight_only:
        acts = {"num_bits": 8, "type": kind, "symmetric": True, "strategy": scheme.activations,
                "dynamic": not scheme.static_activations,
                "group_size": scheme.activation_group_size,
                "observer": "minmax" if scheme.static_activations else None}
    return {"targets": list(targets), "weights": weights, "input_activations": acts,
            "output_activations": None}
