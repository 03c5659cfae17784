"""End-to-end speed: a Llama-3-8B-shaped decoder, bf16 against fp8_dynamic through qbackend.

The model is built from a config with random weights (transformers, nothing downloaded), 32 layers
deep by default as Llama-3-8B is, with q/k/v and gate/up merged into one projection each as serving
engines run them (MergedProjection; --separate-projections keeps transformers' layout); the fp8 copy
has every decoder Linear swapped for a QuantLinear (lm_head and embeddings stay bf16, as FP8
checkpoints ship them).

  prefill:   tokens/s for a batch of 8 x 2048 tokens (no KV cache; logits for the last token only,
             as an engine computes them); with --compile measured again with each decoder layer
             under torch.compile, as engines run it (reported as the prefill, eager kept beside it)
  decode:    latency of one decode step at batch 1, 16 and 64 with a KV cache holding --context
             tokens (transformers' StaticCache), replayed from a CUDA graph so that the host's
             Python does not hide the GEMMs
  attention: EngineAttention (below), the same in both models

    python bench/bench_e2e.py --compile             # on the H200: bench/results/e2e_h200.json + .png
    python bench/bench_e2e.py --tiny --device cpu   # smoke test of the script itself

Output JSON: {"prefill": {"bf16_tok_s", "fp8_tok_s", ...}, "decode": [{"batch", "bf16_ms",
"fp8_ms", ...}], plus the config, device, provider selection and notes}.
"""
from __future__ import annotations

import argparse
import copy
import inspect
import json
import statistics
import time
from pathlib import Path

import torch

import qbackend
from qbackend.nn import quantize_model

TARGETS = {"prefill_speedup": 1.5, "decode_speedup_batch_1_16": 1.3}


class EngineAttention:
    """Attention as an inference engine computes it, for both models alike: scaled_dot_product_attention
    over the filled part of the KV cache only (`filled` slots, set by the decode benchmark; None: all
    of it), grouped-query K/V read in place (enable_gqa), no mask tensor. transformers' own "sdpa"
    path masks the whole static cache and, with a mask, copies K and V out to every query head
    (repeat_kv): at batch 16 that copy alone took longer than all the layer GEMMs, which would hide
    what this benchmark compares."""

    NAME = "engine_sdpa"
    SUMMARY = "Attention as an inference engine computes it, for both models alike (see bench/bench_e2e.py)"
    filled: int | None = None

    @classmethod
    def register(cls) -> str:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
        AttentionInterface.register(cls.NAME, cls.forward)
        AttentionMaskInterface.register(cls.NAME, lambda *args, **kwargs: None)  # no mask tensor is built
        return cls.NAME

    @classmethod
    def forward(cls, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        q_len = query.shape[2]
        kv_len = cls.filled or key.shape[2]
        if q_len > 1 and q_len != kv_len:
            raise ValueError(f"EngineAttention: {q_len} queries over {kv_len} cached keys: only a full "
                             "causal pass or one decode step is supported")
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key[:, :, :kv_len], value[:, :, :kv_len], is_causal=q_len > 1, scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous(), None


def llama3_8b_config(layers: int, tiny: bool):
    from transformers import LlamaConfig
    attention = EngineAttention.register()
    if tiny:
        return LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                           num_key_value_heads=2, num_hidden_layers=layers, vocab_size=1000,
                           max_position_embeddings=4096, attn_implementation=attention)
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                       num_key_value_heads=8, num_hidden_layers=layers, vocab_size=128256,
                       max_position_embeddings=8192, rope_theta=500000.0, attn_implementation=attention)


def build_model(config, device):
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build in bf16 directly: no fp32 copy of 8B-shaped layers
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


class MergedProjection(torch.nn.Module):
    """Several Linear layers that read the same input, as one GEMM: the layout serving engines use
    for q/k/v and for gate/up (Llama-3-8B's merged shapes are (6144, 4096) and (28672, 4096)). It
    takes the first layer's place and returns its slice; `MergedSlice` modules take the others'
    places and return theirs from the same product, so the model's own forward is unchanged."""

    def __init__(self, linears):
        super().__init__()
        first = linears[0]
        self.proj = torch.nn.Linear(first.in_features, sum(lin.out_features for lin in linears),
                                    bias=first.bias is not None, device=first.weight.device,
                                    dtype=first.weight.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(torch.cat([lin.weight for lin in linears]))
            if first.bias is not None:
                self.proj.bias.copy_(torch.cat([lin.bias for lin in linears]))
        self.sizes = [lin.out_features for lin in linears]
        self.source, self.slices = None, ()

    def forward(self, x):
        first, *rest = self.proj(x).split(self.sizes, dim=-1)
        self.source, self.slices = x, tuple(rest)
        return first


class MergedSlice(torch.nn.Module):
    def __init__(self, merged: MergedProjection, index: int):
        super().__init__()
        self.merged = [merged]  # a list: not a second registration of the same submodule
        self.index = index

    def forward(self, x):
        merged = self.merged[0]
        if merged.source is not x:
            raise RuntimeError("MergedSlice: called with another input than its merged projection")
        part = merged.slices[self.index - 1]
        if self.index == len(merged.slices):  # the last slice: let go of the activations
            merged.source, merged.slices = None, ()
        return part


def merge_projections(model) -> None:
    """q/k/v and gate/up of every decoder layer merged into one projection each, in place."""
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                              (layer.mlp, ("gate_proj", "up_proj"))):
            merged = MergedProjection([getattr(parent, n) for n in names])
            setattr(parent, names[0], merged)
            for i, n in enumerate(names[1:], start=1):
                setattr(parent, n, MergedSlice(merged, i))


class Timer:
    """Mean seconds per call: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, fn, iters: int, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


@torch.no_grad()
def prefill_tok_s(model, batch, seq_len, vocab, device, iters) -> float:
    ids = torch.randint(0, vocab, (batch, seq_len), device=device)
    seconds = Timer(device)(lambda: model(ids, use_cache=False, logits_to_keep=1), iters)
    return batch * seq_len / seconds


@torch.no_grad()
def decode_step(model, config, batch, context, device):
    """A function running one decode step with `context` tokens already in a static KV cache."""
    from transformers import StaticCache
    cache = StaticCache(config=config, max_cache_len=context + 8)
    # transformers 5 renamed past_key_values to cache.
    kv = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}
    prompt = torch.randint(0, config.vocab_size, (batch, context), device=device)
    positions = torch.arange(context, device=device).unsqueeze(0).expand(batch, context)
    EngineAttention.filled = context
    model(prompt, position_ids=positions, use_cache=True, logits_to_keep=1, **kv)
    step_ids = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    step_pos = torch.full((batch, 1), context, device=device)
    # StaticCache advances a device-side write position on every call (graph replays included):
    # rewind it first, so every timed step writes slot `context` instead of running off the end.
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", [])
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def step():
        EngineAttention.filled = context + 1  # the prompt and this step's token
        for c in counters:
            c.fill_(context)
        return model(step_ids, position_ids=step_pos, use_cache=True, logits_to_keep=1, **kv).logits

    return step


@torch.no_grad()
def decode_step_ms(model, config, batch, context, device, iters, graphs: bool) -> tuple[float, bool, str]:
    """One decode step's latency with `context` tokens already in a static KV cache."""
    step = decode_step(model, config, batch, context, device)
    try:
        return _time_decode(step, batch, device, iters, graphs)
    finally:
        EngineAttention.filled = None


def _time_decode(step, batch, device, iters, graphs: bool) -> tuple[float, bool, str]:
    timer = Timer(device)
    note = ""
    if graphs and timer.cuda:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up (allocations, lazy init) off the capture
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            return timer(graph.replay, iters) * 1e3, True, note
        except Exception as e:  # noqa: BLE001 - report and fall back to eager timing
            note = f"CUDA graph capture failed at batch {batch}: {type(e).__name__}: {e}"
            torch.cuda.synchronize()
    return timer(step, iters) * 1e3, False, note


@torch.no_grad()
def agreement(bf16_model, fp8_model, vocab, device) -> dict:
    """Cosine similarity, fp8 against bf16, of the last-token logits and of the hidden states after
    each layer: a check that the fp8 model computes the same function. With random weights each
    layer's quantization noise compounds through the depth (about 0.7 % of cosine per layer of this
    shape), so the logits of a deep random model agree less than one layer does; accuracy on a real
    model is checked by tests/test_minilm_accuracy.py."""
    ids = torch.randint(0, vocab, (2, 64), device=device)
    a = bf16_model(ids, use_cache=False, logits_to_keep=1, output_hidden_states=True)
    b = fp8_model(ids, use_cache=False, logits_to_keep=1, output_hidden_states=True)

    def cos(x, y):
        return round(float(torch.nn.functional.cosine_similarity(x.float().flatten(), y.float().flatten(), dim=0)), 5)

    return {"logits_cosine_fp8_vs_bf16": cos(a.logits, b.logits),
            "hidden_state_cosine_by_layer": [cos(x, y) for x, y in zip(a.hidden_states[1:], b.hidden_states[1:])]}


KERNEL_KINDS = [("gemm", ("gemm", "nvjet", "cutlass", "gemv", "splitk", "marlin")),
                ("quantize", ("(anonymous namespace)::per_token", "(anonymous namespace)::elementwise",
                              "(anonymous namespace)::amax")),
                ("attention", ("attention", "fmha", "flash", "sdpa", "softmax"))]


@torch.no_grad()
def profile_decode(models: dict, config, batches, context, device) -> None:
    """Where one eager decode step spends GPU time, per kernel kind and the top kernels."""
    from torch.profiler import ProfilerActivity, profile
    timer = Timer(device)
    activity = ProfilerActivity.CUDA if timer.cuda else ProfilerActivity.CPU  # CPU: to test the script
    for batch in batches:
        for name, model in models.items():
            step = decode_step(model, config, batch, context, device)
            for _ in range(3):
                step()
            timer.sync()
            with profile(activities=[activity]) as prof:
                step()
                timer.sync()
            EngineAttention.filled = None
            kernels = [(e.key, e.device_time_total if timer.cuda else e.self_cpu_time_total, e.count)
                       for e in prof.key_averages()]
            kernels = [k for k in kernels if k[1] > 0]
            total = sum(t for _, t, _ in kernels)
            kinds = {kind: 0.0 for kind, _ in KERNEL_KINDS}
            kinds["other"] = 0.0
            for key, t, _ in kernels:
                kind = next((k for k, words in KERNEL_KINDS if any(w in key.lower() for w in words)), "other")
                kinds[kind] += t
            print(f"decode batch {batch} {name}: {total / 1e3:.2f} ms of kernels; "
                  + ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in kinds.items()))
            for key, t, count in sorted(kernels, key=lambda k: -k[1])[:12]:
                print(f"    {t / 1e3:7.3f} ms  {count:5d}x  {key[:110]}")


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    p = result["prefill"]
    modes = [("eager", p["eager"]), ("compiled", p)] if "eager" in p else [("eager", p)]
    for i, (_, m) in enumerate(modes):
        ax1.bar([i - 0.2], [m["bf16_tok_s"]], 0.4, color="#888", label="bf16" if i == 0 else None)
        ax1.bar([i + 0.2], [m["fp8_tok_s"]], 0.4, color="#2a7", label="fp8_dynamic" if i == 0 else None)
    ax1.set_xticks(range(len(modes)), [f"{mode}\n{m['speedup']:.2f}x" for mode, m in modes])
    ax1.set_title(f"prefill, {p['batch']} x {p['seq_len']} tokens")
    ax1.set_ylabel("tokens / s")
    ax1.legend()
    d = result["decode"]
    xs = range(len(d))
    ax2.bar([x - 0.2 for x in xs], [r["bf16_ms"] for r in d], 0.4, label="bf16", color="#888")
    ax2.bar([x + 0.2 for x in xs], [r["fp8_ms"] for r in d], 0.4, label="fp8_dynamic", color="#2a7")
    ax2.set_xticks(list(xs), [f"batch {r['batch']}\n{r['speedup']:.2f}x" for r in d])
    ax2.set_ylabel("ms per decode step")
    ax2.set_title(f"decode, {result['decode_context']} tokens of context"
                  f"{', CUDA graphs' if all(r['graphs'] for r in d) else ''}")
    ax2.legend()
    fig.suptitle(f"{result['model']} on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def decode_rows(models: dict, batches, config, context, device, iters, graphs, notes) -> list:
    rows = []
    for batch in batches:
        row = {"batch": batch}
        for name, model in models.items():
            ms, captured, note = decode_step_ms(model, config, batch, context, device, iters, graphs)
            row[f"{name}_ms"] = ms
            row["graphs"] = captured and row.get("graphs", True)
            if note:
                notes.append(f"{name}: {note}")
        row["speedup"] = row["bf16_ms"] / row["fp8_ms"]
        rows.append(row)
    return rows


def prefill_row(models: dict, shape) -> dict:
    row = {f"{name}_tok_s": prefill_tok_s(model, *shape) for name, model in models.items()}
    row["speedup"] = row["fp8_tok_s"] / row["bf16_tok_s"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prefill-batch", type=int, default=8)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--decode-batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--context", type=int, default=1024, help="tokens in the KV cache while decoding")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a small config, to test the script")
    ap.add_argument("--out", default="bench/results/e2e_h200.json")
    ap.add_argument("--separate-projections", action="store_true",
                    help="keep q/k/v and gate/up as separate layers (default: merged, as engines run them)")
    ap.add_argument("--profile", action="store_true", help="print where a decode step spends GPU time, then exit")
    ap.add_argument("--compile", action="store_true",
                    help="also time prefill with each decoder layer under torch.compile (reported as the prefill; "
                         "the eager time is kept beside it)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    config = llama3_8b_config(args.layers, args.tiny)
    bf16 = build_model(config, device)
    if not args.separate_projections:
        merge_projections(bf16)
    fp8 = quantize_model(copy.deepcopy(bf16), "fp8_dynamic", ignore=["lm_head"])
    if args.profile:
        profile_decode({"bf16": bf16, "fp8": fp8}, config, args.decode_batches, args.context, device)
        return 0
    notes = []
    result = {
        "model": f"Llama-3-8B-shaped, {args.layers} layers, random weights{' (tiny)' if args.tiny else ''}",
        "projections": "separate" if args.separate_projections else "q/k/v and gate/up merged",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "qbackend": qbackend.__version__,
        "config": {k: getattr(config, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                   "num_key_value_heads", "num_hidden_layers", "vocab_size")},
        "targets": TARGETS,
    }
    try:
        table = qbackend.selection_table(qbackend.device_info(device))
        result["providers"] = {kind: name for kind, (name, _) in table.items()}
    except Exception as e:  # noqa: BLE001 - informational only
        notes.append(f"provider table unavailable: {e}")
    result.update(agreement(bf16, fp8, config.vocab_size, device))

    result["attention"] = EngineAttention.SUMMARY
    result["decode_context"] = args.context
    models = {"bf16": bf16, "fp8": fp8}
    prefill_shape = (args.prefill_batch, args.prefill_len, config.vocab_size, device, args.iters)
    decode_args = (config, args.context, device, args.iters * 5, not args.no_graphs, notes)
    decode = decode_rows(models, args.decode_batches, *decode_args)
    prefill = prefill_row(models, prefill_shape)
    result["decode"], result["prefill"] = decode, {**prefill, "mode": "eager"}
    if args.compile:
        # As engines run prefill: the norms, rotary embedding, SiLU and residual adds fused by
        # torch.compile (one compiled decoder layer serves every layer), the GEMMs and the attention
        # unchanged; the same for both models. Decode stays eager: its static KV cache is indexed by
        # each layer's number, which torch.compile would specialize into one compile per layer.
        for model in models.values():
            for layer in model.model.layers:
                layer.compile(dynamic=False)
        result["prefill"] = {**prefill_row(models, prefill_shape), "mode": "torch.compile of each decoder layer",
                             "eager": prefill}
    result["prefill"].update(batch=args.prefill_batch, seq_len=args.prefill_len)

    p = result["prefill"]
    if p["speedup"] < TARGETS["prefill_speedup"]:
        notes.append(f"prefill speedup {p['speedup']:.2f}x misses the {TARGETS['prefill_speedup']}x target")
    for row in result["decode"]:
        if row["batch"] in (1, 16) and row["speedup"] < TARGETS["decode_speedup_batch_1_16"]:
            notes.append(f"decode batch {row['batch']} speedup {row['speedup']:.2f}x misses the "
                         f"{TARGETS['decode_speedup_batch_1_16']}x target")
    result["notes"] = notes

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        plot(result, out.with_suffix(".png"))
    except ImportError:
        notes.append("matplotlib not installed: no plot")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"prefill": result["prefill"], "decode": result["decode"], "notes": notes}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
