"""Build hook: compile csrc_cuda into libqbackend_cuda.so when this machine can use it.

By default the library is built for the families of the visible NVIDIA GPU (nvidia-smi / NVML; no
CUDA context) and not at all without one, so a GPU-less install is pure Python and fast.
QBACKEND_CUDA_ARCHS=all|native|"89;90a" builds those families; QBACKEND_BUILD_CUDA=1 builds every
family when no GPU is visible and makes a missing nvcc an error; QBACKEND_BUILD_CUDA=0 never builds.
`qbackend build` builds later, after any install. The logic is in providers/cuda_build.py.

Likewise csrc_rocm becomes libqbackend_rocm.so when ROCm's hipcc is present (providers/rocm_build.py):
QBACKEND_ROCM_ARCHS="gfx942;gfx950" picks the targets (default: those of the two that hipcc knows),
QBACKEND_BUILD_ROCM=0 never builds, =1 makes a missing hipcc an error. `qbackend build --rocm` builds later.

The library lands in providers/_lib/ (editable installs) or the wheel's qbackend_providers/_lib/;
a wheel holding one is tagged py3-none-<platform> (a C ABI, no torch or Python linkage), and also
carries csrc_cuda and csrc_rocm so that `qbackend build` can rebuild them for other archs.
"""
import importlib
import shutil
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _load_build_module(name):
    # providers/__init__.py imports torch, which pip's build environment does not have: the package is
    # stood in for by an empty one over the same folder, so that only the stdlib build modules (and
    # what they import from each other) are executed.
    if "qbackend_providers" not in sys.modules:
        package = types.ModuleType("qbackend_providers")
        package.__path__ = [str(ROOT / "providers")]
        sys.modules["qbackend_providers"] = package
    return importlib.import_module(f"qbackend_providers.{name}")


cuda_build = _load_build_module("cuda_build")
rocm_build = _load_build_module("rocm_build")
_plans = {}


def _install_plan(build_module, language: str):
    """(archs or None, why) of one native library, decided (and said) once per setup.py run."""
    if language not in _plans:
        archs, why = _plans[language] = build_module.install_archs()
        what = f"building the {language} library for {';'.join(archs)}" if archs else f"no {language} library built"
        print(f"qbackend: {what} ({why})", file=sys.stderr, flush=True)
    return _plans[language]


def cuda_plan():
    return _install_plan(cuda_build, "CUDA")


def rocm_plan():
    return _install_plan(rocm_build, "ROCm")


class BuildPyWithCuda(build_py):
    def run(self):
        super().run()
        editable = getattr(self, "editable_mode", False)
        package = ROOT / "providers" if editable else Path(self.build_lib) / "qbackend_providers"
        if not editable:
            shutil.copytree(ROOT / "csrc_cuda", package / "csrc_cuda", dirs_exist_ok=True)
            shutil.copytree(ROOT / "csrc_rocm", package / "csrc_rocm", dirs_exist_ok=True)
        archs, _ = cuda_plan()
        if archs:
            cuda_build.build(archs, build_dir=ROOT / "build" / "cuda", dest=package / "_lib",
                             source=ROOT / "csrc_cuda")
        archs, _ = rocm_plan()
        if archs:
            rocm_build.build(archs, build_dir=ROOT / "build" / "rocm", dest=package / "_lib",
                             source=ROOT / "csrc_rocm")


class BdistWheel(bdist_wheel):
    """py3-none-<platform> when the wheel holds a library: it runs on any CPython and any torch."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = not (cuda_plan()[0] or rocm_plan()[0])

    def get_tag(self):
        python, abi, plat = super().get_tag()
        return ("py3", "none", plat) if not self.root_is_pure else (python, abi, plat)


setup(cmdclass={"build_py": BuildPyWithCuda, "bdist_wheel": BdistWheel})
