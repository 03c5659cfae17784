"""Threads on a GPU: 8 threads x 500 mixed calls (quantize, scaled_mm FP8 and INT8, W8A16, linear
with prepared weights, marlin W8A16 through a weight prepared for it) through the native providers,
every output compared, bit for bit, with the same call made alone:

- each thread on its own stream (the C side runs concurrently: ctypes releases the GIL);
- all threads on one shared stream;
- CUDA graphs: each thread captures a few calls on its own stream (thread-local capture mode) and
  replays the graph 500 times, checking the outputs after each replay.

Block-scaled calls (served by cuBLASLt through torch) are left out: cuBLAS does not promise the same
bits when several streams run at once."""
import threading

import pytest
import torch
from test_threads_cpu import CALLS, THREADS, hammer, make_calls, same

import qbackend
from qbackend import probe, registry

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DEV = "cuda"
E4M3 = torch.float8_e4m3fn


def _marlin_calls(monkeypatch):
    """W8A16 calls on a weight prepared for marlin (forced at prepare time; linear then uses marlin
    whatever the selection), or none where marlin cannot run."""
    g = torch.Generator(device=DEV).manual_seed(1)
    w8, ws = qbackend.quantize(torch.randn(128, 256, device=DEV, generator=g), E4M3, "channel")
    x = torch.randn(64, 256, device=DEV, generator=g, dtype=torch.float16)
    monkeypatch.setenv("QBACKEND_PROVIDER", "marlin")
    registry.reload()
    try:
        pw = qbackend.prepare_weight(w8, ws, activation=torch.float16)
    finally:
        monkeypatch.delenv("QBACKEND_PROVIDER")
        registry.reload()
    if pw.provider != "marlin":
        return []
    return [(f"marlin linear M={M}", lambda M=M: (qbackend.linear(x[:M], pw),)) for M in (1, 16, 64)]


@pytest.fixture
def calls(monkeypatch, recwarn):
    every = [c for c in make_calls(DEV) if not c[0].startswith("block")] + _marlin_calls(monkeypatch)
    expected = [fn() for _, fn in every]      # alone, on the default stream; also the warm-up
    torch.cuda.synchronize()
    return every, expected


def _fresh_selection():
    """The threads race to build the registry, probe the device and decide."""
    registry._registry = None
    probe.reset()


def test_each_thread_on_its_own_stream(calls):
    every, expected = calls
    streams = [torch.cuda.Stream() for _ in range(THREADS)]
    _fresh_selection()

    def run_one(t, fn):
        with torch.cuda.stream(streams[t]):
            out = fn()
        streams[t].synchronize()
        return out

    failures = hammer(every, expected, run_one)
    assert not failures, "\n".join(failures[:20])


def test_all_threads_on_one_stream(calls):
    every, expected = calls
    shared = torch.cuda.Stream()
    _fresh_selection()

    def run_one(t, fn):
        with torch.cuda.stream(shared):
            out = fn()
        shared.synchronize()
        return out

    failures = hammer(every, expected, run_one)
    assert not failures, "\n".join(failures[:20])


def test_graph_replay_in_every_thread(calls):
    every, expected = calls
    failures, lock = [], threading.Lock()
    start = threading.Barrier(THREADS)

    def worker(t):
        try:
            picks = [(t * 5 + j * 11) % len(every) for j in range(4)]
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):     # warm-up on the capturing stream (its marlin workspace)
                for k in picks:
                    every[k][1]()
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            start.wait()                        # every thread captures at the same time
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                outs = [every[k][1]() for k in picks]
            for i in range(CALLS):
                graph.replay()
                stream.synchronize()
                for k, got in zip(picks, outs):
                    if not all(same(g, e) for g, e in zip(got, expected[k])):
                        with lock:
                            failures.append(f"thread {t} replay {i}: {every[k][0]} differs from the call made alone")
        except BaseException as exc:
            with lock:
                failures.append(f"thread {t}: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert not failures, "\n".join(failures[:20])
