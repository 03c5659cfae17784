"""Threads on the CPU: 8 threads x 500 mixed calls (quantize, scaled_mm, linear) through the
reference and the torch provider, starting together on a fresh registry (so the first decisions
and the probe are made while other threads ask too); every output equals, bit for bit, the same
call made alone. tests/gpu/test_threads.py does the same with the native providers."""
import threading

import pytest
import torch

import qbackend
from qbackend import probe, registry

E4M3 = torch.float8_e4m3fn
THREADS, CALLS = 8, 500


def make_calls(device="cpu"):
    """[(name, fn)]: each fn() returns a tuple of tensors and depends on nothing but its inputs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g).to(device)
    xb = x.to(torch.bfloat16)
    w = torch.randn(96, 256, generator=g).to(device)
    w8, ws = qbackend.quantize(w, E4M3, "channel")
    wi, wis = qbackend.quantize(w, torch.int8, "channel")
    wblk, wbs = qbackend.quantize(w, E4M3, "block")
    p8 = qbackend.prepare_weight(w8, ws, activation=E4M3)
    p16 = qbackend.prepare_weight(w8, ws, activation=torch.bfloat16)
    calls = []
    for M in (1, 7, 33, 64):
        calls += [
            (f"quantize token e4m3 M={M}", lambda M=M: qbackend.quantize(xb[:M], E4M3, "token")),
            (f"quantize tensor int8 M={M}", lambda M=M: qbackend.quantize(x[:M], torch.int8, "tensor")),
            (f"quantize group e5m2 M={M}", lambda M=M: qbackend.quantize(x[:M], torch.float8_e5m2, "group")),
            (f"fp8 scaled_mm M={M}", lambda M=M: _fp8_mm(xb[:M], w8, ws)),
            (f"int8 scaled_mm M={M}", lambda M=M: _int8_mm(x[:M], wi, wis)),
            (f"block scaled_mm M={M}", lambda M=M: _block_mm(x[:M], wblk, wbs)),
            (f"W8A16 scaled_mm M={M}", lambda M=M: (qbackend.scaled_mm(xb[:M], w8.t(), None, ws.t()),)),
            (f"linear fp8 M={M}", lambda M=M: _fp8_linear(xb[:M], p8)),
            (f"linear W8A16 M={M}", lambda M=M: (qbackend.linear(xb[:M], p16),)),
        ]
    return calls


def _fp8_mm(x, w8, ws):
    q, s = qbackend.quantize(x, E4M3, "token")
    return (qbackend.scaled_mm(q, w8.t(), s, ws.t(), bias=None),)


def _int8_mm(x, wi, wis):
    q, s = qbackend.quantize(x, torch.int8, "token")
    return (qbackend.scaled_mm(q, wi.t(), s, wis.t(), out_dtype=torch.float16),)


def _block_mm(x, wblk, wbs):
    q, s = qbackend.quantize(x, E4M3, "group")
    return (qbackend.scaled_mm(q, wblk.t(), s, wbs.t()),)


def _fp8_linear(x, p8):
    q, s = qbackend.quantize(x, E4M3, "token")
    return (qbackend.linear(q, p8, s),)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits (so NaNs in the same places compare equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def hammer(calls, expected, run_one, threads=THREADS, per_thread=CALLS) -> list:
    """per_thread calls in each of `threads` threads, started together; run_one(t, fn) makes one
    call for thread t. Returns the mismatches and exceptions, as strings."""
    failures, lock = [], threading.Lock()
    start = threading.Barrier(threads)

    def worker(t):
        try:
            start.wait()
            for i in range(per_thread):
                k = (i * 7 + t * 13) % len(calls)
                got = run_one(t, calls[k][1])
                if not all(same(g, e) for g, e in zip(got, expected[k])):
                    with lock:
                        failures.append(f"thread {t} call {i}: {calls[k][0]} differs from the call made alone")
        except BaseException as exc:
            with lock:
                failures.append(f"thread {t}: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return failures


@pytest.fixture
def one_thread():
    """One intra-op thread per call: with 8 Python threads on a small CI machine, torch's own thread
    pool would only make them wait for each other."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("provider", ["reference", "torch"])
def test_threads_match_calls_made_alone(monkeypatch, provider):
    monkeypatch.setenv("QBACKEND_PROVIDER", provider)
    registry.reload()
    calls = make_calls()
    expected = [fn() for _, fn in calls]
    # Fresh state: the threads race to build the registry, probe the device and decide.
    registry._registry = None
    probe.reset()
    failures = hammer(calls, expected, lambda t, fn: fn())
    assert not failures, "\n".join(failures[:20])
