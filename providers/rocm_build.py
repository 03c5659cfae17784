"""Build csrc_rocm into libqbackend_rocm.so with hipcc: used by setup.py and `qbackend build --rocm`.

Standard library only: setup.py loads this file by path inside pip's build environment, where neither
torch nor qbackend is installed.

The library is two HIP sources compiled by one hipcc command for the gfx targets asked for
(QBACKEND_ROCM_ARCHS, default: those of gfx942 and gfx950 that the installed hipcc knows). A build is
skipped when a stamp in the build directory shows the same command over the same sources. The
command and the compiler's output go to <build dir>/build.log.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .install_paths import BuildError, SourceTree, default_dest

ALL_ARCHS = ("gfx942", "gfx950")
LIB_NAME = "libqbackend_rocm.so"
SOURCES = ("quantize.hip", "build_info.hip")
# Flags of every compile of the kernels, the CI's code-object check included. The results must equal
# the reference provider's bits: no a*b+c contracted into an fma, IEEE fp32 division (hipcc's
# default, stated so that no configuration file can change it).
KERNEL_FLAGS = ("-std=c++17", "-O3", "-ffp-contract=off", "-fhip-fp32-correctly-rounded-divide-sqrt")
BUILD_HINT = ("qbackend build --rocm  (needs ROCm's hipcc: on the PATH, or in $ROCM_PATH/bin or "
              "/opt/rocm/bin)")

SOURCE_TREE = SourceTree("csrc_rocm", "quantize.hip", "ROCm", build_name="rocm", cache_build_name="build-rocm")
in_checkout = SOURCE_TREE.in_checkout
source_dir = SOURCE_TREE.source_dir
default_build_dir = SOURCE_TREE.default_build_dir


def hipcc() -> str | None:
    found = shutil.which("hipcc")
    if found:
        return found
    for root in (os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH"), "/opt/rocm"):
        if root and (Path(root) / "bin" / "hipcc").exists():
            return str(Path(root) / "bin" / "hipcc")
    return None


def parse_archs(text: str) -> list:
    """'all' -> every target; 'gfx942;gfx950', 'gfx942,gfx950', 'gfx950' -> those named, in the order of
    ALL_ARCHS. Feature suffixes (gfx942:xnack-) are not taken: the library runs with either setting."""
    text = text.strip().lower()
    if text == "all":
        return list(ALL_ARCHS)
    wanted = {item for item in re.split(r"[;,\s]+", text) if item}
    unknown = sorted(wanted - set(ALL_ARCHS))
    if unknown:
        raise BuildError(f"unknown ROCm arch {', '.join(map(repr, unknown))}: use 'all' or a list of "
                         f"{', '.join(ALL_ARCHS)} (the wave64 CDNA targets the kernels are written for)")
    if not wanted:
        raise BuildError(f"empty ROCm arch list: use 'all' or a list of {', '.join(ALL_ARCHS)}")
    return [a for a in ALL_ARCHS if a in wanted]


def compiler_knows(compiler: str, arch: str) -> bool:
    """Whether a HIP compiler (hipcc or clang) accepts --offload-arch=arch: a preprocessor run, no code."""
    cmd = [compiler, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-nogpulib", "-nogpuinc",
           "-E", os.devnull, "-o", os.devnull]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def install_archs() -> tuple:
    """(archs or None, why) for setup.py, from QBACKEND_BUILD_ROCM and QBACKEND_ROCM_ARCHS: hipcc
    present means a build (it takes about a minute), for the targets of ALL_ARCHS it knows."""
    mode = os.environ.get("QBACKEND_BUILD_ROCM", "").strip().lower()
    requested = os.environ.get("QBACKEND_ROCM_ARCHS", "").strip()
    if mode in ("0", "off", "no", "false"):
        return None, "QBACKEND_BUILD_ROCM=0"
    compiler = hipcc()
    if compiler is None:
        if mode in ("1", "on", "yes", "true") or requested:
            raise BuildError("a ROCm build was asked for (QBACKEND_BUILD_ROCM / QBACKEND_ROCM_ARCHS) but hipcc "
                             "was not found: put it on the PATH or set ROCM_PATH")
        return None, "no hipcc on the PATH, in $ROCM_PATH or in /opt/rocm"
    if requested:
        return parse_archs(requested), f"QBACKEND_ROCM_ARCHS={requested}"
    known = [a for a in ALL_ARCHS if compiler_knows(compiler, a)]
    if not known:
        why = (f"{compiler} knows none of {', '.join(ALL_ARCHS)} (MI300, gfx942, is supported from ROCm 6.0, "
               "MI350, gfx950, from ROCm 7.0)")
        if mode in ("1", "on", "yes", "true"):
            raise BuildError(why)
        return None, why
    return known, f"the targets {compiler} knows"


def command(compiler: str, archs: list, source: Path, out: Path) -> list:
    # The arch list reaches build_info.hip as comma-separated tokens, which it turns into a string:
    # no quotes or spaces that a wrapper script could split.
    return [compiler, *KERNEL_FLAGS, "-fPIC", "-shared", *[f"--offload-arch={a}" for a in archs],
            f"-DQB_ROCM_ARCHS={','.join(archs)}", "-I", str(source / "include"),
            f"-Wl,--version-script={source / 'exports.map'}", *[str(source / s) for s in SOURCES], "-o", str(out)]


def _stamp(cmd: list, source: Path) -> str:
    digest = hashlib.sha256("\0".join(cmd).encode())
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build(archs: list, build_dir: Path | None = None, dest: Path | None = None, source: Path | None = None) -> Path:
    """Compile (unless the last build here was of the same sources and command); copy the library into
    `dest`; return its path there."""
    compiler = hipcc()
    if compiler is None:
        raise BuildError("hipcc not found: install ROCm (6.0 or newer), put hipcc on the PATH or set ROCM_PATH")
    source = Path(source or source_dir())
    build_dir = Path(build_dir or default_build_dir()).resolve()
    dest = Path(dest or default_dest())
    build_dir.mkdir(parents=True, exist_ok=True)
    built = build_dir / LIB_NAME
    cmd = command(compiler, archs, source, built)
    stamp = _stamp(cmd, source)
    stamp_file = build_dir / "stamp"
    log = build_dir / "build.log"
    if built.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        print(f"qbackend: {built} is up to date (nothing compiled)", file=sys.stderr, flush=True)
    else:
        print(f"qbackend: building {LIB_NAME} for {';'.join(archs)} (log: {log})", file=sys.stderr, flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True)
        log.write_text("$ " + " ".join(cmd) + "\n" + out.stdout + out.stderr)
        if out.returncode != 0:
            tail = "\n".join((out.stdout + out.stderr).splitlines()[-25:])
            raise BuildError(f"the ROCm build failed:\n{tail}\n(full log: {log})")
        stamp_file.write_text(stamp)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / LIB_NAME
    # Replace, never overwrite in place: a process that has the old library mapped keeps it intact.
    tmp = dest / (LIB_NAME + ".tmp")
    shutil.copy2(built, tmp)
    os.replace(tmp, target)
    return target
