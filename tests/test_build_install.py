"""The build and install machinery, on the CPU: which archs an install builds, where the loader looks,
how a build that has nothing to do is recognised, what `qbackend build` refuses, and what a wheel holds."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qbackend import cli
from qbackend_providers import cuda_build, install_paths, native

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("QBACKEND_BUILD_CUDA", "QBACKEND_CUDA_ARCHS", "QBACKEND_CUDA_LIB", "QBACKEND_CUTLASS_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cuda_build, "nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    return monkeypatch


def gpus(monkeypatch, *caps):
    monkeypatch.setattr(cuda_build, "visible_gpus", lambda: list(caps))


# --- which archs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cap, families", [
    ((7, 0), []), ((7, 5), ["75"]), ((8, 0), ["80"]), ((8, 6), ["80"]), ((8, 9), ["80", "89"]),
    ((9, 0), ["80", "90a"]), ((10, 0), ["80", "89"]), ((12, 0), ["80", "89"]),
])
def test_families_of_a_gpu(cap, families):
    assert cuda_build.families_for(*cap) == families


def test_no_gpu_means_no_cuda_build(clean_env):
    gpus(clean_env)
    archs, why = cuda_build.install_archs()
    assert archs is None and "no NVIDIA GPU visible" in why and "QBACKEND_CUDA_ARCHS=all" in why


def test_a_visible_gpu_builds_its_families(clean_env):
    gpus(clean_env, (9, 0))
    assert cuda_build.install_archs()[0] == ["80", "90a"]
    gpus(clean_env, (8, 9), (7, 5))
    assert cuda_build.install_archs()[0] == ["75", "80", "89"]


def test_asking_builds_without_a_gpu(clean_env):
    gpus(clean_env)
    clean_env.setenv("QBACKEND_BUILD_CUDA", "1")
    assert cuda_build.install_archs()[0] == list(cuda_build.ALL_ARCHS)
    clean_env.delenv("QBACKEND_BUILD_CUDA")
    clean_env.setenv("QBACKEND_CUDA_ARCHS", "all")
    assert cuda_build.install_archs()[0] == ["75", "80", "89", "90a"]
    clean_env.setenv("QBACKEND_CUDA_ARCHS", "89;90a")
    assert cuda_build.install_archs()[0] == ["89", "90a"]


def test_build_cuda_0_wins_over_a_gpu(clean_env):
    gpus(clean_env, (9, 0))
    clean_env.setenv("QBACKEND_BUILD_CUDA", "0")
    assert cuda_build.install_archs()[0] is None


def test_asking_without_nvcc_is_an_error(clean_env):
    clean_env.setattr(cuda_build, "nvcc", lambda: None)
    assert cuda_build.install_archs() == (None, "no nvcc on the PATH or in CUDA_HOME")
    clean_env.setenv("QBACKEND_CUDA_ARCHS", "90a")
    with pytest.raises(cuda_build.BuildError, match="nvcc was not found"):
        cuda_build.install_archs()


def test_arch_lists_are_read_leniently_and_checked():
    assert cuda_build.parse_archs("sm_89, 90") == ["89", "90a"]
    assert cuda_build.parse_archs("90a;75") == ["75", "90a"]
    with pytest.raises(cuda_build.BuildError, match="unknown CUDA arch '91'.*75, 80, 89, 90a"):
        cuda_build.parse_archs("89;91")


# --- where the loader looks ---------------------------------------------------------------------------------

@pytest.fixture
def lib_dirs(tmp_path, clean_env):
    pkg, cache = tmp_path / "pkg" / "_lib", tmp_path / "cache"
    pkg.parent.mkdir()
    clean_env.setattr(install_paths, "package_lib_dir", lambda: pkg)
    clean_env.setenv("XDG_CACHE_HOME", str(cache))
    return pkg, cache / "qbackend" / "lib"


def put_library(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / cuda_build.LIB_NAME).write_bytes(b"")
    return str(folder / cuda_build.LIB_NAME)


def test_loader_searches_the_package_then_the_cache(lib_dirs):
    pkg, cache = lib_dirs
    assert [w for w, _ in native.library_candidates()] == ["package", "cache"]
    assert native.library_path() == str(pkg / cuda_build.LIB_NAME)   # none found: the first one is named
    in_cache = put_library(cache)
    assert native.library_path() == in_cache
    in_package = put_library(pkg)
    assert native.library_path() == in_package                        # both: the package's


def test_qbackend_cuda_lib_is_the_only_candidate_when_set(lib_dirs, tmp_path):
    put_library(lib_dirs[0])
    lib_dirs_env = str(tmp_path / "elsewhere.so")
    os.environ["QBACKEND_CUDA_LIB"] = lib_dirs_env
    try:
        assert native.library_candidates() == [("QBACKEND_CUDA_LIB", lib_dirs_env)]
        assert native.library_path() == lib_dirs_env
    finally:
        del os.environ["QBACKEND_CUDA_LIB"]


def test_default_destination_is_the_cache_when_the_package_is_read_only(lib_dirs, clean_env):
    assert cuda_build.default_dest() == lib_dirs[0]
    clean_env.setattr(cuda_build.os, "access", lambda path, mode: False)
    assert cuda_build.default_dest() == lib_dirs[1]


def test_info_says_what_to_run_without_the_library(clean_env):
    env = dict(os.environ, QBACKEND_CUDA_LIB="/nonexistent/libqbackend_cuda.so")
    out = subprocess.run([sys.executable, "-m", "qbackend", "info"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert "QBACKEND_CUDA_LIB=/nonexistent/libqbackend_cuda.so: no such file" in out
    assert "    to build it: qbackend build" in out and "pip install 'qbackend[cuda]'" in out


# --- an up-to-date build is recognised ----------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_dry_run_counts_objects_and_an_up_to_date_build_has_none(tmp_path):
    (tmp_path / "a.cu").write_text("")
    (tmp_path / "b.cu").write_text("")
    (tmp_path / "build.ninja").write_text(
        "rule cc\n  command = touch $out\n  description = Building CUDA object $out\n"
        "build a.o: cc a.cu\nbuild b.o: cc b.cu\n")
    assert sorted(cuda_build.pending_objects(tmp_path)) == ["a.o", "b.o"]
    subprocess.run(["ninja", "-C", str(tmp_path)], check=True, capture_output=True)
    assert cuda_build.pending_objects(tmp_path) == []
    assert set(cuda_build._last_durations(tmp_path)) == {"a.o", "b.o"}
    os.utime(tmp_path / "b.cu", (2e9, 2e9))   # one changed source: one object
    assert cuda_build.pending_objects(tmp_path) == ["b.o"]


def test_estimate_schedules_the_longest_objects_first():
    assert cuda_build.estimate_seconds([60.0], 2) == 60.0
    assert cuda_build.estimate_seconds([60.0, 30.0, 30.0], 2) == 60.0
    assert cuda_build.estimate_seconds([10.0] * 4, 2) == 20.0


# --- what `qbackend build` refuses ----------------------------------------------------------------------------

def run_build(capsys, *args) -> tuple:
    rc = cli.main(["build", *args])
    return rc, capsys.readouterr().err


def test_build_without_a_gpu_asks_for_archs(clean_env, capsys):
    gpus(clean_env)
    rc, err = run_build(capsys)
    assert rc == 2 and "no NVIDIA GPU is visible here" in err and "--archs all" in err


def test_build_refuses_an_unknown_arch(clean_env, capsys):
    rc, err = run_build(capsys, "--archs", "sm_100")
    assert rc == 2 and "unknown CUDA arch 'sm_100'" in err


def test_build_without_nvcc_says_so(clean_env, capsys):
    clean_env.setattr(cuda_build, "nvcc", lambda: None)
    clean_env.setattr(cuda_build.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    rc, err = run_build(capsys, "--archs", "75")
    assert rc == 2 and "nvcc not found" in err


def test_missing_cutlass_names_the_package_to_install(clean_env, tmp_path):
    clean_env.setitem(sys.modules, "cutlass_library", None)   # import fails
    with pytest.raises(cuda_build.BuildError, match=r"pip install 'nvidia-cutlass==4\.2\.0\.0'.*qbackend\[cuda\]"):
        cuda_build.cutlass_dir(tmp_path)
    clean_env.setenv("QBACKEND_CUTLASS_DIR", str(tmp_path))
    with pytest.raises(cuda_build.BuildError, match="QBACKEND_CUTLASS_DIR=.*no include/cutlass/cutlass.h"):
        cuda_build.cutlass_dir(tmp_path)


def test_an_earlier_cutlass_copy_serves_without_the_package(clean_env, tmp_path):
    clean_env.setitem(sys.modules, "cutlass_library", None)
    header = tmp_path / "cutlass" / "4.2.0.0" / "include" / "cutlass" / "cutlass.h"
    header.parent.mkdir(parents=True)
    header.write_text("")
    assert cuda_build.cutlass_dir(tmp_path) == tmp_path / "cutlass" / "4.2.0.0"


# --- the wheel ------------------------------------------------------------------------------------------------

WHEELS = sorted((ROOT / "dist").glob("qbackend-*.whl"))


@pytest.mark.skipif(not WHEELS, reason="no wheel in dist/ (nox -s wheel)")
def test_the_wheel_holds_the_library_and_the_sources_under_a_torch_free_tag():
    wheel = WHEELS[-1]
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith("qbackend_providers/_lib/libqbackend_cuda.so") for n in names)
    assert any(n.endswith("qbackend_providers/csrc_cuda/CMakeLists.txt") for n in names)
    assert any(n.endswith("qbackend_providers/cuda_build.py") for n in names)
