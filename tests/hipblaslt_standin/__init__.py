"""The stand-in hipBLASLt (hipblaslt_standin.c) for the CPU tests: compiling it, installing it in a
fake ROCm tree, pretending a version and an arch, and reading the calls it recorded."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("hipblaslt_standin.c")
HEUR_NORMAL, HEUR_NONE, HEUR_BAD_STATE, HEUR_IGNORE_LIMIT = range(4)
KINDS = ("handle", "desc", "layout", "pref")

_built: Path | None = None


def version_code(version) -> int:
    """(major, minor[, patch]) in hipblasLtGetVersion's encoding."""
    major, minor, patch = (tuple(version) + (0,))[:3]
    return major * 100000 + minor * 100 + patch


def build(directory: Path) -> Path:
    """Compile the stand-in once per pytest run (gcc, a second or so)."""
    global _built
    if _built is None or not _built.exists():
        out = Path(directory) / "libhipblaslt_standin.so"
        cmd = ["gcc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", str(out),
               str(SOURCE), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"compiling the hipBLASLt stand-in failed:\n{done.stderr}")
        _built = out
    return _built


def install(built: Path, root: Path, rocm: str | None = "6.3.1", file_version: str | None = None) -> Path:
    """A ROCm tree at root: .info/version holding `rocm` (none when None) and lib/libhipblaslt.so, a
    copy of the stand-in (each copy loads as its own library, with its own state). With
    file_version ("0.10.60301") the copy is named libhipblaslt.so.<file_version> and
    libhipblaslt.so links to it, as in a ROCm install. Returns the path of lib/libhipblaslt.so."""
    lib = root / "lib"
    lib.mkdir(parents=True)
    if rocm is not None:
        (root / ".info").mkdir()
        (root / ".info" / "version").write_text(f"{rocm}-48\n")
    if file_version:
        shutil.copy(built, lib / f"libhipblaslt.so.{file_version}")
        (lib / "libhipblaslt.so").symlink_to(f"libhipblaslt.so.{file_version}")
    else:
        shutil.copy(built, lib / "libhipblaslt.so")
    return lib / "libhipblaslt.so"


def _parse(line: str) -> tuple:
    head, _, why = line.partition(" why=")
    name, *fields = head.split(" ")
    record = dict(f.split("=", 1) for f in fields)
    if why:
        record["why"] = why
    return name, record


class StandIn:
    """Controls of one loaded copy of the stand-in (its ctypes handle)."""

    def __init__(self, cdll):
        self.c = cdll
        c = ctypes
        cdll.standin_set_version.argtypes = [c.c_int]
        cdll.standin_set_arch.argtypes = [c.c_char_p]
        cdll.standin_set_heuristic.argtypes = [c.c_int, c.c_uint64]
        cdll.standin_log.argtypes = [c.c_char_p, c.c_size_t]
        cdll.standin_log.restype = c.c_size_t
        cdll.standin_live.argtypes = [c.c_int]
        cdll.standin_live.restype = c.c_long
        cdll.standin_sizeof_heuristic_result.restype = c.c_size_t

    def pretend(self, version=(0, 10, 0), arch: str = "gfx942") -> StandIn:
        self.c.standin_set_version(version_code(version))
        if self.c.standin_set_arch(arch.encode()) != 0:
            raise ValueError(f"the stand-in knows gfx942 and gfx950, not {arch}")
        return self

    def heuristic(self, mode: int = HEUR_NORMAL, workspace: int = 4096) -> None:
        self.c.standin_set_heuristic(mode, workspace)

    def lines(self) -> list:
        n = self.c.standin_log(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.c.standin_log(buf, n + 1)
        return buf.value.decode().splitlines()

    def calls(self, name: str | None = None) -> list:
        """[(function, {field: value})] in call order, or the fields of one function's calls."""
        parsed = [_parse(line) for line in self.lines()]
        return parsed if name is None else [rec for n, rec in parsed if n == name]

    def names(self) -> list:
        return [n for n, _ in self.calls()]

    def failures(self) -> list:
        return [(n, rec) for n, rec in self.calls() if rec.get("status") != "0"]

    def live(self, kind: str) -> int:
        return self.c.standin_live(KINDS.index(kind))

    def clear(self) -> None:
        self.c.standin_clear_log()
