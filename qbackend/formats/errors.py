"""The one exception type for unusable checkpoints: says which file and which tensor."""
from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is. `file` and `tensor` say where (either may be
    None), and the message says what rule it broke."""

    def __init__(self, message: str, file: str | Path | None = None, tensor: str | None = None):
        self.file = str(file) if file is not None else None
        self.tensor = tensor
        where = ", ".join(p for p in (self.file, f"tensor {tensor!r}" if tensor else None) if p)
        super().__init__(f"{where}: {message}" if where else message)
