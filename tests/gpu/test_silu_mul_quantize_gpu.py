"""qb_quantize_silu_mul (a MoE layer's SiLU(gate) * up quantized in the same pass), bit-exact against
torch's own SiLU and product on the GPU followed by the reference quantize, through the native entry
point and the public qbackend.silu_mul_quantize; non-finite inputs; graph capture.

Each case poisons q (0x7f bytes) and the scales (NaN) first, then compares bytes and bits.
"""

import pytest
import torch
from nonfinite_corpus import same_bits

import qbackend
from qbackend.ops import silu_mul
from qbackend.validate_grouped import validate_silu_mul_quantize
from qbackend_providers import native
from qbackend_providers.reference import reference_quantize

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if native.load() is None:
    pytest.skip(f"native library unavailable: {native.load_error()}", allow_module_level=True)
if not native.has_quantize_silu_mul():
    pytest.skip("this libqbackend_cuda predates qb_quantize_silu_mul", allow_module_level=True)

DEV = "cuda"
Q_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8]
# (rows, I, group (0: per token), row stride extra, element offset). I = 1001 and the offset of 1
# take the scalar path; 1000 in groups of 64 ends in a short group of 40 on the 16-byte path;
# 40000 per token and groups of 2048 are longer than the register cache.
SHAPES = [(1, 768, 0, 0, 0), (128, 768, 0, 0, 0), (7, 2048, 128, 0, 0), (33, 1408, 0, 0, 0),
          (5, 1001, 0, 0, 0), (6, 1000, 64, 3, 1), (6, 1000, 64, 0, 0), (300, 2048, 128, 0, 0),
          (17, 200, 0, 16, 8), (2, 40000, 0, 0, 0), (3, 4096, 2048, 0, 0)]


def _h(rows, inter, extra, offset, dtype, g):
    """Rows over five decades with a larger column every 97; small enough in fp16 that SiLU(gate) * up
    stays finite (an overflow to inf would quantize every finite value of its granule to 0 and
    compare nothing of the activation's bits: the non-finite test covers that)."""
    base = torch.randn(rows, 2 * inter + extra + offset, device=DEV, generator=g) * 3
    top = 2 if dtype == torch.bfloat16 else 0.5
    base *= torch.logspace(-3, top, rows, device=DEV).reshape(rows, 1)
    base[:, ::97] *= 20
    return base.to(dtype)[:, offset:offset + 2 * inter]


def _native(h, qdtype, group):
    rows, inter = h.shape[0], h.shape[1] // 2
    q = torch.empty(rows, inter, device=DEV, dtype=qdtype)
    q.view(torch.uint8).fill_(0x7F)
    shape = (rows, -(-inter // group)) if group else (rows,)
    scale = torch.full(shape, float("nan"), device=DEV)
    native.quantize_silu_mul(h, q, scale, group)
    return q, scale


def _reference(h, qdtype, group):
    q, s = reference_quantize(silu_mul(h), qdtype, "group" if group else "token", None, None, group or 128, None)
    return q, (s if group else s.reshape(-1))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("hdtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("qdtype", Q_DTYPES, ids=str)
def test_bit_exact_against_torch_silu_then_the_reference_quantize(shape, hdtype, qdtype):
    rows, inter, group, extra, offset = shape
    g = torch.Generator(device=DEV).manual_seed(rows * 7 + inter)
    h = _h(rows, inter, extra, offset, hdtype, g)
    q, s = _native(h, qdtype, group)
    q_ref, s_ref = _reference(h, qdtype, group)
    same_bits(s, s_ref, "scale")
    same_bits(q, q_ref, "q")


@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("hdtype", [torch.bfloat16, torch.float16], ids=str)
def test_non_finite_inputs_as_the_composition(group, hdtype):
    """NaN, +-inf, huge and tiny values in the gate and in up (SiLU(-inf) = -inf / inf is NaN, as
    torch computes it): the fused kernel gives the composition's bits, NaN scales included."""
    h = _h(8, 512, 0, 0, hdtype, torch.Generator(device=DEV).manual_seed(5))
    big = torch.finfo(hdtype).max
    h[0, 3] = float("nan")          # gate NaN
    h[1, 512 + 7] = float("inf")    # up +inf
    h[2, 9] = float("-inf")         # gate -inf
    h[3, 11] = float("inf")         # gate +inf
    h[4, 13], h[4, 512 + 13] = big, big  # overflows to inf in h's dtype
    h[5, :] = 0.0                   # an all-zero activation row
    h[6, 20] = 1e-30                # rounds to 0 or a subnormal
    h[7, 130:140] = -30.0           # SiLU underflows towards -0
    for qdtype in Q_DTYPES:
        q, s = _native(h, qdtype, group)
        q_ref, s_ref = _reference(h, qdtype, group)
        same_bits(s, s_ref, "scale")
        same_bits(q, q_ref, "q")


@pytest.mark.parametrize("granularity", ["token", "group"])
def test_public_api_takes_the_fused_kernel_and_matches_the_composition(granularity):
    g = torch.Generator(device=DEV).manual_seed(11)
    h = torch.randn(512, 2 * 768, device=DEV, generator=g).to(torch.bfloat16)
    problem = validate_silu_mul_quantize(h, torch.float8_e4m3fn, granularity, 128)
    assert qbackend.select(problem, torch.device(DEV)).name == "cutlass"
    q, s = qbackend.silu_mul_quantize(h, torch.float8_e4m3fn, granularity)
    q_ref, s_ref = qbackend.quantize(silu_mul(h), torch.float8_e4m3fn, granularity)
    same_bits(s, s_ref, "scale")
    same_bits(q, q_ref, "q")
    # No activation tensor in between: the only allocations are q and its scales.
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    qbackend.silu_mul_quantize(h, torch.float8_e4m3fn, granularity)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before == 2
    # fp32 h (no fused kernel): the composition, the same bits.
    hf = h.float()
    q, s = qbackend.silu_mul_quantize(hf, torch.float8_e4m3fn, granularity)
    q_ref, s_ref = qbackend.quantize(silu_mul(hf), torch.float8_e4m3fn, granularity)
    same_bits(s, s_ref, "scale")
    same_bits(q, q_ref, "q")


def test_graph_capture_replays_with_new_inputs():
    h = torch.randn(64, 2 * 1536, device=DEV).to(torch.bfloat16)
    q = torch.empty(64, 1536, device=DEV, dtype=torch.float8_e4m3fn)
    s = torch.empty(64, 12, device=DEV)
    native.quantize_silu_mul(h, q, s, 128)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        native.quantize_silu_mul(h, q, s, 128)
    for seed in range(3):
        g = torch.Generator(device=DEV).manual_seed(seed)
        h.copy_(torch.randn(64, 2 * 1536, device=DEV, generator=g) * (seed + 1))
        q.view(torch.uint8).fill_(0x7F)
        s.fill_(float("nan"))
        graph.replay()
        q_ref, s_ref = _reference(h, torch.float8_e4m3fn, 128)
        same_bits(s, s_ref, "scale")
        same_bits(q, q_ref, "q")


def test_bad_arguments_raise_before_any_launch():
    h = torch.randn(3, 512, device=DEV).to(torch.bfloat16)
    q = torch.empty(3, 256, device=DEV, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale must be fp32 \[3, 2\]"):
        native.quantize_silu_mul(h, q, torch.empty(3, 3, device=DEV), 128)
    with pytest.raises(ValueError, match="q must be"):
        native.quantize_silu_mul(h, q[:, :128], torch.empty(3, device=DEV), 0)
    with pytest.raises(ValueError, match=r"h must be 2-D \[rows, 2 \* I\]"):
        native.quantize_silu_mul(h[:, :511], q, torch.empty(3, device=DEV), 0)
    with pytest.raises(ValueError, match="group must be an int >= 0"):
        native.quantize_silu_mul(h, q, torch.empty(3, device=DEV), -1)
    with pytest.raises(RuntimeError, match="x_dtype 0 must be f16"):
        native.quantize_silu_mul(h.float(), q, torch.empty(3, device=DEV), 0)
