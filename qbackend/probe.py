"""Capability probe: what each device is, without creating a CUDA context.

Order on NVIDIA: NVML (no context, fork-safe), then cuda-python's driver API (cuInit and attribute
queries: no context either), then torch (which may initialize CUDA: last resort). On AMD: amdsmi,
then hip-python, then torch. The first probe that answers fills the record and is named in it.

QBACKEND_SIMULATE=<arch> (or `qbackend info --simulate <arch>`) makes the default device a
simulated one, e.g. sm_89 or gfx942 (gfx942:rocm6.2 for a given ROCm release), to ask "what would
run there" without the hardware. It changes reports and explicit selection queries only; calls on
real tensors always use the tensor's device.
"""
from __future__ import annotations

import os
import platform
import re
import threading
from dataclasses import dataclass, field, replace

import torch

from . import dtypes as qd

SIMULATE_ENV = "QBACKEND_SIMULATE"

# CUDA cores per multiprocessor, by compute-capability major (minor where it differs): turns
# NVML's core count into a multiprocessor count without touching the CUDA runtime.
_CORES_PER_SM = {(7, None): 64, (8, 0): 64, (8, None): 128, (9, None): 128, (10, None): 128,
                 (11, None): 128, (12, None): 128}

# Typical parts, for simulated devices.
_SIMULATED = {
    "sm_75": ("Tesla T4 (simulated)", 40, 16), "sm_80": ("A100 (simulated)", 108, 80),
    "sm_86": ("A10 (simulated)", 72, 24), "sm_89": ("L40S (simulated)", 142, 48),
    "sm_90": ("H100 (simulated)", 132, 80), "sm_100": ("B200 (simulated)", 148, 180),
    "gfx942": ("MI300X (simulated)", 304, 192), "gfx950": ("MI355X (simulated)", 256, 288),
}


@dataclass(frozen=True)
class DeviceInfo:
    backend: str                      # "cuda", "hip" or "cpu"
    index: int | None
    name: str
    arch: str                         # "sm_90", "gfx942", "cpu"
    fp8_dtypes: tuple = ()            # formats the hardware computes natively, preferred first
    multiprocessors: int | None = None
    memory_bytes: int | None = None
    driver_version: str | None = None
    runtime_version: str | None = None
    probe: str = "none"               # which probe answered
    simulated: bool = False
    notes: tuple = field(default=(), compare=False)

    @property
    def key(self) -> tuple:
        # A simulated AMD device's ROCm release changes what its providers answer.
        return (self.backend, self.index, self.arch, self.simulated,
                self.runtime_version if self.simulated else None)

    @property
    def sm(self) -> int | None:
        """Compute capability as an int (90 for sm_90), None off NVIDIA."""
        m = re.fullmatch(r"sm_(\d+)[a-z]?", self.arch)
        return int(m.group(1)) if m else None

    def to_json(self) -> dict:
        return {"backend": self.backend, "index": self.index, "name": self.name, "arch": self.arch,
                "fp8_dtypes": [qd.dtype_name(d) for d in self.fp8_dtypes],
                "multiprocessors": self.multiprocessors, "memory_bytes": self.memory_bytes,
                "driver_version": self.driver_version, "runtime_version": self.runtime_version,
                "probe": self.probe, "simulated": self.simulated, "notes": list(self.notes)}


def native_fp8(arch: str) -> tuple:
    """The fp8 formats an arch's matrix units take, preferred first."""
    m = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    if m:
        return qd.FP8_OCP if int(m.group(1)) >= 89 else ()
    if arch == "gfx942":
        return qd.FP8_FNUZ
    if arch == "gfx950" or arch.startswith("gfx12"):
        return qd.FP8_OCP
    return ()


def normalize_arch(text: str) -> str:
    t = text.strip().lower().replace("-", "_")
    m = re.fullmatch(r"(?:sm_?|compute_?)?(\d)(\d+)a?", t)
    if m:
        return f"sm_{m.group(1)}{m.group(2)}"
    m = re.fullmatch(r"(gfx[0-9a-f]+)(?::.*)?", t)
    if m:
        return m.group(1)
    if t == "cpu":
        return "cpu"
    raise ValueError(f"unknown arch {text!r}: expected e.g. sm_80, sm_90, gfx942, gfx950 or cpu")


KNOWN_ARCHS = tuple(_SIMULATED) + ("cpu",)
_NEWEST_NVIDIA = max(int(a[3:]) for a in _SIMULATED if a.startswith("sm_"))


_ROCM_RELEASE = re.compile(r":rocm(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)


def simulated(arch: str) -> DeviceInfo:
    """A simulated device of an arch qbackend knows (KNOWN_ARCHS), or of an NVIDIA arch newer than
    all of them (answered by the rules' compute-capability ranges, with a note that says so).
    An AMD arch may name the ROCm release to simulate, `gfx942:rocm6.2`: it becomes the record's
    runtime_version (without one, providers answer for the newest release they know)."""
    text, rocm = arch.strip(), None
    if ":rocm" in text.lower():
        m = _ROCM_RELEASE.search(text)
        if m is None or m.end() != len(text):
            raise ValueError(f"{arch!r}: a simulated ROCm release is written as a suffix like gfx942:rocm6.2")
        text, rocm = text[:m.start()], m.group(1)
    arch = normalize_arch(text)
    if rocm is not None and not arch.startswith("gfx"):
        raise ValueError(f"{arch!r}: only AMD archs (gfx...) take a ROCm release (:rocm{rocm})")
    if arch == "cpu":
        return replace(cpu_info(), simulated=True, probe="simulated")
    notes = ()
    if arch not in _SIMULATED:
        sm = int(arch[3:]) if arch.startswith("sm_") else None
        if sm is None or sm <= _NEWEST_NVIDIA:
            raise ValueError(f"unknown arch {arch!r}: qbackend knows {', '.join(KNOWN_ARCHS)}, and NVIDIA "
                             f"archs newer than sm_{_NEWEST_NVIDIA} (answered by the rules' sm ranges)")
        notes = (f"{arch} is newer than the archs qbackend knows: answered by the rules' compute-capability "
                 f"ranges, as an sm_{_NEWEST_NVIDIA}+ device",)
    name, sms, gib = _SIMULATED.get(arch, (f"{arch} (simulated)", None, None))
    if rocm is not None:
        name = f"{name[:-1]}, ROCm {rocm})"
    return DeviceInfo(backend="hip" if arch.startswith("gfx") else "cuda", index=0, name=name,
                      arch=arch, fp8_dtypes=native_fp8(arch), multiprocessors=sms,
                      memory_bytes=gib * 2**30 if gib else None, runtime_version=rocm, probe="simulated",
                      simulated=True, notes=notes)


def cpu_info() -> DeviceInfo:
    return DeviceInfo(backend="cpu", index=None, name=platform.processor() or platform.machine(),
                      arch="cpu", fp8_dtypes=(), multiprocessors=os.cpu_count(), probe="cpu")


def _visible_nvml_index(index: int) -> int | str:
    """Map a CUDA device index to an NVML index or UUID through CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return index
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if index >= len(entries):
        raise LookupError(f"CUDA device {index} is not visible (CUDA_VISIBLE_DEVICES={visible})")
    entry = entries[index]
    return int(entry) if entry.isdigit() else entry


def _probe_nvml(index: int) -> DeviceInfo:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    target = _visible_nvml_index(index)
    handle = (pynvml.nvmlDeviceGetHandleByIndex(target) if isinstance(target, int)
              else pynvml.nvmlDeviceGetHandleByUUID(target))
    name = pynvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    sms = None
    try:
        cores = pynvml.nvmlDeviceGetNumGpuCores(handle)
        per_sm = _CORES_PER_SM.get((major, minor)) or _CORES_PER_SM.get((major, None))
        sms = cores // per_sm if per_sm else None
    except Exception:  # older drivers lack the query
        pass
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    driver = pynvml.nvmlSystemGetDriverVersion()
    driver = driver.decode() if isinstance(driver, bytes) else driver
    cuda = pynvml.nvmlSystemGetCudaDriverVersion()
    arch = f"sm_{major}{minor}"
    info = DeviceInfo("cuda", index, name, arch, native_fp8(arch), sms, int(memory),
                      f"{driver} (CUDA {cuda // 1000}.{cuda % 1000 // 10})",
                      torch.version.cuda, "nvml")
    return replace(info, notes=_order_notes(pynvml))


def _order_notes(pynvml) -> tuple:
    """NVML numbers GPUs in PCI order; CUDA does too only under CUDA_DEVICE_ORDER=PCI_BUS_ID.
    With different GPU models in one host the two numberings can name different chips."""
    if os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return ()
    count = pynvml.nvmlDeviceGetCount()
    models = {pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i))
              for i in range(count)}
    if len(models) > 1:
        return ("GPUs of different compute capabilities: set CUDA_DEVICE_ORDER=PCI_BUS_ID so that "
                "CUDA's device numbers match NVML's",)
    return ()


def _probe_cuda_python(index: int) -> DeviceInfo:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        from cuda import cuda as cu  # cuda-python < 12.6 layout

    def ok(result):
        err, *values = result
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {int(err)}")
        return values[0] if len(values) == 1 else values

    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(index))
    attr = cu.CUdevice_attribute
    major = ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    sms = ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    name = ok(cu.cuDeviceGetName(256, dev)).split(b"\0")[0].decode()
    memory = ok(cu.cuDeviceTotalMem(dev))
    version = ok(cu.cuDriverGetVersion())
    arch = f"sm_{major}{minor}"
    return DeviceInfo("cuda", index, name, arch, native_fp8(arch), int(sms), int(memory),
                      f"CUDA {version // 1000}.{version % 1000 // 10}", torch.version.cuda,
                      "cuda-python")


def _probe_amdsmi(index: int) -> DeviceInfo:
    import amdsmi

    amdsmi.amdsmi_init()
    handle = amdsmi.amdsmi_get_processor_handles()[index]
    asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
    arch = normalize_arch(str(asic.get("target_graphics_version", "")))
    vram = amdsmi.amdsmi_get_gpu_vram_info(handle).get("vram_size")
    driver = amdsmi.amdsmi_get_gpu_driver_info(handle).get("driver_version")
    return DeviceInfo("hip", index, str(asic.get("market_name", arch)), arch, native_fp8(arch),
                      asic.get("num_compute_units"), int(vram) * 2**20 if vram else None,
                      driver, torch.version.hip, "amdsmi")


def _probe_hip_python(index: int) -> DeviceInfo:
    from hip import hip

    err, props = hip.hipGetDeviceProperties(index)
    if int(err) != 0:
        raise RuntimeError(f"hipGetDeviceProperties error {int(err)}")
    raw = props.gcnArchName
    arch = normalize_arch(raw.decode() if isinstance(raw, bytes) else str(raw))
    name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    return DeviceInfo("hip", index, name, arch, native_fp8(arch), props.multiProcessorCount,
                      props.totalGlobalMem, None, torch.version.hip, "hip-python")


def _probe_torch(index: int) -> DeviceInfo:
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise LookupError("torch sees no such GPU")
    props = torch.cuda.get_device_properties(index)  # initializes CUDA: last resort
    if torch.version.hip:
        arch, backend, runtime = normalize_arch(props.gcnArchName), "hip", torch.version.hip
    else:
        arch, backend, runtime = f"sm_{props.major}{props.minor}", "cuda", torch.version.cuda
    return DeviceInfo(backend, index, props.name, arch, native_fp8(arch),
                      props.multi_processor_count, props.total_memory, None, runtime, "torch")


_PROBES = {"cuda": (("nvml", _probe_nvml), ("cuda-python", _probe_cuda_python), ("torch", _probe_torch)),
           "hip": (("amdsmi", _probe_amdsmi), ("hip-python", _probe_hip_python), ("torch", _probe_torch))}


def gpu_backend() -> str:
    """'hip' under a ROCm build of torch (which still calls its devices 'cuda'), else 'cuda'."""
    return "hip" if torch.version.hip else "cuda"


_last_notes: tuple = ()


def probe_gpu(index: int = 0) -> DeviceInfo | None:
    """Probe GPU `index` through each probe in order; None when none finds it."""
    global _last_notes
    notes = []
    for name, probe in _PROBES[gpu_backend()]:
        try:
            info = probe(index)
        except Exception as exc:  # a missing library or driver is an answer, not an error
            notes.append(f"{name}: {type(exc).__name__}: {exc}".strip())
            continue
        return replace(info, notes=tuple(notes) + tuple(info.notes))
    _last_notes = tuple(notes)
    return None


def visible_gpus(limit: int = 64) -> list:
    """(index, DeviceInfo) of every GPU the probes find, from index 0 up to the first they do not."""
    found = []
    for index in range(limit):
        try:
            found.append((index, device_info(f"cuda:{index}")))
        except RuntimeError:  # no probe could identify it: past the last GPU
            break
    return found


_cache: dict = {}   # (device type, index) or None (the default device) -> DeviceInfo: one per device
_cache_lock = threading.RLock()


def device_info(device=None) -> DeviceInfo:
    """The record of a torch device ('cpu', 'cuda:1', torch.device), or of the default device
    (None): the simulated one under QBACKEND_SIMULATE, else GPU 0 if any, else the CPU."""
    if device is None:
        sim = os.environ.get(SIMULATE_ENV)
        if sim:
            return simulated(sim)
        key = None
    else:
        device = torch.device(device)
        key = (device.type, device.index)
    found = _cache.get(key)
    if found is not None:
        return found
    # Probed once per device: threads that ask together wait for the first one's answer.
    with _cache_lock:
        found = _cache.get(key)
        if found is None:
            found = _cache[key] = _probe(device, key)
    return found


def _probe(device, key) -> DeviceInfo:
    if key is None:
        info = probe_gpu(0) or replace(cpu_info(), notes=_last_notes)
    elif device.type == "cpu" or device.type == "meta":
        info = cpu_info()
    elif device.type == "cuda":
        info = probe_gpu(device.index or 0)
        if info is None:
            raise RuntimeError(f"qbackend: no probe could identify {device}")
    else:
        info = DeviceInfo(device.type, device.index, device.type, device.type, probe="none")
    return info


def reset() -> None:
    with _cache_lock:
        _cache.clear()
