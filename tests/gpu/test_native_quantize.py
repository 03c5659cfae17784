"""libqbackend_cuda's quantize kernels, bit-exact against plain torch, on a GPU.

Reference (what the header promises, computed with true IEEE fp32 division on the GPU; note that
torch divides by a *Python float* on CUDA by multiplying with its reciprocal, so the oracle divides
by tensors):
    fp8:  q = clamp(x.float() / scale, -qmax, qmax).to(fp8)            qmax 448 (e4m3), 57344 (e5m2)
    int8: q = clamp(round(x.float() / scale), -128, 127).to(int8)      round half to even, qmax 127
    dynamic: scale = max(min(amax, scale_ub) / qmax, 1 / (qmax * 512)), amax per tensor or per row.
Every case checks the bytes of q and the bits of the scales for equality, over bf16/fp16/fp32 inputs,
row strides larger than cols, rows that take the 16-byte path and rows that cannot (odd cols, odd
offsets), rows longer than the per-token kernel's register cache, and scale_ub on and off. q is
poisoned (0x7f bytes: NaN for fp8) before each call.
"""

import pytest
import torch

from qbackend_providers import native

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if native.load() is None:
    pytest.skip(f"native library unavailable: {native.load_error()}", allow_module_level=True)

DEV = "cuda"
QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0, torch.int8: 127.0}
X_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
Q_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8]
# (rows, cols, row stride extra, element offset): 16-byte path, scalar path (odd cols / offsets),
# sliced rows, long rows (past the per-token register cache), a single row.
SHAPES = [(1, 16, 0, 0), (3, 4096, 0, 0), (17, 1000, 0, 0), (64, 14336, 0, 0), (33, 4104, 24, 8),
          (5, 20000, 0, 0), (7, 1001, 3, 1), (256, 512, 64, 0), (2, 40000, 0, 0)]
# many rows: blocks of the per-token kernels own several rows each
TOKEN_SHAPES = SHAPES + [(3000, 4096, 0, 0), (2500, 1000, 8, 0)]


def _x(rows, cols, extra, offset, dtype, g):
    base = torch.randn(rows, cols + extra + offset, device=DEV, generator=g, dtype=torch.float32) * 3
    base[:, ::97] *= 40  # outliers, so static scales saturate some values
    base = base.to(dtype)
    return base[:, offset:offset + cols]


def _div(a, b):
    """IEEE fp32 division (b a tensor, never a Python float: see the module docstring)."""
    return torch.div(a, b)


def _quant_ref(x, scale, qdtype):
    v = _div(x.float(), scale)
    if qdtype == torch.int8:
        return torch.round(v).clamp(-128, 127).to(torch.int8)
    q = QMAX[qdtype]
    return v.clamp(-q, q).to(qdtype)


def _scale_ref(amax, qdtype, ub):
    if ub is not None:
        amax = torch.minimum(amax, ub)
    q = QMAX[qdtype]
    return torch.maximum(_div(amax, torch.full_like(amax, q)), torch.full_like(amax, 1.0 / (q * 512.0)))


def _same_bits(a, b, what):
    av, bv = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    if not torch.equal(av, bv):
        bad = (av != bv).nonzero()
        i = tuple(bad[0].tolist())
        pytest.fail(f"{what}: {bad.shape[0]} bytes differ; first at {i}: "
                    f"got {av[i].item():#x} want {bv[i].item():#x}")


def _q(rows, cols, qdtype):
    q = torch.empty(rows, cols, device=DEV, dtype=qdtype)
    q.view(torch.uint8).fill_(0x7F)
    return q


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("qdtype", Q_DTYPES, ids=str)
@pytest.mark.parametrize("xdtype", X_DTYPES, ids=str)
def test_static_tensor(xdtype, qdtype, shape):
    g = torch.Generator(device=DEV)
    g.seed()
    rows, cols, extra, offset = shape
    x = _x(rows, cols, extra, offset, xdtype, g)
    scale = (x.float().abs().amax() / QMAX[qdtype] / 2).reshape(1)  # half the range: some values saturate
    q = _q(rows, cols, qdtype)
    native.quantize(x, q, scale, native.STATIC_TENSOR)
    _same_bits(q, _quant_ref(x, scale, qdtype), f"static {xdtype}->{qdtype} {shape}")


@pytest.mark.parametrize("use_ws", [True, False], ids=["workspace", "no-workspace"])
@pytest.mark.parametrize("ub", [None, 2.5])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("qdtype", Q_DTYPES, ids=str)
@pytest.mark.parametrize("xdtype", X_DTYPES, ids=str)
def test_dynamic_tensor(xdtype, qdtype, shape, ub, use_ws):
    g = torch.Generator(device=DEV)
    g.seed()
    rows, cols, extra, offset = shape
    x = _x(rows, cols, extra, offset, xdtype, g)
    ub_t = torch.tensor([ub], device=DEV) if ub is not None else None
    scale = torch.full((1,), float("nan"), device=DEV)
    ws = None
    if use_ws:
        ws = torch.full((native.quantize_workspace_size(rows, cols, native.DYNAMIC_TENSOR),), 0xAB,
                        dtype=torch.uint8, device=DEV)  # garbage: the library must reset it
    q = _q(rows, cols, qdtype)
    native.quantize(x, q, scale, native.DYNAMIC_TENSOR, ub_t, ws)
    s_ref = _scale_ref(x.float().abs().amax().reshape(1), qdtype, ub_t)
    _same_bits(scale, s_ref, f"dyn-tensor scale {xdtype}->{qdtype} {shape}")
    _same_bits(q, _quant_ref(x, s_ref, qdtype), f"dyn-tensor q {xdtype}->{qdtype} {shape}")


@pytest.mark.parametrize("kernel", [-1, 0, 1], ids=["auto", "block", "pipelined"])
@pytest.mark.parametrize("ub", [None, 2.5])
@pytest.mark.parametrize("shape", TOKEN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("qdtype", Q_DTYPES, ids=str)
@pytest.mark.parametrize("xdtype", X_DTYPES, ids=str)
def test_dynamic_token(xdtype, qdtype, shape, ub, kernel):
    g = torch.Generator(device=DEV)
    g.seed()
    rows, cols, extra, offset = shape
    x = _x(rows, cols, extra, offset, xdtype, g)
    ub_t = torch.tensor([ub], device=DEV) if ub is not None else None
    scale = torch.full((rows, 1), float("nan"), device=DEV)
    q = _q(rows, cols, qdtype)
    native.quantize_override(kernel)
    try:
        native.quantize(x, q, scale, native.DYNAMIC_TOKEN, ub_t)
    finally:
        native.quantize_override()
    s_ref = _scale_ref(x.float().abs().amax(dim=1, keepdim=True), qdtype, ub_t)
    _same_bits(scale, s_ref, f"dyn-token scale {xdtype}->{qdtype} {shape}")
    _same_bits(q, _quant_ref(x, s_ref, qdtype), f"dyn-token q {xdtype}->{qdtype} {shape}")


@pytest.mark.parametrize("row_vecs", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", TOKEN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("xdtype,qdtype", [(torch.bfloat16, torch.float8_e4m3fn), (torch.float32, torch.int8)],
                         ids=str)
def test_dynamic_token_row_vecs(xdtype, qdtype, shape, row_vecs):
    """The block-per-row kernel with each forced number of cached vectors per thread (the automatic
    choice takes one, two or four depending on rows and columns; every depth must give the same bits,
    rows longer than the block's cache included; the scalar path, for odd shapes, always takes four)."""
    g = torch.Generator(device=DEV)
    g.seed()
    rows, cols, extra, offset = shape
    x = _x(rows, cols, extra, offset, xdtype, g)
    scale = torch.full((rows, 1), float("nan"), device=DEV)
    q = _q(rows, cols, qdtype)
    native.quantize_override(0, row_vecs)
    try:
        native.quantize(x, q, scale, native.DYNAMIC_TOKEN)
    finally:
        native.quantize_override()
    s_ref = _scale_ref(x.float().abs().amax(dim=1, keepdim=True), qdtype, None)
    what = f"{row_vecs} vectors per thread, {xdtype}->{qdtype} {shape}"
    _same_bits(scale, s_ref, f"dyn-token scale, {what}")
    _same_bits(q, _quant_ref(x, s_ref, qdtype), f"dyn-token q, {what}")


def test_zero_rows_and_tiny_values():
    # all-zero rows get the minimum scale and zero codes
    x = torch.zeros(4, 64, device=DEV, dtype=torch.bfloat16)
    x[1] = 1e-30
    q = _q(4, 64, torch.float8_e4m3fn)
    s = torch.empty(4, 1, device=DEV)
    native.quantize(x, q, s, native.DYNAMIC_TOKEN)
    s_ref = _scale_ref(x.float().abs().amax(dim=1, keepdim=True), torch.float8_e4m3fn, None)
    _same_bits(s, s_ref, "zero rows scale")
    _same_bits(q, _quant_ref(x, s_ref, torch.float8_e4m3fn), "zero rows q")
    # rows == 0 is a no-op
    native.quantize(x[:0], q[:0], s[:0], native.DYNAMIC_TOKEN)


def test_graph_capture_dynamic_tensor():
    """Dynamic per-tensor (memset + amax + convert) replays inside a CUDA graph on new data."""
    g = torch.Generator(device=DEV)
    g.seed()
    x = torch.randn(1024, 4096, device=DEV, generator=g, dtype=torch.bfloat16)
    q = _q(1024, 4096, torch.float8_e4m3fn)
    s = torch.empty(1, device=DEV)
    ws = torch.empty(native.quantize_workspace_size(1024, 4096, native.DYNAMIC_TENSOR), dtype=torch.uint8,
                     device=DEV)
    st = torch.cuda.Stream()
    with torch.cuda.stream(st):
        native.quantize(x, q, s, native.DYNAMIC_TENSOR, None, ws)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        native.quantize(x, q, s, native.DYNAMIC_TENSOR, None, ws)
    for _ in range(2):
        x.copy_(torch.randn(1024, 4096, device=DEV, generator=g, dtype=torch.bfloat16) * 7)
        graph.replay()
        torch.cuda.synchronize()
        s_ref = _scale_ref(x.float().abs().amax().reshape(1), torch.float8_e4m3fn, None)
        _same_bits(s, s_ref, "graph scale")
        _same_bits(q, _quant_ref(x, s_ref, torch.float8_e4m3fn), "graph q")


def test_quantize_errors():
    x = torch.randn(4, 64, device=DEV)
    q = torch.empty(4, 64, device=DEV, dtype=torch.float8_e4m3fn)
    s = torch.ones(1, device=DEV)
    lib = native.load()
    buf = native._errbuf()
    assert lib.qb_quantize(x.data_ptr(), 64, q.data_ptr(), 64, s.data_ptr(), 4, 64, 0, 3, 9, None, None, None,
                           buf, 1024) == 1 and b"mode" in buf.value
    assert lib.qb_quantize(x.data_ptr(), 32, q.data_ptr(), 64, s.data_ptr(), 4, 64, 0, 3, 0, None, None, None,
                           buf, 1024) == 1 and b"ldx" in buf.value
    assert lib.qb_quantize(None, 64, q.data_ptr(), 64, s.data_ptr(), 4, 64, 0, 3, 0, None, None, None,
                           buf, 1024) == 1
    assert lib.qb_quantize(x.data_ptr() + 2, 64, q.data_ptr(), 64, s.data_ptr(), 4, 64, 0, 3, 0,
                           None, None, None, buf, 1024) == 1 and b"aligned" in buf.value
    assert lib.qb_quantize(x.data_ptr(), 64, q.data_ptr(), 64, s.data_ptr(), 4, 64, 7, 3, 0, None, None, None,
                           buf, 1024) == 1
    torch.cuda.synchronize()
