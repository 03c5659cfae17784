"""The toolchains that check csrc_rocm without an AMD GPU, for tests/test_rocm_*.py.

- Code objects: a clang that knows gfx942 (LLVM 17 or newer; gfx950 needs LLVM 20), ROCm's HIP headers
  and its device libraries. On Debian 12: clang-22 and lld-22 (bookworm-security), libamdhip64-dev
  and rocm-device-libs (ROCm 5.2); .ci/run installs them.
- HIP-CPU: AMD's header-only HIP runtime for CPUs (github.com/ROCm/HIP-CPU), a C++17 g++ and TBB
  (libtbb-dev). It is found at $QBACKEND_HIP_CPU_DIR, else at ../shared/third_party/hip-cpu beside
  the checkout; it is never copied into the tree.

What each toolchain makes is cached in a directory named by a hash of everything it is made from
(the sources, the commands, the compiler's identity, the HIP-CPU files), under $QBACKEND_ROCM_CHECK_CACHE
or the system's temporary directory: a second test run reuses it (CI runs the suite twice), and any
change rebuilds it.

A missing toolchain skips the tests that need it, with the reason. QBACKEND_ROCM_CHECKS names the
toolchains whose absence is a failure instead ("code-object", "hip-cpu", comma-separated; "required"
means both), so that CI cannot pass without running them. .ci/run requires the code objects always
and HIP-CPU where the copy it finds is complete.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from qbackend_providers import rocm_build

ROOT = Path(__file__).resolve().parent.parent
# The device libraries the kernels link, as clang links them for HIP (the control libraries pick IEEE
# denormals, no unsafe math, correctly rounded sqrt, wave64). No oclc_isa_version_<gfx>.bc: Debian's
# ROCm 5.2 libraries predate gfx942, and the kernels reach only ockl's work-item functions, which do
# not read it.
DEVICE_LIBS = ("hip", "ocml", "ockl", "oclc_daz_opt_off", "oclc_unsafe_math_off", "oclc_finite_only_off",
               "oclc_correctly_rounded_sqrt_on", "oclc_wavefrontsize64_on", "oclc_abi_version_500")
# The LLVM release that added each target.
MIN_LLVM = {"gfx942": 17, "gfx950": 20}
# The tests' HIP-CPU build caps grids at this many blocks, so that small inputs run every grid-stride
# loop many times.
TEST_MAX_GRID = 5


def required(toolchain: str) -> bool:
    """Whether QBACKEND_ROCM_CHECKS makes a missing `toolchain` ("code-object" or "hip-cpu") a failure."""
    names = {n.strip().lower() for n in os.environ.get("QBACKEND_ROCM_CHECKS", "").split(",")}
    return "required" in names or toolchain in names


def unavailable(reason: str, toolchain: str = "code-object"):
    """Skip with the reason, or fail where QBACKEND_ROCM_CHECKS requires that toolchain."""
    if required(toolchain):
        pytest.fail(f"QBACKEND_ROCM_CHECKS={os.environ['QBACKEND_ROCM_CHECKS']}, but: {reason}", pytrace=False)
    pytest.skip(reason)


def _run(cmd: list, what: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).splitlines()[-40:])
        raise AssertionError(f"{what} failed:\n$ {' '.join(map(str, cmd))}\n{tail}")
    return out.stdout + out.stderr


def _digest(parts: list, trees: list) -> str:
    """A hash of the command parts and the files under the trees. The sources' own directory is left
    out of it: a checkout and an installed wheel hold the same csrc_rocm at different paths."""
    h = hashlib.sha256()
    src = str(rocm_build.source_dir())
    for part in parts:
        h.update(str(part).replace(src, "<csrc_rocm>").encode() + b"\0")
    for tree in trees:
        for path in sorted(p for p in Path(tree).rglob("*") if p.is_file()):
            h.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def cache_dir(kind: str, key: str) -> Path:
    base = os.environ.get("QBACKEND_ROCM_CHECK_CACHE") or os.path.join(tempfile.gettempdir(),
                                                                        f"qbackend-rocm-checks-{os.getuid()}")
    return Path(base) / f"{kind}-{key}"


def _publish(build: Path, final: Path) -> None:
    """Move a finished build directory into place (another test process may have done it first)."""
    try:
        os.replace(build, final)
    except OSError:
        shutil.rmtree(build, ignore_errors=True)


# --- code objects ------------------------------------------------------------------------------------------

def _clang_version(path: str) -> int | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"clang version (\d+)", out)
    return int(m.group(1)) if m else None


def device_clang() -> tuple:
    """(path, LLVM major version) of the newest clang on the PATH, or (None, None)."""
    found = []
    for name in [f"clang++-{v}" for v in range(40, 16, -1)] + ["clang++"]:
        path = shutil.which(name)
        version = _clang_version(path) if path else None
        if version:
            found.append((version, path))
    if not found:
        return None, None
    version, path = max(found)
    return path, version


def hip_include() -> Path | None:
    """A directory holding ROCm's hip/hip_runtime.h (not HIP-CPU's)."""
    roots = [os.environ.get("ROCM_PATH"), "/opt/rocm", "/usr"]
    for root in filter(None, roots):
        inc = Path(root) / "include"
        if (inc / "hip" / "amd_detail" / "amd_hip_runtime.h").exists():
            return inc
    return None


def device_lib_dir() -> Path | None:
    candidates = [Path(r) / "amdgcn" / "bitcode" for r in filter(None, [os.environ.get("ROCM_PATH"), "/opt/rocm"])]
    candidates.append(Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"))  # Debian's rocm-device-libs
    return next((d for d in candidates if (d / "ockl.bc").exists()), None)


def _common_flags(include: Path) -> list:
    src = rocm_build.source_dir()
    # /usr/include is searched anyway, and naming it again would break the C++ headers' #include_next.
    system = [] if include == Path("/usr/include") else ["-isystem", str(include)]
    # -D__AMDGCN_WAVEFRONT_SIZE=64: Debian's HIP 5.2 headers read this macro, which LLVM 20 and newer no
    # longer define (every target here is wave64).
    return ["-x", "hip", *rocm_build.KERNEL_FLAGS, "-D__AMDGCN_WAVEFRONT_SIZE=64", *system, "-I", str(src / "include")]


def code_object_command(clang: str, arch: str, include: Path, libs: Path, out: Path) -> list:
    """The device half of what hipcc compiles for one target, with the library's own flags."""
    links = [arg for name in DEVICE_LIBS if (libs / f"{name}.bc").exists()
             for arg in ("-Xclang", "-mlink-builtin-bitcode", "-Xclang", str(libs / f"{name}.bc"))]
    return [clang, *_common_flags(include), f"--offload-arch={arch}", "--cuda-device-only", "--no-gpu-bundle-output",
            "-nogpulib", *links, "-c", str(rocm_build.source_dir() / "quantize.hip"), "-o", str(out)]


def host_object_command(clang: str, source: str, include: Path, out: Path) -> list:
    """The host half of what hipcc compiles, against ROCm's HIP headers (HIP-CPU's are another API)."""
    return [clang, *_common_flags(include), "--offload-arch=gfx942", "--cuda-host-only", "-fPIC", "-c",
            str(rocm_build.source_dir() / source), "-o", str(out)]


def compiled(archs: list) -> dict:
    """{arch: quantize.hip's code object for it} for the archs the clang found knows, {arch: reason} for
    the others, and {"host": [the host objects of quantize.hip and build_info.hip]}: compiled in
    parallel, cached. Skips (or fails) when no toolchain is here."""
    clang, version = device_clang()
    include, libs = hip_include(), device_lib_dir()
    if clang is None or version < MIN_LLVM["gfx942"]:
        unavailable(f"no clang of LLVM {MIN_LLVM['gfx942']} or newer (found {clang or 'none'}): "
                    "apt-get install clang-22 lld-22")
    if include is None or libs is None:
        unavailable("ROCm's HIP headers or device libraries are missing: apt-get install libamdhip64-dev "
                    "rocm-device-libs")
    jobs = {}  # name: [(command maker taking the output path, output file name)]
    result = {}
    for arch in archs:
        if version < MIN_LLVM[arch]:
            result[arch] = (f"{arch} needs LLVM {MIN_LLVM[arch]} or newer; the newest clang here is LLVM {version} "
                            f"({clang})")
        else:
            make = lambda out, a=arch: code_object_command(clang, a, include, libs, out)
            jobs[arch] = [(make, f"quantize-{arch}.co")]
    jobs["host"] = [(lambda out, f=f: host_object_command(clang, f, include, out), f"{f}.o")
                    for f in rocm_build.SOURCES]
    running = []  # (build directory, its final place, [(process, command)])
    for name, steps in jobs.items():
        key = _digest([arg for make, _ in steps for arg in make(Path("OUT"))] + [_clang_version(clang), clang],
                      [rocm_build.source_dir(), libs])
        final = cache_dir(f"compile-{name}", key)
        outputs = [final / out for _, out in steps]
        result[name] = outputs if name == "host" else outputs[0]
        if all(o.exists() for o in outputs):
            continue
        build = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=_mkdir(final.parent)))
        commands = [make(build / out) for make, out in steps]
        running.append((build, final, [(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                         text=True), cmd) for cmd in commands]))
    for build, final, procs in running:
        for proc, cmd in procs:
            out = proc.communicate()[0]
            if proc.returncode != 0:
                raise AssertionError(f"compiling failed:\n$ {' '.join(map(str, cmd))}\n{out[-4000:]}")
        _publish(build, final)
    return result


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- reading a code object: the ELF note with the AMDGPU metadata (msgpack) -----------------------------------

NT_AMDGPU_METADATA = 32


def _msgpack(data: bytes, pos: int = 0) -> tuple:
    """(value, next position) of the msgpack object at pos: the subset AMDGPU metadata uses (maps,
    arrays, strings, integers, booleans, nil)."""
    b = data[pos]
    pos += 1

    def seq(n, pos, pairs):
        out = {} if pairs else []
        for _ in range(n):
            k, pos = _msgpack(data, pos)
            if pairs:
                v, pos = _msgpack(data, pos)
                out[k] = v
            else:
                out.append(k)
        return out, pos

    def raw(n, pos):
        return data[pos:pos + n].decode(), pos + n

    def num(fmt, pos):
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, data, pos)[0], pos + size

    if b <= 0x7f:
        return b, pos
    if b >= 0xe0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8f:
        return seq(b & 0x0f, pos, True)
    if 0x90 <= b <= 0x9f:
        return seq(b & 0x0f, pos, False)
    if 0xa0 <= b <= 0xbf:
        return raw(b & 0x1f, pos)
    fixed = {0xc0: None, 0xc2: False, 0xc3: True}
    if b in fixed:
        return fixed[b], pos
    ints = {0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q", 0xd0: ">b", 0xd1: ">h", 0xd2: ">i", 0xd3: ">q"}
    if b in ints:
        return num(ints[b], pos)
    lengths = {0xd9: ">B", 0xda: ">H", 0xdb: ">I", 0xdc: ">H", 0xdd: ">I", 0xde: ">H", 0xdf: ">I"}
    if b in lengths:
        n, pos = num(lengths[b], pos)
        if b <= 0xdb:
            return raw(n, pos)
        return seq(n, pos, b >= 0xde)
    raise ValueError(f"msgpack type byte {b:#x} at {pos - 1} is not one AMDGPU metadata uses")


def amdgpu_metadata(path: Path) -> dict:
    """The NT_AMDGPU_METADATA note of an AMDGPU code object (an ELF64 shared object), decoded."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3a)
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        if sh_type != 7:  # SHT_NOTE
            continue
        offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 24)
        pos, end = offset, offset + size
        while pos < end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name = data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            desc = pos + 12 + (namesz + 3) // 4 * 4
            if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                return _msgpack(data, desc)[0]
            pos = desc + (descsz + 3) // 4 * 4
    raise ValueError(f"{path}: no AMDGPU metadata note")


# --- HIP-CPU -------------------------------------------------------------------------------------------------

def hip_cpu_dir() -> Path:
    return Path(os.environ.get("QBACKEND_HIP_CPU_DIR") or ROOT.parent / "shared" / "third_party" / "hip-cpu")


def hip_cpu_problem(root: Path) -> str | None:
    """Why HIP-CPU at root cannot be used, or None. Its public headers include its src/ and external/
    folders, so a copy of include/ alone does not compile."""
    if not (root / "include" / "hip" / "hip_runtime.h").exists():
        return (f"HIP-CPU not found at {root} (set QBACKEND_HIP_CPU_DIR to a checkout of "
                "github.com/ROCm/HIP-CPU)")
    for needed in ("src/include/hip/detail/api.hpp", "external/libco/libco.h", "external/half/half.hpp"):
        if not (root / needed).exists():
            return (f"HIP-CPU at {root} is incomplete: {needed} is missing (its include/hip headers include "
                    "src/include/hip/detail/*.hpp, which need external/; a full checkout of "
                    "github.com/ROCm/HIP-CPU has them)")
    return None


def hip_cpu_library() -> Path:
    """libqbackend_rocm built from csrc_rocm against HIP-CPU with g++ (cached), with the HIP-CPU build's
    stream and synchronize entry points (csrc_rocm/hip_cpu_stream.cpp). Skips (or fails) when a part is
    missing."""
    root = hip_cpu_dir()
    problem = hip_cpu_problem(root)
    if problem:
        unavailable(problem, "hip-cpu")
    gxx = shutil.which("g++")
    if gxx is None:
        unavailable("no g++ on the PATH (HIP-CPU needs a C++17 compiler with parallel algorithms)", "hip-cpu")
    probe = subprocess.run([gxx, "-std=c++17", "-x", "c++", "-E", "-", "-o", os.devnull],
                           input="#include <tbb/version.h>\n", capture_output=True, text=True)
    if probe.returncode != 0:
        unavailable("TBB's headers are missing (HIP-CPU's parallel algorithms need them): "
                    "apt-get install libtbb-dev", "hip-cpu")
    src = rocm_build.source_dir()
    # -O0: the tests' inputs are small, and g++ takes minutes to optimise HIP-CPU's launch machinery.
    flags = ["-std=c++17", "-O0", "-fPIC", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
             "-Wno-unknown-pragmas", f"-DQB_ROCM_MAX_GRID={TEST_MAX_GRID}", "-I", str(src / "include"),
             "-isystem", str(root / "include")]
    units = [src / "quantize.hip", src / "build_info.hip", src / "hip_cpu_stream.cpp"]
    version = subprocess.run([gxx, "--version"], capture_output=True, text=True).stdout
    key = _digest([*flags, *map(str, units), version, gxx], [src, root / "include", root / "src"])
    final = cache_dir("hip-cpu", key)
    lib = final / "libqbackend_rocm_hip_cpu.so"
    if lib.exists():
        return lib
    build = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=_mkdir(final.parent)))
    procs = []
    for unit in units:  # one process per unit: quantize.hip is most of the time, the rest runs beside it
        cmd = [gxx, *flags, "-x", "c++", "-c", str(unit), "-o", str(build / (unit.name + ".o"))]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), cmd))
    for proc, cmd in procs:
        out = proc.communicate()[0]
        if proc.returncode != 0:
            raise AssertionError(f"the HIP-CPU build failed:\n$ {' '.join(cmd)}\n{out[-6000:]}")
    _run([gxx, "-shared", "-o", str(build / lib.name), *[str(build / (u.name + ".o")) for u in units],
          f"-Wl,--version-script={src / 'exports.map'}", "-ltbb", "-pthread"], "linking the HIP-CPU build")
    _publish(build, final)
    return lib
