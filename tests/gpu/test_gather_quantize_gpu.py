"""qb_quantize_gather (a MoE layer's routed rows gathered and quantized in one kernel), bit-exact
against the reference on the gathered rows, through the native entry point and the public
qbackend.gather_quantize; out-of-range indices poison their row's scales without a fault; graph
capture with new routing on every replay.

Each case poisons q (0x7f bytes) and the scales (NaN) first, then compares bytes and bits.
"""

import pytest
import torch
from nonfinite_corpus import same_bits

import qbackend
from qbackend.validate_grouped import validate_gather_quantize
from qbackend_providers import native
from qbackend_providers.reference import reference_quantize

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if native.load() is None:
    pytest.skip(f"native library unavailable: {native.load_error()}", allow_module_level=True)
if not native.has_quantize_gather():
    pytest.skip("this libqbackend_cuda predates qb_quantize_gather", allow_module_level=True)

DEV = "cuda"
Q_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8]
# (tokens, cols, group (0: per token), routed rows, row stride extra, element offset)
SHAPES = [(1, 128, 0, 8, 0, 0), (7, 7168, 128, 56, 0, 0), (33, 2048, 0, 264, 0, 0), (5, 7232, 128, 40, 0, 0),
          (9, 4104, 0, 72, 24, 8), (6, 1001, 64, 48, 3, 1), (300, 4096, 128, 2400, 0, 0),
          (17, 100, 0, 3, 0, 0), (4, 14336, 0, 32, 0, 0)]


def _x(tokens, cols, extra, offset, dtype, g):
    base = torch.randn(tokens, cols + extra + offset, device=DEV, generator=g) * 3
    base *= torch.logspace(-3, 3, tokens, device=DEV).reshape(tokens, 1)
    base[:, ::97] *= 40
    return base.to(dtype)[:, offset:offset + cols]


def _native(x, index, qdtype, group):
    rows, cols = index.numel(), x.shape[1]
    q = torch.empty(rows, cols, device=DEV, dtype=qdtype)
    q.view(torch.uint8).fill_(0x7F)
    shape = (rows, -(-cols // group)) if group else (rows,)
    scale = torch.full(shape, float("nan"), device=DEV)
    native.quantize_gather(x, index, q, scale, group)
    return q, scale


def _reference(x, index, qdtype, group):
    rows = x[index]
    q, s = reference_quantize(rows, qdtype, "group" if group else "token", None, None, group or 128, None)
    return q, (s if group else s.reshape(-1))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("xdtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("qdtype", Q_DTYPES, ids=str)
def test_bit_exact_against_the_reference_on_the_gathered_rows(shape, xdtype, qdtype):
    tokens, cols, group, rows, extra, offset = shape
    g = torch.Generator(device=DEV).manual_seed(tokens * 7 + cols)
    x = _x(tokens, cols, extra, offset, xdtype, g)
    index = torch.randint(0, tokens, (rows,), device=DEV, generator=g)
    q, s = _native(x, index, qdtype, group)
    q_ref, s_ref = _reference(x, index, qdtype, group)
    same_bits(s, s_ref, "scale")
    same_bits(q, q_ref, "q")


@pytest.mark.parametrize("group", [0, 128])
def test_out_of_range_indices_poison_their_rows_and_fault_nothing(group):
    x = torch.randn(10, 1024, device=DEV).to(torch.bfloat16)
    index = torch.tensor([3, 10, -1, 9, 1 << 40, 0], device=DEV)
    q, s = _native(x, index, torch.float8_e4m3fn, group)
    torch.cuda.synchronize()
    good = torch.tensor([0, 3, 5], device=DEV)
    bad = torch.tensor([1, 2, 4], device=DEV)
    assert s[bad].isnan().all()
    q_ref, s_ref = _reference(x, index[good], torch.float8_e4m3fn, group)
    same_bits(s[good], s_ref, "scale")
    same_bits(q[good], q_ref, "q")
    # Through the public API on a GPU (values unchecked there), the same.
    q2, s2 = qbackend.gather_quantize(x, index, granularity="group" if group else "token")
    assert s2[bad].isnan().all() and torch.isfinite(s2[good]).all()


@pytest.mark.parametrize("granularity", ["token", "group"])
def test_public_api_takes_the_fused_kernel_and_matches_quantize(granularity):
    g = torch.Generator(device=DEV).manual_seed(11)
    x = torch.randn(64, 7168, device=DEV, generator=g).to(torch.bfloat16)
    index = torch.randint(0, 64, (512,), device=DEV, generator=g)
    problem = validate_gather_quantize(x, index, torch.float8_e4m3fn, granularity, 128)
    assert qbackend.select(problem, torch.device(DEV)).name == "cutlass"
    q, s = qbackend.gather_quantize(x, index, torch.float8_e4m3fn, granularity)
    q_ref, s_ref = qbackend.quantize(x[index], torch.float8_e4m3fn, granularity)
    same_bits(s, s_ref, "scale")
    same_bits(q, q_ref, "q")
    # No x[index] copy: the kernel's only allocations are q and its scales.
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    qbackend.gather_quantize(x, index, torch.float8_e4m3fn, granularity)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before == 2


def test_graph_capture_replays_with_new_routing():
    x = torch.randn(32, 2048, device=DEV).to(torch.bfloat16)
    index = torch.zeros(256, dtype=torch.int64, device=DEV)
    q = torch.empty(256, 2048, device=DEV, dtype=torch.float8_e4m3fn)
    s = torch.empty(256, device=DEV)
    native.quantize_gather(x, index, q, s, 0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        native.quantize_gather(x, index, q, s, 0)
    for seed in range(3):
        g = torch.Generator(device=DEV).manual_seed(seed)
        x.copy_(torch.randn(32, 2048, device=DEV, generator=g))
        index.copy_(torch.randint(0, 32, (256,), device=DEV, generator=g))
        q.view(torch.uint8).fill_(0x7F)
        s.fill_(float("nan"))
        graph.replay()
        q_ref, s_ref = _reference(x, index, torch.float8_e4m3fn, 0)
        same_bits(s, s_ref, "scale")
        same_bits(q, q_ref, "q")


def test_bad_arguments_raise_before_any_launch():
    x = torch.randn(4, 256, device=DEV).to(torch.bfloat16)
    index = torch.tensor([0, 1, 2], device=DEV)
    q = torch.empty(3, 256, device=DEV, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale must be fp32 \[3, 2\]"):
        native.quantize_gather(x, index, q, torch.empty(3, 3, device=DEV), 128)
    with pytest.raises(ValueError, match="q must be"):
        native.quantize_gather(x, index, q[:, :128], torch.empty(3, device=DEV), 0)
    with pytest.raises(ValueError, match="index must be a contiguous 1-D int64"):
        native.quantize_gather(x, index.int(), q, torch.empty(3, device=DEV), 0)
    with pytest.raises(ValueError, match="index must be a contiguous 1-D int64"):
        native.quantize_gather(x, index.cpu(), q, torch.empty(3, device=DEV), 0)
    with pytest.raises(ValueError, match="group must be an int >= 0"):
        native.quantize_gather(x, index, q, torch.empty(3, device=DEV), -1)
