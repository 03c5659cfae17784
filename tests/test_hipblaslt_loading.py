"""Finding libhipblaslt, reading its version and the ROCm version, choosing (or refusing) the enum
values, what `qbackend info` says on AMD, and selection for simulated ROCm releases. Against
copies of the stand-in library (tests/hipblaslt_standin) installed in fake ROCm trees."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import qbackend
from hipblaslt_standin import StandIn, build, install
from qbackend import cli, probe, registry
from qbackend.probe import DeviceInfo
from qbackend.problem import PROBLEM_KINDS, representative
from qbackend_providers import hipblaslt as hb
from qbackend_providers import hipblaslt_lib as hl

FZ4 = torch.float8_e4m3fnuz


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("standin"))


@pytest.fixture
def clean_env(monkeypatch):
    """No hipBLASLt location from the machine, and the process-wide library searched afresh."""
    for var in (hl.ENV_LIB, "ROCM_PATH"):
        monkeypatch.delenv(var, raising=False)
    hl.reset()
    yield monkeypatch
    hl.reset()


def run_info(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("QBACKEND_SIMULATE", hl.ENV_LIB)}
    return subprocess.run([sys.executable, "-m", "qbackend", "info", *args], env=env, capture_output=True,
                          text=True, check=True).stdout


def mi300(arch="gfx942"):
    return DeviceInfo(backend="hip", index=0, name="AMD Instinct MI300X", arch=arch,
                      fp8_dtypes=probe.native_fp8(arch), probe="amdsmi")


def kind(name):
    return representative(name, FZ4)


# --- versions ---------------------------------------------------------------------------------

def test_version_from_the_file_name(built, tmp_path):
    path = install(built, tmp_path / "rocm", rocm="6.4.3", file_version="0.12.60403")
    lib = hl.HipBlasLt.open(str(path))
    assert lib.reason is None
    assert lib.version == (0, 12) and lib.version_source == "the file name libhipblaslt.so.0.12.60403"
    assert lib.rocm_version == (6, 4, 3) and lib.rocm_source == str(tmp_path / "rocm" / ".info" / "version")
    assert lib.release.scale_vec_ext == (102, 103) and lib.release.scale_mode is None


@pytest.mark.parametrize("rocm,version,rowwise", [
    ("6.2.4", (0, 8), None), ("6.3.1", (0, 10), "scale_vec_ext"), ("7.0.2", (1, 0), "scale_mode"),
    ("7.2.1", (1, 2), "scale_mode")])
def test_version_from_the_rocm_release_when_the_file_name_has_none(built, tmp_path, rocm, version, rowwise):
    lib = hl.HipBlasLt.open(str(install(built, tmp_path / "rocm", rocm=rocm)))
    assert lib.reason is None and lib.version == version
    assert lib.version_source == f"ROCm {rocm} ({tmp_path / 'rocm' / '.info' / 'version'})"
    assert (lib.release.scale_vec_ext is not None, lib.release.scale_mode is not None) == \
        (rowwise == "scale_vec_ext", rowwise == "scale_mode")


def test_an_unknown_version_is_refused_naming_it_and_the_known_ones(built, tmp_path):
    newer = hl.HipBlasLt.open(str(install(built, tmp_path / "a", rocm="7.5.0", file_version="1.7.70500")))
    assert newer.reason == ("hipBLASLt 1.7 (from the file name libhipblaslt.so.1.7.70500) is not a version qbackend "
                            "knows the enum values of; it knows hipBLASLt 0.6-0.8 (ROCm 6.0-6.2), hipBLASLt 0.10-0.12 "
                            "(ROCm 6.3-6.4), hipBLASLt 1.0-1.4 (ROCm 7.0-7.2 and the develop headers)")
    unnamed = hl.HipBlasLt.open(str(install(built, tmp_path / "b", rocm="10.1.0")))
    assert unnamed.reason.startswith(f"cannot tell which hipBLASLt {tmp_path / 'b' / 'lib' / 'libhipblaslt.so'} is: "
                                     "its file name carries no version and ROCm 10.1.0 (")
    bare = hl.HipBlasLt.open(str(install(built, tmp_path / "c", rocm=None)))
    assert "no ROCm version file was found" in bare.reason
    verdict = hb.HipBlasLtProvider(newer).runtime_verdict(mi300(), kind("fp8_w8a8_per_tensor"))
    assert not verdict.ok and verdict.reason == newer.reason


# --- finding the library --------------------------------------------------------------------------

def test_the_environment_variable_is_the_only_place_looked_at(built, tmp_path, clean_env):
    clean_env.setenv("ROCM_PATH", str(install(built, tmp_path / "rocm").parent.parent))
    clean_env.setenv(hl.ENV_LIB, str(tmp_path / "nowhere" / "libhipblaslt.so"))
    lib = hl.load()
    assert lib.lib is None and lib.found_in == hl.ENV_LIB
    assert lib.reason == f"hipBLASLt not loaded: OSError: {tmp_path / 'nowhere' / 'libhipblaslt.so'}: no such file"


def test_rocm_path_is_searched(built, tmp_path, clean_env):
    path = install(built, tmp_path / "rocm", rocm="7.0.2", file_version="1.0.70002")
    clean_env.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    lib = hl.load()
    assert lib.found_in == "ROCM_PATH" and lib.path == str(path) and lib.version == (1, 0)
    assert hl.load() is lib                      # found once per process


def test_not_found_names_where_it_looked(clean_env, monkeypatch):
    monkeypatch.setattr(hl.ctypes.util, "find_library", lambda name: None)
    clean_env.setenv("ROCM_PATH", "/nonexistent/rocm")
    reason = hl.load().reason
    assert reason.startswith("hipBLASLt not loaded: libhipblaslt.so not found (looked for "
                             "/nonexistent/rocm/lib/libhipblaslt.so, /opt/rocm/lib/libhipblaslt.so)")
    assert reason.endswith(f"set {hl.ENV_LIB} or ROCM_PATH")


# --- verdicts on a real (not simulated) AMD device ---------------------------------------------

@pytest.mark.parametrize("rocm,file_version,arch,problem,reason", [
    ("6.2.4", "0.8.60204", "gfx942", "fp8_w8a8_per_tensor", None),
    ("6.2.4", "0.8.60204", "gfx942", "fp8_w8a8_per_token_channel",
     "per-token / per-channel scales need hipBLASLt 0.10+ (ROCm 6.3+); found hipBLASLt 0.8 (ROCm 6.2.4)"),
    ("6.3.1", "0.10.60301", "gfx942", "fp8_w8a8_per_token_channel", None),
    ("6.4.3", "0.12.60403", "gfx950", "fp8_w8a8_per_tensor",
     "gfx950 needs hipBLASLt 1.0+ (ROCm 7.0+); found hipBLASLt 0.12 (ROCm 6.4.3)"),
    ("7.0.2", "1.0.70002", "gfx950", "fp8_w8a8_per_token_channel", None),
])
def test_runtime_verdict_by_installed_version(built, tmp_path, rocm, file_version, arch, problem, reason):
    lib = hl.HipBlasLt.open(str(install(built, tmp_path / "rocm", rocm=rocm, file_version=file_version)))
    device = mi300(arch)
    verdict = hb.HipBlasLtProvider(lib).supports(device, representative(problem, device.fp8_dtypes[0]))
    assert (verdict.ok, None if verdict.ok else verdict.reason) == (reason is None, reason)


def test_info_on_an_amd_machine_shows_the_versions_and_why(built, tmp_path, clean_env, monkeypatch):
    """`qbackend info` on an MI300 with ROCm 6.2: the ROCm and hipBLASLt versions, the enum values
    used, and why hipblaslt does not serve per-token x per-channel scales there."""
    clean_env.setenv(hl.ENV_LIB, str(install(built, tmp_path / "rocm", rocm="6.2.4", file_version="0.8.60204")))
    monkeypatch.setattr(probe, "device_info", lambda device=None: mi300())
    monkeypatch.setattr(qbackend, "device_info", lambda device=None: mi300())
    registry.reload()
    report = cli.info_report()
    entry = next(lib for lib in report["native_libraries"] if lib["name"] == "libhipblaslt")
    assert entry["loaded"] and entry["error"] is None and entry["found_in"] == hl.ENV_LIB
    assert entry["details"] == [
        f"ROCm: 6.2.4 ({tmp_path / 'rocm' / '.info' / 'version'})",
        "hipBLASLt: 0.8 (from the file name libhipblaslt.so.0.8.60204)",
        "enum values: hipBLASLt 0.6-0.8 (ROCm 6.0-6.2)",
        "per-row / per-column scales: no (hipBLASLt 0.10+, ROCm 6.3+, has them)"]
    assert report["selection"]["fp8_w8a8_per_tensor"] == "hipblaslt"
    assert report["selection"]["fp8_w8a8_per_token_channel"] == "torch"
    assert report["selection_reasons"]["fp8_w8a8_per_token_channel"]["hipblaslt"] == (
        "per-token / per-channel scales need hipBLASLt 0.10+ (ROCm 6.3+); found hipBLASLt 0.8 (ROCm 6.2.4)")


def test_info_without_hipblaslt_says_what_to_do(clean_env, monkeypatch):
    monkeypatch.setattr(hl.ctypes.util, "find_library", lambda name: None)
    clean_env.setenv("ROCM_PATH", "/nonexistent/rocm")
    monkeypatch.setattr(probe, "device_info", lambda device=None: mi300())
    monkeypatch.setattr(qbackend, "device_info", lambda device=None: mi300())
    registry.reload()
    report = cli.info_report()
    hip = next(p for p in report["providers"] if p["name"] == "hipblaslt")
    assert not hip["available"] and "libhipblaslt.so not found" in hip["reason"] and hl.ENV_LIB in hip["reason"]


def test_the_hipblaslt_entry_is_listed_on_amd_only(monkeypatch):
    monkeypatch.setenv("QBACKEND_SIMULATE", "sm_90")
    monkeypatch.setattr(torch.version, "hip", None)
    assert hb.qbackend_native_libraries() == []


# --- simulated ROCm releases ----------------------------------------------------------------

@pytest.mark.parametrize("arch,per_tensor,per_token_channel,reason", [
    ("gfx942", "hipblaslt", "hipblaslt", None),
    ("gfx942:rocm6.3", "hipblaslt", "hipblaslt", None),
    ("gfx942:rocm6.2", "hipblaslt", "torch", "per-token / per-channel scales need hipBLASLt 0.10+ (ROCm 6.3+); "
                                             "found simulated ROCm 6.2 (hipBLASLt 0.8)"),
    ("gfx950", "hipblaslt", "hipblaslt", None),
    ("gfx950:rocm7.0", "hipblaslt", "hipblaslt", None),
    ("gfx950:rocm6.4", "torch", "torch", "gfx950 needs hipBLASLt 1.0+ (ROCm 7.0+); found simulated ROCm 6.4 "
                                         "(hipBLASLt 0.12)"),
    ("gfx942:rocm10.1", "torch", "torch", "simulated ROCm 10.1: not a release qbackend knows the hipBLASLt of "
                                          "(known: ROCm 6.0, 6.1, 6.2, 6.3, 6.4, 7.0, 7.1, 7.2)"),
])
def test_selection_for_a_simulated_rocm_release(arch, per_tensor, per_token_channel, reason):
    device = probe.simulated(arch)
    assert qbackend.select("fp8_w8a8_per_tensor", device).name == per_tensor
    decision = qbackend.select("fp8_w8a8_per_token_channel", device)
    assert decision.name == per_token_channel
    if reason:
        assert dict(decision.verdicts)["hipblaslt"].reason == reason


def test_decisions_are_kept_apart_per_simulated_release():
    """The decision cache is keyed by the device record, which includes a simulated ROCm release."""
    kinds = [qbackend.select("fp8_w8a8_per_token_channel", probe.simulated(a)).name
             for a in ("gfx942:rocm6.2", "gfx942", "gfx942:rocm6.2")]
    assert kinds == ["torch", "hipblaslt", "torch"]


def test_info_flag_takes_a_rocm_release():
    r = json.loads(run_info("--json", "--simulate", "gfx942:rocm6.2"))
    assert r["device"]["name"] == "MI300X (simulated, ROCm 6.2)" and r["device"]["runtime_version"] == "6.2"
    assert r["selection"] == dict(zip(PROBLEM_KINDS, ["hipblaslt", "torch", "torch", "torch", "torch"]))
    entry = next(lib for lib in r["native_libraries"] if lib["name"] == "libhipblaslt")
    assert entry["details"][-1] == ("simulated: ROCm 6.2, hipBLASLt 0.8, enum values of hipBLASLt 0.6-0.8 "
                                    "(ROCm 6.0-6.2); per-row / per-column scales: no (hipBLASLt 0.10+, ROCm 6.3+, "
                                    "has them)")


@pytest.mark.parametrize("text,message", [
    ("gfx942:rocm", "a simulated ROCm release is written as a suffix like gfx942:rocm6.2"),
    ("gfx942:rocm6.2:xnack-", "a simulated ROCm release is written as a suffix like gfx942:rocm6.2"),
    ("sm_90:rocm6.2", "only AMD archs (gfx...) take a ROCm release"),
])
def test_a_malformed_rocm_release_is_an_error(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        probe.simulated(text)


def test_standin_reports_the_version_it_pretends(built, tmp_path):
    """The check at the first handle reads hipblasLtGetVersion: the stand-in encodes its version
    the way hipBLASLt does (major * 100000 + minor * 100 + patch)."""
    lib = hl.HipBlasLt.open(str(install(built, tmp_path / "rocm", rocm="7.2.1", file_version="1.2.70201")))
    StandIn(lib.lib).pretend((1, 2, 2))
    handle = hl.ctypes.c_void_p()
    assert lib.lib.hipblasLtCreate(hl.ctypes.byref(handle)) == 0
    assert lib.confirm(handle) is None and lib.reported_version == (1, 2, 2)
    assert lib.git_revision == "standin-100202"


def test_a_reported_version_of_the_same_release_is_accepted(built, tmp_path):
    """Enum values are chosen per release: a library named 0.10 that reports 0.12.1 (the same
    values, ROCm 6.3-6.4) is used; one that reports 1.0 is not (checked in test_hipblaslt_standin)."""
    lib = hl.HipBlasLt.open(str(install(built, tmp_path / "rocm", rocm="6.3.1", file_version="0.10.60301")))
    StandIn(lib.lib).pretend((0, 12, 1))
    handle = hl.ctypes.c_void_p()
    assert lib.lib.hipblasLtCreate(hl.ctypes.byref(handle)) == 0
    assert lib.confirm(handle) is None and lib.reported_version == (0, 12, 1)
    StandIn(lib.lib).pretend((1, 0, 0))
    assert "hipblasLtGetVersion reports 1.0.0" in lib.confirm(handle)


def test_the_fallback_warning_says_how_to_get_hipblaslt(clean_env, monkeypatch):
    from qbackend import fallback
    from qbackend.problem import Verdict

    monkeypatch.setattr(hl.ctypes.util, "find_library", lambda name: None)
    clean_env.setenv("ROCM_PATH", "/nonexistent/rocm")
    hints = fallback.fast_path_hints([("hipblaslt", Verdict(False, hl.load().reason))])
    assert hints == ["hipblaslt: install ROCm's hipBLASLt (libhipblaslt.so), or point QBACKEND_HIPBLASLT_LIB or "
                     "ROCM_PATH at it"]
