"""GGUF (llama.cpp) files: F32, F16, BF16 and Q8_0 tensors, read through the `gguf` package.

Q8_0 stores blocks of 32 int8 values along a row with one fp16 scale each. No GEMM kernel here
takes 32-wide scales, so a Q8_0 weight is requantized to a qbackend scheme: INT8 per-channel
(int8_dynamic, the closest: still int8, one scale per row) or FP8. The result reports, per
tensor, the requantization error against the exact Q8_0 values. Other quantization types
(Q4_K, Q6_K, ...) are refused with a clear error; nothing is read before every tensor's type has
been checked. The file is memory-mapped by gguf's reader; tensors are converted one at a time.

GGUF tensor names stay as llama.cpp writes them (blk.0.attn_q.weight, ...): mapping them onto a
model's module names is the model author's (gguf.TensorNameMap helps).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..nn.schemes import Scheme, get_scheme
from ..nn.weight import QuantizedWeight
from .errors import CheckpointError

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0")
Q8_0_BLOCK = 32
Q8_0_BYTES = 2 + Q8_0_BLOCK  # fp16 scale + 32 int8


@dataclass(frozen=True)
class RequantizationError:
    """How far the requantized weight W' is from the Q8_0 weight W (exact block values)."""
    relative: float   # ||W' - W||_F / ||W||_F
    max_abs: float    # max |W' - W|


@dataclass
class GGUFModel:
    tensors: dict[str, torch.Tensor | QuantizedWeight] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)   # each tensor's GGUF type name
    requantization_error: dict[str, RequantizationError] = field(default_factory=dict)
    architecture: str | None = None


def _reader(path: Path):
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'qbackend[gguf]'") from None
    if not path.is_file():
        raise CheckpointError("no such GGUF file", path)
    try:
        return gguf.GGUFReader(str(path), "r")
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise CheckpointError(f"cannot read GGUF file ({e}); it is truncated or not a GGUF file",
                              path) from None


def _architecture(reader) -> str | None:
    f = reader.fields.get("general.architecture")
    if f is None or not f.data:
        return None
    return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")


def load_gguf(path: str | Path, scheme: str | Scheme | None = "int8_dynamic",
              device: str | torch.device = "cpu") -> GGUFModel:
    """Every tensor of a GGUF file, in torch shape order ([rows, cols] = [out, in] for weights).

    scheme: what Q8_0 2-D weights become (QuantizedWeight, with requantization_error recorded);
    None dequantizes them to float32 tensors. F32/F16/BF16 tensors are returned as they are.
    """
    path = Path(path)
    target = get_scheme(scheme) if scheme is not None else None
    if target is not None and target.static_activations:
        raise ValueError(f"load_gguf: scheme {target.name} needs calibrated activation scales; "
                         "use a dynamic or weight-only scheme")
    reader = _reader(path)
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise CheckpointError(f"unsupported GGUF type {t.tensor_type.name} (supported: "
                                  f"{', '.join(SUPPORTED_TYPES)})", path, t.name)
    out = GGUFModel(architecture=_architecture(reader))
    for t in reader.tensors:
        kind = t.tensor_type.name
        # GGUF lists dimensions fastest-first (ne0 = columns); torch wants them slowest-first.
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        out.types[t.name] = kind
        try:
            if kind == "Q8_0":
                weight = dequantize_q8_0(np.asarray(t.data), shape)
            else:
                weight = _float_tensor(np.asarray(t.data), kind, shape)
        except ValueError as e:
            raise CheckpointError(f"malformed {kind} data: {e}", path, t.name) from None
        if kind == "Q8_0" and target is not None and weight.dim() == 2:
            if target.weight_granularity == "block" and weight.shape[1] % target.block_size[1]:
                raise CheckpointError(f"cannot requantize to {target.name}: in_features {weight.shape[1]} "
                                      f"is not a multiple of {target.block_size[1]}", path, t.name)
            q = QuantizedWeight.from_float(weight, target)
            diff = q.dequantize(torch.float32) - weight
            out.requantization_error[t.name] = RequantizationError(
                float(diff.norm() / weight.norm().clamp_min(1e-30)), float(diff.abs().max()))
            out.tensors[t.name] = q.to(device)
        else:
            out.tensors[t.name] = weight.to(device)
    return out


def dequantize_q8_0(raw: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """Q8_0 bytes -> float32 tensor of `shape`: each 34-byte block is an fp16 scale d and 32 int8
    values q, meaning d * q."""
    if shape[-1] % Q8_0_BLOCK:
        raise ValueError(f"row length {shape[-1]} is not a multiple of {Q8_0_BLOCK}")
    n_blocks = int(np.prod(shape)) // Q8_0_BLOCK
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if blocks.size != n_blocks * Q8_0_BYTES:
        raise ValueError(f"{blocks.size} bytes for {n_blocks} blocks of {Q8_0_BYTES}")
    blocks = blocks.reshape(n_blocks, Q8_0_BYTES)
    d = torch.from_numpy(blocks[:, :2].copy().view(np.float16)).float()          # [n_blocks, 1]
    q = torch.from_numpy(blocks[:, 2:].copy().view(np.int8)).float()             # [n_blocks, 32]
    return (d * q).reshape(shape)


def _float_tensor(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> torch.Tensor:
    if kind == "BF16":
        # numpy has no bfloat16: the reader hands raw bytes; reinterpret them in torch.
        bits = np.ascontiguousarray(raw).view(np.int16).copy()
        return torch.from_numpy(bits).view(torch.bfloat16).reshape(shape)
    dtype = np.float32 if kind == "F32" else np.float16
    return torch.from_numpy(np.ascontiguousarray(raw).view(dtype).copy()).reshape(shape)
