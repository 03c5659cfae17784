"""Build csrc_cuda into libqbackend_cuda.so: used by setup.py, `qbackend build`, noxfile.py and CI.

Standard library only: setup.py loads this file by path inside pip's build environment, where
neither torch nor qbackend is installed.

What makes the build cheap to repeat:
- one build directory per place the sources live: build/cuda in a checkout, else
  ~/.cache/qbackend/build (XDG_CACHE_HOME is honoured);
- the CUTLASS headers are copied once per CUTLASS version into that build directory, so the
  include path in every compile command stays the same whichever Python environment (pip's
  throw-away build environment, the user's venv) supplied them; an unchanged rebuild then
  compiles nothing, and a changed .cu file recompiles one object;
- ccache or sccache, when on the PATH, wraps nvcc and the C++ compiler.
The build prints an estimate and one line per compiled object to stderr, and writes everything
(CMake's and the compilers' output too) to <build dir>/build.log.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .install_paths import BuildError, SourceTree, default_dest

ALL_ARCHS = ("75", "80", "89", "90a")
LIB_NAME = "libqbackend_cuda.so"
CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"
CUTLASS_HINT = (f"pip install '{CUTLASS_PIN}' (what the `cuda` extra installs: pip install 'qbackend[cuda]'), "
                "or set QBACKEND_CUTLASS_DIR to a CUTLASS checkout")
# Seconds one object takes on one core when no earlier build of it is in the ninja log: the mean of
# a full 2-core build (36 objects in about 14 minutes).
DEFAULT_OBJECT_SECONDS = 45.0

SOURCE_TREE = SourceTree("csrc_cuda", "CMakeLists.txt", "CUDA", build_name="cuda", cache_build_name="build")
in_checkout = SOURCE_TREE.in_checkout
source_dir = SOURCE_TREE.source_dir
default_build_dir = SOURCE_TREE.default_build_dir


def build_log_candidates() -> list:
    """Where the logs of earlier builds may be, for `qbackend info`."""
    dirs = [SOURCE_TREE.cache_build_dir()]
    if in_checkout():
        dirs.insert(0, SOURCE_TREE.checkout_build_dir())
    return [d / "build.log" for d in dirs]


# --- which archs -------------------------------------------------------------------------------------------

def parse_archs(text: str) -> list:
    """'all' -> every family; '89;90a', 'sm_89,sm_90a', '90' -> the families named, in build order;
    'native' -> those of the visible GPUs."""
    text = text.strip().lower()
    if text == "all":
        return list(ALL_ARCHS)
    if text == "native":
        found = gpu_archs()
        if not found:
            raise BuildError("--archs native: no NVIDIA GPU is visible here")
        return found
    wanted = set()
    for item in re.split(r"[;,\s]+", text):
        if not item:
            continue
        name = re.sub(r"^(sm_?|compute_)", "", item)
        name = "90a" if name == "90" else name   # the sm_90 family is built for sm_90a only
        if name not in ALL_ARCHS:
            raise BuildError(f"unknown CUDA arch {item!r}: use 'all', 'native' or a list of "
                             f"{', '.join(ALL_ARCHS)} (for example '89;90a')")
        wanted.add(name)
    if not wanted:
        raise BuildError("empty arch list: use 'all', 'native' or for example '89;90a'")
    return [a for a in ALL_ARCHS if a in wanted]


def families_for(major: int, minor: int) -> list:
    """The families a GPU of compute capability major.minor runs from (cutlass.py and marlin.py choose
    among them): its own SASS where we build one, else the PTX of the newest family it can JIT."""
    sm = major * 10 + minor
    if sm < 75:
        return []
    if sm < 80:
        return ["75"]
    if sm < 89:
        return ["80"]            # int8 and marlin; sm_80 SASS runs on sm_86 / sm_87
    if sm == 89:
        return ["80", "89"]
    if sm == 90:
        return ["80", "90a"]
    return ["80", "89"]          # newer chips: no sm_90a there; compute_80 / compute_89 PTX is JIT-compiled


def visible_gpus() -> list:
    """[(major, minor)] of the NVIDIA GPUs nvidia-smi or NVML sees; neither creates a CUDA context."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            caps = [line.strip().split(".") for line in out.stdout.splitlines() if line.strip()]
            return [(int(c[0]), int(c[1])) for c in caps if len(c) == 2 and c[0].isdigit() and c[1].isdigit()]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [tuple(pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, no driver, no device: no GPU to build for
        return []


def gpu_archs() -> list:
    wanted = {a for major, minor in visible_gpus() for a in families_for(major, minor)}
    return [a for a in ALL_ARCHS if a in wanted]


def install_archs() -> tuple:
    """(archs or None, why) for setup.py: QBACKEND_BUILD_CUDA and QBACKEND_CUDA_ARCHS, else the visible
    GPUs' families, else no CUDA build (a GPU-less machine gets a fast, pure-Python install)."""
    mode = os.environ.get("QBACKEND_BUILD_CUDA", "").strip().lower()
    requested = os.environ.get("QBACKEND_CUDA_ARCHS", "").strip()
    if mode in ("0", "off", "no", "false"):
        return None, "QBACKEND_BUILD_CUDA=0"
    forced = mode in ("1", "on", "yes", "true")
    if nvcc() is None:
        if forced or requested:
            raise BuildError("a CUDA build was asked for (QBACKEND_BUILD_CUDA / QBACKEND_CUDA_ARCHS) "
                             "but nvcc was not found: put it on the PATH or set CUDA_HOME")
        return None, "no nvcc on the PATH or in CUDA_HOME"
    if requested:
        return parse_archs(requested), f"QBACKEND_CUDA_ARCHS={requested}"
    found = gpu_archs()
    if found:
        return found, "the visible GPU"
    if forced:
        return list(ALL_ARCHS), "QBACKEND_BUILD_CUDA=1 without a visible GPU: every family"
    return None, ("no NVIDIA GPU visible (QBACKEND_BUILD_CUDA=1 or QBACKEND_CUDA_ARCHS=all builds anyway; "
                  "`qbackend build --archs all` builds later)")


# --- tools -------------------------------------------------------------------------------------------------

def nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidate = Path(os.environ[var]) / "bin" / "nvcc"
            if candidate.exists():
                return str(candidate)
    candidate = Path("/usr/local/cuda/bin/nvcc")
    return str(candidate) if candidate.exists() else None


def compiler_launcher():
    """ccache or sccache when installed: a rebuild after `rm -rf build/` then costs little.
    QBACKEND_COMPILER_LAUNCHER names another one, or `none` (to time a build, say)."""
    chosen = os.environ.get("QBACKEND_COMPILER_LAUNCHER", "").strip()
    if chosen:
        return None if chosen.lower() == "none" else chosen
    for tool in ("sccache", "ccache"):
        found = shutil.which(tool)
        if found:
            return found
    return None


def cutlass_dir(build_dir: Path) -> Path:
    """A CUTLASS root (include/, tools/util/include/) whose path does not change between builds."""
    override = os.environ.get("QBACKEND_CUTLASS_DIR")
    if override:
        root = Path(override)
        if not (root / "include" / "cutlass" / "cutlass.h").exists():
            raise BuildError(f"QBACKEND_CUTLASS_DIR={override}: no include/cutlass/cutlass.h there")
        return root
    try:
        import cutlass_library
    except ImportError:
        cutlass_library = None
    copies = build_dir / "cutlass"
    if cutlass_library is None:
        # A copy left by an earlier build (setup.py's, from pip's build environment) still serves.
        earlier = sorted(copies.glob("*/include/cutlass/cutlass.h"))
        if earlier:
            return earlier[-1].parent.parent.parent
        raise BuildError(f"the CUTLASS headers are missing: {CUTLASS_HINT}")
    source = Path(cutlass_library.__file__).resolve().parent / "source"
    try:
        from importlib.metadata import version

        tag = version("nvidia-cutlass")
    except Exception:
        tag = "unknown"
    root = copies / tag
    if not (root / ".complete").exists():
        # copy2 keeps the files' times: the same headers never look newer than the objects.
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(source / "include", root / "include", copy_function=shutil.copy2)
        shutil.copytree(source / "tools" / "util" / "include", root / "tools" / "util" / "include",
                        copy_function=shutil.copy2)
        (root / ".complete").write_text(str(source) + "\n")
    return root


# --- the build ---------------------------------------------------------------------------------------------

class Console:
    """Lines for the user: stderr, the log file, and the terminal when pip captures stderr (pip -q
    hides a build's output; the controlling terminal, where there is one, still shows progress)."""

    def __init__(self, log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "w")
        self.tty = None
        if not sys.stderr.isatty():
            try:
                self.tty = open("/dev/tty", "w")
            except OSError:
                self.tty = None

    def say(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        self.to_log_and_tty(line)

    def to_log_and_tty(self, line: str) -> None:
        self.log.write(line + "\n")
        self.log.flush()
        if self.tty is not None:
            self.tty.write(line + "\n")
            self.tty.flush()

    def close(self) -> None:
        self.log.close()
        if self.tty is not None:
            self.tty.close()


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _last_durations(build_dir: Path) -> dict:
    """{output: seconds} of each output's latest build, from .ninja_log."""
    durations = {}
    try:
        lines = (build_dir / ".ninja_log").read_text().splitlines()
    except OSError:
        return durations
    for line in lines[1:]:   # the first line is the format version
        fields = line.split("\t")
        if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
            durations[fields[3]] = (int(fields[1]) - int(fields[0])) / 1000.0
    return durations


def estimate_seconds(durations: list, jobs: int) -> float:
    """Wall time of `durations` on `jobs` workers, the longest started first (as a plain sum over jobs
    would undercount one long object)."""
    workers = [0.0] * max(1, jobs)
    for seconds in sorted(durations, reverse=True):
        workers[workers.index(min(workers))] += seconds
    return max(workers)


def _objects(n: int) -> str:
    return f"{n} object" + ("" if n == 1 else "s")


def pending_objects(build_dir: Path) -> list:
    """The object files ninja would compile now (a dry run)."""
    out = subprocess.run(["ninja", "-C", str(build_dir), "-n"], capture_output=True, text=True)
    objects = []
    for line in out.stdout.splitlines():
        match = re.search(r"Building \w+ object (\S+)", line)
        if match:
            objects.append(match.group(1))
    return objects


# Below this many jobs the sm_90a instantiation files compile INSTANCES_PER_UNIT to a unit (CMake's
# QB_INSTANCES_PER_UNIT): the CUTLASS headers are parsed, and the shared collectives instantiated, once
# per unit. On a 2-core machine pairs (2) took the all-arch build from 27.7 to 19.1 min; from 12 jobs
# up, more units in flight win.
GROUP_BELOW_JOBS = 12
INSTANCES_PER_UNIT = 4


def _configure(source: Path, build_dir: Path, archs: list, cutlass: Path, console: Console, jobs: int) -> None:
    # A build directory keeps the generator it was made with; Ninja gives the dry run and the estimate.
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    args = ["cmake", "-S", str(source), "-B", str(build_dir), "-G", generator, "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_CUDA_COMPILER={nvcc()}", f"-DQB_CUTLASS_DIR={cutlass}", f"-DQB_CUDA_ARCHS={';'.join(archs)}",
            f"-DQB_INSTANCES_PER_UNIT={INSTANCES_PER_UNIT if jobs < GROUP_BELOW_JOBS else 1}"]
    launcher = compiler_launcher()
    # Empty when none is installed: a launcher cached by an earlier configure must not linger.
    args += [f"-DCMAKE_CUDA_COMPILER_LAUNCHER={launcher or ''}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher or ''}"]
    console.to_log_and_tty("$ " + " ".join(args))
    out = subprocess.run(args, capture_output=True, text=True)
    console.log.write(out.stdout + out.stderr)
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).splitlines()[-25:])
        raise BuildError(f"CMake configure failed:\n{tail}\n(full log: {console.log.name})")
    console.say(f"qbackend: configured {build_dir} (archs {';'.join(archs)}, CUTLASS {cutlass}, "
                f"compiler launcher {launcher or 'none'})")


def build(archs: list, jobs: int | None = None, build_dir: Path | None = None, dest: Path | None = None,
          source: Path | None = None) -> Path:
    """Configure (when needed) and build; copy the library into `dest`; return its path there."""
    if shutil.which("cmake") is None:
        raise BuildError("cmake not found on the PATH: pip install cmake (3.25 or newer)")
    if nvcc() is None:
        raise BuildError("nvcc not found: install the CUDA toolkit (12.4 or newer), put nvcc on the PATH "
                         "or set CUDA_HOME")
    source = source or source_dir()
    build_dir = Path(build_dir or default_build_dir()).resolve()
    dest = Path(dest or default_dest())
    jobs = jobs or int(os.environ.get("QBACKEND_BUILD_JOBS") or os.cpu_count() or 2)
    cutlass = cutlass_dir(build_dir)
    console = Console(build_dir / "build.log")
    try:
        console.say(f"qbackend: building {LIB_NAME} for archs {';'.join(archs)} in {build_dir} "
                    f"with {jobs} jobs (log: {console.log.name})")
        _configure(source, build_dir, archs, cutlass, console, jobs)
        pending = pending_objects(build_dir) if shutil.which("ninja") else None
        if pending is None:
            console.say("qbackend: no ninja, so no count of objects or estimate (pip install ninja for them)")
        elif pending:
            known = _last_durations(build_dir)
            seconds = estimate_seconds([known.get(obj, DEFAULT_OBJECT_SECONDS) for obj in pending], jobs)
            basis = "earlier builds here" if any(obj in known for obj in pending) else \
                f"about {DEFAULT_OBJECT_SECONDS:.0f} s per object per core"
            console.say(f"qbackend: {_objects(len(pending))} to compile; estimate {_minutes(seconds)} "
                        f"with {jobs} jobs (from {basis})")
        else:
            console.say("qbackend: nothing to compile: the library is up to date")
        t0 = time.time()
        env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
        proc = subprocess.Popen(["cmake", "--build", str(build_dir), "-j", str(jobs)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            console.say(line.rstrip("\n"))
        if proc.wait() != 0:
            raise BuildError(f"the CUDA build failed (compiler output above and in {console.log.name})")
        built = build_dir / LIB_NAME
        target = dest / LIB_NAME
        dest.mkdir(parents=True, exist_ok=True)
        # Replace, never overwrite in place: a process that has the old library mapped keeps it intact.
        tmp = dest / (LIB_NAME + ".tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, target)
        if pending is None:
            console.say(f"qbackend: built {target} in {_minutes(time.time() - t0)}")
        elif pending:
            console.say(f"qbackend: built {target} in {_minutes(time.time() - t0)} ({_objects(len(pending))} compiled)")
        else:
            console.say(f"qbackend: {target} is up to date (nothing compiled)")
        return target
    finally:
        console.close()
