"""`qbackend info`, the capability probe and its simulation override, import cost."""
import json
import os
import subprocess
import sys

import pytest
import torch

import qbackend
from qbackend import probe


def run_info(*args, env=None):
    full_env = dict(os.environ)
    full_env.pop("QBACKEND_SIMULATE", None)
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-m", "qbackend", "info", *args], env=full_env,
                          capture_output=True, text=True, check=True)
    return done.stdout


def test_info_json_on_this_machine():
    r = json.loads(run_info("--json"))
    for key in ("device", "providers", "selection", "native_libraries", "plugin_errors"):
        assert key in r
    if not torch.cuda.is_available():
        assert r["device"]["backend"] == "cpu" and r["device"]["arch"] == "cpu"
        assert set(r["selection"].values()) == {"reference"}
    assert list(r["selection"]) == list(qbackend.PROBLEM_KINDS)
    for p in r["providers"]:
        assert set(p) >= {"name", "available", "reason", "source"}
        assert isinstance(p["available"], bool) and p["reason"]
    assert not r["plugin_errors"], r["plugin_errors"]  # built-ins load cleanly


@pytest.mark.parametrize("arch,kind,provider", [
    ("sm_90", "fp8_w8a8_per_token_channel", "cutlass"),
    ("sm_80", "fp8_w8a16", "marlin"),
    ("sm_80", "int8_w8a8", "cutlass"),
    ("gfx942", "fp8_w8a8_per_tensor", "hipblaslt"),
])
def test_info_simulate_flag_selects(arch, kind, provider):
    r = json.loads(run_info("--json", "--simulate", arch))
    assert r["device"]["simulated"] and r["device"]["arch"] == arch
    assert r["selection"][kind] == provider


@pytest.mark.parametrize("arch,available,reason", [
    ("gfx942", True, "serves quantize (no GEMM kind)"),
    ("sm_90", False, "runs on hip, not cuda"),
])
def test_info_reports_a_quantize_only_provider_by_its_quantize_rules(arch, available, reason):
    """The rocm provider only quantizes: `info` says so where it serves, and why not elsewhere,
    rather than that it lacks scaled_mm."""
    r = json.loads(run_info("--json", "--simulate", arch))
    rocm = next(p for p in r["providers"] if p["name"] == "rocm")
    assert (rocm["available"], rocm["reason"]) == (available, reason)


def test_info_simulate_gfx942_lists_fnuz():
    r = json.loads(run_info("--json", "--simulate", "gfx942"))
    assert "float8_e4m3fnuz" in r["device"]["fp8_dtypes"] and r["device"]["backend"] == "hip"


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_info_simulate_amd_shows_what_the_torch_provider_serves(arch):
    """On AMD, hipBLASLt takes FP8 with per-tensor and per-token x per-channel scales (on the
    newest ROCm qbackend knows); every other kind goes to torch's own ops, and the report names
    the op."""
    r = json.loads(run_info("--json", "--simulate", arch))
    assert r["selection"] == {"fp8_w8a8_per_tensor": "hipblaslt", "fp8_w8a8_per_token_channel": "hipblaslt",
                              "fp8_w8a16": "torch", "int8_w8a8": "torch", "fp8_block": "torch"}
    paths = r["selection_paths"]
    assert paths["int8_w8a8"].startswith("torch._int_mm")
    assert paths["fp8_w8a16"] == paths["fp8_block"] == "operands dequantized to bfloat16, one bfloat16 GEMM"
    torch_line = next(p for p in r["providers"] if p["name"] == "torch")
    assert torch_line["available"] and torch_line["reason"] == "serves fp8_w8a16, int8_w8a8, fp8_block"
    if arch == "gfx942":  # where hipBLASLt has no vector scales (ROCm 6.2), torch's rowwise form serves
        rowwise = json.loads(run_info("--json", "--simulate", "gfx942:rocm6.2"))["selection_paths"]
        assert rowwise["fp8_w8a8_per_token_channel"] == ("torch._scaled_mm with per-row and per-column "
                                                        "scales, use_fast_accum=True")
    text = run_info("--simulate", arch)
    assert "fp8_block                    -> torch  (operands dequantized to bfloat16" in text


def test_info_simulate_environment_variable_matches_flag():
    by_env = json.loads(run_info("--json", env={"QBACKEND_SIMULATE": "sm_89"}))
    by_flag = json.loads(run_info("--json", "--simulate", "sm_89"))
    assert by_env["selection"] == by_flag["selection"]
    assert by_env["selection"]["fp8_w8a8_per_tensor"] == "cutlass"


def test_info_human_readable():
    text = run_info("--simulate", "sm_90")
    assert "arch sm_90" in text and "[simulated]" in text
    assert "fp8_w8a8_per_token_channel" in text and "-> cutlass" in text
    assert "native libraries:" in text and "counts as built for sm_90" in text


@pytest.mark.parametrize("arch", ["sm_99", "gfx1100", "sm_87"])
def test_simulating_an_arch_qbackend_does_not_know_is_an_error(arch):
    """Only the named archs, and NVIDIA archs newer than all of them, can be simulated: a typo or an
    arch whose rules nobody wrote is refused with the list."""
    done = subprocess.run([sys.executable, "-m", "qbackend", "info", "--simulate", arch],
                          capture_output=True, text=True)
    assert done.returncode == 2 and f"unknown arch '{arch}'" in done.stderr
    assert "sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, gfx942, gfx950, cpu" in done.stderr


def test_simulating_a_newer_nvidia_arch_says_how_it_is_answered():
    r = json.loads(run_info("--json", "--simulate", "sm_120"))
    assert r["device"]["arch"] == "sm_120" and r["selection"]["fp8_w8a8_per_tensor"] == "cutlass"
    assert any("newer than the archs qbackend knows" in n for n in r["device"]["notes"])
    assert "probe note: sm_120 is newer than the archs qbackend knows" in run_info("--simulate", "sm_120")


def test_a_cuda_lib_path_that_does_not_exist_is_named():
    r = json.loads(run_info("--json", env={"QBACKEND_CUDA_LIB": "/nonexistent/libqbackend_cuda.so"}))
    lib = next(lib for lib in r["native_libraries"] if lib["name"] == "libqbackend_cuda")
    assert not lib["loaded"] and "QBACKEND_CUDA_LIB=/nonexistent/libqbackend_cuda.so: no such file" in lib["error"]


def test_unknown_simulated_arch_is_a_clear_error():
    done = subprocess.run([sys.executable, "-m", "qbackend", "info", "--simulate", "tpu"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unknown arch 'tpu'" in done.stderr


def test_normalize_arch_and_native_fp8():
    assert probe.normalize_arch("SM90a") == "sm_90" and probe.normalize_arch("89") == "sm_89"
    assert probe.normalize_arch("gfx942:sramecc+:xnack-") == "gfx942"
    assert probe.native_fp8("sm_86") == () and torch.float8_e5m2 in probe.native_fp8("sm_100")
    assert probe.native_fp8("gfx942")[0] == torch.float8_e4m3fnuz
    assert probe.native_fp8("gfx950")[0] == torch.float8_e4m3fn


def test_probe_records_which_probe_answered():
    info = qbackend.device_info()
    assert info.probe in ("nvml", "cuda-python", "torch", "amdsmi", "hip-python", "cpu")
    if info.backend == "cpu":
        assert any(n.startswith("nvml") for n in info.notes)  # NVML was asked first
    assert qbackend.device_info("cpu").arch == "cpu"


def test_probe_does_not_initialize_cuda():
    code = ("import torch, qbackend, json; i = qbackend.device_info(); "
            "print(json.dumps([i.arch, i.probe, torch.cuda.is_initialized()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    arch, probe_name, initialized = json.loads(out.stdout)
    assert initialized is False


def test_import_cost_over_torch():
    """`import qbackend` adds well under a second to `import torch`. Timed inside one process after
    torch is loaded (fastest of three fresh interpreters), not as the difference of two totals whose
    noise on a busy machine is as large as the bound."""
    code = "import time, torch; t = time.perf_counter(); import qbackend; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(3)]
    assert min(runs) < 0.5, runs


def test_fnuz_reencoding_is_exact():
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    q = bits.view(torch.float8_e4m3fn)
    qz, s2 = qbackend.to_fnuz(q, torch.tensor(1.0))
    assert s2.item() == 2.0
    fn_vals, fz_vals = q.float(), qz.float() * 2
    finite = ~torch.isnan(fn_vals)
    assert torch.equal(fn_vals[finite], fz_vals[finite])  # -0 -> +0 compares equal
    assert qz.view(torch.uint8)[0x80].item() == 0 and torch.isnan(qz.float()[0x7F])
    assert not torch.isnan(qz.float()[finite]).any()


class FakeNvml:
    """Stands in for pynvml: two GPUs, an H100 (sm_90) and an L40S (sm_89)."""
    GPUS = [("NVIDIA H100 80GB HBM3", (9, 0), 16896, 80 * 2**30), ("NVIDIA L40S", (8, 9), 18176, 48 * 2**30)]

    class Memory:
        def __init__(self, total):
            self.total = total

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.GPUS)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.GPUS[h][0]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.GPUS[h][1]

    def nvmlDeviceGetNumGpuCores(self, h):
        return self.GPUS[h][2]

    def nvmlDeviceGetMemoryInfo(self, h):
        return self.Memory(self.GPUS[h][3])

    def nvmlSystemGetDriverVersion(self):
        return "580.1"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000


def test_nvml_probe_reads_each_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    h100 = probe._probe_nvml(0)
    l40s = probe._probe_nvml(1)
    assert (h100.arch, h100.multiprocessors, h100.probe) == ("sm_90", 132, "nvml")
    assert (l40s.arch, l40s.multiprocessors) == ("sm_89", 142)
    assert torch.float8_e4m3fn in l40s.fp8_dtypes and "CUDA 13.0" in h100.driver_version
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in h100.notes)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert probe._probe_nvml(0).notes == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert probe._probe_nvml(0).arch == "sm_89"  # CUDA device 0 is physical GPU 1
    with pytest.raises(LookupError, match="not visible"):
        probe._probe_nvml(1)


def test_info_all_devices_gives_each_gpu_its_own_selection(monkeypatch, capsys):
    """A host with an H100 and an A100 (probes faked, counted as having the native library): each GPU
    is listed with the selection made for its own arch, as the registry makes it for tensors there."""
    from dataclasses import replace

    from qbackend.cli import info_report, main

    archs = {0: "sm_90", 1: "sm_80"}
    monkeypatch.setattr(probe, "probe_gpu", lambda index=0: replace(probe.simulated(archs[index]), index=index)
                        if index in archs else None)
    probe.reset()
    try:
        report = info_report(all_devices=True)
        gpus = report["all_devices"]
        assert [(d["device"], d["arch"]) for d in gpus] == [("cuda:0", "sm_90"), ("cuda:1", "sm_80")]
        for d in gpus:
            table = qbackend.selection_table(probe.device_info(d["device"]))
            assert d["selection"] == {kind: name for kind, (name, _) in table.items()}
        assert gpus[0]["selection"]["fp8_w8a8_per_token_channel"] == "cutlass"
        assert gpus[1]["selection"]["fp8_w8a16"] == "marlin"
        assert main(["info", "--all-devices"]) == 0
        out = capsys.readouterr().out
        assert "every visible GPU:" in out and "  cuda:1: " in out and "arch sm_80" in out
        assert main(["info", "--all-devices", "--simulate", "sm_90"]) == 2
        assert "does not combine with --simulate" in capsys.readouterr().err
    finally:
        probe.reset()
