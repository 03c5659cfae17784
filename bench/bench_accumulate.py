"""accumulate="fast" against "precise": time and error of FP8 W8A8 (per-token x per-channel, bf16 out)
through qbackend.linear, on the scaled_mm grid's shapes at M = 16 and 4096.

    python bench/bench_accumulate.py --out bench/results/accumulate_h200.json

Each mode's weight is prepared for it (qbackend.prepare_weight(..., accumulate=mode)), so each runs
the provider the selection gives it (see the "provider" field). Time: CUDA-graph replay over weight
copies rotated past the L2, the two modes in interleaved rounds (qbackend/benchmark.py). Error:
max|out - ref| / max|ref| against the float64 product of the dequantized operands, on the first copy.
"""
import argparse
import json
import os
from functools import partial

import torch

import qbackend
from qbackend.benchmark import graph_time, interleaved, weight_copies

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192),
          (57344, 8192), (8192, 28672)]
MODES = ("fast", "precise")
E4M3 = torch.float8_e4m3fn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", default="16,4096")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for N, K in SHAPES:
        copies = weight_copies(N * K)
        ws = [qbackend.quantize(torch.randn(N, K, device="cuda", generator=g) / K ** 0.5, E4M3, "channel")
              for _ in range(copies)]
        prepared = {m: [qbackend.prepare_weight(q, s, E4M3, "token", accumulate=m) for q, s in ws] for m in MODES}
        for M in (int(m) for m in args.ms.split(",")):
            qx, sx = qbackend.quantize(torch.randn(M, K, device="cuda", generator=g), E4M3, "token")
            q0, s0 = ws[0]
            ref = (qx.double() * sx.double()) @ (q0.double() * s0.double()).t()
            timers, errors = {}, {}
            for m in MODES:
                out = qbackend.linear(qx, prepared[m][0], sx)
                errors[m] = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                timers[m] = partial(graph_time, [lambda pw=pw: qbackend.linear(qx, pw, sx) for pw in prepared[m]],
                                    5.0)
            med = interleaved(timers)
            for m in MODES:
                rows.append({"M": M, "N": N, "K": K, "accumulate": m, "provider": prepared[m][0].provider,
                             "us": med[m], "tflops": 2 * M * N * K / med[m] / 1e6, "max_err": errors[m]})
            print(f"M={M:5d} N={N:5d} K={K:5d} " + "  ".join(
                f"{m} ({prepared[m][0].provider}) {med[m]:9.2f}us err {errors[m]:.2e}" for m in MODES)
                + f"  precise/fast time x{med['precise'] / med['fast']:.3f}", flush=True)
        del ws, prepared
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
