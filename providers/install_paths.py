"""Where the native libraries' sources, build directories and built files live, for cuda_build and
rocm_build alike.

Standard library only, like its two users: setup.py imports them inside pip's build environment,
where neither torch nor qbackend is installed.

A library is looked for (and by default built into) the package's _lib/ first, then the per-user
cache (~/.cache/qbackend/lib, XDG_CACHE_HOME honoured); a read-only package sends builds to the cache.
"""
from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


class BuildError(RuntimeError):
    """A build that cannot start or failed; the message says what to do."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qbackend"


def package_lib_dir() -> Path:
    return HERE / "_lib"


def cache_lib_dir() -> Path:
    return cache_dir() / "lib"


def default_dest() -> Path:
    """The package's _lib/ when it can be written, else the per-user cache (both are searched)."""
    pkg = package_lib_dir()
    writable = os.access(pkg if pkg.exists() else pkg.parent, os.W_OK)
    return pkg if writable else cache_lib_dir()


class SourceTree:
    """One native source folder (csrc_cuda, csrc_rocm): in a checkout beside providers/, in a wheel
    copied into the package so that `qbackend build` works after any install."""

    def __init__(self, folder: str, marker: str, language: str, build_name: str, cache_build_name: str):
        self.folder = folder                      # csrc_cuda
        self.marker = marker                      # a file that only a complete copy has
        self.language = language                  # for messages: "CUDA"
        self.build_name = build_name              # build/<build_name> in a checkout
        self.cache_build_name = cache_build_name  # <cache>/<cache_build_name> elsewhere

    def in_checkout(self) -> bool:
        """Whether this module runs from a source checkout (an editable install or setup.py)."""
        return HERE.name == "providers" and (HERE.parent / self.folder / self.marker).exists()

    def source_dir(self) -> Path:
        if self.in_checkout():
            return HERE.parent / self.folder
        shipped = HERE / self.folder
        if (shipped / self.marker).exists():
            return shipped
        raise BuildError(f"the {self.language} sources are not part of this installation ({shipped} is "
                         "missing): install qbackend from a wheel or a source checkout")

    def checkout_build_dir(self) -> Path:
        return HERE.parent / "build" / self.build_name

    def cache_build_dir(self) -> Path:
        return cache_dir() / self.cache_build_name

    def default_build_dir(self) -> Path:
        return self.checkout_build_dir() if self.in_checkout() else self.cache_build_dir()
