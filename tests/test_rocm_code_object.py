"""csrc_rocm compiled for gfx942 and gfx950 without ROCm: Debian's clang, HIP headers and device
libraries, the library's own flags (tests/rocm_toolchain.py). The code object's metadata is checked
kernel by kernel: every kernel the host code launches is there, for wave64, with no register spills,
no scratch memory, the LDS the source declares, and registers that let the launch shapes run at the
occupancy the kernels are designed for. The host half compiles against the same HIP headers.

gfx950 needs LLVM 20 or newer; with an older clang its test skips, saying so."""
from __future__ import annotations

import pytest
from rocm_toolchain import amdgpu_metadata, compiled, unavailable

ARCHS = ("gfx942", "gfx950")
X_TYPES = ("float", "qbr::F16", "qbr::Bf16")
VECS = {"float": 4, "qbr::F16": 8, "qbr::Bf16": 8}
# VGPRs (and AGPRs: gfx942 and gfx950 share one file of 512 per SIMD lane) per kernel family, at most:
# the fused per-token and per-group kernels keep 16-byte vectors in registers and may use up to 128
# (four wavefronts per SIMD, which a 1024-thread per-token block needs); the streaming passes stay
# within 64 (eight wavefronts per SIMD, to hide memory latency).
VGPR_BUDGET = {"per_token_kernel": 128, "per_group_kernel": 128, "elementwise_kernel": 64, "amax_kernel": 64,
               "finalize_scale_kernel": 64}
# LDS bytes: one uint32 per wavefront of the largest block for the block reductions.
LDS = {"per_token_kernel": 16 * 4, "amax_kernel": 4 * 4}
VGPRS_PER_SIMD_LANE = 512


def _family(name: str) -> str:
    return name.split("<")[0].split("::")[-1]


def expected_kernels() -> set:
    """Every kernel quantize.hip launches: four families per input type and vector width, and one."""
    names = {"qbr::finalize_scale_kernel"}
    for x in X_TYPES:
        for vec in (VECS[x], 1):
            for family in ("per_token_kernel", "per_group_kernel", "elementwise_kernel", "amax_kernel"):
                names.add(f"qbr::{family}<{x}, {vec}>")
    return names


def demangle(symbols: list) -> list:
    """The kernels' source names (c++filt of binutils, which CI has), parameters dropped."""
    import subprocess

    out = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True, check=True)
    names = []
    for line in out.stdout.splitlines():
        name = line.split("(")[0]
        names.append(name[len("void "):] if name.startswith("void ") else name)
    return names


@pytest.fixture(scope="module")
def objects():
    return compiled(list(ARCHS))


def kernels(path) -> tuple:
    md = amdgpu_metadata(path)
    ks = md["amdhsa.kernels"]
    return md["amdhsa.target"], dict(zip(demangle([k[".name"] for k in ks]), ks))


@pytest.mark.parametrize("arch", ARCHS)
def test_code_object(objects, arch):
    path = objects[arch]
    if isinstance(path, str):
        unavailable(path)
    target, ks = kernels(path)
    assert target.startswith(f"amdgcn-amd-amdhsa--{arch}"), target
    assert set(ks) == expected_kernels(), sorted(set(ks) ^ expected_kernels())
    for name, k in ks.items():
        family = _family(name)
        what = f"{arch} {name}"
        assert k[".wavefront_size"] == 64, what
        assert k[".vgpr_spill_count"] == 0 and k[".sgpr_spill_count"] == 0, \
            f"{what} spills: {k['.vgpr_spill_count']} VGPRs, {k['.sgpr_spill_count']} SGPRs"
        assert k[".private_segment_fixed_size"] == 0 and not k[".uses_dynamic_stack"], \
            f"{what} uses scratch memory ({k['.private_segment_fixed_size']} bytes per lane)"
        assert k[".group_segment_fixed_size"] == LDS.get(family, 0), \
            f"{what}: {k['.group_segment_fixed_size']} bytes of LDS, expected {LDS.get(family, 0)}"
        registers = k[".vgpr_count"] + k.get(".agpr_count", 0)
        assert registers <= VGPR_BUDGET[family], f"{what}: {registers} VGPRs, budget {VGPR_BUDGET[family]}"
        # The largest block the launch bounds allow must fit: its wavefronts, four SIMDs to a CU.
        waves_per_simd = -(-k[".max_flat_workgroup_size"] // 64 // 4)
        assert registers * waves_per_simd <= VGPRS_PER_SIMD_LANE, what


def test_metadata_reader_reads_what_it_should(objects):
    """The reader against facts of the source: launch bounds and kernel argument sizes."""
    path = next((objects[a] for a in ARCHS if not isinstance(objects[a], str)), None)
    if path is None:
        unavailable("no code object was built")
    _, ks = kernels(path)
    token = ks["qbr::per_token_kernel<qbr::Bf16, 8>"]
    assert token[".max_flat_workgroup_size"] == 1024   # __launch_bounds__(kMaxThreads)
    assert ks["qbr::per_group_kernel<float, 4>"][".max_flat_workgroup_size"] == 256
    # x, ldx, q, ldq, scales, rows, nvec, scale_ub: eight 8-byte arguments, then the int format code.
    explicit = [a for a in token[".args"] if not a[".value_kind"].startswith("hidden_")]
    assert [a[".size"] for a in explicit] == [8] * 8 + [4]


def test_host_code_compiles_against_rocm_headers(objects):
    """The host half of the library (argument checks, launches, build info) against ROCm's own HIP
    headers, which the HIP-CPU build does not see: the symbols of the C ABI are defined."""
    import subprocess

    symbols = set()
    for obj in objects["host"]:
        out = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True)
        symbols |= {line.split()[-1] for line in out.stdout.splitlines() if " T " in line}
    assert {"qb_quantize", "qb_quantize_group", "qb_quantize_workspace_size", "qb_build_info",
            "qb_has_variant"} <= symbols, sorted(symbols)
