"""Build hook: compile csrc_cuda into libqbackend_cuda.so when nvcc is present.

QBACKEND_BUILD_CUDA=0 skips it (a pure-Python install: the reference provider everywhere);
QBACKEND_BUILD_CUDA=1 makes a missing nvcc an error; unset, it builds when nvcc is found.
QBACKEND_CUDA_ARCHS (e.g. "80;89;90a") chooses the arch families. The library lands in
providers/_lib/ (editable installs) or the wheel's qbackend_providers/_lib/.
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = Path(cuda_home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else None


def build_cuda_library(dest: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from build_cuda import build

    build(ROOT / "csrc_cuda", ROOT / "build" / "cuda", dest, os.environ.get("QBACKEND_CUDA_ARCHS"))


class BuildPyWithCuda(build_py):
    def run(self):
        super().run()
        mode = os.environ.get("QBACKEND_BUILD_CUDA", "auto").strip().lower()
        if mode in ("0", "off", "no", "false") or not (ROOT / "csrc_cuda" / "CMakeLists.txt").exists():
            return
        if _nvcc() is None:
            if mode in ("1", "on", "yes", "true"):
                raise RuntimeError("QBACKEND_BUILD_CUDA=1 but nvcc was not found (set CUDA_HOME)")
            return
        if getattr(self, "editable_mode", False):
            dest = ROOT / "providers" / "_lib"
        else:
            dest = Path(self.build_lib) / "qbackend_providers" / "_lib"
        build_cuda_library(dest)


setup(cmdclass={"build_py": BuildPyWithCuda})
