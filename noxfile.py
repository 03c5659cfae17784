"""Developer sessions. They run in the current environment (set up by the README's first
command), so the torch build that matches the machine is the one tested: `nox -s tests`."""
import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]


@nox.session
def tests(session):
    """The CPU test suite (GPU tests run too where a CUDA device is present)."""
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "./tests/demo_provider")
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session
def gpu(session):
    """Only the GPU tests (tests/gpu), on a machine with a CUDA device."""
    session.run("python", "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", *session.posargs)


@nox.session
def rocm(session):
    """Only the ROCm tests (tests/rocm), on a machine with an AMD GPU and a ROCm build of torch."""
    session.run("python", "-m", "pytest", "-q", "-m", "rocm", "tests/rocm", *session.posargs)


@nox.session
def lint(session):
    session.run("python", "-m", "pip", "install", "-q", "ruff")
    session.run("ruff", "check", "qbackend", "providers", "tests", "bench", "tools")


@nox.session
def build(session):
    """Compile csrc_cuda into providers/_lib/libqbackend_cuda.so: `qbackend build` (incremental, in
    build/cuda); posargs go to it, e.g. `nox -s build -- --archs all --jobs 2`."""
    session.run("qbackend", "build", *session.posargs)


@nox.session
def wheel(session):
    """A binary wheel in dist/ holding libqbackend_cuda.so for every arch family (QBACKEND_CUDA_ARCHS
    narrows it), tagged py3-none-<platform>: the library has a C ABI and links neither Python nor
    torch, so one file serves every CPython >= 3.9 and every torch >= 2.4. It is built from build/cuda,
    so after `qbackend build --archs all` nothing is compiled again."""
    import os
    import shutil

    # setuptools' staging area may hold files of an earlier wheel that the tree no longer has.
    shutil.rmtree("build/lib", ignore_errors=True)
    env = {"QBACKEND_BUILD_CUDA": "1", "QBACKEND_CUDA_ARCHS": os.environ.get("QBACKEND_CUDA_ARCHS") or "all"}
    session.run("python", "-m", "pip", "wheel", "--no-deps", "-w", "dist", ".", *session.posargs, env=env)


@nox.session
def bench(session):
    """H200 benchmarks; results land in bench/results/."""
    out = session.posargs[0] if session.posargs else "bench/results"
    for script in ("bench/bench_scaled_mm.py", "bench/bench_quantize.py", "bench/bench_marlin.py"):
        session.run("python", script, "--out", out)


@nox.session
def docs(session):
    """Regenerate the golden selection table in docs/selection.md and check the docs' links."""
    session.run("python", "tools/update_docs.py")
