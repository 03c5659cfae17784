"""`qbackend bench`: time what qbackend selects on this GPU, for your own weight shapes, against what you
would run instead: torch._scaled_mm (cuBLASLt) for W8A8 fp8 and a bf16 torch.mm for every kind.

    qbackend bench --shapes 4096x4096,14336x4096 --m 1,16,256 [--kind fp8_w8a8_per_tensor,...]
                   [--out-dtype bf16] [--json FILE] [--png FILE]

Shapes are N x K of the weight (a [N, K] nn.Linear weight), M the tokens per call. Each call is the
one a model makes per layer: the weight quantized as a checkpoint stores it and prepared once
(qbackend.prepare_weight), then qbackend.linear on activations already in the kind's form.
Timing (qbackend.benchmark): CUDA-graph replay of one call per weight copy, the copies together
several times the L2 so weights come from HBM; per point every candidate is timed once per round in
a balanced order, and its median is reported.
"""
from __future__ import annotations

import argparse
import os
import sys
from functools import partial

OUT_DTYPES = ("bf16", "fp16", "fp32")
# The torch._scaled_mm mode a W8A8 fp8 kind is compared with; other kinds have no _scaled_mm form.
SCALED_MM_MODES = {"fp8_w8a8_per_tensor": "tensorwise", "fp8_w8a8_per_token_channel": "rowwise"}
OUT_BYTES_CAP = 2 * 2**30   # output held by one graph's calls (large M x N): fewer copies beyond it


# ---- arguments ---------------------------------------------------------------------------------

def _positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{what} must be a positive integer; got {text!r}")
    return value


def _items(text: str, what: str) -> list:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"{what}: a comma-separated list with no empty items; got {text!r}")
    return list(dict.fromkeys(items))


def shapes_arg(text: str) -> list:
    """[(N, K), ...] from "NxK,NxK,...": weight shapes, both sides positive integers."""
    shapes = []
    for item in _items(text, "shapes"):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise argparse.ArgumentTypeError(f"shape {item!r} is not NxK (the weight's N and K, e.g. 4096x4096)")
        shapes.append((_positive(parts[0], f"N in shape {item!r}"), _positive(parts[1], f"K in shape {item!r}")))
    return list(dict.fromkeys(shapes))


def ms_arg(text: str) -> list:
    """[M, ...] from "1,16,256": token counts, positive integers."""
    return list(dict.fromkeys(_positive(item, "M") for item in _items(text, "m")))


def kinds_arg(text: str) -> list:
    """[kind, ...] from "kind,kind": names from qbackend.PROBLEM_KINDS."""
    from .problem import PROBLEM_KINDS

    kinds = _items(text, "kind")
    unknown = [k for k in kinds if k not in PROBLEM_KINDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown kind {', '.join(map(repr, unknown))}; "
                                         f"known: {', '.join(PROBLEM_KINDS)}")
    return kinds


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of milliseconds; got {text!r}")
    return value


def add_bench_subcommand(subparsers) -> None:
    """Register `qbackend bench` on the CLI's subparsers."""
    p = subparsers.add_parser("bench", help="time the selected provider on this GPU against torch._scaled_mm "
                              "and bf16 torch.mm, for your shapes", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=shapes_arg, required=True, metavar="NxK,...",
                   help="weight shapes, N x K of a [N, K] linear weight, e.g. 4096x4096,14336x4096")
    p.add_argument("--m", type=ms_arg, default=[1, 16, 256], metavar="M,...",
                   help="tokens per call (default: 1,16,256)")
    p.add_argument("--kind", type=kinds_arg, action="extend", metavar="KIND,...",
                   help="problem kinds to time (default: every kind a provider other than the reference "
                   "serves on this device)")
    p.add_argument("--out-dtype", choices=OUT_DTYPES, default="bf16", help="output dtype (default: bf16)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--png", metavar="FILE", help="also plot the speed-ups (needs matplotlib)")
    p.add_argument("--trials", type=partial(_positive, what="trials"), default=3,
                   help="timed trials per candidate and round, median taken (default: 3)")
    p.add_argument("--trial-ms", type=_positive_float, default=2.0,
                   help="graph replays per trial, in milliseconds of GPU time (default: 2)")
    p.set_defaults(func=_cmd_bench)


# ---- measuring ---------------------------------------------------------------------------------

def no_gpu_reason() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    import torch

    if torch.cuda.is_available():
        return None
    build = "has no CUDA or ROCm support" if torch.version.cuda is None and torch.version.hip is None \
        else "sees no GPU"
    return f"no GPU to time on: this torch ({torch.__version__}) {build}"


def gpu_timer(trials: int, trial_ms: float):
    """{label: [calls]} -> {label: median microseconds per call}: the benchmark method."""
    from .benchmark import graph_time, interleaved

    def time_all(calls: dict) -> dict:
        return interleaved({label: partial(graph_time, fns, trial_ms, trials) for label, fns in calls.items()})
    return time_all


def default_kinds(device) -> list:
    """The kinds a provider other than the reference oracle serves on `device`."""
    import qbackend

    return [k for k in qbackend.PROBLEM_KINDS if qbackend.select(k, device).name not in (None, "reference")]


def served_by(decision) -> tuple:
    """(provider, path, how) of a registry decision: the path is what the chosen provider's verdict
    says beyond "ok" (the torch provider names the torch op it calls)."""
    reason = dict(decision.verdicts)[decision.name].reason
    return decision.name, reason[len("ok: "):] if reason.startswith("ok: ") else "", decision.how


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def measure_kind(kind: str, N: int, K: int, ms: list, out_dtype, timer, device, rotate_bytes: int) -> list:
    """Rows for one kind and weight shape at every M: qbackend.linear, bf16 torch.mm and, for W8A8
    fp8 kinds, torch._scaled_mm, timed together by `timer` ({label: [calls]} -> {label: us})."""
    import torch

    import qbackend
    from qbackend import probe, registry

    from .benchmark import activation, checkpoint_weight, weight_copies
    from .weights import weight_scale_to_b

    g = torch.Generator(device=device).manual_seed(N * 131 + K)
    copies = weight_copies(N * K, rotate_bytes)
    weights = [checkpoint_weight(kind, N, K, g, qbackend.native_fp8_dtype(device)) for _ in range(copies)]
    act_dtype, granularity = weights[0][2], weights[0][3]
    if act_dtype == torch.bfloat16 and out_dtype == torch.float16:
        act_dtype = torch.float16   # W8A16 runs in its activations' dtype
    prepared = [qbackend.prepare_weight(q, s, act_dtype, granularity, out_dtype=out_dtype) for q, s, _, _ in weights]
    provider, path, how = served_by(registry.get().decide(probe.device_info(device), prepared[0].problem))
    mode = SCALED_MM_MODES.get(kind)
    scaled = [(q, weight_scale_to_b(s, N, K)) for q, s, _, _ in weights] if mode else []
    del weights
    bf16 = [torch.randn(N, K, device=device, dtype=torch.bfloat16, generator=g) for _ in range(copies)]
    rows = []
    for M in ms:
        n = max(1, min(copies, OUT_BYTES_CAP // (M * N * out_dtype.itemsize)))
        a, sa = activation(M, K, act_dtype, granularity, g)
        ab = torch.randn(M, K, device=device, dtype=torch.bfloat16, generator=g)
        calls = {"qbackend": [partial(qbackend.linear, a, pw, sa, out_dtype=out_dtype) for pw in prepared[:n]],
                 "torch.mm": [partial(torch.mm, ab, w.t()) for w in bf16[:n]]}
        note = ""
        if mode:
            smm = [partial(torch._scaled_mm, a, q.t(), scale_a=sa, scale_b=s, out_dtype=out_dtype,
                           use_fast_accum=True) for q, s in scaled[:n]]
            try:
                smm[0]()   # torch's own rules (dtypes, scale shapes, out dtype) may refuse it here
                calls["torch._scaled_mm"] = smm
            except (RuntimeError, TypeError, ValueError) as exc:
                note = f"torch._scaled_mm {mode} refused: {str(exc).splitlines()[0]}"
        us = timer(calls)
        weight_bytes = _nbytes(prepared[0].data)
        rows.append({"kind": kind, "N": N, "K": K, "M": M, "out_dtype": str(out_dtype).replace("torch.", ""),
                     "provider": provider, "path": path, "how": how, "layout": prepared[0].layout,
                     "weight_copies": n, "rotated_bytes": n * weight_bytes,
                     "flops": 2 * M * N * K, "bytes": weight_bytes + _nbytes(a) + M * N * out_dtype.itemsize,
                     "us": us["qbackend"], "bf16_us": us["torch.mm"],
                     "scaled_mm": mode, "scaled_mm_us": us.get("torch._scaled_mm"), "note": note})
    return rows


def run(shapes, ms, kinds, out_dtype, timer, device, on_row=None, on_skip=None) -> tuple:
    """(rows, skipped) for every shape x kind x M; a kind that fails on a shape is skipped with its
    error, the others still run. on_row / on_skip see each as it comes."""
    import torch

    from .benchmark import ROTATE_BYTES

    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) if device.type == "cuda" else 0
    rotate = max(ROTATE_BYTES, 4 * l2)
    rows, skipped = [], []
    for N, K in shapes:
        for kind in kinds:
            try:
                mine = measure_kind(kind, N, K, ms, out_dtype, timer, device, rotate)
            except Exception as exc:  # one kind's failure must not cost the others' numbers
                skip = {"kind": kind, "N": N, "K": K, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
                skipped.append(skip)
                if on_skip:
                    on_skip(skip)
                mine = []
            for row in mine:
                row["l2_bytes"] = l2
                rows.append(row)
                if on_row:
                    on_row(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows, skipped


# ---- the command -------------------------------------------------------------------------------

def _check_outputs(args) -> str | None:
    """Why the requested output files cannot be written (checked before minutes of timing)."""
    for flag, path in (("--json", args.json), ("--png", args.png)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            return f"{flag}: directory {os.path.dirname(os.path.abspath(path))!r} does not exist"
    if args.png:
        from .bench_report import pyplot

        try:
            pyplot()
        except ImportError as exc:
            return f"--png: {exc}"
    return None


def _device():
    """The GPU to time on: the current CUDA (or ROCm) device."""
    import torch

    return torch.device("cuda", torch.cuda.current_device())


def _cmd_bench(args) -> int:
    problem = no_gpu_reason() or _check_outputs(args)
    if problem:
        print(f"qbackend bench: error: {problem}", file=sys.stderr)
        return 2
    import torch

    import qbackend

    from . import bench_report as report

    device = _device()
    kinds = args.kind or default_kinds(device)
    if not kinds:
        print("qbackend bench: error: no kind has a provider other than the reference on this device "
              "(qbackend info says why); name kinds with --kind to time them anyway", file=sys.stderr)
        return 2
    out_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.out_dtype]
    info = qbackend.device_info(device)
    meta = report.metadata(info.arch, info.name, torch.__version__, qbackend.__version__, args.trials,
                           args.trial_ms, args.out_dtype)
    print(report.title(meta))
    print(report.header(), flush=True)
    rows, skipped = run(args.shapes, args.m, kinds, out_dtype, gpu_timer(args.trials, args.trial_ms), device,
                        on_row=lambda r: print(report.line(r), flush=True),
                        on_skip=lambda s: print(report.skip_line(s), flush=True))
    for note in report.notes(rows):
        print(note)
    if args.json:
        report.write_json(args.json, meta, rows, skipped)
        print(f"wrote {args.json}")
    if args.png:
        report.write_png(args.png, meta, rows)
        print(f"wrote {args.png}")
    return 0 if rows else 1
