"""Writing a model folder's tensors as safetensors shards with an index, one shard in memory at a time.

The caller describes every output tensor up front (name and byte size) plus a function producing
it; `write_shards` plans the shards from the sizes, then builds and saves one shard at a time, so
peak memory is about one shard (max_shard_size) plus the tensor being produced.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from .safetensors_folder import INDEX_NAME

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """'2GB' -> 2_000_000_000, '500MiB' -> 524_288_000, 1000 -> 1000."""
    if isinstance(text, int):
        size = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).upper() not in _UNITS:
            raise ValueError(f"size {text!r} is not a number with an optional unit "
                             "(B, KB, MB, GB, KiB, MiB, GiB)")
        size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return size


@dataclass
class PlannedTensor:
    """One output tensor: its name, size in bytes, and the function that produces its group.

    Tensors produced together (a quantized weight and its scale) share `produce`, which returns a
    dict of all of them; it is called once per shard that needs any of them."""
    name: str
    nbytes: int
    produce: Callable[[], dict[str, torch.Tensor]]


def plan_shards(tensors: list[PlannedTensor], max_shard_size: int) -> list[list[PlannedTensor]]:
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def write_shards(folder: Path, tensors: list[PlannedTensor], max_shard_size: int,
                 on_tensor: Callable[[str], None] | None = None,
                 metadata: dict[str, str] | None = None) -> list[str]:
    """Write `tensors` into folder as model.safetensors, or model-0000i-of-0000n.safetensors plus
    model.safetensors.index.json when they need more than one shard. Returns the file names."""
    shards = plan_shards(tensors, max_shard_size)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map = {}
    for shard, fname in zip(shards, names):
        data: dict[str, torch.Tensor] = {}
        produced: dict[int, dict[str, torch.Tensor]] = {}
        for t in shard:
            group = produced.get(id(t.produce))
            if group is None:
                group = produced[id(t.produce)] = t.produce()
            data[t.name] = group[t.name].contiguous()
            weight_map[t.name] = fname
            if on_tensor:
                on_tensor(t.name)
        save_file(data, str(folder / fname), metadata={"format": "pt", **(metadata or {})})
        del data, produced
    if len(shards) > 1:
        total = sum(t.nbytes for t in tensors)
        (folder / INDEX_NAME).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return names


def check_destination(dst: Path, force: bool) -> None:
    """Refuse to overwrite a non-empty folder without force, and never replace (even with force)
    a folder that does not look like a model folder."""
    if not dst.exists():
        return
    if not dst.is_dir():
        raise FileExistsError(f"{dst}: exists and is not a folder")
    if not any(dst.iterdir()):
        return
    if not force:
        raise FileExistsError(f"{dst}: exists and is not empty; pass --force (force=True) to replace it")
    if not ((dst / "config.json").exists() or any(dst.glob("*.safetensors"))):
        raise FileExistsError(f"{dst}: exists and does not look like a model folder (no config.json "
                              "or .safetensors); not replacing it even with --force")


def staging_folder(dst: Path) -> Path:
    """A fresh sibling of dst to write into, so that a failed run leaves dst untouched."""
    work = dst.parent / f".{dst.name}.partial-{os.getpid()}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


def move_into_place(work: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    work.rename(dst)
