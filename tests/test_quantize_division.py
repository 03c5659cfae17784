"""The quantize kernels' exact division (Divisor::quotient in csrc_cuda/common/quantize.cu) checked
on the CPU, through the same formula in C (tests/native_checks/quantize_division.c): equal to the
IEEE division for every finite fp32 amax over each qmax (the dynamic scale), and on random pairs
within the fast path's range. Needs a C compiler; the exhaustive part takes a few seconds."""
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "native_checks" / "quantize_division.c"
COMPILER = shutil.which("cc") or shutil.which("gcc")


def cpu_has_fma() -> bool:
    try:
        return " fma " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    if COMPILER is None:
        pytest.skip("no C compiler (cc or gcc) on PATH")
    exe = tmp_path_factory.mktemp("division") / "quantize_division"
    # The hardware fused multiply-add where the CPU has one (fmaf is exact either way, only slower).
    flags = ["-mfma"] if platform.machine() in ("x86_64", "AMD64") and cpu_has_fma() else []
    subprocess.run([COMPILER, "-O2", "-ffp-contract=off", *flags, str(SOURCE), "-o", str(exe), "-lm"],
                   check=True, capture_output=True)
    return exe


def mismatches(exe, *args) -> int:
    return int(subprocess.run([str(exe), *map(str, args)], check=True, capture_output=True,
                              text=True).stdout)


@pytest.mark.parametrize("qmax", [448.0, 57344.0, 127.0], ids=["e4m3", "e5m2", "int8"])
def test_amax_over_qmax_is_the_ieee_quotient_for_every_finite_amax(checker, qmax):
    assert mismatches(checker, "qmax", qmax) == 0


def test_fast_path_quotient_is_the_ieee_quotient_on_random_pairs(checker):
    assert mismatches(checker, "random", 20_000_000) == 0
