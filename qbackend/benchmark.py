"""The one GPU timing method of every qbackend benchmark (`qbackend bench` and the scripts in bench/):
CUDA-graph replay, interleaved rounds in a balanced order, and weights and activations made as a
model has them.

Why CUDA graphs: at small M one call is a few microseconds of GPU work behind more host time
(argument checks, the launch), so eager timing measures the host. A graph of R calls over R
different weight copies, replayed, measures the GPU, and copies totalling well over the L2 make
every call read its weight from HBM as a model's layers do.

Why rounds in a balanced order: under sustained GEMM load the H200 sits at its 700 W power limit and
its SM clock wanders (1.2 to 1.75 GHz seen within one minute), so a timing can depend on when it
runs and on what ran just before it. Timing candidates one after the other, or always in the same
order, hands that drift to some of them. `interleaved` times every candidate once per round, in
the orders of a Williams design: each candidate comes first in one round and directly follows each
other candidate equally often. Each candidate's median over the rounds is reported.
"""
from __future__ import annotations

import math
import re
import statistics

import torch

from .api import quantize
from .problem import PROBLEM_KINDS
from .weights import _aligned_rows

TARGET_MS = 20.0
ROTATE_BYTES = 512 * 2**20   # weight copies rotated per timing: several times a GPU's L2


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


def graph_time(fns: list, target_ms: float = TARGET_MS, trials: int = 5) -> float:
    """Median microseconds per call of fns[i]() (each one call), replayed from one CUDA graph:
    `trials` trials of about target_ms each."""
    g, one = captured(fns)
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = max(1, min(200, int(target_ms / one)))
    ts = []
    for _ in range(trials):
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


def weight_copies(copy_bytes: int, total_bytes: int = ROTATE_BYTES, most: int = 16) -> int:
    """How many copies of a weight of copy_bytes to rotate through so that together they make
    total_bytes: at least 2, at most `most` (a tiny weight stays in L2 whatever the count)."""
    return max(2, min(most, total_bytes // copy_bytes))


def checkpoint_weight(kind: str, N: int, K: int, g: torch.Generator, fp8: torch.dtype = torch.float8_e4m3fn):
    """(quantized [N, K] weight, its scale as a checkpoint stores it, activation dtype, activation
    granularity) for a problem kind (qbackend.PROBLEM_KINDS), on the generator's device. fp8: the
    device's fp8 dtype (qbackend.native_fp8_dtype)."""
    w = torch.randn(N, K, device=g.device, generator=g) / math.sqrt(K)
    if kind == "fp8_w8a8_per_tensor":
        q, s = quantize(w, fp8, "tensor")
        return q, s, fp8, "tensor"
    if kind == "fp8_w8a8_per_token_channel":
        q, s = quantize(w, fp8, "channel")
        return q, s, fp8, "token"
    if kind == "fp8_w8a16":
        q, s = quantize(w, fp8, "channel")
        return q, s, torch.bfloat16, "tensor"
    if kind == "int8_w8a8":
        q, s = quantize(w, torch.int8, "channel")
        return q, s, torch.int8, "token"
    if kind == "fp8_block":
        q, s = quantize(w, fp8, "block")   # 128 x 128 weight blocks
        return q, s, fp8, "group"
    raise ValueError(f"kind: unknown problem kind {kind!r}; known: {', '.join(PROBLEM_KINDS)}")


def activation(M: int, K: int, act_dtype: torch.dtype, granularity: str, g: torch.Generator):
    """(a, scale_a) as a layer receives them: bf16/fp16 as is for W8A16 (scale None), else
    quantized to act_dtype with `granularity` scales; rows 16-byte aligned, as an engine pads them
    where K is not a multiple of 16 bytes."""
    if act_dtype in (torch.bfloat16, torch.float16):
        return _aligned_rows(torch.randn(M, K, device=g.device, generator=g, dtype=act_dtype)), None
    x = torch.randn(M, K, device=g.device, generator=g, dtype=torch.bfloat16)
    a, scale = quantize(x, act_dtype, granularity)
    return _aligned_rows(a), scale


def device_tag(device) -> str:
    """The short name results files carry: 'h200' for an NVIDIA H200, 'h100' for an H100, 'cpu' on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    name = torch.cuda.get_device_name(device).replace("NVIDIA", "")
    found = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", name)
    return (found.group(1) if found else re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")).lower()
