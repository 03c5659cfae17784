"""Tensor parallelism: a Llama-3-8B-shaped decoder split over N GPUs with torch.distributed, each rank's
linear layers through qbackend (FP8 W8A8, per-channel weights, per-token activations), against the same
split in bf16.

    torchrun --standalone --nproc-per-node 2 bench/bench_tp.py --out bench/results      # tp_<gpu>x2.json
    torchrun --standalone --nproc-per-node 2 bench/bench_tp.py --device cpu --tiny --out /tmp/tp   # gloo smoke test

The split is Megatron's: q/k/v (merged, by heads: 32 query and 8 KV heads of 128 over the ranks) and gate/up
(merged, by intermediate columns) are column-parallel, o_proj and down_proj row-parallel, each followed by one
all-reduce of the hidden state; embeddings, norms and lm_head are replicated (bf16, as FP8 checkpoints ship
them). Attention is scaled_dot_product_attention over a preallocated KV cache (no rotary embedding: it
changes neither the GEMMs nor the communication). Weights are random, drawn per layer from seeds that do
not depend on the rank count, so every N builds the same model.

Measured on every rank (rank 0 reports):
  prefill  tokens/s for --prefill-batch x --prefill-len tokens (logits of the last token only);
  decode   one step at batch 1 and 16 with --context tokens cached, replayed from a CUDA graph that holds
           the NCCL all-reduces (eager on the CPU);
  accuracy rank 0 also builds the whole model on its own device (the same weights; for FP8 quantized whole,
           so row-parallel layers' per-channel scales cover all of K) and compares the prefill's last-token
           logits of the TP bf16 and FP8 models with it: relative error (within 0.02 for bf16, 0.1 for FP8,
           else the exit status is 1) and the agreement of the top-1 token.
JSON: {"world_size", "device", "config", "bf16": {"prefill_tok_s", "decode_ms": {batch: ms}}, "fp8": {...},
"fp8_over_bf16": {"prefill", "decode_batch_1", "decode_batch_16"}, "accuracy": {"bf16"|"fp8": {"rel_err",
"top1_agree", "tolerance_rel_err"}},
"providers"}.

Keep NVLink multicast off (NCCL_NVLS_ENABLE=0 is set here unless the environment sets it).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import qbackend
from qbackend.benchmark import device_tag
from qbackend.nn import quantize_model


@dataclass(frozen=True)
class Shape:
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    layers: int = 32
    vocab: int = 128256


TINY = Shape(hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, layers=2, vocab=1000)


def _weight(seed: int, rows: int, cols: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(rows, cols, generator=g, device=device) / cols ** 0.5).to(torch.bfloat16)


def _linear(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    layer.weight.data.copy_(weight)
    return layer


def _all_reduce(x: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(x)
    return x


class Layer(nn.Module):
    """One decoder layer's shard: rank `rank` of `world` (world 1: the whole layer)."""

    def __init__(self, s: Shape, index: int, rank: int, world: int, device):
        super().__init__()
        q_heads, kv_heads, inter = s.heads // world, s.kv_heads // world, s.intermediate // world
        self.s, self.world, self.q_heads, self.kv_heads = s, world, q_heads, kv_heads
        seed = 1000 * index
        d = s.head_dim
        wq = _weight(seed + 1, s.heads * d, s.hidden, device)
        wk = _weight(seed + 2, s.kv_heads * d, s.hidden, device)
        wv = _weight(seed + 3, s.kv_heads * d, s.hidden, device)
        wo = _weight(seed + 4, s.hidden, s.heads * d, device)
        wg = _weight(seed + 5, s.intermediate, s.hidden, device)
        wu = _weight(seed + 6, s.intermediate, s.hidden, device)
        wd = _weight(seed + 7, s.hidden, s.intermediate, device)
        cols = slice(rank * q_heads * d, (rank + 1) * q_heads * d)
        kv = slice(rank * kv_heads * d, (rank + 1) * kv_heads * d)
        mlp = slice(rank * inter, (rank + 1) * inter)
        self.qkv = _linear(torch.cat([wq[cols], wk[kv], wv[kv]]))        # column-parallel
        self.o = _linear(wo[:, cols].contiguous())                         # row-parallel
        self.gate_up = _linear(torch.cat([wg[mlp], wu[mlp]]))              # column-parallel
        self.down = _linear(wd[:, mlp].contiguous())                       # row-parallel
        self.norm1 = nn.RMSNorm(s.hidden, eps=1e-5, device=device, dtype=torch.bfloat16)
        self.norm2 = nn.RMSNorm(s.hidden, eps=1e-5, device=device, dtype=torch.bfloat16)

    def forward(self, x, cache_k, cache_v, pos: int):
        """x [B, T, H]; the cache [B, kv_heads, context, d] gets rows pos..pos+T-1; attention over 0..pos+T-1."""
        B, T, _ = x.shape
        d = self.s.head_dim
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([self.q_heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.view(B, T, self.q_heads, d).transpose(1, 2)
        cache_k[:, :, pos:pos + T] = k.view(B, T, self.kv_heads, d).transpose(1, 2)
        cache_v[:, :, pos:pos + T] = v.view(B, T, self.kv_heads, d).transpose(1, 2)
        keys, values = cache_k[:, :, :pos + T], cache_v[:, :, :pos + T]
        attn = F.scaled_dot_product_attention(q, keys, values, is_causal=T > 1 and pos == 0,
                                              enable_gqa=self.q_heads != self.kv_heads)
        x = x + _all_reduce(self.o(attn.transpose(1, 2).reshape(B, T, self.q_heads * d)), self.world)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + _all_reduce(self.down(F.silu(gate) * up), self.world)


class Model(nn.Module):
    def __init__(self, s: Shape, rank: int, world: int, device):
        super().__init__()
        self.s = s
        self.embed = _weight(7, s.vocab, s.hidden, device) * s.hidden ** 0.5
        self.layers = nn.ModuleList(Layer(s, i, rank, world, device) for i in range(s.layers))
        self.norm = nn.RMSNorm(s.hidden, eps=1e-5, device=device, dtype=torch.bfloat16)
        self.lm_head = _linear(_weight(8, s.vocab, s.hidden, device))

    def cache(self, batch: int, context: int):
        kv = self.layers[0].kv_heads
        shape = (batch, kv, context, self.s.head_dim)
        return [(self.embed.new_zeros(shape), self.embed.new_zeros(shape)) for _ in self.layers]

    def forward(self, tokens, cache, pos: int):
        x = F.embedding(tokens, self.embed)
        for layer, (k, v) in zip(self.layers, cache):
            x = layer(x, k, v, pos)
        return self.lm_head(self.norm(x[:, -1]))


def fp8(model: Model) -> Model:
    return quantize_model(model, "fp8_dynamic", ignore=["lm_head"])


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, device, iters: int) -> float:
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def prefill_tok_s(model, batch, length, device, iters) -> float:
    tokens = torch.randint(0, model.s.vocab, (batch, length), device=device,
                           generator=torch.Generator(device=device).manual_seed(5))
    cache = model.cache(batch, length)
    model(tokens, cache, 0)
    return batch * length / _median_time(lambda: model(tokens, cache, 0), device, iters)


@torch.no_grad()
def decode_ms(model, batch, context, device, iters) -> float:
    cache = model.cache(batch, context + 1)
    tokens = torch.randint(0, model.s.vocab, (batch, 1), device=device,
                           generator=torch.Generator(device=device).manual_seed(6))
    step = (lambda: model(tokens, cache, context))
    if device.type == "cuda":
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                step()                 # warm-up off the default stream, as graph capture wants
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        step = graph.replay
    step()
    return 1000 * _median_time(step, device, iters)


TOLERANCE = {"bf16": 0.02, "fp8": 0.1}   # relative error of the last-token logits, TP against whole


def _compare(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> dict:
    return {"rel_err": ((got - want).norm() / want.norm()).item(),
            "top1_agree": (got.argmax(-1) == want.argmax(-1)).float().mean().item(), "tolerance_rel_err": tolerance}


@torch.no_grad()
def accuracy(tp: dict, s: Shape, rank: int, device, batch: int, length: int) -> dict | None:
    """Rank 0: each TP model's last-token logits against the whole model's (same weights) on one device.
    bf16 differs by the order of the all-reduce's sums only; fp8 also by the row-parallel layers'
    per-channel scales, which the whole model takes over all of K."""
    tokens = torch.randint(0, s.vocab, (batch, length), device=device,
                           generator=torch.Generator(device=device).manual_seed(9))
    got = {name: m(tokens, m.cache(batch, length), 0).float() for name, m in tp.items()}
    if rank != 0:
        return None
    whole = Model(s, 0, 1, device).eval()
    result = {"bf16": _compare(got["bf16"], whole(tokens, whole.cache(batch, length), 0).float(), TOLERANCE["bf16"])}
    whole = fp8(whole)
    result["fp8"] = _compare(got["fp8"], whole(tokens, whole.cache(batch, length), 0).float(), TOLERANCE["fp8"])
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for tp_<device>x<N>.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--layers", type=int, help="decoder layers (default 32, tiny 2)")
    ap.add_argument("--prefill-batch", type=int, default=8)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error("no CUDA device in this torch; --device cpu --tiny runs the smoke test")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    s = TINY if args.tiny else Shape()
    if args.layers:
        s = Shape(**{**asdict(s), "layers": args.layers})
    if s.heads % world or s.kv_heads % world or s.intermediate % world:
        ap.error(f"{world} ranks must divide {s.heads} heads, {s.kv_heads} KV heads and {s.intermediate}")
    if args.tiny:
        args.prefill_batch, args.prefill_len, args.context, args.iters = 2, 32, 16, 2

    result = {"world_size": world, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
              "torch": torch.__version__, "qbackend": qbackend.__version__, "config": asdict(s),
              "prefill": {"batch": args.prefill_batch, "length": args.prefill_len},
              "decode": {"context": args.context, "cuda_graphs": cuda}}
    bf16 = Model(s, rank, world, device).eval()
    fp8_model = fp8(copy.deepcopy(bf16))
    for name, model in (("bf16", bf16), ("fp8", fp8_model)):
        result[name] = {
            "prefill_tok_s": prefill_tok_s(model, args.prefill_batch, args.prefill_len, device, args.iters),
            "decode_ms": {b: decode_ms(model, b, args.context, device, args.iters) for b in (1, 16)}}
    result["fp8_over_bf16"] = {
        "prefill": result["fp8"]["prefill_tok_s"] / result["bf16"]["prefill_tok_s"],
        **{f"decode_batch_{b}": result["bf16"]["decode_ms"][b] / result["fp8"]["decode_ms"][b] for b in (1, 16)}}
    result["providers"] = {kind: name for kind, (name, _) in qbackend.selection_table(device).items()}
    result["accuracy"] = accuracy({"bf16": bf16, "fp8": fp8_model}, s, rank, device, 2, 64 if not args.tiny else 16)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    acc = result["accuracy"]
    path = Path(args.out) / f"tp_{device_tag(device)}x{world}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    r = result["fp8_over_bf16"]
    print(f"{world} ranks on {result['device']}: fp8/bf16 prefill x{r['prefill']:.3f}, decode batch 1 "
          f"x{r['decode_batch_1']:.3f}, batch 16 x{r['decode_batch_16']:.3f}; TP against the whole model: "
          + ", ".join(f"{k} rel err {a['rel_err']:.4f} (top-1 agreement {a['top1_agree']:.2f})" for k, a in acc.items())
          + f" -> {path}")
    return 0 if all(a["rel_err"] < a["tolerance_rel_err"] for a in acc.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
