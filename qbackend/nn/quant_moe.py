"""QuantMoE: a mixture-of-experts feed-forward block on qbackend.grouped_scaled_mm.

    router top-k -> moe_align (expert order) -> gather + quantize -> grouped gate/up -> SiLU(gate) * up
    + quantize (one op) -> grouped down (routing weights in its activation scales) -> sum back into
    token order

Routing (`Routing`): softmax over the router's logits and top-k (Mixtral, Qwen3-MoE), or
DeepSeek-V3's: sigmoid scores, a per-expert bias added for the choice only, the experts in n_group
groups of which the topk_group best (by the sum of each group's two best scores; DeepSeek-V2 ranks
groups by their best score) are eligible, the chosen scores renormalized and scaled by
routed_scaling_factor. (Shared experts are not part of this block.)

Weights are stored stacked over experts in canonical form (row-major [E, N, K], 8-bit):
  w13        [E, 2 * I, H]  gate rows then up rows of each expert
  w13_scale  [E, 2 * I] per channel, or [E, ceil(2I/bn), ceil(H/bk)] blocks; per-tensor gate and up
             scales are held as per-channel ones (each part's scale over its rows: the same numbers),
             since one stacked weight cannot carry two scales per expert otherwise
  w2         [E, H, I]
  w2_scale   [E] per tensor, [E, H] per channel, or [E, ceil(H/bn), ceil(I/bk)] blocks
Activations are quantized dynamically per token (per group of block_size[1] along K with block
weights). A static input_scale in a checkpoint is not used: every token gets its own scale.
No call reads routing data on the host, so the block captures in a CUDA graph where its provider
does (the reference provider loops over experts on the host).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import qbackend

from .schemes import get_scheme
from .weight import QuantizedWeight

FP8 = torch.float8_e4m3fn


def _stack_scale(scales: list, granularity: str) -> torch.Tensor:
    if granularity == "tensor":
        return torch.stack([s.reshape(()) for s in scales])
    if granularity == "channel":
        return torch.stack([s.reshape(-1) for s in scales])
    return torch.stack(scales)


def _gate_up_scale(gate: QuantizedWeight, up: QuantizedWeight) -> torch.Tensor:
    """One expert's w13 scale: per-channel [2I] (from per-tensor or per-channel parts) or blocks."""
    g, u = gate.scheme.weight_granularity, up.scheme.weight_granularity
    if g != u:
        raise ValueError(f"QuantMoE: gate and up weights must share a scale granularity; got {g} and {u}")
    if g == "block":
        bn = gate.scheme.block_size[0]
        if gate.out_features % bn:
            raise ValueError(f"QuantMoE: block-scaled gate/up weights need intermediate size a multiple of "
                             f"the block ({bn}) to stack; got {gate.out_features}")
        return torch.cat([gate.weight_scale, up.weight_scale], 0)
    parts = [w.weight_scale.float().reshape(-1).expand(w.out_features) for w in (gate, up)]
    return torch.cat(parts)


@dataclass(frozen=True)
class Routing:
    """How each token's top-k experts and their weights come from the router's logits."""
    scoring: str = "softmax"   # "softmax" (Mixtral, Qwen3-MoE) or "sigmoid" (DeepSeek-V3)
    renormalize: bool = True   # the chosen weights divided by their sum (norm_topk_prob)
    n_group: int = 1           # expert groups; only the topk_group best groups are eligible
    topk_group: int = 1
    group_score: str = "top2_sum"  # how groups are ranked: "top2_sum" (DeepSeek-V3) or "max" (DeepSeek-V2)
    scaling: float = 1.0       # routed_scaling_factor

    def __post_init__(self):
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"QuantMoE: routing scoring must be 'softmax' or 'sigmoid'; got {self.scoring!r}")
        if self.group_score not in ("top2_sum", "max"):
            raise ValueError(f"QuantMoE: routing group_score must be 'top2_sum' or 'max'; got {self.group_score!r}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"QuantMoE: routing needs 1 <= topk_group <= n_group; got topk_group="
                             f"{self.topk_group}, n_group={self.n_group}")


class QuantMoE(nn.Module):
    def __init__(self, router_weight: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                 w2: torch.Tensor, w2_scale: torch.Tensor, top_k: int, renormalize: bool = True,
                 block_size: tuple | None = None, routing: Routing | None = None,
                 score_bias: torch.Tensor | None = None):
        super().__init__()
        E, two_i, H = w13.shape
        if w2.dim() != 3 or tuple(w2.shape) != (E, H, two_i // 2) or two_i % 2:
            raise ValueError(f"QuantMoE: w2: shape must be [E, H, I] = [{E}, {H}, {two_i // 2}] for w13 of "
                             f"shape {list(w13.shape)}; got {list(w2.shape)}")
        if tuple(router_weight.shape) != (E, H):
            raise ValueError(f"QuantMoE: router_weight: shape must be [E, H] = [{E}, {H}]; got "
                             f"{list(router_weight.shape)}")
        if not isinstance(top_k, int) or not 1 <= top_k <= E:
            raise ValueError(f"QuantMoE: top_k: must be an int in [1, {E}]; got {top_k!r}")
        self.num_experts, self.hidden, self.intermediate, self.top_k = E, H, two_i // 2, top_k
        self.routing = routing or Routing(renormalize=renormalize)
        if E % self.routing.n_group or (self.routing.n_group > 1 and
                                         top_k > self.routing.topk_group * (E // self.routing.n_group)):
            raise ValueError(f"QuantMoE: routing: {E} experts in n_group={self.routing.n_group} groups of which "
                             f"topk_group={self.routing.topk_group} are eligible cannot give top_k={top_k}")
        if score_bias is not None and tuple(score_bias.shape) != (E,):
            raise ValueError(f"QuantMoE: score_bias: shape must be [E] = [{E}]; got {list(score_bias.shape)}")
        self.register_buffer("score_bias", None if score_bias is None else score_bias.float())
        self.block_size = tuple(block_size) if block_size else None
        self.register_buffer("router_weight", router_weight)
        self.register_buffer("w13", w13)
        self.register_buffer("w13_scale", w13_scale.float())
        self.register_buffer("w2", w2)
        self.register_buffer("w2_scale", w2_scale.float())

    @property
    def renormalize(self) -> bool:
        return self.routing.renormalize

    @classmethod
    def from_experts(cls, router_weight: torch.Tensor, gate: list, up: list, down: list, top_k: int,
                     renormalize: bool = True, routing: Routing | None = None,
                     score_bias: torch.Tensor | None = None) -> "QuantMoE":
        """Stack per-expert QuantizedWeights (gate/up [I, H], down [H, I]) into one block."""
        if not (len(gate) == len(up) == len(down) >= 1):
            raise ValueError(f"QuantMoE: gate, up, down: need the same number (>= 1) of experts; got "
                             f"{len(gate)}, {len(up)}, {len(down)}")
        schemes = {w.scheme.weight_granularity for w in gate + up + down}
        if len(schemes) != 1:
            raise ValueError(f"QuantMoE: every expert weight must share a scale granularity; got {sorted(schemes)}")
        granularity = schemes.pop()
        w13 = torch.stack([torch.cat([g.weight, u.weight], 0) for g, u in zip(gate, up)])
        w13_scale = torch.stack([_gate_up_scale(g, u) for g, u in zip(gate, up)])
        w2 = torch.stack([d.weight for d in down])
        w2_scale = _stack_scale([d.weight_scale for d in down], granularity)
        block = down[0].scheme.block_size if granularity == "block" else None
        return cls(router_weight, w13, w13_scale, w2, w2_scale, top_k, renormalize, block, routing, score_bias)

    @classmethod
    def from_float(cls, router_weight: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                   w_down: torch.Tensor, top_k: int, scheme: str = "fp8_dynamic",
                   renormalize: bool = True, routing: Routing | None = None,
                   score_bias: torch.Tensor | None = None) -> "QuantMoE":
        """Quantize float expert weights (w_gate, w_up [E, I, H], w_down [E, H, I]) under a named
        scheme ("fp8_dynamic": per channel, "fp8_dynamic_tensor": per tensor, "fp8_block")."""
        s = get_scheme(scheme)
        q = (lambda ws: [QuantizedWeight.from_float(w, s) for w in ws])
        return cls.from_experts(router_weight, q(w_gate), q(w_up), q(w_down), top_k, renormalize, routing,
                                score_bias)

    @staticmethod
    def _scale_b(scale: torch.Tensor) -> torch.Tensor:
        """A stacked canonical weight scale in grouped_scaled_mm's scale_b form."""
        return scale.transpose(-2, -1) if scale.dim() == 3 else scale

    def _activation_quantization(self) -> tuple[str, int]:
        """How activations are quantized for the grouped GEMMs: per token, or per 1 x block_size[1]
        group with block-scaled weights."""
        return ("group", self.block_size[1]) if self.block_size else ("token", 128)

    def _grouped(self, q, s, w, scale, offsets, out_dtype):
        group = self.block_size[0] if self.block_size else 128
        return qbackend.grouped_scaled_mm(q, w.transpose(-2, -1), s, self._scale_b(scale), offsets,
                                          out_dtype=out_dtype, group_size=group)

    def route(self, x2: torch.Tensor):
        """(weights [T, top_k] fp32, expert ids [T, top_k]) under self.routing (see the module's doc)."""
        r = self.routing
        logits = F.linear(x2.float(), self.router_weight.float())
        scores = torch.softmax(logits, dim=-1) if r.scoring == "softmax" else torch.sigmoid(logits)
        choice = scores if self.score_bias is None else scores + self.score_bias
        if r.n_group > 1:
            per_group = choice.reshape(choice.shape[0], r.n_group, -1)
            k = min(2, per_group.shape[-1]) if r.group_score == "top2_sum" else 1
            best = per_group.topk(k, dim=-1).values.sum(dim=-1)
            keep = torch.zeros_like(best).scatter_(1, best.topk(r.topk_group, dim=-1).indices, 1.0)
            choice = per_group.masked_fill(keep.unsqueeze(-1) == 0, float("-inf")).reshape(choice.shape)
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if r.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * r.scaling if r.scaling != 1.0 else weights, ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden:
            raise ValueError(f"QuantMoE: x: last dimension must be hidden size {self.hidden}; got {x.shape[-1]}")
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
        x2 = x.reshape(-1, self.hidden)
        weights, ids = self.route(x2)
        perm, offsets, inverse = qbackend.moe_align(ids, self.num_experts)
        granularity, group = self._activation_quantization()
        # The routed rows (each token once per chosen expert, in expert order) are gathered by the
        # quantize itself, and SiLU(gate) * up is computed by the quantize of the second GEMM's input.
        q, s = qbackend.gather_quantize(x2, perm // self.top_k, FP8, granularity, group)
        h = self._grouped(q, s, self.w13, self.w13_scale, offsets, out_dtype)
        q, s = qbackend.silu_mul_quantize(h, FP8, granularity, group)
        # Each row's routing weight joins its activation scale: the down GEMM applies it in its fp32
        # epilogue, and no weighted copy of the expert outputs is made.
        s = s * weights.reshape(-1).index_select(0, perm).unsqueeze(-1)
        y = self._grouped(q, s, self.w2, self.w2_scale, offsets, out_dtype)
        # Back to (token, slot) order; each token's sum over its experts (accumulated in fp32).
        y = y.index_select(0, inverse).reshape(x2.shape[0], self.top_k, self.hidden)
        return y.sum(dim=1).reshape(x.shape)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"top_k={self.top_k}, weight={self.w13.dtype}, block={self.block_size}, routing={self.routing}"
                + (", score_bias" if self.score_bias is not None else ""))
