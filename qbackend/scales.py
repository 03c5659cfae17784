"""How a scale tensor's shape maps onto the operand it scales.

One rule covers every granularity: a scale of shape [R, C] over an operand of shape [rows, cols]
splits the operand into R x C blocks; block (i, j) holds rows i*gr .. and columns j*gc .. . Along a
dimension of length n, c scales mean: the whole dimension when c == 1, one per element when c == n,
and groups of the stated size g (128 by default, DeepSeek-style; the last group may be partial)
when c == ceil(n / g). Any other count is an error: the size is never guessed.
"""
from __future__ import annotations

import math

import torch

BLOCK = 128


def group_size(n: int, count: int, size: int = BLOCK) -> int | None:
    """The group size that `count` scales of stated group size `size` cover along a dimension of
    length n, or None when the count does not fit."""
    if count <= 0 or size <= 0:
        return None
    if count == 1:
        return max(n, 1)
    if count == n:
        return 1
    if count == math.ceil(n / size):
        return size
    return None


def expand(scale: torch.Tensor, rows: int, cols: int, size: tuple = (BLOCK, BLOCK)) -> torch.Tensor:
    """Broadcast a 0-d, [C] (over columns), or [R, C] scale to a full [rows, cols] fp32 tensor;
    `size` is the stated group size along rows and columns."""
    s = scale.float()
    if s.dim() == 0 or s.numel() == 1:
        return s.reshape(1, 1).expand(rows, cols)
    if s.dim() == 1:
        s = s.reshape(1, -1)
    r, c = s.shape
    gr, gc = group_size(rows, r, size[0]), group_size(cols, c, size[1])
    if gr is None or gc is None:
        raise ValueError(f"scale of shape {list(s.shape)} does not split [{rows}, {cols}] into groups of {tuple(size)}")
    return s.repeat_interleave(gr, dim=0)[:rows].repeat_interleave(gc, dim=1)[:, :cols]
