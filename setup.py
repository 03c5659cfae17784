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
import importlib.util
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _load_build_module(name):
    # By path: the package is not importable (nor is torch) in pip's build environment.
    spec = importlib.util.spec_from_file_location(f"qbackend_{name}", ROOT / "providers" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cuda_build = _load_build_module("cuda_build")
rocm_build = _load_build_module("rocm_build")
_plan = None
_rocm_plan = None


def cuda_plan():
    """(archs or None, why), decided once per setup.py run."""
    global _plan
    if _plan is None:
        _plan = cuda_build.install_archs()
        archs, why = _plan
        what = f"building the CUDA library for {';'.join(archs)}" if archs else "no CUDA library built"
        print(f"qbackend: {what} ({why})", file=sys.stderr, flush=True)
    return _plan


def rocm_plan():
    """(archs or None, why) of the ROCm library, decided once per setup.py run."""
    global _rocm_plan
    if _rocm_plan is None:
        _rocm_plan = rocm_build.install_archs()
        archs, why = _rocm_plan
        what = f"building the ROCm library for {';'.join(archs)}" if archs else "no ROCm library built"
        print(f"qbackend: {what} ({why})", file=sys.stderr, flush=True)
    return _rocm_plan


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
