"""Interleaved A/B of two builds of libqbackend_cuda on the same scaled_mm calls.

    python bench/ab_libs.py OLD.so NEW.so [--ms 1,16,32] [--shapes N:K,...] [--rounds 5]
                            [--force CONFIG[:SPLITS]]

A process loads one library, so each build runs in a worker process of its own; the workers take
turns on the GPU, one timing at a time, each candidate once per round in the orders of
benchmark.interleaved (a balanced design), every timing as benchmark.graph_time (CUDA-graph replay, weights
rotated past L2). cuBLASLt tensorwise is timed too (in the first worker), as the reference the
issue-3 targets use. Both workers make the same weights and activations (the same seeds). --force
times a config by name in both builds instead of the dispatcher's choice (SPLITS: the split-K
factor, or for the small-M kernel "stream_*" its cluster size). Prints one line per point: each
candidate's median in microseconds, and new against old.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def worker(lib: str, force: str, conn) -> None:
    """Serves ("setup", N, K), ("time", M, impl) and ("quit",) over conn, with `lib` loaded."""
    os.environ["QBACKEND_CUDA_LIB"] = lib
    import torch
    from bench_scaled_mm import F8, Problem

    from qbackend.benchmark import graph_time
    from qbackend_providers import native

    if native.load() is None:
        conn.send(f"error: {native.load_error()}")
        return
    if force:
        name, _, splits = force.partition(":")
        native.override(native.config_names(F8, 90).index(name), 0, int(splits or -1), -1)
    conn.send("ready")
    prob, inputs = None, {}
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            return
        if msg[0] == "setup":
            prob, inputs = None, {}
            torch.cuda.empty_cache()
            prob = Problem(msg[1], msg[2], want_bf16=False)
            conn.send("ok")
        else:
            M, impl = msg[1], msg[2]
            if M not in inputs:
                inputs[M] = prob.inputs(M)
            ab, af, sa = inputs[M]
            conn.send(graph_time(prob.fns(impl, M, ab, af, sa), target_ms=8.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--ms", default="1,16,32")
    ap.add_argument("--shapes", default="", help="N:K,N:K,... (default: the issue-3 list)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--force", default="", help="CONFIG[:SPLITS] timed in both builds instead of the automatic choice")
    args = ap.parse_args()
    from bench_scaled_mm import shapes_arg

    from qbackend.benchmark import interleaved

    shapes = shapes_arg(args.shapes)
    ctx = mp.get_context("spawn")
    conns = []
    for lib in (args.old, args.new):
        here, there = ctx.Pipe()
        ctx.Process(target=worker, args=(os.path.abspath(lib), args.force, there), daemon=True).start()
        reply = here.recv()
        if reply != "ready":
            sys.exit(f"{lib}: {reply}")
        conns.append(here)

    def ask(conn, *msg):
        conn.send(msg)
        return conn.recv()

    for N, K in shapes:
        for c in conns:
            ask(c, "setup", N, K)
        for M in (int(m) for m in args.ms.split(",")):
            med = interleaved({"old": lambda M=M: ask(conns[0], "time", M, "qbackend.cutlass"),
                               "new": lambda M=M: ask(conns[1], "time", M, "qbackend.cutlass"),
                               "tensorwise": lambda M=M: ask(conns[0], "time", M, "torch._scaled_mm.tensorwise")},
                              args.rounds)
            print(f"M={M} N={N} K={K} " + " ".join(f"{k}={v:.2f}" for k, v in med.items()) +
                  f" | new/old x{med['new'] / med['old']:.3f}, new at x{med['tensorwise'] / med['new']:.3f} of "
                  f"tensorwise", flush=True)
    for c in conns:
        c.send(("quit",))


if __name__ == "__main__":
    main()
