"""What the default selection runs for each problem kind on this GPU, against bf16 torch.mm.

    python bench/bench_selection.py --out DIR [--selections default,torch,reference]
    python bench/bench_selection.py --plot DIR/selection_h200.json      (the PNG and a table, from the JSON)

For each kind (qbackend.problem.PROBLEM_KINDS), (N, K) in {(4096, 4096), (28672, 4096)} and M in
{1, 16, 256, 4096}, the call a model makes per layer is timed as a model makes it: the weight
quantized as its checkpoint would be and prepared once (qbackend.prepare_weight), then
qbackend.linear on activations already in the kind's form (bf16 for W8A16; quantized, with their
scales, for W8A8; the activation quantization is its own op, not in these times). Selections:
  default     whatever the installed providers choose on this device
  torch       QBACKEND_DISABLE=cutlass,marlin: the torch provider where it is chosen
  reference   QBACKEND_PROVIDER=reference, at M = 1 and 4096 only: the cost of the oracle, which
              the fallback warning quotes
  sm80        QBACKEND_CUTLASS_VARIANT=80: the cutlass provider's sm_80 kernels (the INT8 family a GPU
              without its own runs; on newer GPUs through the PTX), for comparison with the default
Method (qbackend/benchmark.py): CUDA-graph replay, weight copies rotated past the L2 (>= 512 MB of fp8),
each selection timed in interleaved rounds with bf16 torch.mm on the same shapes, medians.
Writes DIR/selection_<device>.json (selection_h200.json on an H200) {"device", "torch", "rows": [{"kind", "M",
"N", "K", "selection", "provider", "us", "bf16_us", "ratio"}]} (ratio = bf16_us / us: above 1 is faster than bf16).
"""
import argparse
import json
import math
import os
import traceback
from functools import partial

import torch

import qbackend
from qbackend import registry
from qbackend.bench_report import pyplot, speedup_axes
from qbackend.benchmark import activation, checkpoint_weight, device_tag, graph_time, interleaved, weight_copies
from qbackend.problem import PROBLEM_KINDS

SHAPES = [(4096, 4096), (28672, 4096)]
MS = [1, 16, 256, 4096]
REFERENCE_MS = (1, 4096)
SELECTIONS = {"default": {}, "torch": {"QBACKEND_DISABLE": "cutlass,marlin"},
              "reference": {"QBACKEND_PROVIDER": "reference"}, "sm80": {"QBACKEND_CUTLASS_VARIANT": "80"}}
TRIAL_MS = 5.0
dev = "cuda"


def select(env: dict) -> None:
    for k in ("QBACKEND_DISABLE", "QBACKEND_PROVIDER", "QBACKEND_CUTLASS_VARIANT"):
        os.environ.pop(k, None)
    os.environ.update(env)
    registry.reload()


def bench_kind(kind, N, K, ms, selections, g):
    rows = []
    n = weight_copies(N * K)   # fp8 copies of about 512 MB together
    weights = [checkpoint_weight(kind, N, K, g) for _ in range(n)]
    act_dtype, granularity = weights[0][2], weights[0][3]
    wb = [torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(n)]
    prepared = {}
    for sel in selections:
        select(SELECTIONS[sel])
        prepared[sel] = [qbackend.prepare_weight(q, s, act_dtype, granularity) for q, s, _, _ in weights]
    for M in ms:
        a, sa = activation(M, K, act_dtype, granularity, g)
        ab = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
        here = [s for s in selections if s != "reference" or M in REFERENCE_MS]

        def timed(sel):
            select(SELECTIONS[sel])
            return graph_time([lambda pw=pw: qbackend.linear(a, pw, sa) for pw in prepared[sel]], TRIAL_MS)

        timers = {sel: partial(timed, sel) for sel in here}
        timers["bf16"] = partial(graph_time, [lambda w=w: torch.mm(ab, w.t()) for w in wb], TRIAL_MS)
        med = interleaved(timers)
        for sel in here:
            provider = prepared[sel][0].provider
            rows.append({"kind": kind, "M": M, "N": N, "K": K, "selection": sel, "provider": provider,
                         "layout": prepared[sel][0].layout, "us": med[sel], "bf16_us": med["bf16"],
                         "ratio": med["bf16"] / med[sel]})
            print(f"{kind:27s} M={M:5d} N={N:5d} K={K:5d} {sel:9s} {provider:9s} {med[sel]:10.2f}us "
                  f"bf16 {med['bf16']:9.2f}us  x{med['bf16'] / med[sel]:6.3f}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--plot", help="a selection JSON to plot (no GPU needed)")
    ap.add_argument("--selections", default="default,torch,reference")
    ap.add_argument("--kinds", default=",".join(PROBLEM_KINDS))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    args = ap.parse_args()
    if args.plot:
        with open(args.plot) as f:
            res = json.load(f)
        plot(res["rows"], os.path.splitext(args.plot)[0] + ".png", res["device"])
        print(table(res["rows"]))
        summarize(res["rows"])
        return
    os.makedirs(args.out, exist_ok=True)
    selections = args.selections.split(",")
    ms = [int(m) for m in args.ms.split(",")]
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        for kind in args.kinds.split(","):
            try:
                rows += bench_kind(kind, N, K, ms, selections, g)
            except Exception:  # one kind's failure must not cost the others' numbers; the log shows it
                traceback.print_exc()
                print(f"{kind} {N}x{K}: FAILED (above)", flush=True)
            torch.cuda.empty_cache()
    select({})
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "method": "qbackend.linear with weights prepared once, activations already quantized; CUDA-graph "
                     "replay over weight copies >= 512 MB of fp8, median of 5 trials of ~5 ms per round, "
                     "median over rounds interleaved with bf16 torch.mm in a balanced order",
           "rows": rows}
    path = os.path.join(args.out, f"selection_{device_tag('cuda')}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)
    summarize(rows)


def summarize(rows):
    for sel in ("default", "torch"):
        mine = [r for r in rows if r["selection"] == sel]
        if not mine:
            continue
        worst = min(mine, key=lambda r: r["ratio"])
        print(f"{sel}: slowest point x{worst['ratio']:.3f} ({worst['kind']} M={worst['M']} "
              f"{worst['N']}x{worst['K']} on {worst['provider']})")
        w8a16 = [r["ratio"] for r in mine if r["kind"] == "fp8_w8a16" and r["M"] <= 16]
        block = [r["ratio"] for r in mine if r["kind"] == "fp8_block" and r["M"] >= 256]
        if w8a16:
            print(f"  fp8_w8a16 geomean over M <= 16: x{math.exp(sum(map(math.log, w8a16)) / len(w8a16)):.3f}")
        if block:
            print(f"  fp8_block at M >= 256: min x{min(block):.3f}")


def table(rows) -> str:
    """A markdown table: per kind and shape, each selection's ratio to bf16 at every M, with the
    provider that served it."""
    ms = sorted({r["M"] for r in rows})
    lines = ["| kind | N x K | selection | " + " | ".join(f"M = {m}" for m in ms) + " |",
             "|---|---|---|" + "---|" * len(ms)]
    keys = sorted({(r["kind"], r["N"], r["K"], r["selection"]) for r in rows},
                  key=lambda k: (PROBLEM_KINDS.index(k[0]), k[1], list(SELECTIONS).index(k[3])))
    for kind, N, K, sel in keys:
        cells = []
        for m in ms:
            r = next((r for r in rows if (r["kind"], r["N"], r["K"], r["selection"], r["M"]) == (kind, N, K, sel, m)),
                     None)
            cells.append(f"x{r['ratio']:.2f} {r['provider']}" if r else "")
        lines.append(f"| {kind} | {N} x {K} | {sel} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, path, device):
    plt = pyplot()
    shapes = sorted({(r["N"], r["K"]) for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 5), squeeze=False)
    styles = {"default": "-", "torch": "--", "reference": ":"}
    for ax, (N, K) in zip(axes[0], shapes):
        for i, kind in enumerate(PROBLEM_KINDS):  # one colour per kind, one line style per selection
            for sel, style in styles.items():
                pts = sorted((r["M"], r["ratio"]) for r in rows
                             if r["kind"] == kind and r["selection"] == sel and (r["N"], r["K"]) == (N, K))
                if pts:
                    ax.plot(*zip(*pts), style, color=f"C{i}", marker="o", label=f"{kind} ({sel})")
        ax.axhline(0.9, ls="--", c="red", lw=0.8)
        speedup_axes(ax, N, K, legend_size=6)
    fig.suptitle(f"{device}: the selected provider per kind vs bf16 torch.mm, CUDA graphs, weights from HBM")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


if __name__ == "__main__":
    main()
