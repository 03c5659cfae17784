"""The one GPU timing method of every benchmark here: CUDA-graph replay, and interleaved rounds in a
balanced order.

Why rounds in a balanced order: under sustained GEMM load the H200 sits at its 700 W power limit and
its SM clock wanders (1.2 to 1.75 GHz seen within one minute), so a timing can depend on when it
runs and on what ran just before it. Timing candidates one after the other, or always in the same
order, hands that drift to some of them. `interleaved` times every candidate once per round, in
the orders of a Williams design: each candidate comes first in one round and directly follows each
other candidate equally often. Each candidate's median over the rounds is reported.
"""
from __future__ import annotations

import statistics

import torch

TARGET_MS = 20.0


def captured(fns: list) -> tuple:
    """(graph, milliseconds per replay): one call of each fns[i]() captured in one CUDA graph, after a
    warm-up on a side stream; the first replay (setup) is not the one timed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    st.record()
    g.replay()
    en.record()
    torch.cuda.synchronize()
    return g, max(st.elapsed_time(en), 1e-3)


def graph_time(fns: list, target_ms: float = TARGET_MS) -> float:
    """Median microseconds per call of fns[i]() (each one call), replayed from one CUDA graph."""
    g, one = captured(fns)
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = max(1, min(200, int(target_ms / one)))
    ts = []
    for _ in range(5):
        st.record()
        for _ in range(reps):
            g.replay()
        en.record()
        torch.cuda.synchronize()
        ts.append(st.elapsed_time(en) * 1e3 / reps / len(fns))
    del g
    return statistics.median(ts)


def balanced_orders(n: int) -> list:
    """A Williams design over range(n): n orders (2n when n is odd) in which every index comes first
    once (twice) and directly follows every other index exactly once (twice)."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(i + shift) % n for i in first] for shift in range(n)]
    return orders + [o[::-1] for o in orders] if n % 2 else orders


def interleaved(timers: dict, rounds: int = 0) -> dict:
    """{label: median microseconds} of timers {label: () -> microseconds}, each timed once per round.
    rounds = 0: one full balanced design (n rounds, 2n for odd n); fewer: its first `rounds` orders,
    more: the design repeated."""
    labels = list(timers)
    orders = balanced_orders(len(labels))
    times = {label: [] for label in labels}
    for r in range(rounds or len(orders)):
        for i in orders[r % len(orders)]:
            times[labels[i]].append(timers[labels[i]]())
    return {label: statistics.median(ts) for label, ts in times.items()}
