"""End-to-end speed: a Llama-3-8B-shaped decoder (or, with --model moe, a Qwen3-30B-A3B-shaped mixture of
experts), bf16 against fp8_dynamic through qbackend.

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

--model moe (issue 38): Qwen3MoeForCausalLM from a config with Qwen3-30B-A3B's shapes (hidden 2048, 32 query
and 4 KV heads of 128, 128 experts, top-8 with the top-k weights renormalized, expert intermediate 768, vocab
151936), random weights, 48 layers deep by default as the model is. Only the depth may be cut (--layers): the
bf16 lm_head (0.6 GB) is read by every decode step, and a decode step at batch 1 reads about 114 MB of bf16
weights per layer (8 experts: 75 MB, attention: 38 MB), so with 4 layers the lm_head alone would cap the
fp8/bf16 ratio at 1.27x, under the issue's 1.4x target, whatever the kernels do (at 48 layers: 1.81x). The
48 layers' weights take about 61 GB in bf16 and 31 GB in fp8, both models held at once (on an 80 GB card
use --layers 32 or fewer).
  bf16 model: each sparse MoE block is replaced by GroupedBf16MoE (below): QuantMoE's routing and data
             movement (router in fp32, qbackend.moe_align on the device, one gather, one weighted sum) with
             its two GEMMs through torch._grouped_mm in bf16, so that the comparison is the expert GEMMs
             and nothing else, and the block captures in a CUDA graph. Where this torch has no
             torch._grouped_mm, transformers' own block stays (the JSON's bf16_moe says which). Its output
             is checked against transformers' block once (bf16_moe.check_rel_err).
  fp8 model: each sparse MoE block is a qbackend.nn.QuantMoE made from the same router and expert weights
             (QuantMoE.from_float, per-expert per-channel fp8 scales, per-token activation scales); the
             attention projections go through quantize_model as in the Llama shape (lm_head stays bf16).
    python bench/bench_e2e.py --model moe           # bench/results/e2e_moe_<device>.json + .png
    python bench/bench_e2e.py --model moe --tiny --device cpu --layers 2   # smoke test
Its JSON adds bf16_moe, moe_served (the provider and path serving QuantMoE's two grouped GEMMs),
grouped_explain (qbackend.explain of each grouped kind) and the target (FP8 decode >= 1.4x bf16 at batch 1
and 16); there is no prefill target.
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
import torch.nn.functional as F

import qbackend
from qbackend.benchmark import device_tag
from qbackend.nn import QuantMoE, quantize_model

TARGETS = {"prefill_speedup": 1.5, "decode_speedup_batch_1_16": 1.3}
MOE_TARGETS = {"decode_speedup_batch_1_16": 1.4}
DEFAULT_LAYERS = {"llama": 32, "moe": 48}


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


def qwen3_30b_a3b_config(layers: int, tiny: bool):
    """Qwen3-30B-A3B's shapes (its config.json), `layers` deep; every layer's feed-forward is a sparse MoE block."""
    try:
        from transformers import Qwen3MoeConfig
    except ImportError as e:
        raise SystemExit(f"--model moe needs a transformers with Qwen3-MoE (4.51 or newer): {e}") from None
    attention = EngineAttention.register()
    if tiny:
        return Qwen3MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_experts=16,
                              num_experts_per_tok=4, norm_topk_prob=True, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32, num_hidden_layers=layers, vocab_size=1000,
                              max_position_embeddings=4096, decoder_sparse_step=1, mlp_only_layers=[],
                              attn_implementation=attention)
    return Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                          num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
                          head_dim=128, num_hidden_layers=layers, vocab_size=151936, max_position_embeddings=40960,
                          rope_theta=1000000.0, rms_norm_eps=1e-6, decoder_sparse_step=1, mlp_only_layers=[],
                          tie_word_embeddings=False, attn_implementation=attention)


def build_model(config, device):
    if type(config).__name__ == "Qwen3MoeConfig":
        from transformers import Qwen3MoeForCausalLM as model_class
    else:
        from transformers import LlamaForCausalLM as model_class
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build in bf16 directly: no fp32 copy of 8B-shaped layers
    try:
        with torch.device(device):
            model = model_class(config)
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
    """q/k/v and gate/up of every decoder layer merged into one projection each, in place (a sparse MoE
    block has no gate/up Linear layers: its experts are left as they are)."""
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                              (layer.mlp, ("gate_proj", "up_proj"))):
            if not all(isinstance(getattr(parent, n, None), torch.nn.Linear) for n in names):
                continue
            merged = MergedProjection([getattr(parent, n) for n in names])
            setattr(parent, names[0], merged)
            for i, n in enumerate(names[1:], start=1):
                setattr(parent, n, MergedSlice(merged, i))


def is_moe_block(module) -> bool:
    """A sparse MoE feed-forward block: transformers' (a router `gate` and `experts`) or one of ours."""
    return isinstance(module, (GroupedBf16MoE, QuantMoE)) or (hasattr(module, "gate") and hasattr(module, "experts"))


def expert_weights(block) -> tuple:
    """(router [E, H], gate/up [E, 2I, H] with each expert's gate rows first, down [E, H, I]) of a sparse MoE
    block, without a copy where they are stacked already: transformers 5 keeps them so; transformers 4
    keeps one MLP module per expert."""
    if isinstance(block, GroupedBf16MoE):
        return block.router_weight, block.w13, block.w2
    router, experts = block.gate.weight.detach(), block.experts
    if hasattr(experts, "gate_up_proj"):
        if not getattr(experts, "is_concatenated", True):
            raise NotImplementedError("expert_weights: gate and up rows interleaved per expert are not supported")
        gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
        if getattr(experts, "is_transposed", False):  # stored as [E, H, 2I] and [E, I, H]
            gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
        return router, gate_up, down
    w13 = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in experts]).detach()
    return router, w13, torch.stack([e.down_proj.weight for e in experts]).detach()


class GroupedBf16MoE(torch.nn.Module):
    """The bf16 baseline of a sparse MoE block: QuantMoE's computation step for step (fp32 router, softmax,
    top-k, renormalized weights; qbackend.moe_align; one gather into expert order; SiLU(gate) * up; the
    weighted sum over each token's experts) with the two expert GEMMs in bf16 through torch._grouped_mm
    (device-side offsets, no host sync: it captures in a CUDA graph). Written out here rather than taken
    from transformers so that the two models differ in the GEMMs and in what FP8 fuses into its
    quantizes and GEMMs only: QuantMoE gathers in its first quantize, computes SiLU(gate) * up in its
    second (qbackend.silu_mul_quantize) and applies the routing weights in the down GEMM's scales. Here
    each step is the shortest torch has: SiLU(gate) * up two bf16 kernels, the weighted sum one
    batched bf16 GEMM (fp32 accumulation) over each token's expert outputs."""

    IMPL = "torch._grouped_mm"

    def __init__(self, router_weight, w13, w2, top_k: int, renormalize: bool):
        super().__init__()
        self.num_experts, two_i, self.hidden = w13.shape
        self.intermediate, self.top_k, self.renormalize = two_i // 2, top_k, renormalize
        self.register_buffer("router_weight", router_weight)
        self.register_buffer("w13", w13)  # [E, 2I, H], gate rows then up rows
        self.register_buffer("w2", w2)    # [E, H, I]

    @classmethod
    def from_block(cls, block, top_k: int, renormalize: bool) -> "GroupedBf16MoE":
        router, w13, w2 = expert_weights(block)
        return cls(router, w13.contiguous(), w2.contiguous(), top_k, renormalize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.hidden)
        probs = torch.softmax(F.linear(x2.float(), self.router_weight.float()), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        perm, offsets, inverse = qbackend.moe_align(ids, self.num_experts)
        rows = x2.index_select(0, perm // self.top_k)
        h = torch._grouped_mm(rows, self.w13.transpose(-2, -1), offs=offsets)
        i = self.intermediate
        act = F.silu(h[:, :i]) * h[:, i:]
        y = torch._grouped_mm(act, self.w2.transpose(-2, -1), offs=offsets)
        y = y.index_select(0, inverse).reshape(x2.shape[0], self.top_k, self.hidden)
        return torch.bmm(weights.unsqueeze(1).to(y.dtype), y).reshape(x.shape)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"top_k={self.top_k}, {self.IMPL} bf16")


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


@torch.no_grad()
def moe_bf16_blocks(model, config, device) -> dict:
    """Replace every sparse MoE block of the bf16 model by a GroupedBf16MoE (in place, sharing its weights)
    where this torch has torch._grouped_mm; the first one is checked against transformers' block on 64
    random tokens. Returns what the JSON says of the bf16 blocks."""
    experts_impl = getattr(config, "_experts_implementation", None) or "eager"
    layers = [layer for layer in model.model.layers if is_moe_block(layer.mlp)]
    reference = f"transformers {type(layers[0].mlp).__name__} (experts_implementation={experts_impl!r})"
    if not hasattr(torch, "_grouped_mm"):
        return {"impl": reference, "why": f"torch {torch.__version__} has no torch._grouped_mm: transformers' "
                                          "block kept (it may not capture in a CUDA graph)"}
    top_k, renormalize = config.num_experts_per_tok, bool(config.norm_topk_prob)
    info = {"impl": f"GroupedBf16MoE ({GroupedBf16MoE.IMPL} bf16, routing as QuantMoE's)"}
    for n, layer in enumerate(layers):
        block = GroupedBf16MoE.from_block(layer.mlp, top_k, renormalize)
        if n == 0:
            g = torch.Generator(device=device).manual_seed(1)
            x = torch.randn(1, 64, config.hidden_size, generator=g, device=device, dtype=torch.bfloat16)
            ref = layer.mlp(x)
            ref = ref[0] if isinstance(ref, tuple) else ref  # transformers 4 also returns the router logits
            info.update(check_against=reference, check_tokens=64, check_rel_err=round(_rel_err(block(x), ref), 6))
        layer.mlp = block
    return info


@torch.no_grad()
def fp8_moe_copy(bf16, config, scheme: str = "fp8_dynamic"):
    """The fp8 model: a copy of the bf16 one (its expert weights not copied) with each sparse MoE block a
    QuantMoE made from that block's router and expert weights, and every other Linear but lm_head a
    QuantLinear (quantize_model)."""
    layers = list(bf16.model.layers)
    blocks = {id(layer.mlp) for layer in layers if is_moe_block(layer.mlp)}
    fp8 = copy.deepcopy(bf16, dict.fromkeys(blocks))  # the MoE blocks come out as None: no copy of their experts
    for source, layer in zip(layers, fp8.model.layers):
        if id(source.mlp) in blocks:
            router, w13, w2 = expert_weights(source.mlp)
            i = w13.shape[1] // 2
            layer.mlp = QuantMoE.from_float(router.clone(), w13[:, :i], w13[:, i:], w2, config.num_experts_per_tok,
                                            scheme, renormalize=bool(config.norm_topk_prob))
    return quantize_model(fp8, scheme, ignore=["lm_head"])


@torch.no_grad()
def moe_served(model, device, tokens: int = 16) -> dict:
    """The provider and path serving the two grouped GEMMs of the fp8 model's first QuantMoE, for a routing of
    `tokens` random tokens (the decision qbackend.grouped_scaled_mm takes for those operands)."""
    from qbackend.bench_cli import served_by
    from qbackend.validate_grouped import validate_grouped_scaled_mm
    moe = next(layer.mlp for layer in model.model.layers if isinstance(layer.mlp, QuantMoE))
    x = torch.randn(tokens, moe.hidden, device=device, dtype=torch.bfloat16)
    _, ids = moe.route(x)
    _, offsets, _ = qbackend.moe_align(ids, moe.num_experts)
    rows = tokens * moe.top_k
    out = {}
    for name, k, w, scale in (("gate_up", moe.hidden, moe.w13, moe.w13_scale),
                              ("down", moe.intermediate, moe.w2, moe.w2_scale)):
        a, sa = qbackend.quantize(torch.randn(rows, k, device=device, dtype=torch.bfloat16),
                                  torch.float8_e4m3fn, "token")
        sb = scale.transpose(-2, -1) if scale.dim() == 3 else scale
        problem = validate_grouped_scaled_mm(a, w.transpose(-2, -1), sa, sb, offsets, torch.bfloat16, None)
        provider, path, how = served_by(qbackend.select(problem, device))
        out[name] = {"provider": provider, "path": path, "how": how, "problem": problem.describe(),
                     "N": w.shape[1], "K": k, "routed_rows": rows}
    return out


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


KERNEL_KINDS = [("gemm", ("gemm", "nvjet", "cutlass", "gemv", "splitk", "marlin", "grouped")),
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
    ap.add_argument("--model", choices=sorted(DEFAULT_LAYERS), default="llama",
                    help="llama: Llama-3-8B-shaped (default); moe: Qwen3-30B-A3B-shaped mixture of experts")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=None,
                    help=f"decoder layers (default: {DEFAULT_LAYERS['llama']} for llama, "
                         f"{DEFAULT_LAYERS['moe']} for moe)")
    ap.add_argument("--prefill-batch", type=int, default=8)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--decode-batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--context", type=int, default=1024, help="tokens in the KV cache while decoding")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a small config, to test the script")
    ap.add_argument("--out", default=None, help="the JSON to write (default: bench/results/e2e_h200.json for llama, "
                                                "bench/results/e2e_moe_<device>.json for moe)")
    ap.add_argument("--separate-projections", action="store_true",
                    help="keep q/k/v and gate/up as separate layers (default: merged, as engines run them)")
    ap.add_argument("--profile", action="store_true", help="print where a decode step spends GPU time, then exit")
    ap.add_argument("--compile", action="store_true",
                    help="also time prefill with each decoder layer under torch.compile (reported as the prefill; "
                         "the eager time is kept beside it)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    moe = args.model == "moe"
    layers = args.layers if args.layers is not None else DEFAULT_LAYERS[args.model]
    config = qwen3_30b_a3b_config(layers, args.tiny) if moe else llama3_8b_config(layers, args.tiny)
    targets = MOE_TARGETS if moe else TARGETS
    bf16 = build_model(config, device)
    if not args.separate_projections:
        merge_projections(bf16)
    if moe:
        bf16_moe = moe_bf16_blocks(bf16, config, device)
        fp8 = fp8_moe_copy(bf16, config)
    else:
        fp8 = quantize_model(copy.deepcopy(bf16), "fp8_dynamic", ignore=["lm_head"])
    if args.profile:
        profile_decode({"bf16": bf16, "fp8": fp8}, config, args.decode_batches, args.context, device)
        return 0
    notes = []
    if moe:
        result = {
            "model": f"Qwen3-30B-A3B-shaped MoE, {layers} layers, random weights{' (tiny)' if args.tiny else ''}",
            "projections": "separate" if args.separate_projections else "q/k/v merged (experts: gate/up stacked)",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "qbackend": qbackend.__version__, "transformers": _transformers_version(),
            "config": {k: getattr(config, k) for k in (
                "hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob",
                "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size")},
            "targets": targets,
            "bf16_moe": bf16_moe,
            "fp8_moe": "qbackend.nn.QuantMoE.from_float(..., 'fp8_dynamic'): per-expert per-channel weight scales, "
                       "per-token activation scales, qbackend.grouped_scaled_mm",
        }
    else:
        result = {
            "model": f"Llama-3-8B-shaped, {layers} layers, random weights{' (tiny)' if args.tiny else ''}",
            "projections": "separate" if args.separate_projections else "q/k/v and gate/up merged",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "qbackend": qbackend.__version__,
            "config": {k: getattr(config, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                       "num_key_value_heads", "num_hidden_layers", "vocab_size")},
            "targets": targets,
        }
    try:
        if moe:
            from qbackend.problem import ALL_KINDS, GROUPED_KINDS
            table = qbackend.selection_table(qbackend.device_info(device), ALL_KINDS)
            result["grouped_explain"] = {kind: qbackend.explain(kind, device).splitlines() for kind in GROUPED_KINDS}
        else:
            table = qbackend.selection_table(qbackend.device_info(device))
        result["providers"] = {kind: name for kind, (name, _) in table.items()}
    except Exception as e:  # noqa: BLE001 - informational only
        notes.append(f"provider table unavailable: {e}")
    if moe:
        try:
            result["moe_served"] = moe_served(fp8, device)
        except Exception as e:  # noqa: BLE001 - informational only
            notes.append(f"grouped provider decision unavailable: {type(e).__name__}: {e}")
        err = bf16_moe.get("check_rel_err")
        if err is not None and err > 2e-2:
            notes.append(f"GroupedBf16MoE differs from transformers' block by {err:.3g} (relative): routing "
                         "near-ties decided differently (fp32 against bf16 router logits) or a wrong baseline")
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
    if "prefill_speedup" in targets and p["speedup"] < targets["prefill_speedup"]:
        notes.append(f"prefill speedup {p['speedup']:.2f}x misses the {targets['prefill_speedup']}x target")
    for row in result["decode"]:
        if row["batch"] in (1, 16) and row["speedup"] < targets["decode_speedup_batch_1_16"]:
            notes.append(f"decode batch {row['batch']} speedup {row['speedup']:.2f}x misses the "
                         f"{targets['decode_speedup_batch_1_16']}x target")
    result["notes"] = notes

    out = Path(args.out or f"bench/results/e2e{'_moe' if moe else ''}_{device_tag(device)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        plot(result, out.with_suffix(".png"))
    except ImportError:
        notes.append("matplotlib not installed: no plot")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"prefill": result["prefill"], "decode": result["decode"], "notes": notes}, indent=2))
    return 0


def _transformers_version() -> str:
    import transformers
    return transformers.__version__


if __name__ == "__main__":
    raise SystemExit(main())
