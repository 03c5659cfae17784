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
def lint(session):
    session.run("python", "-m", "pip", "install", "-q", "ruff")
    session.run("ruff", "check", "qbackend", "providers", "tests", "bench", "tools")


@nox.session
def build(session):
    """Compile csrc_cuda into providers/_lib/libqbackend_cuda.so (QBACKEND_CUDA_ARCHS picks archs)."""
    session.run("python", "tools/build_cuda.py", *session.posargs)


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
