"""The rocm provider, its loader and its build, on the CPU: which quantize problems go to it on AMD
devices (simulated) and why others do not, what it says when its library is missing or built for
another target, and what `pip install` / `qbackend build --rocm` do with and without hipcc. The
kernels themselves are checked by tests/test_rocm_hip_cpu.py and tests/test_rocm_code_object.py."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import qbackend
from qbackend import cli, probe, registry
from qbackend import dtypes as qd
from qbackend.problem import Granularity as G
from qbackend.problem import Op, Problem
from qbackend_providers import rocm_build, rocm_native
from qbackend_providers.rocm_quantize import RocmQuantizeProvider

ROOT = Path(__file__).resolve().parent.parent


def quantize_problem(x_dtype, q_dtype, granularity, static=False, contiguous=True, scale_ub=False) -> Problem:
    return Problem(Op.QUANTIZE, x_dtype, q_dtype, None, G(granularity), G.NONE, False, 16,
                   16 if contiguous else 1, static, scale_ub)


@pytest.fixture
def fresh_registry():
    registry.reload()
    yield
    registry.reload()


# --- selection --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("q_dtype", [qd.E4M3_FNUZ, qd.E5M2_FNUZ, qd.E4M3, qd.E5M2, torch.int8])
def test_amd_quantize_goes_to_rocm(fresh_registry, arch, q_dtype):
    device = probe.simulated(arch)
    for x_dtype in (torch.bfloat16, torch.float16, torch.float32):
        for granularity, static in (("tensor", False), ("tensor", True), ("token", False), ("group", False)):
            decision = qbackend.select(quantize_problem(x_dtype, q_dtype, granularity, static), device)
            assert decision.name == "rocm", (arch, x_dtype, granularity, static, decision.verdicts)


def test_what_rocm_leaves_to_others(fresh_registry):
    gfx942 = probe.simulated("gfx942")
    cases = [
        (quantize_problem(torch.bfloat16, qd.E4M3_FNUZ, "channel"), "granularity channel not supported"),
        (quantize_problem(torch.bfloat16, qd.E4M3_FNUZ, "block"), "granularity block not supported"),
        (quantize_problem(torch.bfloat16, qd.E4M3_FNUZ, "token", static=True), "static quantization not supported"),
        (quantize_problem(torch.bfloat16, qd.E4M3_FNUZ, "token", contiguous=False),
         "needs the last dimension contiguous"),
    ]
    for problem, why in cases:
        decision = qbackend.select(problem, gfx942)
        assert decision.name != "rocm" and why in dict(decision.verdicts)["rocm"].reason, decision.verdicts
    for arch, why in (("sm_90", "runs on hip, not cuda"), ("cpu", "runs on hip, not cpu")):
        decision = qbackend.select(quantize_problem(torch.bfloat16, qd.E4M3, "token"), probe.simulated(arch))
        assert why in dict(decision.verdicts)["rocm"].reason
    # An AMD arch the kernels are not written for: the rule names the ones they are.
    mi200 = replace(gfx942, arch="gfx90a")
    verdict = RocmQuantizeProvider().supports(mi200, quantize_problem(torch.bfloat16, qd.E4M3_FNUZ, "token"))
    assert not verdict.ok and "gfx942, gfx950" in verdict.reason and "gfx90a" in verdict.reason


def test_a_real_device_needs_the_library_built_for_it(monkeypatch):
    device = replace(probe.simulated("gfx950"), simulated=False)
    problem = quantize_problem(torch.bfloat16, qd.E4M3, "token")
    provider = RocmQuantizeProvider()
    monkeypatch.setattr(rocm_native, "_tried", True)
    monkeypatch.setattr(rocm_native, "_loaded", None)
    monkeypatch.setattr(rocm_native, "_load_error", "OSError: not found: /x/libqbackend_rocm.so")
    verdict = provider.supports(device, problem)
    assert not verdict.ok
    assert verdict.reason == "native library not available: OSError: not found: /x/libqbackend_rocm.so"

    class Gfx942Only:
        archs = ("gfx942",)

    monkeypatch.setattr(rocm_native, "_loaded", Gfx942Only())
    verdict = provider.supports(device, problem)
    assert not verdict.ok and "built for gfx942, not gfx950" in verdict.reason
    assert "qbackend build --rocm --archs gfx950" in verdict.reason
    assert provider.supports(replace(device, arch="gfx942"), problem).ok


# --- the loader -----------------------------------------------------------------------------------------------

@pytest.fixture
def unloaded(monkeypatch):
    for name, value in (("_tried", False), ("_loaded", None), ("_load_error", None)):
        monkeypatch.setattr(rocm_native, name, value)
    monkeypatch.delenv("QBACKEND_ROCM_LIB", raising=False)
    return monkeypatch


def test_loader_searches_the_package_then_the_cache(unloaded):
    where = [w for w, _ in rocm_native.library_candidates()]
    assert where == ["package", "cache"]
    paths = [p for _, p in rocm_native.library_candidates()]
    assert paths[0].endswith("_lib/libqbackend_rocm.so")
    assert paths[1].endswith(".cache/qbackend/lib/libqbackend_rocm.so")


def test_qbackend_rocm_lib_is_the_only_candidate(unloaded, tmp_path):
    missing = tmp_path / "nowhere.so"
    unloaded.setenv("QBACKEND_ROCM_LIB", str(missing))
    assert rocm_native.library_candidates() == [("QBACKEND_ROCM_LIB", str(missing))]
    assert rocm_native.load() is None
    assert rocm_native.load_error() == f"OSError: QBACKEND_ROCM_LIB={missing}: no such file"
    assert rocm_native.relevant()  # named, so `qbackend info` lists it
    d = rocm_native.describe()
    assert d["name"] == "libqbackend_rocm" and not d["loaded"] and d["hint"] == rocm_build.BUILD_HINT


def test_info_lists_the_library_only_where_it_matters(unloaded):
    if torch.version.hip or any(os.path.exists(p) for _, p in rocm_native.library_candidates()):
        pytest.skip("this machine has a ROCm torch or a built libqbackend_rocm")
    assert not rocm_native.relevant()
    names = [lib["name"] for lib in cli.info_report()["native_libraries"]]
    assert "libqbackend_rocm" not in names


# --- the build ------------------------------------------------------------------------------------------------

@pytest.fixture
def build_env(monkeypatch):
    for var in ("QBACKEND_BUILD_ROCM", "QBACKEND_ROCM_ARCHS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_arch_lists(build_env):
    assert rocm_build.parse_archs("all") == ["gfx942", "gfx950"]
    assert rocm_build.parse_archs("gfx950;gfx942") == ["gfx942", "gfx950"]
    assert rocm_build.parse_archs(" gfx950, ") == ["gfx950"]
    with pytest.raises(rocm_build.BuildError, match="unknown ROCm arch 'gfx90a'.*gfx942, gfx950"):
        rocm_build.parse_archs("gfx942;gfx90a")
    with pytest.raises(rocm_build.BuildError, match="empty ROCm arch list"):
        rocm_build.parse_archs(";")


def test_what_an_install_builds(build_env):
    build_env.setattr(rocm_build, "hipcc", lambda: None)
    assert rocm_build.install_archs() == (None, "no hipcc on the PATH, in $ROCM_PATH or in /opt/rocm")
    build_env.setenv("QBACKEND_BUILD_ROCM", "1")
    with pytest.raises(rocm_build.BuildError, match="hipcc was not found"):
        rocm_build.install_archs()
    build_env.setenv("QBACKEND_BUILD_ROCM", "0")
    assert rocm_build.install_archs() == (None, "QBACKEND_BUILD_ROCM=0")

    build_env.delenv("QBACKEND_BUILD_ROCM")
    build_env.setattr(rocm_build, "hipcc", lambda: "/opt/rocm/bin/hipcc")
    build_env.setattr(rocm_build, "compiler_knows", lambda compiler, arch: arch == "gfx942")  # ROCm 6.2, say
    assert rocm_build.install_archs()[0] == ["gfx942"]
    build_env.setenv("QBACKEND_ROCM_ARCHS", "gfx950")
    assert rocm_build.install_archs() == (["gfx950"], "QBACKEND_ROCM_ARCHS=gfx950")
    build_env.delenv("QBACKEND_ROCM_ARCHS")
    build_env.setattr(rocm_build, "compiler_knows", lambda compiler, arch: False)  # ROCm 5
    archs, why = rocm_build.install_archs()
    assert archs is None and "knows none of gfx942, gfx950" in why


def test_compiler_knows_asks_the_compiler():
    from rocm_toolchain import device_clang

    clang, version = device_clang()
    if clang is None or version < 17:
        pytest.skip("no clang of LLVM 17 or newer here")
    assert rocm_build.compiler_knows(clang, "gfx942")
    assert rocm_build.compiler_knows(clang, "gfx950") == (version >= 20)
    assert not rocm_build.compiler_knows(clang, "gfx9999")


def fake_hipcc(tmp_path: Path) -> Path:
    """A hipcc that records its arguments and writes the file named after -o."""
    script = tmp_path / "hipcc"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      f"open({str(tmp_path / 'calls')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                      "open(sys.argv[sys.argv.index('-o') + 1], 'w').write('library')\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_build_runs_hipcc_once_per_change(tmp_path, monkeypatch):
    hipcc = fake_hipcc(tmp_path)
    monkeypatch.setattr(rocm_build, "hipcc", lambda: str(hipcc))
    source = tmp_path / "src"
    import shutil

    shutil.copytree(rocm_build.source_dir(), source)
    dest = tmp_path / "lib"
    for _ in range(2):
        target = rocm_build.build(["gfx942", "gfx950"], build_dir=tmp_path / "build", dest=dest, source=source)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 and target == dest / "libqbackend_rocm.so" and target.read_text() == "library"
    args = calls[0].split()
    for flag in (*rocm_build.KERNEL_FLAGS, "--offload-arch=gfx942", "--offload-arch=gfx950",
                 "-DQB_ROCM_ARCHS=gfx942,gfx950", "-shared", f"-Wl,--version-script={source / 'exports.map'}"):
        assert flag in args, flag
    (source / "quantize.hip").write_text((source / "quantize.hip").read_text() + "\n// changed\n")
    rocm_build.build(["gfx942", "gfx950"], build_dir=tmp_path / "build", dest=dest, source=source)
    rocm_build.build(["gfx942"], build_dir=tmp_path / "build", dest=dest, source=source)
    assert len((tmp_path / "calls").read_text().splitlines()) == 3


def test_qbackend_build_rocm_without_hipcc_says_so(build_env, capsys):
    build_env.setattr(rocm_build, "hipcc", lambda: None)
    assert cli.main(["build", "--rocm", "--archs", "gfx942"]) == 2
    assert "hipcc not found" in capsys.readouterr().err
    assert cli.main(["build", "--rocm", "--archs", "gfx1100"]) == 2
    assert "unknown ROCm arch 'gfx1100'" in capsys.readouterr().err


def test_setup_py_reads_the_switches(build_env):
    """pip's view: setup.py's ROCm plan with QBACKEND_BUILD_ROCM=0 and without hipcc on this machine."""
    code = ("import runpy, sys; sys.argv = ['setup.py', '--name']; "
            "m = runpy.run_path('setup.py', run_name='not_main'); print(m['rocm_plan']())")
    env = dict(os.environ, QBACKEND_BUILD_ROCM="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "(None, 'QBACKEND_BUILD_ROCM=0')" in out.stdout, out.stdout + out.stderr


WHEELS = sorted((ROOT / "dist").glob("qbackend-*.whl"))


@pytest.mark.skipif(not WHEELS, reason="no wheel in dist/ (nox -s wheel)")
def test_the_wheel_carries_the_rocm_sources():
    wheel = WHEELS[-1]
    if wheel.stat().st_mtime < (ROOT / "csrc_rocm" / "quantize.hip").stat().st_mtime:
        pytest.skip(f"{wheel.name} predates csrc_rocm (nox -s wheel)")
    names = zipfile.ZipFile(wheel).namelist()
    for f in ("quantize.hip", "quantize_kernels.h", "include/qbackend_rocm.h", "exports.map"):
        assert any(n.endswith(f"qbackend_providers/csrc_rocm/{f}") for n in names), f
