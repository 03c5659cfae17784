"""load_checkpoint: put a checkpoint folder's weights into a model, layer by layer.

Quantized layers replace the model's nn.Linear (or QuantLinear) with a QuantLinear holding the
checkpoint's weight; everything else is copied into the existing parameter or buffer. The model may
be built on the meta device (`with torch.device("meta"): model = Model(config)`): then tensors are
assigned (cast to the dtype the model was built with) instead of copied, so no memory is spent on a
random init and no layer is ever held twice.

With `scheme`, float Linear weights are quantized as they are read (online quantization of a
bf16/fp16 checkpoint: peak memory is the quantized model plus one float layer).
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from ..nn.patterns import check_patterns, matches_any
from ..nn.quant_linear import QuantLinear
from ..nn.schemes import Scheme, get_scheme
from ..nn.weight import QuantizedWeight
from .checkpoint import QuantizedCheckpoint
from .errors import CheckpointError


class LoadResult(NamedTuple):
    missing_keys: list[str]      # model state_dict entries the checkpoint did not provide
    unexpected_keys: list[str]   # checkpoint tensors the model has no place for
    quantized: list[str]         # layers now running as QuantLinear


def load_checkpoint(model: nn.Module, folder: str | Path, device: str | torch.device | None = None,
                    merged: dict[str, list[str]] | None = None, scheme: str | Scheme | None = None,
                    ignore: Iterable[str] = ("lm_head",), strict: bool = True) -> LoadResult:
    """Load a checkpoint folder into `model` in place.

    device: where new tensors go (quantized layers, tensors replacing meta ones); default: where
        the model's tensor already is (cpu for meta). Copies into real tensors keep their device.
    merged: fused layers of the model, by last name component, e.g. {"qkv_proj": ["q_proj",
        "k_proj", "v_proj"]} when the model has qkv_proj and the checkpoint q/k/v_proj.
    scheme: quantize the checkpoint's float nn.Linear weights with this scheme while loading,
        except modules matching `ignore` (only used with `scheme`).
    strict: raise CheckpointError listing missing and unexpected tensors.
    """
    scheme = get_scheme(scheme) if scheme is not None else None
    ignore = check_patterns(ignore)
    folder = Path(folder)
    loaded: set[str] = set()
    unexpected: list[str] = []
    quantized: list[str] = []
    with QuantizedCheckpoint(folder) as ckpt:
        for name, value in ckpt.items(device or "cpu", merged):
            if isinstance(value, QuantizedWeight):
                module = _linear(model, name, folder)
                if module is None:
                    unexpected.append(name + ".weight")
                    continue
                new = _replace(model, name, module, value.to(_target(module.weight, device)), folder)
                loaded.update(name + "." + k for k in new.state_dict() if k != "bias")
                quantized.append(name)
            elif not _set_tensor(model, name, value, device, folder):
                unexpected.append(name)
            else:
                loaded.add(name)
                layer = name[: -len(".weight")] if name.endswith(".weight") else None
                if scheme is not None and layer and not matches_any(layer, ignore):
                    module = model.get_submodule(layer)
                    if isinstance(module, nn.Linear):
                        new = QuantLinear.from_linear(module, scheme)
                        _set_module(model, layer, new)
                        loaded.update(layer + "." + k for k in new.state_dict() if k != "bias")
                        quantized.append(layer)
    # A tied tensor (lm_head.weight sharing the embedding's) counts as loaded with its twin.
    state = model.state_dict(keep_vars=True)
    loaded_ids = {id(state[k]) for k in loaded if k in state}
    missing = [k for k, v in state.items() if k not in loaded and id(v) not in loaded_ids]
    if strict and (missing or unexpected):
        raise CheckpointError(_mismatch_message(missing, unexpected), folder)
    return LoadResult(missing, unexpected, quantized)


def _mismatch_message(missing: list[str], unexpected: list[str]) -> str:
    parts = []
    for what, keys in (("missing from the checkpoint", missing), ("not in the model", unexpected)):
        if keys:
            parts.append(f"{len(keys)} tensor(s) {what}: {', '.join(keys[:10])}"
                         f"{' ...' if len(keys) > 10 else ''}")
    return "checkpoint does not fit the model (strict=True); " + "; ".join(parts)


def _target(current: torch.Tensor | None, device) -> torch.device:
    if device is not None:
        return torch.device(device)
    if current is None or current.device.type == "meta":
        return torch.device("cpu")
    return current.device


def _linear(model: nn.Module, name: str, folder: Path) -> nn.Module | None:
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return None
    if not isinstance(module, (nn.Linear, QuantLinear)):
        raise CheckpointError(f"the checkpoint stores a quantized linear weight for {name!r} but the "
                              f"model's {name} is a {type(module).__name__}", folder, name + ".weight")
    return module


def _replace(model: nn.Module, name: str, module: nn.Module, weight: QuantizedWeight,
             folder: Path) -> QuantLinear:
    if (module.out_features, module.in_features) != tuple(weight.weight.shape):
        raise CheckpointError(f"weight shape {list(weight.weight.shape)} does not fit the model's layer "
                              f"({module.out_features} out x {module.in_features} in)", folder,
                              name + ".weight")
    # Prepare for the model's activation dtype (the replaced layer's), not torch's default.
    dtype = module._dtype if isinstance(module, QuantLinear) else module.weight.dtype
    new = QuantLinear.from_quantized(weight, module.bias, dtype=dtype)
    _set_module(model, name, new)
    return new


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor, device, folder: Path) -> bool:
    """Copy (or, onto meta, assign) one plain tensor; False when the model has no such tensor."""
    owner_name, _, attr = name.rpartition(".")
    try:
        owner = model.get_submodule(owner_name) if owner_name else model
    except AttributeError:
        return False
    if attr in owner._parameters and owner._parameters[attr] is not None:
        current = owner._parameters[attr]
    elif attr in owner._buffers and owner._buffers[attr] is not None:
        current = owner._buffers[attr]
    else:
        return False
    if tuple(current.shape) != tuple(value.shape):
        raise CheckpointError(f"shape {list(value.shape)} does not fit the model's {list(current.shape)}",
                              folder, name)
    if isinstance(owner, QuantLinear) and attr != "bias":
        raise CheckpointError("the model's layer is quantized but the checkpoint's is not (load it "
                              "with scheme=... to quantize while loading)", folder, name)
    with torch.no_grad():
        if current.device.type == "meta":
            # The dtype the model was built with wins, as it does for copies into real tensors.
            dtype = current.dtype if current.is_floating_point() and value.is_floating_point() else None
            value = value.to(_target(None, device), dtype)
            if attr in owner._parameters:
                owner._parameters[attr] = nn.Parameter(value, requires_grad=current.requires_grad)
            else:
                owner._buffers[attr] = value
        else:
            current.copy_(value)  # keeps the model's device and dtype
    return True
