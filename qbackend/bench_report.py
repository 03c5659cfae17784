"""What `qbackend bench` shows of its measurements: the console table, the JSON file and the PNG plot.

A row (from bench_cli.measure_kind) holds raw numbers: microseconds of qbackend.linear, of bf16
torch.mm and of torch._scaled_mm where that applies, the FLOPs and bytes of the call, and the
provider and path that served it. Rates and speed-ups are derived here, the same for every output.
"""
from __future__ import annotations

import json

# (heading, width); the shape and the kind are left-aligned, numbers right-aligned.
COLUMNS = (("shape N x K", 13), ("M", 6), ("kind", 27), ("µs", 10), ("TFLOP/s", 8), ("TB/s", 6),
           ("bf16 mm µs", 11), ("vs bf16", 8), ("_scaled_mm µs", 14), ("vs _scaled_mm", 14))
LEFT = (0, 2)


def _cells(cells) -> str:
    return " ".join(f"{c:<{w}}" if i in LEFT else f"{c:>{w}}" for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))


def rates(row: dict) -> dict:
    """The row with what it implies: TFLOP/s and TB/s of qbackend's call (bytes: the weight as
    prepared, the activations and the output), its speed-up over each baseline (baseline time /
    its time: above 1 is faster), and where the weights were read from."""
    us = row["us"]
    smm = row.get("scaled_mm_us")
    return {**row, "tflops": row["flops"] / us / 1e6, "tbps": row["bytes"] / us / 1e6,
            "speedup_vs_bf16": row["bf16_us"] / us,
            "speedup_vs_scaled_mm": smm / us if smm else None,
            "weights_from": "HBM" if row["rotated_bytes"] > 2 * row.get("l2_bytes", 0) else "L2"}


def metadata(arch: str, device: str, torch_version: str, qbackend_version: str, trials: int,
             trial_ms: float, out_dtype: str) -> dict:
    return {"device": device, "arch": arch, "torch": torch_version, "qbackend": qbackend_version,
            "out_dtype": out_dtype, "trials": trials, "trial_ms": trial_ms,
            "method": "qbackend.linear on a weight prepared once, activations already in the kind's form; "
                      "CUDA-graph replay of one call per weight copy (2 to 16 copies, together at least 512 MB "
                      f"and 4x the L2 where 16 reach it), median of {trials} trials of ~{trial_ms:g} ms, each "
                      "candidate timed once per round in a balanced order, median over rounds; baselines on the "
                      "same shapes: bf16 torch.mm, torch._scaled_mm (fast accumulation) for W8A8 fp8"}


def title(meta: dict) -> str:
    return (f"qbackend bench: {meta['device']} ({meta['arch']}), torch {meta['torch']}, qbackend "
            f"{meta['qbackend']}, out {meta['out_dtype']}; CUDA graphs, weights from HBM, median of "
            f"{meta['trials']} trials x {meta['trial_ms']:g} ms in interleaved rounds")


def header() -> str:
    return _cells(name for name, _ in COLUMNS) + "  served by"


def _speedup(x) -> str:
    return f"x{x:.2f}" if x is not None else "-"


def line(row: dict) -> str:
    """One table line: qbackend's time and rates, the baselines' times and its speed-ups over them,
    and which provider (and path) served it."""
    r = rates(row)
    smm_us = f"{r['scaled_mm_us']:.2f}" if r["scaled_mm_us"] else "-"
    served = r["provider"] + (f" ({r['path']})" if r["path"] else "")
    served += "" if r["how"] == "priority" else f" [{r['how']}]"
    served += " [L2]" if r["weights_from"] == "L2" else ""
    cells = (f"{r['N']}x{r['K']}", r["M"], r["kind"], f"{r['us']:.2f}", f"{r['tflops']:.1f}", f"{r['tbps']:.2f}",
             f"{r['bf16_us']:.2f}", _speedup(r["speedup_vs_bf16"]), smm_us, _speedup(r["speedup_vs_scaled_mm"]))
    return _cells(cells) + "  " + served


def skip_line(skip: dict) -> str:
    return _cells((f"{skip['N']}x{skip['K']}", "", skip["kind"])) + f" skipped: {skip['error']}"


def table(rows: list, skipped: list = ()) -> str:
    """The whole console table for finished measurements."""
    return "\n".join([header()] + [line(r) for r in rows] + [skip_line(s) for s in skipped] + notes(rows))


def notes(rows: list) -> list:
    """Lines under the table: what its markers mean, and baselines torch refused."""
    out = []
    if any(rates(r)["weights_from"] == "L2" for r in rows):
        out.append("[L2]: the weight copies fit in twice the L2 (a small N x K), so these times include L2 hits")
    if any(r["how"] != "priority" for r in rows):
        out.append("[forced] / [hook]: chosen by QBACKEND_PROVIDER or a plugin's qbackend_select hook, "
                   "not by priority")
    seen = set()
    for r in rows:
        if r.get("note") and (r["kind"], r["note"]) not in seen:
            seen.add((r["kind"], r["note"]))
            out.append(f"{r['kind']}: {r['note']}")
    return out


def write_json(path: str, meta: dict, rows: list, skipped: list) -> None:
    with open(path, "w") as f:
        json.dump({**meta, "rows": [rates(r) for r in rows], "skipped": list(skipped)}, f, indent=1)
        f.write("\n")


def pyplot():
    """matplotlib.pyplot on a file-only backend, or ImportError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("matplotlib is not installed; pip install matplotlib "
                          "(or the qbackend[bench] extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_png(path: str, meta: dict, rows: list) -> None:
    """Per weight shape, the speed-up over bf16 torch.mm against M: one colour per kind, qbackend
    solid, torch._scaled_mm dashed."""
    plt = pyplot()
    shapes = sorted({(r["N"], r["K"]) for r in rows})
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    fig, axes = plt.subplots(1, max(1, len(shapes)), figsize=(6 * max(1, len(shapes)), 4.5), squeeze=False)
    for ax, (N, K) in zip(axes[0], shapes):
        for i, kind in enumerate(kinds):
            mine = sorted((r for r in map(rates, rows) if r["kind"] == kind and (r["N"], r["K"]) == (N, K)),
                          key=lambda r: r["M"])
            if not mine:
                continue
            ax.plot([r["M"] for r in mine], [r["speedup_vs_bf16"] for r in mine], "-o", color=f"C{i}",
                    label=f"{kind} ({mine[0]['provider']})")
            smm = [r for r in mine if r["scaled_mm_us"]]
            if smm:
                ax.plot([r["M"] for r in smm], [r["bf16_us"] / r["scaled_mm_us"] for r in smm], "--x",
                        color=f"C{i}", label=f"{kind} (torch._scaled_mm {smm[0]['scaled_mm']})")
        speedup_axes(ax, N, K)
    fig.suptitle(f"qbackend bench, {meta['device']}: CUDA graphs, weights from HBM, out {meta['out_dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def speedup_axes(ax, N: int, K: int, legend_size: int = 7) -> None:
    """Dress an axis of speed-ups over bf16 torch.mm against M for one weight shape: log-log, the
    x1 line, grid and legend."""
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="M (tokens)", ylabel="speed-up over bf16 torch.mm",
           title=f"N={N} K={K}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
