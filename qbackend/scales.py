"""How a scale tensor's shape maps onto the operand it scales.

One rule covers every granularity: a scale of shape [R, C] over an operand of shape [rows, cols]
splits the operand into R x C blocks; block (i, j) holds rows i*gr .. and columns j*gc .. . A group
size along a dimension of length n with c scales is 128 when c == ceil(n / 128) (DeepSeek-style
blocks, the last one possibly partial), else n // c when c divides n.
"""
from __future__ import annotations

import math

import torch

BLOCK = 128


def group_size(n: int, count: int) -> int | None:
    """The group size that `count` scales imply along a dimension of length n, or None."""
    if count <= 0:
        return None
    if count == 1:
        return max(n, 1)
    if count == math.ceil(n / BLOCK):
        return BLOCK
    if n % count == 0:
        return n // count
    return None


def expand(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Broadcast a 0-d, [C] (over columns), or [R, C] scale to a full [rows, cols] fp32 tensor."""
    s = scale.float()
    if s.dim() == 0 or s.numel() == 1:
        return s.reshape(1, 1).expand(rows, cols)
    if s.dim() == 1:
        s = s.reshape(1, -1)
    r, c = s.shape
    gr, gc = group_size(rows, r), group_size(cols, c)
    assert gr is not None and gc is not None, (tuple(s.shape), rows, cols)
    return s.repeat_interleave(gr, dim=0)[:rows].repeat_interleave(gc, dim=1)[:, :cols]
