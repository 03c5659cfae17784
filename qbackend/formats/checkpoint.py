"""A quantized (or plain) safetensors model folder, checked and read layer by layer.

Opening a checkpoint reads config.json and the shard headers only, and sorts every `X.weight` into
a quantized layer (8-bit weight with its scale) or a plain tensor, raising CheckpointError for a
layer that is neither (8-bit weight without scale, scale beside a float weight, a weight dtype the
config does not announce). Reading a layer checks its scales' shapes, dtypes and values (finite,
positive) and returns a QuantizedWeight in canonical form.

    with QuantizedCheckpoint(folder) as ckpt:
        for name, value in ckpt.items(device="cuda", merged={"qkv_proj": ["q_proj", "k_proj", "v_proj"]}):
            ...  # value: a QuantizedWeight for layer `name`, or a plain tensor named `name`
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from ..nn.schemes import Scheme
from ..nn.weight import QuantizedWeight, weight_scale_shape
from .errors import CheckpointError
from .merge import merge_plain, merge_quantized
from .quant_config import CheckpointQuantization, parse_quantization_config
from .safetensors_folder import SafetensorsFolder

EIGHT_BIT = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
FLOAT_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# "act_scale" is the first vLLM FP8 layout's name for input_scale (see the seeds).
INPUT_SCALE_NAMES = ("input_scale", "act_scale")
WEIGHT_SCALE_NAMES = ("weight_scale", "weight_scale_inv")


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"unreadable config ({e})", path) from None
    if not isinstance(config, dict):
        raise CheckpointError("config must be a JSON object", path)
    return config


class QuantizedCheckpoint:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.files = SafetensorsFolder(self.folder)
        self.config = read_config(self.folder)
        self.quantization: CheckpointQuantization | None = parse_quantization_config(
            self.config, self.folder / "config.json")
        # layer name -> (scheme, weight_scale tensor name, input_scale tensor name or None)
        self._layers: dict[str, tuple[Scheme, str, str | None]] = {}
        self._consumed: set[str] = set()
        for name in self.files.keys():
            if name.endswith(".weight"):
                self._classify(name[: -len(".weight")])

    # ---------------------------------------------------------------------------- classification

    def _classify(self, layer: str) -> None:
        files = self.files
        wname = layer + ".weight"
        wdtype = files.dtype(wname)
        scale_name = next((layer + "." + s for s in WEIGHT_SCALE_NAMES if layer + "." + s in files), None)
        quantized_dtype = wdtype in EIGHT_BIT
        if not quantized_dtype and scale_name is None:
            return  # a plain tensor (embedding, norm, unquantized Linear)
        where = files.file_of(wname)
        if self.quantization is None:
            raise CheckpointError(f"weight is {_dtype_str(wdtype)}{' with a scale' if scale_name else ''} "
                                  "but config.json has no quantization_config", where, wname)
        rule = self.quantization.rule_for(layer)
        if rule is None:
            raise CheckpointError(f"the layer is quantized ({_dtype_str(wdtype)}) but quantization_config "
                                  "leaves it unquantized (ignore list / no matching config group)",
                                  where, wname)
        if wdtype != rule.weight_dtype:
            raise CheckpointError(f"weight dtype {_dtype_str(wdtype)} does not match the config "
                                  f"({self.quantization.method}: {_dtype_str(rule.weight_dtype)})",
                                  where, wname)
        expected_scale = layer + "." + rule.scale_name
        if expected_scale not in files:
            other = f" (found {scale_name.rsplit('.', 1)[1]})" if scale_name else ""
            raise CheckpointError(f"missing scale {expected_scale!r}{other}", where, wname)
        shape = files.shape(wname)
        if len(shape) != 2:
            raise CheckpointError(f"quantized weight must be 2-D [out_features, in_features], got "
                                  f"shape {list(shape)}", where, wname)
        granularity = rule.weight_granularity or self._granularity_from_shape(expected_scale, shape)
        scheme = rule.scheme(granularity)
        input_name = None
        if scheme.static_activations:
            input_name = next((layer + "." + s for s in INPUT_SCALE_NAMES if layer + "." + s in files), None)
            if input_name is None:
                raise CheckpointError("missing static activation scale (input_scale): the config's "
                                      "activations are static", where, layer + ".input_scale")
        self._layers[layer] = (scheme, expected_scale, input_name)
        self._consumed.update({wname, expected_scale} | {layer + "." + s for s in INPUT_SCALE_NAMES})

    def _granularity_from_shape(self, scale_name: str, weight_shape: tuple) -> str:
        shape = self.files.shape(scale_name)
        n = 1
        for d in shape:
            n *= d
        if n == 1:
            return "tensor"
        if tuple(shape) in ((weight_shape[0],), (weight_shape[0], 1)):
            return "channel"
        raise CheckpointError(f"weight_scale shape {list(shape)} is neither per-tensor ([] or [1]) nor "
                              f"per-channel ([{weight_shape[0]}, 1]) for a weight of shape "
                              f"{list(weight_shape)}", self.files.file_of(scale_name), scale_name)

    # -------------------------------------------------------------------------------- reading

    def quantized_layers(self) -> list[str]:
        """Names of the layers stored quantized (module names, without '.weight')."""
        return list(self._layers)

    def plain_tensors(self) -> list[str]:
        """Names of the tensors that are not part of a quantized layer."""
        return [n for n in self.files.keys() if n not in self._consumed]

    def scheme(self, layer: str) -> Scheme:
        return self._layers[layer][0]

    def layer(self, name: str, device: str | torch.device = "cpu") -> QuantizedWeight:
        """One quantized layer, checked, in canonical form on `device`."""
        if name not in self._layers:
            raise CheckpointError("not a quantized layer of this checkpoint", self.folder, name + ".weight")
        scheme, scale_name, input_name = self._layers[name]
        weight = self.files.get(name + ".weight", device)
        scale = self._scale(scale_name, weight_scale_shape(scheme, *weight.shape), device)
        input_scale = self._scale(input_name, (), device) if input_name else None
        try:
            return QuantizedWeight(weight, scale, scheme, input_scale)
        except ValueError as e:
            raise CheckpointError(str(e), self.files.file_of(name + ".weight"), name + ".weight") from None

    def _scale(self, name: str, shape: tuple, device) -> torch.Tensor:
        where = self.files.file_of(name)
        dtype = self.files.dtype(name)
        if dtype not in FLOAT_SCALE_DTYPES:
            raise CheckpointError(f"scale dtype must be float32 (or bfloat16/float16), got "
                                  f"{_dtype_str(dtype)}", where, name)
        got = tuple(self.files.shape(name))
        # Per-tensor scales come as [] or [1], per-channel ones as [N, 1] or [N]: same numbers.
        accepted = {tuple(shape), *(((1,),) if shape == () else ()),
                    *(((shape[0],),) if len(shape) == 2 and shape[1] == 1 else ())}
        if got not in accepted:
            raise CheckpointError(f"scale shape {list(got)} does not match the expected {list(shape)}",
                                  where, name)
        scale = self.files.get(name, "cpu").float().reshape(shape)
        bad = ~(torch.isfinite(scale) & (scale > 0))
        if bool(bad.any()):
            value = scale.reshape(-1)[bad.reshape(-1)][0].item()
            raise CheckpointError(f"scale must be finite and positive; {int(bad.sum())} value(s) are not "
                                  f"(e.g. {value})", where, name)
        return scale.to(device)

    def tensor(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        return self.files.get(name, device)

    def merged_layer(self, names: list[str], device: str | torch.device = "cpu") -> QuantizedWeight:
        """Several quantized layers fused along out_features (q/k/v, gate/up) with one scale each
        where the scheme has one: per-tensor parts are requantized to their largest scale, static
        input scales take their max."""
        return merge_quantized([self.layer(n, device) for n in names], names)

    def items(self, device: str | torch.device = "cpu", merged: dict[str, list[str]] | None = None
              ) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
        """Every layer and tensor, one at a time: (layer name, QuantizedWeight) for quantized layers,
        (tensor name, tensor) for the rest.

        merged: {fused: [part, ...]} by last name component, e.g. {"qkv_proj": ["q_proj", "k_proj",
        "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}: "P.q_proj", "P.k_proj", "P.v_proj"
        come out as one "P.qkv_proj" (weights and biases concatenated in the order given).
        """
        merged = merged or {}
        part_of = {part: fused for fused, parts in merged.items() for part in parts}
        done: set[str] = set()
        for layer in self._layers:
            prefix, _, leaf = layer.rpartition(".")
            if leaf not in part_of:
                yield layer, self.layer(layer, device)
                continue
            fused = _join(prefix, part_of[leaf])
            if fused not in done:
                done.add(fused)
                names = self._parts(prefix, merged[part_of[leaf]], ".weight")
                if not all(n in self._layers for n in names):
                    raise CheckpointError(f"cannot merge {', '.join(names)} into {fused}: some parts are "
                                          "quantized and some are not", self.folder, fused)
                yield fused, self.merged_layer(names, device)
        for name in self.plain_tensors():
            layer, _, attr = name.rpartition(".")
            prefix, _, leaf = layer.rpartition(".")
            if leaf not in part_of:
                yield name, self.tensor(name, device)
                continue
            fused = _join(prefix, part_of[leaf]) + "." + attr
            if fused not in done:
                done.add(fused)
                names = [n + "." + attr for n in self._parts(prefix, merged[part_of[leaf]], "." + attr)]
                yield fused, merge_plain([self.tensor(n, device) for n in names], names)

    def _parts(self, prefix: str, parts: list[str], suffix: str) -> list[str]:
        names = [_join(prefix, p) for p in parts]
        missing = [n + suffix for n in names if n + suffix not in self.files]
        if missing:
            raise CheckpointError(f"merged layer needs {', '.join(missing)}, which the checkpoint lacks",
                                  self.folder, missing[0])
        return names

    def close(self) -> None:
        self.files.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _dtype_str(dtype) -> str:
    return str(dtype).replace("torch.", "")


def load_quantized(folder: str | Path, device: str | torch.device = "cpu",
                   merged: dict[str, list[str]] | None = None) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Every layer and tensor of a checkpoint folder: {layer: QuantizedWeight} for quantized
    layers, {tensor name: tensor} for the rest. See QuantizedCheckpoint.items for `merged`."""
    with QuantizedCheckpoint(folder) as ckpt:
        return dict(ckpt.items(device, merged))
