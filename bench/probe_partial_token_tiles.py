"""What a partly filled token tile costs: scaled_mm at M from one token tile to the next, against the
same tokens padded to a whole tile (the dispatcher's token tile: 8, 16, 32 or 64 rows up to M = 64,
96 up to 96, else 128).

    python bench/probe_partial_token_tiles.py [--ms 64,72,80,96,112,120,128] [--shapes N:K,...]

Per point (CUDA-graph replay, weights rotated past L2, microseconds per call, as qbackend/benchmark.py):
  auto         the dispatcher's choice at M
  <config>     the swapped 64-row ping-pong configs with 128-, 96- and 64-token tiles, forced
  tensorwise   cuBLASLt (torch._scaled_mm, per-tensor scales)
  padded       the same M tokens in an A of a whole tile's rows, zero past M, run on all its
               rows: no token tile reaches past the end of A
  padded128    the same with 128 rows, where the dispatcher's tile is narrower (64 < M <= 96)
  a_view       M tokens as a row slice of that A: the call sees M rows, like `auto`
  api_plain    qbackend.scaled_mm (the cutlass provider) on the M-row A
  api_whole    qbackend.scaled_mm on the slice of the padded A: where whole_tile_tokens(M) asks for
               it, the provider runs the GEMM on the whole tile, as it does for qbackend.quantize's
               output
  api_copy     the M-row A and its scales copied (two torch copies) into fresh buffers of a whole
               tile's rows, then qbackend.scaled_mm on their first M rows: what padding a plain A
               in every call would cost and gain
--quick times auto, tensorwise, padded, api_plain, api_whole and api_copy only.
A token tile that reaches past the last row of A is filled by the TMA unit, which writes zeros for
the missing rows; the gap between `auto` and `padded` is what that costs.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

import qbackend
from qbackend.benchmark import graph_time
from qbackend_providers import native

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scaled_mm import F8, Problem  # noqa: E402

FORCED = ("swap_64x128x128_ping", "swap_64x96x128_ping", "swap_64x64x128_ping")


def token_tile(M: int) -> int:
    """Rows of the whole token tiles that cover M tokens in the dispatcher's configs."""
    if M <= 64:
        return max(8, 1 << (M - 1).bit_length())
    return 96 if M <= 96 else -(-M // 128) * 128


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="64,72,80,96,112,120,128")
    ap.add_argument("--shapes", default="4096:14336,8192:8192,28672:4096")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if native.load() is None:
        sys.exit(f"native library unavailable: {native.load_error()}")
    names = native.config_names(F8, 90)
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.split(":"))
        prob = Problem(N, K, want_bf16=False)
        for M in (int(m) for m in args.ms.split(",")):
            ab, af, sa = prob.inputs(M)
            res = {"auto": graph_time(prob.fns("qbackend.cutlass", M, ab, af, sa), 8.0)}
            for cfg in () if args.quick else FORCED:
                native.override(names.index(cfg), 0, 1, 1)
                try:
                    res[cfg] = graph_time(prob.fns("qbackend.cutlass", M, ab, af, sa), 8.0)
                finally:
                    native.override()
            res["tensorwise"] = graph_time(prob.fns("torch._scaled_mm.tensorwise", M, ab, af, sa), 8.0)
            rows = token_tile(M)
            top = max(128, rows)
            a_pad = torch.zeros(top, K, device="cuda", dtype=F8)
            a_pad[:M] = af
            s_pad = torch.ones(top, 1, device="cuda")
            s_pad[:M] = sa
            res["padded"] = graph_time(prob.fns("qbackend.cutlass", rows, None, a_pad[:rows], s_pad[:rows]), 8.0)
            if rows < 128 and M > 64 and not args.quick:
                res["padded128"] = graph_time(prob.fns("qbackend.cutlass", 128, None, a_pad, s_pad), 8.0)
            if not args.quick:
                res["a_view"] = graph_time(prob.fns("qbackend.cutlass", M, None, a_pad[:M], s_pad[:M]), 8.0)
            for label, a, s in (("api_plain", af, sa), ("api_whole", a_pad[:M], s_pad[:M])):
                res[label] = graph_time([lambda w=w, a=a, s=s, sb=prob.sb: qbackend.scaled_mm(
                    a, w.t(), s, sb, out_dtype=torch.bfloat16) for w in prob.wf[:prob.reps(M)]], 8.0)

            def copied(w, a=af, s=sa, sb=prob.sb, top=top):
                a2 = torch.empty(top, K, device="cuda", dtype=F8)
                s2 = torch.empty(top, 1, device="cuda")
                a2[:M].copy_(a)
                s2[:M].copy_(s)
                return qbackend.scaled_mm(a2[:M], w.t(), s2[:M], sb, out_dtype=torch.bfloat16)
            res["api_copy"] = graph_time([lambda w=w: copied(w) for w in prob.wf[:prob.reps(M)]], 8.0)
            print(f"M={M} N={N} K={K} " + " ".join(f"{k}={v:.1f}" for k, v in res.items()), flush=True)
        del prob
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
