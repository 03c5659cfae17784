"""save_quantized: write a model with QuantLinear layers as a compressed-tensors checkpoint.

For what `qbackend convert` cannot do alone: static activation scales need calibration data, so
the path is quantize_model(model, "fp8_static") -> calibrate(model, batches) -> save_quantized.
The QuantLinear buffers are already named like compressed-tensors tensors (weight, weight_scale,
input_scale), so the state_dict is written as it is, plus the config.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from ..nn.quantize_model import quant_linears
from .quant_config import compressed_tensors_config
from .writer import (
    PlannedTensor,
    check_destination,
    move_into_place,
    parse_size,
    staging_folder,
    write_shards,
)


def save_quantized(model: nn.Module, folder: str | Path, config: dict | None = None,
                   max_shard_size: str | int = "2GB", force: bool = False) -> list[str]:
    """Write `model`'s state_dict and a config.json with its quantization_config into `folder`.

    config: the model config to extend (default: model.config.to_dict() for transformers models,
    else {}). Returns the safetensors file names written.
    """
    layers = dict(quant_linears(model))
    if not layers:
        raise ValueError("save_quantized: the model has no QuantLinear layer (run quantize_model first)")
    for name, layer in layers.items():
        if layer.scheme.static_activations and not bool(
                torch.isfinite(layer.input_scale) & (layer.input_scale > 0)):
            raise ValueError(f"save_quantized: {name} has no calibrated input_scale (run calibrate first)")
    by_scheme: dict = {}
    for name, layer in layers.items():
        by_scheme.setdefault(layer.scheme, []).append(name)
    groups = list(by_scheme.items())
    scheme_arg = groups[0][0] if len(groups) == 1 else [(names, s) for s, names in groups]
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if config is None:
        hf_config = getattr(model, "config", None)
        config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else {}
    config = dict(config, quantization_config=compressed_tensors_config(scheme_arg, ignore))

    folder = Path(folder)
    check_destination(folder, force)
    # Tied tensors (an lm_head sharing the embedding) are written once, like transformers does.
    seen: dict[int, str] = {}
    planned = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen or t.device.type == "meta":
            continue
        seen[id(t)] = name
        planned.append(PlannedTensor(name, t.numel() * t.element_size(),
                                     (lambda n=name, t=t: {n: t.detach().cpu()})))
    work = staging_folder(folder)
    try:
        files = write_shards(work, planned, parse_size(max_shard_size))
        (work / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
        move_into_place(work, folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return files
