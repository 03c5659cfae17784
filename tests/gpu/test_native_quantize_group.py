"""libqbackend_cuda's per-token-group quantize (qb_quantize_group), bit-exact against the reference
provider run on the same GPU, and the public API routing to it.

Each case poisons q (0x7f bytes) and the scales (NaN) first, then compares the bytes of q and the
bits of every scale (NaN positions included, NaN payloads aside). Shapes cover the 16-byte path
(cols and group multiples of 8 bf16 / 4 fp32 elements), the scalar path (odd cols, odd offsets, a
group the vector width does not divide), a shorter last group (K = 7168 + 64), strided rows and
scale rows, groups of one to 64 vectors (the block-per-row kernel takes a power of two up to 32, the
warp-per-group kernel the rest), rows past the block-per-row kernel's register cache (40960 bf16),
and many rows. Every kernel choice (forced through quantize_override) gives the same bits.
"""

import pytest
import torch
from nonfinite_corpus import same_bits

import qbackend
from qbackend.validate import validate_quantize
from qbackend_providers import native
from qbackend_providers.reference import reference_quantize

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if native.load() is None:
    pytest.skip(f"native library unavailable: {native.load_error()}", allow_module_level=True)

DEV = "cuda"
X_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
Q_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8]
# (rows, cols, group, row stride extra, element offset)
SHAPES = [(1, 128, 128, 0, 0), (3, 7168, 128, 0, 0), (17, 7232, 128, 0, 0), (5, 7232, 64, 0, 0),
          (33, 4104, 128, 24, 8), (7, 1001, 128, 3, 1), (4, 1000, 100, 0, 0), (2, 4096, 512, 0, 0),
          (9, 384, 16, 0, 0), (3000, 2048, 128, 0, 0), (2, 96, 128, 0, 0), (5, 264, 8, 0, 0),
          (3, 4096, 256, 0, 0), (2, 40960, 128, 0, 0), (3, 40960 + 64, 128, 8, 0)]
# (rows, cols, group): shapes for the kernel-choice test, each choice against the automatic one
CHOICE_SHAPES = [(1, 7168, 128), (64, 7232, 128), (700, 4096, 64), (2, 40960 + 64, 128), (9, 4096, 256)]


def _x(rows, cols, extra, offset, dtype, g):
    base = torch.randn(rows, cols + extra + offset, device=DEV, generator=g) * 3
    base *= torch.logspace(-4, 3, rows, device=DEV).reshape(rows, 1)  # scales spanning 1e-4 to 1e3
    base[:, ::97] *= 40
    return base.to(dtype)[:, offset:offset + cols]


def _native(x, qdtype, group, scale_rows_extra=0):
    rows, cols = x.shape
    groups = -(-cols // group)
    q = torch.empty(rows, cols, device=DEV, dtype=qdtype)
    q.view(torch.uint8).fill_(0x7F)
    scale_store = torch.full((rows, groups + scale_rows_extra), float("nan"), device=DEV)
    scale = scale_store[:, :groups]
    native.quantize_group(x, q, scale, group)
    return q, scale


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("xdtype", X_DTYPES, ids=str)
@pytest.mark.parametrize("qdtype", Q_DTYPES, ids=str)
def test_bit_exact_against_the_reference(shape, xdtype, qdtype):
    rows, cols, group, extra, offset = shape
    g = torch.Generator(device=DEV).manual_seed(rows * 7 + cols)
    x = _x(rows, cols, extra, offset, xdtype, g)
    q, s = _native(x, qdtype, group, scale_rows_extra=3)
    torch.cuda.synchronize()
    q_ref, s_ref = reference_quantize(x, qdtype, "group", None, None, group, None)
    assert s.shape == s_ref.shape == (rows, -(-cols // group))
    same_bits(s, s_ref, "scale")
    same_bits(q, q_ref, "q")


@pytest.mark.parametrize("shape", CHOICE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("xdtype", X_DTYPES, ids=str)
def test_every_kernel_choice_gives_the_same_bits(shape, xdtype):
    rows, cols, group = shape
    g = torch.Generator(device=DEV).manual_seed(rows + cols)
    x = _x(rows, cols, 0, 0, xdtype, g)
    x[0, 5] = float("nan")
    x[-1, cols - 3] = float("inf")
    q_auto, s_auto = _native(x, torch.float8_e4m3fn, group)
    try:
        for kernel, vecs in [(-1, 1), (-1, 2), (-1, 4), (2, 0)]:
            native.quantize_override(kernel, vecs)
            q, s = _native(x, torch.float8_e4m3fn, group)
            same_bits(s, s_auto, f"scale, kernel {kernel}, vecs {vecs}")
            same_bits(q, q_auto, f"q, kernel {kernel}, vecs {vecs}")
    finally:
        native.quantize_override()
    q_ref, s_ref = reference_quantize(x, torch.float8_e4m3fn, "group", None, None, group, None)
    same_bits(s_auto, s_ref, "scale")
    same_bits(q_auto, q_ref, "q")


@pytest.mark.parametrize("qdtype", Q_DTYPES, ids=str)
def test_non_finite_values_follow_the_reference(qdtype):
    """NaN in a group gives that group a NaN scale (and NaN / 0 bytes); inf an inf scale; all-zero
    groups the minimum scale; subnormals and values past qmax saturate as the reference does."""
    x = torch.randn(6, 7232, device=DEV)
    x[0, 5] = float("nan")
    x[1, 200] = float("inf")
    x[2, 7200] = -float("inf")          # in the shorter last group
    x[3] = 0.0
    x[4, :128] = float("nan")           # an all-NaN group
    x[5, 300:400] = 1e-42               # fp32 subnormals
    x[5, 500] = 3e38
    for xdtype in (torch.float32, torch.bfloat16):
        xx = x.to(xdtype)
        q, s = _native(xx, qdtype, 128)
        q_ref, s_ref = reference_quantize(xx, qdtype, "group", None, None, 128, None)
        same_bits(s, s_ref, f"{xdtype} scale")
        same_bits(q, q_ref, f"{xdtype} q")


def test_public_api_routes_to_the_kernel_and_feeds_the_block_gemm():
    g = torch.Generator(device=DEV).manual_seed(5)
    x = torch.randn(2, 9, 7232, device=DEV, generator=g).to(torch.bfloat16)
    problem = validate_quantize(x, torch.float8_e4m3fn, "group", None, None, 128, (128, 128))
    assert qbackend.select(problem, torch.device(DEV)).name == "cutlass"
    q, s = qbackend.quantize(x, torch.float8_e4m3fn, "group", group_size=128)
    assert s.shape == (2, 9, 57) and s.is_contiguous()
    q_ref, s_ref = reference_quantize(x, torch.float8_e4m3fn, "group", None, None, 128, None)
    same_bits(s, s_ref, "scale")
    same_bits(q, q_ref, "q")
    w = torch.randn(2112, 7232, device=DEV, generator=g)
    qw, sw = qbackend.quantize(w, torch.float8_e4m3fn, "block", block_size=(128, 128))
    out = qbackend.scaled_mm(q.reshape(18, 7232), qw.t(), s.reshape(18, 57), sw.t(), out_dtype=torch.bfloat16)
    ref = qbackend.dequantize(q.reshape(18, 7232), s.reshape(18, 57), torch.float32) @ \
        qbackend.dequantize(qw, sw, torch.float32, block_size=(128, 128)).t()
    assert torch.isfinite(out).all()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, rel


def test_graph_capture_replays_with_new_inputs():
    x = torch.randn(64, 7168, device=DEV).to(torch.bfloat16)
    q = torch.empty(64, 7168, device=DEV, dtype=torch.float8_e4m3fn)
    s = torch.empty(64, 56, device=DEV)
    native.quantize_group(x, q, s, 128)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        native.quantize_group(x, q, s, 128)
    for seed in range(3):
        x.copy_(torch.randn(64, 7168, device=DEV, generator=torch.Generator(device=DEV).manual_seed(seed)))
        q.view(torch.uint8).fill_(0x7F)
        s.fill_(float("nan"))
        graph.replay()
        q_ref, s_ref = reference_quantize(x, torch.float8_e4m3fn, "group", None, None, 128, None)
        same_bits(s, s_ref, "scale")
        same_bits(q, q_ref, "q")


def test_bad_arguments_raise_before_any_launch():
    x = torch.randn(4, 256, device=DEV).to(torch.bfloat16)
    q = torch.empty(4, 256, device=DEV, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale must be fp32 \[4, 2\]"):
        native.quantize_group(x, q, torch.empty(4, 3, device=DEV), 128)
    with pytest.raises(ValueError, match="q must be"):
        native.quantize_group(x, q[:, :128], torch.empty(4, 2, device=DEV), 128)
    with pytest.raises(ValueError, match="group must be a positive int"):
        native.quantize_group(x, q, torch.empty(4, 1, device=DEV), 0)
    with pytest.raises(ValueError, match="scale must be fp32"):
        native.quantize_group(x, q, torch.empty(4, 2, device=DEV, dtype=torch.float16), 128)
