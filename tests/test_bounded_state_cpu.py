"""Long runs keep bounded state: 20,000 calls over 2,000 distinct M values (a server's changing batch
sizes) leave every cache within its stated bound (docs/selection.md, "State and caches") and the
host memory Python allocates flat after the first pass."""
import gc
import tracemalloc

import pytest
import torch

import qbackend
from qbackend import bounded, registry
from qbackend.bounded import BoundedCache

E4M3 = torch.float8_e4m3fn
DISTINCT_M, CALLS, K, N = 2000, 20000, 32, 16


def test_bounded_cache_drops_the_least_recently_used():
    c = BoundedCache(3)
    for k in "abc":
        c.put(k, k.upper())
    assert c.get("a") == "A"          # a is now the most recent
    c.put("d", "D")
    assert "b" not in c and len(c) == 3 and c.get("a") == "A"
    assert c.get_or_make("e", lambda: "E") == "E" and len(c) == 3
    with pytest.raises(ValueError):
        BoundedCache(0)


def _operands():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(DISTINCT_M, K, generator=g).to(E4M3)
    sa = torch.rand(DISTINCT_M, 1, generator=g) + 0.5
    w = torch.randn(N, K, generator=g).to(E4M3)
    sw = torch.rand(1, N, generator=g) + 0.5
    x = torch.randn(DISTINCT_M, K, generator=g)
    return a, sa, w, sw, x


def _call(i, a, sa, w, sw, x):
    M = i % DISTINCT_M + 1
    if i % 4 == 3:  # a quantize now and then: its decisions are cached too
        q, s = qbackend.quantize(x[:M], E4M3, "token")
        return qbackend.scaled_mm(q, w.t(), s, sw)
    return qbackend.scaled_mm(a[:M], w.t(), sa[:M], sw)


def _check_bounds():
    for name, (size, bound) in bounded.sizes().items():
        assert size <= bound, f"{name}: {size} entries, bound {bound}"
    # The decision cache is keyed by problem kinds, not sizes: a handful here.
    assert len(registry.get()._cache) <= 8


@pytest.fixture
def one_thread():
    """Tiny GEMMs run fastest on one thread (a busy CI machine makes torch's thread pool slow)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("provider,calls", [("reference", CALLS), ("torch", 2 * DISTINCT_M)])
def test_many_shapes_keep_state_bounded(monkeypatch, provider, calls):
    """All the calls for the reference provider, fewer for the torch provider (same caches, same
    code path in the core). tracemalloc (which slows every allocation) watches the last two passes
    over the M values: the first fills whatever is per-process, the second must add nothing."""
    monkeypatch.setenv("QBACKEND_PROVIDER", provider)
    registry.reload()
    ops = _operands()
    for i in range(calls - 2 * DISTINCT_M):
        _call(i, *ops)
    tracemalloc.start()
    try:
        for i in range(calls - 2 * DISTINCT_M, calls - DISTINCT_M):
            _call(i, *ops)
        _check_bounds()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(calls - DISTINCT_M, calls):
            _call(i, *ops)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    _check_bounds()
    # Flat: what stays allocated after another pass over every M is noise (a warnings registry
    # entry, an interned int), not a per-call or per-shape record.
    assert grown < 64 * 1024, f"host memory grew by {grown} bytes over {DISTINCT_M} calls"
