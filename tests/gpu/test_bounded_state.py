"""Long runs on a GPU keep bounded state: 20,000 calls over 2,000 distinct M values through the native
providers (cutlass quantize and FP8 / INT8 GEMMs, marlin W8A16, a prepared weight through linear)
leave every cache within its bound (docs/selection.md, "State and caches"), and after a warm-up
pass over every M neither the host memory Python allocates (tracemalloc) nor the GPU memory torch
holds for live tensors (torch.cuda.memory_allocated) grows."""
import gc
import tracemalloc

import pytest
import torch

import qbackend
from qbackend import bounded, registry

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DEV = "cuda"
E4M3 = torch.float8_e4m3fn
DISTINCT_M, CALLS, K, N = 2000, 20000, 256, 128


def _operands():
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(DISTINCT_M, K, device=DEV, generator=g, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=DEV, generator=g)
    w8, ws = qbackend.quantize(w, E4M3, "channel")
    wi, wis = qbackend.quantize(w, torch.int8, "channel")
    prepared = qbackend.prepare_weight(w8, ws, activation=torch.bfloat16)   # W8A16
    return x, w8, ws, wi, wis, prepared


def _call(i, x, w8, ws, wi, wis, prepared):
    M = i % DISTINCT_M + 1
    kind = i % 4
    if kind == 0:
        q, s = qbackend.quantize(x[:M], E4M3, "token")
        return qbackend.scaled_mm(q, w8.t(), s, ws.t())
    if kind == 1:
        q, s = qbackend.quantize(x[:M], torch.int8, "token")
        return qbackend.scaled_mm(q, wi.t(), s, wis.t())
    if kind == 2:
        return qbackend.linear(x[:M], prepared)
    return qbackend.scaled_mm(x[:M], w8.t(), None, ws.t())     # W8A16 without preparing


def _check_bounds():
    for name, (size, bound) in bounded.sizes().items():
        assert size <= bound, f"{name}: {size} entries, bound {bound}"
    assert len(registry.get()._cache) <= 16


def test_many_shapes_keep_host_and_gpu_state_bounded(recwarn):
    registry.reload()
    ops = _operands()
    for i in range(CALLS - 2 * DISTINCT_M):
        _call(i, *ops)
    torch.cuda.synchronize()
    tracemalloc.start()
    try:
        for i in range(CALLS - 2 * DISTINCT_M, CALLS - DISTINCT_M):
            _call(i, *ops)
        torch.cuda.synchronize()
        _check_bounds()
        gc.collect()
        host_before = tracemalloc.get_traced_memory()[0]
        gpu_before = torch.cuda.memory_allocated()
        for i in range(CALLS - DISTINCT_M, CALLS):
            _call(i, *ops)
        torch.cuda.synchronize()
        gc.collect()
        host_grown = tracemalloc.get_traced_memory()[0] - host_before
        gpu_grown = torch.cuda.memory_allocated() - gpu_before
    finally:
        tracemalloc.stop()
    _check_bounds()
    names = sorted({d.name for d in registry.get()._cache._data.values()})  # who served, for the message
    assert host_grown < 64 * 1024, f"host memory grew by {host_grown} bytes ({names})"
    assert gpu_grown == 0, f"GPU memory grew by {gpu_grown} bytes ({names})"
