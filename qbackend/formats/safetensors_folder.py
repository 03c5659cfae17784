"""A model folder's safetensors files, sharded or not, read tensor by tensor through mmap.

Opening the folder parses every shard's header (so a truncated shard fails here, naming the file)
and nothing else; a tensor's bytes are read only when `get` asks for it. safetensors holds raw
tensor data and a JSON header: nothing in it is ever executed.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"

# safetensors' dtype names -> torch dtypes.
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsFolder:
    """Tensors of `folder`: the shards listed in model.safetensors.index.json, else every
    *.safetensors file in it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointError("not a directory (expected a model folder with .safetensors files)",
                                  self.folder)
        index_path = self.folder / INDEX_NAME
        index = self._read_index(index_path) if index_path.exists() else None
        if index is not None:
            files = sorted(set(index.values()))
        else:
            files = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if not files:
                pickled = sorted(p.name for p in self.folder.glob("*.bin")) + sorted(
                    p.name for p in self.folder.glob("*.pt"))
                hint = (f" (found {', '.join(pickled[:3])}: pickled checkpoints are never loaded, "
                        "since unpickling runs code from the file)") if pickled else ""
                raise CheckpointError(f"no .safetensors files{hint}", self.folder)
        self._handles = {}
        self._file_of: dict[str, str] = {}
        for name in files:
            path = self.folder / name
            if not path.is_file():
                raise CheckpointError(f"shard listed in {INDEX_NAME} does not exist", path)
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"cannot read safetensors header ({e}); the file is truncated "
                                      "or not a safetensors file", path) from None
            self._handles[name] = handle
            for key in handle.keys():
                if key in self._file_of:
                    raise CheckpointError(f"tensor also present in {self._file_of[key]}", path, key)
                self._file_of[key] = name
        if index is not None:
            for key, name in index.items():
                if key not in self._file_of:
                    raise CheckpointError(f"listed in {INDEX_NAME} but missing from the shard",
                                          self.folder / name, key)
                if self._file_of[key] != name:
                    raise CheckpointError(f"{INDEX_NAME} places it in {name} but it is in "
                                          f"{self._file_of[key]}", self.folder / name, key)

    def _read_index(self, path: Path) -> dict[str, str]:
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"unreadable index (needs a JSON object with a 'weight_map'): {e}",
                                  path) from None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and "/" not in v and "\\" not in v
                for k, v in weight_map.items()):
            raise CheckpointError("weight_map must map tensor names to shard file names in this "
                                  "folder", path)
        return weight_map

    def keys(self) -> list[str]:
        """Tensor names, shard by shard (the order that reads each file front to back)."""
        return list(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def file_of(self, name: str) -> Path:
        return self.folder / self._file_of[name]

    def dtype(self, name: str) -> torch.dtype | str:
        """The tensor's torch dtype, or its safetensors name when torch has no such dtype."""
        code = self._handles[self._file_of[name]].get_slice(name).get_dtype()
        return DTYPES.get(code, code)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[name]].get_slice(name).get_shape())

    def nbytes(self, name: str) -> int:
        dtype = self.dtype(name)
        size = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
        n = 1
        for d in self.shape(name):
            n *= d
        return n * size

    def get(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        """One tensor's data, read from its shard."""
        if name not in self._file_of:
            raise CheckpointError("no such tensor in the checkpoint", self.folder, name)
        try:
            t = self._handles[self._file_of[name]].get_tensor(name)
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"cannot read tensor: {e}", self.file_of(name), name) from None
        if torch.device(device) != t.device:
            return t.to(device)
        # Tensors read from a shard can start at any byte offset; kernels want 16-byte alignment.
        return t.clone() if t.data_ptr() % 16 else t

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
