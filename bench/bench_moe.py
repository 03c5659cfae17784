"""Mixture-of-experts layers as one grouped FP8 GEMM (issue 38): qbackend.grouped_scaled_mm against
torch's grouped GEMMs and a per-expert loop, under CUDA-graph replay.

    python bench/bench_moe.py --out bench/results                   # DIR/moe_<device>.json (+ .png)
    python bench/bench_moe.py --out DIR --models deepseek --tokens 1,16384 --impls qbackend.grouped,loop.scaled_mm
    python bench/bench_moe.py --summarize bench/results/moe_h200.json  # summary and PNG again, from the JSON
    python bench/bench_moe.py --device cpu --tiny --out /tmp/moe     # smoke test of this script: tiny shapes, eager

Expert layers (gate_up: N = 2 x intermediate, K = hidden; down: N = hidden, K = intermediate), bf16 out:
  mixtral   Mixtral-8x7B   G = 8,   top-2  gate_up 28672 x 4096, down 4096 x 14336  per-token x per-expert-channel
  qwen3     Qwen3-30B-A3B  G = 128, top-8  gate_up 1536 x 2048,  down 2048 x 768    per-token x per-expert-channel
  deepseek  DeepSeek-V3    G = 256, top-8  gate_up 4096 x 7168,  down 7168 x 2048   1 x 128 activation groups x
                                                                                     128 x 128 weight blocks
at batch tokens 1, 16, 64, 256, 1024, 4096 and 16384 (routed rows = tokens x top-k).

impl:
  qbackend.grouped          qbackend.grouped_scaled_mm under the default selection (each row names the provider
                            and path that served it)
  torch._scaled_grouped_mm  torch's FP8 grouped GEMM, its rowwise scales (scale_a [rows], scale_b [G, N]) laid out
                            once beforehand, use_fast_accum=True; block scales through
                            torch.nn.functional.scaled_grouped_mm's blockwise recipes where this torch has them.
                            Where torch refuses, the rows are omitted and its reason printed once
  loop.scaled_mm            qbackend.scaled_mm once per non-empty expert into one output tensor: what a model runs
                            without grouped support. The expert boundaries are read on the host when the calls
                            are built, and the graph holds every launch, so neither that sync nor the loop's host
                            time is in its times (eager, the loop costs more than shown)
  torch._grouped_mm.bf16    the same layer unquantized: bf16 activations and weights through torch._grouped_mm
Before it is timed, each impl's output is checked on up to three experts' rows (the largest group, the first and
the last non-empty one) against the fp32 product of the dequantized operands (of the bf16 ones for the bf16 impl).

Method (qbackend/benchmark.py, as bench_block_fp8.py and bench_selection.py): one CUDA graph per impl holding
several calls, replayed; median of 5 trials of about --trial-ms; the impls timed once per round in a balanced
(Williams) order, --rounds rounds, the median over rounds reported.
  Routing: each token's top-k experts drawn uniformly without replacement (fixed seeds; both layers of a model see
  the same routing), sorted into expert order with qbackend.moe_align; its offsets (int32 cumulative row ends on
  the device) go to both grouped_scaled_mm and torch. Activations are random normal, gathered into expert order
  and quantized (per token; per 1 x 128 group for DeepSeek-V3) outside the times, as the engines' fused
  gather-and-quantize hands them over.
  L2: a call only reads the experts its routing touches (8 x 1.5 MiB of Qwen3's down weights at 1 token: less
  than the L2). The calls of one graph therefore cycle over weight copies (as many as make 1 GiB of fp8, at most
  8, and one where a single copy is larger) and over distinct routings (distinct expert sets) until their touched
  fp8 weights add up to 512 MiB (at most 16 calls). Each row records the calls, routings and copies and the
  distinct weight bytes one replay reads; the JSON's method.l2 says per shape what was done.
  Memory: torch.cuda.empty_cache() before each capture and after its warm-up run, so that a path whose
  temporaries are a whole layer (a dequantizing one: DeepSeek-V3's gate_up is 7 GiB of fp8, 28 GiB in fp32) needs
  them once; a call that runs out of memory is skipped with torch's message, like a refused one.
  On the CPU (--device cpu): one call, one copy, eager timing with perf_counter, no graphs.
Exit status 1 where an impl gave a wrong result (it is listed under "wrong" and not timed).
JSON: {"device", "torch", "method", "targets", "layers", "rows": [{"shape", "tokens", "impl", "us", "G", "topk",
"N", "K", "scales", "routed_rows", "experts_touched", "tflops", "touched_tbps", "provider", "path", ...}],
"skipped": [{"shape", "tokens", "impl", "why"}], "wrong": [...], "summary": {...}}. TFLOP/s count the routed rows
(2 x tokens x top-k x N x K); TB/s count the bytes of the experts a call touches (fp8, or bf16 for the bf16 impl).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial

import torch

import qbackend
from qbackend.bench_cli import served_by
from qbackend.benchmark import ROTATE_BYTES, device_tag, graph_time, interleaved
from qbackend.validate import validate_scaled_mm
from qbackend.validate_grouped import validate_grouped_scaled_mm

F8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
MIB = 2**20

QB, SGM, LOOP, BF = "qbackend.grouped", "torch._scaled_grouped_mm", "loop.scaled_mm", "torch._grouped_mm.bf16"
IMPLS = [QB, SGM, LOOP, BF]
TOKENS = [1, 16, 64, 256, 1024, 4096, 16384]
TINY_TOKENS = [1, 16, 64]

# key: (label, experts G, top-k, scales, ((layer, N, K), ...))
MODELS = {
    "mixtral": ("Mixtral-8x7B", 8, 2, "token_channel", (("gate_up", 2 * 14336, 4096), ("down", 4096, 14336))),
    "qwen3": ("Qwen3-30B-A3B", 128, 8, "token_channel", (("gate_up", 2 * 768, 2048), ("down", 2048, 768))),
    "deepseek": ("DeepSeek-V3", 256, 8, "block", (("gate_up", 2 * 2048, 7168), ("down", 7168, 2048))),
}
# The same families at sizes a CPU multiplies in milliseconds (block layers keep K and N multiples of 128).
TINY = {
    "mixtral": ("Mixtral-8x7B (tiny)", 8, 2, "token_channel", (("gate_up", 2 * 64, 128), ("down", 128, 64))),
    "qwen3": ("Qwen3-30B-A3B (tiny)", 64, 8, "token_channel", (("gate_up", 2 * 32, 96), ("down", 96, 32))),
    "deepseek": ("DeepSeek-V3 (tiny)", 16, 4, "block", (("gate_up", 2 * 256, 256), ("down", 256, 256))),
}

# The targets (H200).
TARGETS = {
    "vs_torch_scaled_grouped_mm_geomean": 1.2,   # x, at every point torch._scaled_grouped_mm serves
    "vs_torch_scaled_grouped_mm_min": 1.0,
    "vs_loop_decode_min": 3.0,                   # x, tokens <= 64, G >= 64
    "prefill_tflops_deepseek_16384": 1200.0,     # TFLOP/s on routed tokens, DeepSeek-V3 layers at 16384 tokens
    "decode_touched_tbps": 3.0,                  # TB/s of touched expert weights, tokens <= 64
}
DECODE_TOKENS = 64

COPY_BYTES = 2**30          # weight copies of one layer: together at least this much fp8 ...
MAX_COPIES = 8
WEIGHT_BYTES = 24 * 2**30   # ... but fp8 + bf16 copies at most this (one copy where a single one is larger)
MAX_CALLS = 16              # calls per graph
ACT_BYTES = 4 * 2**30       # activations of the distinct routings of one point, at most (one routing at least)
TOL = 2e-2                  # relative (norm-wise) against the fp32 product
TRIAL_MS = 5.0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Layer:
    key: str
    model: str
    name: str
    G: int
    topk: int
    N: int
    K: int
    scales: str   # "token_channel" or "block"

    @property
    def shape(self) -> str:
        return f"{self.model} {self.name}"

    @property
    def block(self) -> bool:
        return self.scales == "block"

    @property
    def expert_bytes(self) -> int:   # one expert's fp8 weight
        return self.N * self.K


def layers_of(keys: list, tiny: bool) -> list:
    table = TINY if tiny else MODELS
    out = []
    for key in keys:
        model, G, topk, scales, shapes = table[key]
        out += [Layer(key, model, name, G, topk, N, K, scales) for name, N, K in shapes]
    return out


@dataclass
class Weights:
    """One copy of a layer's experts."""
    b: torch.Tensor    # fp8 [G, K, N], column-major per expert (w.transpose(-2, -1) of [G, N, K])
    sb: torch.Tensor   # scale_b as grouped_scaled_mm takes it: [G, N], or [G, K/128, N/128] (a transposed view)
    sb_each: torch.Tensor  # per expert as scaled_mm reads it best: [G, N], or [G, K/128, N/128] contiguous
    wb: torch.Tensor   # the bf16 weight the fp8 one was quantized from, [G, K, N] column-major per expert


def make_weights(layer: Layer, copies: int, device, seed: int) -> list:
    """Random experts (normal / sqrt(K)) in bf16, quantized per expert as their checkpoints store them:
    per output channel, or in 128 x 128 blocks (DeepSeek-V3). One expert at a time, to bound memory."""
    G, N, K = layer.G, layer.N, layer.K
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(copies):
        wb = torch.empty(G, N, K, dtype=BF16, device=device)
        q = torch.empty(G, N, K, dtype=F8, device=device)
        s = torch.empty((G, cdiv(N, 128), cdiv(K, 128)) if layer.block else (G, N), dtype=torch.float32,
                        device=device)
        for g in range(G):
            w = (torch.randn(N, K, generator=gen, device=device) / math.sqrt(K)).to(BF16)
            wq, ws = qbackend.quantize(w, F8, "block" if layer.block else "channel")
            wb[g], q[g] = w, wq
            s[g] = ws if layer.block else ws.reshape(N)
        sb = s.transpose(-2, -1) if layer.block else s
        out.append(Weights(q.transpose(-2, -1), sb, sb.contiguous(), wb.transpose(-2, -1)))
    return out


@dataclass
class Routed:
    """One routing of `tokens` tokens, its activations in expert order."""
    offsets: torch.Tensor   # int32 [G] on the device: cumulative row ends
    a: torch.Tensor         # fp8 [rows, K]
    sa: torch.Tensor        # [rows, 1] per token, or [rows, K/128] per 1 x 128 group
    sa_torch: torch.Tensor  # torch's form: [rows] contiguous, or the groups' scales M-major
    xb: torch.Tensor        # bf16 [rows, K], what was quantized
    groups: list            # (expert, start, end) of each non-empty expert, read on the host once


def route(layer: Layer, tokens: int, r: int, device) -> Routed:
    seed = 1_000_003 * tokens + 7919 * r + layer.G   # the same for both layers of a model
    ids = torch.rand(tokens, layer.G, generator=torch.Generator().manual_seed(seed)).topk(layer.topk, dim=1).indices
    perm, offsets, _ = qbackend.moe_align(ids.to(device), layer.G)
    gen = torch.Generator(device=device).manual_seed(seed + layer.K)
    x = torch.randn(tokens, layer.K, generator=gen, device=device, dtype=BF16)
    xb = x.index_select(0, perm // layer.topk)
    a, sa = qbackend.quantize(xb, F8, "group" if layer.block else "token")
    sa_torch = sa.t().contiguous().t() if layer.block else sa.reshape(-1).contiguous()
    ends = offsets.tolist()
    groups = [(g, s, e) for g, (s, e) in enumerate(zip([0] + ends[:-1], ends)) if e > s]
    return Routed(offsets, a, sa, sa_torch, xb, groups)


# ------------------------------------------------------------------------------------------- the impls

def run_grouped(rt: Routed, w: Weights, layer: Layer):
    return qbackend.grouped_scaled_mm(rt.a, w.b, rt.sa, w.sb, rt.offsets, out_dtype=BF16)


def run_scaled_grouped(rt: Routed, w: Weights, layer: Layer):
    if layer.block:
        F = torch.nn.functional
        return F.scaled_grouped_mm(rt.a, w.b, rt.sa_torch, F.ScalingType.BlockWise1x128, w.sb,
                                   F.ScalingType.BlockWise128x128, offs=rt.offsets, output_dtype=BF16,
                                   use_fast_accum=True)
    return torch._scaled_grouped_mm(rt.a, w.b, rt.sa_torch, w.sb, offs=rt.offsets, out_dtype=BF16,
                                    use_fast_accum=True)


def run_loop(rt: Routed, w: Weights, layer: Layer):
    out = torch.empty((rt.a.shape[0], layer.N), dtype=BF16, device=rt.a.device)
    for g, s, e in rt.groups:
        out[s:e] = qbackend.scaled_mm(rt.a[s:e], w.b[g], rt.sa[s:e], w.sb_each[g], out_dtype=BF16)
    return out


def run_bf16(rt: Routed, w: Weights, layer: Layer):
    return torch._grouped_mm(rt.xb, w.wb, offs=rt.offsets)


RUN = {QB: run_grouped, SGM: run_scaled_grouped, LOOP: run_loop, BF: run_bf16}


def missing(impl: str, layer: Layer):
    """Why this torch cannot run the impl at all (None: try it; torch may still refuse the call)."""
    if impl == SGM:
        if not hasattr(torch, "_scaled_grouped_mm"):
            return f"torch {torch.__version__} has no torch._scaled_grouped_mm"
        F = torch.nn.functional
        if layer.block and not (hasattr(F, "scaled_grouped_mm") and hasattr(F, "ScalingType")
                                and hasattr(F.ScalingType, "BlockWise1x128")):
            return (f"torch {torch.__version__}: torch._scaled_grouped_mm takes rowwise fp32 scales only (scale_a "
                    "[rows], scale_b [G, N]), and there is no grouped API with 1x128 / 128x128 block recipes")
    if impl == BF and not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    return None


def served(impl: str, rt: Routed, w: Weights, layer: Layer) -> tuple:
    """(provider, path) that serve the impl's calls."""
    if impl == QB:
        problem = validate_grouped_scaled_mm(rt.a, w.b, rt.sa, w.sb, rt.offsets, BF16, None)
        return served_by(qbackend.select(problem, rt.a.device))[:2]
    if impl == LOOP:
        g, s, e = rt.groups[0]
        problem = validate_scaled_mm(rt.a[s:e], w.b[g], rt.sa[s:e], w.sb_each[g], BF16, None)
        return served_by(qbackend.select(problem, rt.a.device))[:2]
    if impl == SGM:
        what = "F.scaled_grouped_mm blockwise" if layer.block else "torch._scaled_grouped_mm rowwise"
        return "torch", what + ", use_fast_accum=True"
    return "torch", "torch._grouped_mm bf16"


# ------------------------------------------------------------------------------------------ the check

def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(out: torch.Tensor, rt: Routed, w: Weights, layer: Layer, quantized: bool) -> float:
    """Largest relative error over up to three experts' rows: the largest group, the first and the last."""
    picks = {rt.groups[0], rt.groups[-1], max(rt.groups, key=lambda t: t[2] - t[1])}
    K, N = layer.K, layer.N
    worst = 0.0
    for g, s, e in sorted(picks):
        if quantized:
            sa = rt.sa[s:e].repeat_interleave(128, 1)[:, :K] if layer.block else rt.sa[s:e]
            sb = (w.sb[g].repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N] if layer.block
                  else w.sb[g].reshape(1, N))
            ref = (rt.a[s:e].float() * sa) @ (w.b[g].float() * sb)
        else:
            ref = rt.xb[s:e].float() @ w.wb[g].float()
        worst = max(worst, _rel(out[s:e], ref))
    return worst


# ------------------------------------------------------------------------------------------ the timers

def _release_after_warmup(fns: list) -> list:
    """fns, the last one followed, in graph_time's warm-up run only (outside the capture), by a wait and
    torch.cuda.empty_cache(): the blocks the warm-up cached go back to the device, so that the capture's
    private pool can take them. Paths whose temporaries are a whole layer (the dequantizing ones) would
    otherwise need that memory twice. Nothing is added to the captured graph."""
    last = fns[-1]

    def call():
        out = last()
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return out
    return fns[:-1] + [call]


def gpu_time(fns: list, trial_ms: float) -> float:
    torch.cuda.empty_cache()   # what earlier graphs' private pools left cached
    return graph_time(_release_after_warmup(fns), trial_ms)


def cpu_time(fns: list, trials: int = 3) -> float:
    """Median microseconds per call, eager (the CPU smoke test)."""
    for f in fns:
        f()
    ts = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for f in fns:
            f()
        ts.append((time.perf_counter() - t0) * 1e6 / len(fns))
    return statistics.median(ts)


# -------------------------------------------------------------------------------------------- a point

class Run:
    """What the whole run collects, and the once-only printing of skip reasons."""

    def __init__(self, device, args, layers: list):
        self.device, self.args = device, args
        self.layers = {layer.shape: layer for layer in layers}
        self.cuda = device.type == "cuda"
        self.rows, self.skipped, self.wrong = [], [], []
        self.l2 = {}
        self._said = set()

    def skip(self, layer: Layer, tokens: int, impl: str, why: str):
        why = why.strip().splitlines()[0][:300] if why.strip() else "(no message)"
        self.skipped.append({"shape": layer.shape, "tokens": tokens, "impl": impl, "why": why})
        key = (impl, re.sub(r"\d+", "#", why))
        if key not in self._said:
            self._said.add(key)
            print(f"skip {impl} ({layer.shape}, {tokens} tokens, and wherever the same reason holds): {why}",
                  flush=True)


def rotation(layer: Layer, touched: int, cuda: bool) -> int:
    """Calls per graph: enough that their touched fp8 weights reach ROTATE_BYTES (1 on the CPU)."""
    if not cuda:
        return 1
    return max(1, min(MAX_CALLS, cdiv(ROTATE_BYTES, max(1, touched * layer.expert_bytes))))


def bench_point(run: Run, layer: Layer, tokens: int, weights: list, impls: list) -> None:
    first = route(layer, tokens, 0, run.device)
    rows_routed = tokens * layer.topk
    n_calls = rotation(layer, len(first.groups), run.cuda)
    n_routes = 1 if not run.cuda else min(n_calls, max(1, ACT_BYTES // (rows_routed * layer.K * 3)))
    routes = [first] + [route(layer, tokens, r, run.device) for r in range(1, n_routes)]
    plan = [(routes[i % n_routes], weights[i % len(weights)]) for i in range(n_calls)]
    touched = sum(len(rt.groups) for rt, _ in plan) / n_calls
    distinct = len({(i % len(weights), g) for i, (rt, _) in enumerate(plan) for g, _, _ in rt.groups})
    rotated = distinct * layer.expert_bytes
    calls, info = {}, {}
    for impl in impls:
        why = missing(impl, layer)
        if why:
            run.skip(layer, tokens, impl, why)
            continue
        fns = [partial(RUN[impl], rt, w, layer) for rt, w in plan]
        try:
            out = fns[0]()
            if run.cuda:
                torch.cuda.synchronize()
            err = check(out, first, weights[0], layer, impl != BF)
            info[impl] = served(impl, first, weights[0], layer) + (err,)
            del out
        except Exception as e:   # torch refusing the call, or out of memory: the impl is skipped here, said why
            run.skip(layer, tokens, impl, f"{type(e).__name__}: {e}")
            if run.cuda:
                torch.cuda.empty_cache()
            continue
        if not err < TOL:
            run.wrong.append({"shape": layer.shape, "tokens": tokens, "impl": impl, "rel_err": err})
            print(f"WRONG RESULT {impl} ({layer.shape}, {tokens} tokens): relative error {err:.3g} > {TOL}; "
                  "not timed", flush=True)
            continue
        calls[impl] = fns
    failed = {}

    def timer(impl, fns):
        if impl in failed:
            return math.nan
        try:
            return gpu_time(fns, run.args.trial_ms) if run.cuda else cpu_time(fns)
        except RuntimeError as e:   # out of memory in the capture, or a capture the op does not allow
            failed[impl] = f"{type(e).__name__} while timing: {e}"
            if run.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            return math.nan

    timers = {impl: partial(timer, impl, fns) for impl, fns in calls.items()}
    med = interleaved(timers, run.args.rounds) if timers else {}
    flops = 2 * rows_routed * layer.N * layer.K
    for impl, why in failed.items():
        run.skip(layer, tokens, impl, why)
    for impl in (i for i in calls if i not in failed):
        us = med[impl]
        elem = 2 if impl == BF else 1
        touched_bytes = touched * layer.expert_bytes * elem
        provider, path, err = info[impl]
        row = {"shape": layer.shape, "tokens": tokens, "impl": impl, "us": us, "model": layer.model,
               "layer": layer.name, "G": layer.G, "topk": layer.topk, "N": layer.N, "K": layer.K,
               "scales": layer.scales, "routed_rows": rows_routed, "experts_touched": touched,
               "tflops": flops / us / 1e6, "touched_weight_bytes": touched_bytes,
               "touched_tbps": touched_bytes / us / 1e6, "provider": provider, "path": path,
               "calls_per_graph": n_calls, "routings": n_routes, "weight_copies": len(weights),
               "rotated_fp8_bytes": rotated, "check_rel_err": err}
        run.rows.append(row)
        print(f"{layer.shape:28s} T={tokens:5d} {impl:24s} {us:11.2f} us {row['tflops']:8.1f} TFLOP/s "
              f"{row['touched_tbps']:6.2f} TB/s  [{n_calls} calls, {len(weights)} copies]  {provider}"
              + (f": {path}" if path else ""),
              flush=True)
    info_l2 = run.l2.setdefault(layer.shape, {"copies": len(weights), "points": []})
    info_l2["points"].append((tokens, n_calls, n_routes, touched, rotated))


def copies_for(layer: Layer, cuda: bool) -> int:
    if not cuda:
        return 1
    layer_bytes = layer.G * layer.expert_bytes
    return max(1, min(MAX_COPIES, cdiv(COPY_BYTES, layer_bytes), WEIGHT_BYTES // (3 * layer_bytes)))


def l2_note(layer: Layer, entry: dict, l2_bytes: int) -> str:
    layer_mib = layer.G * layer.expert_bytes / MIB
    per_point = "; ".join(f"{t} tokens: {n} call{'s' if n > 1 else ''} over {r} routing{'s' if r > 1 else ''}, "
                          f"{touched:.1f} experts = {touched * layer.expert_bytes / MIB:.0f} MiB touched per call, "
                          f"{rot / MIB:.0f} MiB distinct per replay"
                          for t, n, r, touched, rot in entry["points"])
    return (f"{entry['copies']} weight cop{'ies' if entry['copies'] > 1 else 'y'} of {layer_mib:.0f} MiB fp8 "
            f"(+ {2 * layer_mib:.0f} MiB bf16 each), L2 {l2_bytes / MIB:.0f} MiB; the calls of one graph cycle "
            f"over the copies and the routings: {per_point}")


# -------------------------------------------------------------------------------------------- summary

def _geomean(xs: list) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _verdict(value: float, target: float) -> str:
    return "MET" if value >= target else f"MISSED by {100 * (1 - value / target):.0f}%"


def summarize(rows: list) -> dict:
    """The issue's targets against qbackend.grouped's rows; prints one line per target."""
    by = {(r["shape"], r["tokens"], r["impl"]): r for r in rows}
    ours = [r for r in rows if r["impl"] == QB]
    out = {}
    lines = []
    served_by_ = sorted({r["provider"] + (f" ({r['path']})" if r["path"] else "") for r in ours})
    if served_by_:
        lines.append("qbackend.grouped was served by: " + "; ".join(served_by_))

    pairs = [(by[(r["shape"], r["tokens"], SGM)]["us"] / r["us"], r) for r in ours
             if (r["shape"], r["tokens"], SGM) in by]
    if pairs:
        geo, (low, at) = _geomean([x for x, _ in pairs]), min(pairs, key=lambda p: p[0])
        tg, tm = TARGETS["vs_torch_scaled_grouped_mm_geomean"], TARGETS["vs_torch_scaled_grouped_mm_min"]
        out["vs_torch_scaled_grouped_mm"] = {"points": len(pairs), "geomean": geo, "min": low,
                                             "min_at": f"{at['shape']}, {at['tokens']} tokens",
                                             "target_geomean": tg, "target_min": tm,
                                             "met": geo >= tg and low >= tm}
        lines.append(f"vs torch._scaled_grouped_mm over {len(pairs)} points: geomean x{geo:.2f} (target >= x{tg}: "
                     f"{_verdict(geo, tg)}), min x{low:.2f} at {at['shape']}, {at['tokens']} tokens "
                     f"(target >= x{tm}: {_verdict(low, tm)})")
    else:
        lines.append("vs torch._scaled_grouped_mm: no point where both ran")

    pairs = [(by[(r["shape"], r["tokens"], LOOP)]["us"] / r["us"], r) for r in ours
             if r["tokens"] <= DECODE_TOKENS and r["G"] >= 64 and (r["shape"], r["tokens"], LOOP) in by]
    if pairs:
        geo, (low, at) = _geomean([x for x, _ in pairs]), min(pairs, key=lambda p: p[0])
        t = TARGETS["vs_loop_decode_min"]
        out["vs_loop_decode"] = {"points": len(pairs), "geomean": geo, "min": low,
                                 "min_at": f"{at['shape']}, {at['tokens']} tokens", "target_min": t, "met": low >= t}
        lines.append(f"vs loop.scaled_mm at <= {DECODE_TOKENS} tokens, G >= 64, over {len(pairs)} points: min "
                     f"x{low:.2f} at {at['shape']}, {at['tokens']} tokens, geomean x{geo:.2f} (target >= x{t}: "
                     f"{_verdict(low, t)})")
    else:
        lines.append(f"vs loop.scaled_mm at <= {DECODE_TOKENS} tokens, G >= 64: no point where both ran")

    pre = [r for r in ours if r["model"] == "DeepSeek-V3" and r["tokens"] == 16384]
    t = TARGETS["prefill_tflops_deepseek_16384"]
    if pre:
        low = min(r["tflops"] for r in pre)
        out["prefill_tflops_deepseek_16384"] = {r["layer"]: r["tflops"] for r in pre}
        out["prefill_tflops_deepseek_16384"].update(target=t, met=low >= t)
        lines.append("prefill, DeepSeek-V3 at 16384 tokens: " + ", ".join(f"{r['layer']} {r['tflops']:.0f} TFLOP/s"
                                                                           for r in pre)
                     + f" (target >= {t:.0f} each: {_verdict(low, t)})")
    else:
        lines.append("prefill, DeepSeek-V3 at 16384 tokens: not measured")

    dec = [r for r in ours if r["tokens"] <= DECODE_TOKENS]
    t = TARGETS["decode_touched_tbps"]
    if dec:
        low = min(dec, key=lambda r: r["touched_tbps"])
        out["decode_touched_tbps"] = {"points": len(dec), "min": low["touched_tbps"],
                                      "min_at": f"{low['shape']}, {low['tokens']} tokens",
                                      "median": statistics.median(r["touched_tbps"] for r in dec),
                                      "met_points": sum(r["touched_tbps"] >= t for r in dec), "target": t,
                                      "met": low["touched_tbps"] >= t}
        d = out["decode_touched_tbps"]
        lines.append(f"decode (<= {DECODE_TOKENS} tokens), touched expert weights: {d['met_points']} of {len(dec)} "
                     f"points at >= {t} TB/s, min {low['touched_tbps']:.2f} TB/s at {low['shape']}, "
                     f"{low['tokens']} tokens, median {d['median']:.2f} "
                     f"({_verdict(low['touched_tbps'], t)})")
    else:
        lines.append(f"decode (<= {DECODE_TOKENS} tokens): not measured")
    print("summary against the issue's targets (set for an H200):")
    for line in lines:
        print("  " + line)
    return out


def plot(rows: list, path: str, device: str) -> None:
    try:
        from qbackend.bench_report import pyplot
        plt = pyplot()
    except ImportError as e:
        print(f"no PNG: {e}")
        return
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    if not shapes:
        return
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.2 * len(shapes), 7.5), squeeze=False)
    for j, shape in enumerate(shapes):
        for i, impl in enumerate(IMPLS):
            pts = sorted((r["tokens"], r["tflops"], r["touched_tbps"]) for r in rows
                         if r["shape"] == shape and r["impl"] == impl)
            if pts:
                t, tf, tb = zip(*pts)
                axes[0][j].plot(t, tf, marker="o", ms=3, color=f"C{i}", label=impl)
                axes[1][j].plot(t, tb, marker="o", ms=3, color=f"C{i}", label=impl)
        if "(tiny)" not in shape:   # the targets are for the real layers
            if shape.startswith("DeepSeek-V3 "):
                axes[0][j].axhline(TARGETS["prefill_tflops_deepseek_16384"], ls="--", c="red", lw=0.8)
            axes[1][j].axhline(TARGETS["decode_touched_tbps"], ls="--", c="red", lw=0.8)
        axes[0][j].set_title(shape, fontsize=9)
        axes[0][j].set_ylabel("TFLOP/s (routed tokens)")
        axes[1][j].set_ylabel("TB/s (touched expert weights)")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch tokens")
            ax.grid(True, which="both", lw=0.3)
    axes[0][0].legend(fontsize=7)
    how = "eager (smoke test)" if device.startswith("cpu") else "CUDA-graph replay"
    fig.suptitle(f"MoE expert layers, grouped GEMM, bf16 out, {device}; {how}; red: the issue's targets")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print("wrote", path)


# ----------------------------------------------------------------------------------------------- main

def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"


def method(run: Run, l2_bytes: int) -> dict:
    eager = not run.cuda
    return {
        "timing": ("eager on the CPU: one call per point, perf_counter, median of 3 (smoke test, not a measurement)"
                   if eager else
                   f"CUDA-graph replay of one graph per impl (its calls as listed per row), median of 5 trials of "
                   f"~{run.args.trial_ms:g} ms; impls timed once per round in a balanced order, "
                   f"{run.args.rounds or 'a full design of'} rounds, median over rounds (qbackend/benchmark.py); "
                   "torch.cuda.empty_cache() before each capture"),
        "routing": "top-k experts per token uniformly at random without replacement, fixed seeds, sorted with "
                   "qbackend.moe_align; activations random normal, gathered and quantized outside the times",
        "weights": "random normal / sqrt(K) in bf16, quantized per expert: per output channel (Mixtral, Qwen3) or "
                   "128 x 128 blocks (DeepSeek-V3); the bf16 impl multiplies the bf16 weights they came from",
        "torch._scaled_grouped_mm": "scales laid out in torch's form once (scale_a [rows], scale_b [G, N]), "
                                    "use_fast_accum=True, bf16 out",
        "loop.scaled_mm": "qbackend.scaled_mm per non-empty expert, written into one output; expert boundaries "
                          "read on the host while the calls are built (not timed)",
        "check": f"each impl's output on up to 3 experts' rows against the fp32 product, relative error < {TOL}",
        "l2": {shape: ("CPU: one copy, one call" if eager else l2_note(layer, run.l2[shape], l2_bytes))
               for shape, layer in run.layers.items() if shape in run.l2},
    }


def save(path: str, run: Run, meta: dict, summary=None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    res = dict(meta, method=method(run, meta["l2_bytes"]), rows=run.rows, skipped=run.skipped, wrong=run.wrong)
    if summary is not None:
        res["summary"] = summary
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, path)


def _list(text: str, known, what: str, ap) -> list:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in known]
    if bad or not items:
        ap.error(f"--{what}: unknown {', '.join(bad) or '(empty)'}; known: {', '.join(known)}")
    return items


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="directory for moe_<device>.json and its PNG")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--tokens", help=f"batch tokens, comma-separated (default {','.join(map(str, TOKENS))}; "
                                     f"--tiny: {','.join(map(str, TINY_TOKENS))})")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, of {', '.join(IMPLS)}")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point (0: a full balanced design)")
    ap.add_argument("--trial-ms", type=float, default=TRIAL_MS, help="milliseconds of replays per trial")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes of the same families (smoke test)")
    ap.add_argument("--summarize", metavar="JSON", help="print the summary of (and plot) a results JSON; no timing")
    args = ap.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as f:
            res = json.load(f)
        summarize(res["rows"])
        plot(res["rows"], os.path.splitext(args.summarize)[0] + ".png", res.get("device", ""))
        return 0
    if not args.out:
        ap.error("--out is required (or --summarize)")
    if args.rounds < 0 or not args.trial_ms > 0:
        ap.error("--rounds must be >= 0 and --trial-ms > 0")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"no CUDA device in this torch ({torch.__version__}); --device cpu --tiny runs the smoke test")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    models = _list(args.models, list(MODELS), "models", ap)
    impls = _list(args.impls, IMPLS, "impls", ap)
    try:
        tokens = [int(t) for t in (args.tokens or ",".join(map(str, TINY_TOKENS if args.tiny else TOKENS))).split(",")]
    except ValueError:
        ap.error(f"--tokens: comma-separated positive integers; got {args.tokens!r}")
    if not tokens or min(tokens) < 1:
        ap.error(f"--tokens: comma-separated positive integers; got {args.tokens!r}")

    layers = layers_of(models, args.tiny)
    run = Run(device, args, layers)
    cuda = run.cuda
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) if cuda else 0
    meta = {"device": device_name(device), "torch": torch.__version__, "cuda": torch.version.cuda,
            "qbackend": qbackend.__version__, "tiny": args.tiny, "l2_bytes": l2_bytes,
            "arch": "sm_%d%d" % torch.cuda.get_device_capability(device) if cuda else "cpu",
            "targets": TARGETS,
            "layers": [{"shape": la.shape, "G": la.G, "topk": la.topk, "N": la.N, "K": la.K, "scales": la.scales,
                        "weight_copies": copies_for(la, cuda), "layer_fp8_bytes": la.G * la.expert_bytes}
                       for la in layers]}
    path = os.path.join(args.out, f"moe_{device_tag(device)}.json")
    print(f"{meta['device']}, torch {torch.__version__} (CUDA {torch.version.cuda}), qbackend {qbackend.__version__}; "
          f"{len(layers)} layers x {len(tokens)} token counts x {len(impls)} impls -> {path}", flush=True)
    t_start = time.time()
    for i, layer in enumerate(layers):
        t0 = time.time()
        copies = copies_for(layer, cuda)
        weights = make_weights(layer, copies, device, seed=101 * i + layer.N + layer.K)
        print(f"{layer.shape}: G={layer.G} top-{layer.topk} N={layer.N} K={layer.K} {layer.scales} scales, "
              f"{copies} weight cop{'ies' if copies > 1 else 'y'} made in {time.time() - t0:.1f} s", flush=True)
        for T in tokens:
            bench_point(run, layer, T, weights, impls)
            if cuda:
                torch.cuda.empty_cache()
            save(path, run, meta)   # after every point: a run cut short keeps what it measured
        del weights
        if cuda:
            torch.cuda.empty_cache()
        print(f"{layer.shape}: {time.time() - t0:.1f} s (total {time.time() - t_start:.1f} s)", flush=True)
    summary = summarize(run.rows)
    save(path, run, meta, summary)
    print("wrote", path)
    plot(run.rows, os.path.splitext(path)[0] + ".png", meta["device"])
    if run.wrong:
        print(f"{len(run.wrong)} WRONG RESULT(S): " + "; ".join(f"{w['impl']} {w['shape']} T={w['tokens']}"
                                                               for w in run.wrong))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
