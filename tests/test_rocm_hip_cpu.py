"""csrc_rocm's kernels run on the CPU under AMD's HIP-CPU runtime, compared with the reference provider
bit for bit.

The library is the GPU library's source compiled with g++ against HIP-CPU (tests/rocm_toolchain.py),
with grids capped at a few blocks so that small inputs run every grid-stride loop many times. It is
called through the rocm provider's own code (providers/rocm_quantize.py) and the ctypes binding
(providers/rocm_native.py), with CPU tensors: every wave64 reduction, shuffle, barrier, vector and
scalar path, and the fp8 / int8 encoders run as written. Scales compare bit for bit (any NaN equals
any NaN), quantized bytes exactly.
"""
from __future__ import annotations

import math

import pytest
import torch
from nonfinite_corpus import corpus, same_bits
from rocm_toolchain import hip_cpu_library

from qbackend import dtypes as qd
from qbackend.validate import validate_quantize
from qbackend_providers import rocm_native
from qbackend_providers.reference import reference_quantize
from qbackend_providers.rocm_quantize import RocmQuantizeProvider

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
Q_DTYPES = (qd.E4M3_FNUZ, qd.E5M2_FNUZ, qd.E4M3, qd.E5M2, torch.int8)
BLOCK = (128, 128)


@pytest.fixture(scope="module")
def lib():
    return rocm_native.RocmLibrary(hip_cpu_library())


@pytest.fixture
def provider(lib, monkeypatch):
    """The rocm provider, with the HIP-CPU build as the library it loads."""
    monkeypatch.setattr(rocm_native, "_loaded", lib)
    monkeypatch.setattr(rocm_native, "_tried", True)
    return RocmQuantizeProvider()


def run(provider, lib, x, dtype, granularity, scale=None, scale_ub=None, group=128):
    problem = validate_quantize(x, dtype, granularity, scale, scale_ub, group, BLOCK)
    q, s = provider.quantize(x, dtype, granularity, scale, scale_ub, group, BLOCK, problem)
    return q, s


def check(provider, lib, x, dtype, granularity, scale=None, scale_ub=None, group=128, what=""):
    q, s = run(provider, lib, x, dtype, granularity, scale, scale_ub, group)
    want_q, want_s = reference_quantize(x, dtype, granularity, scale, scale_ub, group, BLOCK)
    what = f"{what} {qd.dtype_name(x.dtype)}[{list(x.shape)}] -> {qd.dtype_name(dtype)} {granularity}"
    same_bits(s, want_s, what + " scale")
    same_bits(q, want_q, what + " q")


# (granularity, static scale or None, group size) of every mode the kernels have
MODES = [("tensor", None, 128), ("tensor", torch.tensor(0.37), 128), ("token", None, 128),
         ("group", None, 128), ("group", None, 64)]


def test_the_build_is_the_cpu_one(lib):
    assert lib.archs == ("cpu",) and lib.info["abi"] == "1"
    assert lib.info["variants.quantize"] == "0" and lib.info["variants.quantize_group"] == "0"


@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("dtype", Q_DTYPES)
def test_random_inputs_every_mode(provider, lib, x_dtype, dtype):
    """Random data, two shapes per mode: 16 x 256 (16-byte vectors) and 37 x 300 (one element at a
    time: 300 is no multiple of 8), plus a single row and a single column."""
    gen = torch.Generator().manual_seed(7)
    for shape in ((16, 256), (37, 300), (1, 7), (5, 1)):
        x = (torch.randn(shape, generator=gen) * 4).to(x_dtype)
        for granularity, scale, group in MODES:
            check(provider, lib, x, dtype, granularity, scale, group=group)


@pytest.mark.parametrize("x_dtype", X_DTYPES)
def test_sliced_rows_and_batches(provider, lib, x_dtype):
    """Row strides beyond the row (a column slice), a misaligned start (16-byte loads refused), and
    leading batch dimensions."""
    gen = torch.Generator().manual_seed(8)
    wide = (torch.randn(24, 640, generator=gen) * 30).to(x_dtype)
    cases = {"column slice": wide[:, 128:384], "odd offset": wide[:, 3:261], "every other row": wide[::2, :256],
             "batched": wide.reshape(3, 8, 640)[..., :512]}
    for name, x in cases.items():
        for dtype in (qd.E4M3_FNUZ, qd.E4M3, torch.int8):
            for granularity, scale, group in MODES:
                check(provider, lib, x, dtype, granularity, scale, group=group, what=name)


@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("dtype", Q_DTYPES)
def test_non_finite_corpus(provider, lib, x_dtype, dtype):
    """NaN, inf, all-NaN, all-zero, -0, subnormal, saturating and huge rows (tests/nonfinite_corpus.py),
    every mode, with and without scale_ub."""
    x = corpus(torch.Generator().manual_seed(3)).to(x_dtype)
    for granularity, scale, group in MODES + [("tensor", torch.tensor(1.0), 128), ("tensor", torch.tensor(1e-30), 128)]:
        check(provider, lib, x, dtype, granularity, scale, group=group, what="corpus")
    for granularity, ub in (("tensor", 3.0), ("token", 3.0), ("token", math.inf), ("token", math.nan)):
        ub_tensor = torch.tensor(ub)
        if not math.isfinite(ub):  # the API refuses these on the host; the kernels must still poison
            q, s = torch.empty(x.shape, dtype=dtype), torch.empty(x.shape[0], 1)
            lib.quantize(x, q, s, rocm_native.DYNAMIC_TOKEN, ub_tensor)
            want_q, want_s = reference_quantize(x, dtype, "token", None, ub_tensor, 128, BLOCK)
            same_bits(s, want_s, f"scale_ub {ub} scale")
            same_bits(q, want_q, f"scale_ub {ub} q")
        else:
            check(provider, lib, x, dtype, granularity, scale_ub=ub_tensor, what=f"scale_ub {ub}")


@pytest.mark.parametrize("x_dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("dtype", Q_DTYPES)
def test_every_16_bit_input(provider, lib, x_dtype, dtype):
    """All 65536 bit patterns of bf16 and fp16 (NaNs, infinities, subnormals, both zeros), statically
    with scale 1 (the encoder sees each value itself) and dynamically per token and per group."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(x_dtype).reshape(256, 256)
    for granularity, scale, group in (("tensor", torch.tensor(1.0), 128), ("token", None, 128), ("group", None, 64)):
        check(provider, lib, x, dtype, granularity, scale, group=group, what="every pattern")


def fp8_ties(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of an fp8 format, the midpoints between neighbours (the ties of round-to-
    nearest-even) and the fp32 values just either side of each: all within +-qmax."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    values = values[torch.isfinite(values)].unique()
    mids = ((values[1:].double() + values[:-1].double()) / 2).float()  # exact: they fit fp32
    up = torch.nextafter(mids, torch.tensor(math.inf))
    down = torch.nextafter(mids, torch.tensor(-math.inf))
    return torch.cat([values, mids, up, down])


def rows_of(values: torch.Tensor, cols: int = 64) -> torch.Tensor:
    return torch.cat([values, values.new_zeros((-values.numel()) % cols)]).reshape(-1, cols)


@pytest.mark.parametrize("dtype", Q_DTYPES[:4])
def test_fp8_rounding_boundaries(provider, lib, dtype):
    qmax = qd.qmax(dtype)
    past = torch.tensor([qmax * 1.0625, qmax * 2, 1e30, math.inf, -math.inf, -qmax * 1.0625, math.nan])
    x = rows_of(torch.cat([fp8_ties(dtype), past]))
    for scale in (torch.tensor(1.0), torch.tensor(0.25)):
        check(provider, lib, x, dtype, "tensor", scale, what="ties")
    # The same ties as a dynamic token's quotients: every row's amax is made qmax / 8, so the scale is
    # exactly 1/8 and the quotients are the values themselves.
    rows = rows_of(fp8_ties(dtype)) / 8
    rows[:, -1] = qmax / 8
    q, s = run(provider, lib, rows, dtype, "token")
    assert (s == 0.125).all()
    check(provider, lib, rows, dtype, "token", what="ties")


@pytest.mark.parametrize("x_dtype", (torch.float32, torch.bfloat16))
def test_group_shapes_and_scale_rows(lib, x_dtype):
    """Group sizes that do not divide the row (a short last group), groups wider than the register
    cache, and a scale tensor whose rows lie apart in a wider buffer (ld_scale > groups)."""
    gen = torch.Generator().manual_seed(5)
    for rows, cols, group in ((9, 300, 128), (9, 300, 64), (4, 200, 48), (3, 77, 1), (2, 5000, 4096), (6, 40, 100)):
        x = (torch.randn(rows, cols, generator=gen) * 9).to(x_dtype)
        groups = -(-cols // group)
        for dtype in (qd.E4M3_FNUZ, qd.E5M2, torch.int8):
            q = torch.empty(rows, cols, dtype=dtype)
            wide = torch.full((rows, groups + 3), -7.0)
            lib.quantize_group(x, q, wide[:, 1:1 + groups], group)
            want_q, want_s = reference_quantize(x, dtype, "group", None, None, group, BLOCK)
            same_bits(wide[:, 1:1 + groups], want_s, f"group {group} scale")
            same_bits(q, want_q, f"group {group} q")
            assert (wide[:, 0] == -7).all() and (wide[:, 1 + groups:] == -7).all(), "wrote outside the scales"


@pytest.mark.parametrize("x_dtype", (torch.float32, torch.bfloat16, torch.float16))
def test_long_rows_and_many_rows(provider, lib, x_dtype):
    """Rows longer than the per-token register cache (read twice), and more rows than the grid has
    blocks (the test build caps grids at a few blocks)."""
    gen = torch.Generator().manual_seed(6)
    for shape in ((2, 40000), (700, 24)):
        x = (torch.randn(shape, generator=gen) * 3).to(x_dtype)
        for granularity, scale, group in MODES:
            check(provider, lib, x, qd.E4M3_FNUZ, granularity, scale, group=group, what="long/many")


def test_q_rows_apart_and_workspace(lib):
    """q written into a wider buffer (ldq > cols) leaves the bytes between its rows alone; dynamic
    per-tensor gives the same with and without a workspace."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(20, 96, generator=gen).to(torch.bfloat16)
    want_q, want_s = reference_quantize(x, qd.E4M3_FNUZ, "tensor", None, None, 128, BLOCK)
    for workspace in (None, torch.empty(lib.workspace_size(20, 96, rocm_native.DYNAMIC_TENSOR), dtype=torch.uint8)):
        buf = torch.full((20, 128), 0x5A, dtype=torch.uint8)
        q = buf.view(qd.E4M3_FNUZ)[:, 16:112]
        s = torch.empty(())
        lib.quantize(x, q, s, rocm_native.DYNAMIC_TENSOR, None, workspace)
        same_bits(s, want_s, "scale")
        same_bits(q, want_q, "q")
        assert (buf[:, :16] == 0x5A).all() and (buf[:, 112:] == 0x5A).all(), "wrote outside q"


def test_invalid_static_scales_poison_q(lib):
    """Scales the host refuses when it can read them (0, negative, inf, NaN) make every q the format's
    NaN (0 in int8) when they reach the kernels."""
    x = torch.randn(4, 64)
    for bad in (0.0, -1.0, math.inf, math.nan):
        for dtype in Q_DTYPES:
            q = torch.empty(x.shape, dtype=dtype)
            lib.quantize(x, q, torch.tensor(bad), rocm_native.STATIC_TENSOR)
            want_q, _ = reference_quantize(x, dtype, "tensor", torch.tensor(bad), None, 128, BLOCK)
            same_bits(q, want_q, f"static scale {bad}")


def test_bad_arguments_are_refused_with_the_rule(lib):
    """The binding names the argument and the rule; the library's own checks answer calls that get
    past it (here, made directly)."""
    x, q, s = torch.randn(4, 64), torch.empty(4, 64, dtype=qd.E4M3_FNUZ), torch.empty(4)
    cases = [
        (lambda: lib.quantize(x, q[:, :32], s, rocm_native.DYNAMIC_TOKEN), ValueError, "q: must be [4, 64]"),
        (lambda: lib.quantize(x, q, s[:3], rocm_native.DYNAMIC_TOKEN), ValueError, "scale: must be a contiguous"),
        (lambda: lib.quantize(x, q, s, 7), ValueError, "mode: must be one of"),
        (lambda: lib.quantize(x.t(), q.t(), s, rocm_native.DYNAMIC_TOKEN), ValueError, "x: must have unit column"),
        (lambda: lib.quantize(x.double(), q, s, rocm_native.DYNAMIC_TOKEN), TypeError,
         "x: dtype must be one of"),
        (lambda: lib.quantize(x, q.view(torch.uint8), s, rocm_native.DYNAMIC_TOKEN), TypeError,
         "q: dtype must be one of"),
        (lambda: lib.quantize(x, q, s[:1], rocm_native.STATIC_TENSOR, torch.tensor(1.0)), ValueError,
         "scale_ub: applies to the dynamic modes only"),
        (lambda: lib.quantize_group(x, q, torch.empty(4, 1), 0), ValueError, "group: must be an int in"),
        (lambda: lib.quantize_group(x, q, torch.empty(4, 2), 128), ValueError, "scale: must be float32 [4, 1]"),
        (lambda: lib.quantize(x.expand(4, 64)[:1].expand(4, 64), q, s, rocm_native.DYNAMIC_TOKEN), ValueError,
         "x: rows must not overlap"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text.replace("[", r"\[").replace("]", r"\]")):
            call()
    buf = lib._errbuf()
    st = lib._lib.qb_quantize(x.data_ptr(), 32, q.data_ptr(), 64, s.data_ptr(), 4, 64, 0, 7, 2, None, None, None,
                              buf, len(buf))
    assert st == 1 and "ldx (=32) and ldq (=64) must be >= cols (=64)" in buf.value.decode()
    st = lib._lib.qb_quantize(x.data_ptr(), 64, q.data_ptr(), 64, s.data_ptr(), 4, 64, 0, 6, 2, None, None, None,
                              buf, len(buf))
    assert st == 1 and "q_dtype 6 must be" in buf.value.decode()
    st = lib._lib.qb_quantize_group(x.data_ptr(), 64, q.data_ptr(), 64, s.data_ptr(), 0, 4, 64, 32, 0, 7, None,
                                    buf, len(buf))
    assert st == 1 and "ld_scale (=0) must be >= ceil(cols / group) (=2)" in buf.value.decode()
