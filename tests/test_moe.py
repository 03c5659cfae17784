"""Mixture of experts on the CPU: moe_align's routing, QuantMoE against a dense fp32 computation on
every provider that serves here, and FP8 MoE checkpoints (Qwen3-MoE / Mixtral / DeepSeek-V3 layouts)
loading into QuantMoE."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from test_checkpoints import _ct_config, write_folder

import qbackend
from qbackend import ops, registry
from qbackend.formats import CheckpointError, load_moe
from qbackend.nn import QuantizedWeight, QuantMoE, Routing
from qbackend.nn.schemes import SCHEMES
from qbackend.validate_grouped import validate_gather_quantize

E, H, INTER, TOP_K = 8, 128, 256, 2


# ------------------------------------------------------------------------------------ moe_align

@pytest.mark.parametrize("tokens, top_k, experts", [(1, 1, 1), (7, 2, 8), (64, 8, 256), (0, 2, 4)])
def test_moe_align_properties(gen, tokens, top_k, experts):
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen)
    perm, offsets, inverse = qbackend.moe_align(ids, experts)
    flat = ids.reshape(-1)
    assert perm.dtype == inverse.dtype == torch.int64 and offsets.dtype == torch.int32
    assert offsets.shape == (experts,)
    # Rows in expert order, each expert's rows in token order, ends matching the counts.
    sorted_ids = flat[perm]
    assert torch.all(sorted_ids[1:] >= sorted_ids[:-1])
    counts = torch.tensor([(flat == e).sum() for e in range(experts)])
    assert torch.equal(offsets.long(), counts.cumsum(0))
    for e in range(experts):
        rows = perm[sorted_ids == e]
        assert torch.all(rows[1:] > rows[:-1])
    # inverse undoes the permutation.
    assert torch.equal(perm[inverse], torch.arange(flat.numel()))
    assert torch.equal(sorted_ids[inverse], flat)


def test_moe_align_reads_nothing_on_the_host():
    """On a device where reading values would be a sync (here: meta, where it is impossible) it only
    launches device work."""
    perm, offsets, inverse = qbackend.moe_align(torch.empty(5, 2, dtype=torch.int64, device="meta"), 16)
    assert perm.shape == (10,) and offsets.shape == (16,) and inverse.shape == (10,)


def test_moe_align_compiles_fullgraph(gen):
    ids = torch.randint(0, 8, (9, 2), generator=gen)
    compiled = torch.compile(lambda t: qbackend.moe_align(t, 8), fullgraph=True, backend="eager")
    for got, want in zip(compiled(ids), qbackend.moe_align(ids, 8)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("bad, exc, match", [
    ([[0, 1]], TypeError, "topk_ids: must be a torch.Tensor"),
    (torch.zeros(2, 2), TypeError, "topk_ids: dtype must be an integer type"),
    (torch.zeros(2, 2, 2, dtype=torch.int64), ValueError, "topk_ids: must have rank 1 or 2"),
    (torch.tensor([[0, 8]]), ValueError, r"topk_ids: values must lie in \[0, num_experts\)"),
    (torch.tensor([[0, -1]]), ValueError, r"topk_ids: values must lie in \[0, num_experts\)"),
])
def test_moe_align_errors(bad, exc, match):
    with pytest.raises(exc, match="qbackend.moe_align: " + match):
        qbackend.moe_align(bad, 8)
    with pytest.raises(ValueError, match="num_experts: must be a positive int"):
        qbackend.moe_align(torch.zeros(2, 1, dtype=torch.int64), 0)


# ------------------------------------------------------------------------------ gather_quantize

@pytest.mark.parametrize("provider", ["reference", "torch"])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8])
@pytest.mark.parametrize("granularity, K", [("token", 200), ("group", 320), ("group", 100)])
def test_gather_quantize_is_quantize_of_the_gathered_rows(gen, monkeypatch, provider, dtype, granularity, K):
    monkeypatch.setenv("QBACKEND_PROVIDER", provider)
    registry.reload()
    x = (torch.randn(23, K, generator=gen) * 3).to(torch.bfloat16)
    x[5, 7] = 1e4  # one row with an outlier: its scale differs from the rest
    ids = torch.randint(0, 23, (40,), generator=gen)
    for index in (ids, ids.int(), ids[:1], ids[:0]):
        q, s = qbackend.gather_quantize(x, index, dtype, granularity, group_size=64)
        q_ref, s_ref = qbackend.quantize(x[index.long()], dtype, granularity, group_size=64)
        assert q.shape == q_ref.shape and s.shape == s_ref.shape, (q.shape, s.shape, s_ref.shape)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    # A sliced (row-strided) x.
    wide = torch.randn(23, 2 * K, generator=gen).to(torch.bfloat16)
    q, s = qbackend.gather_quantize(wide[:, :K], ids, dtype, granularity, group_size=64)
    q_ref, s_ref = qbackend.quantize(wide[:, :K][ids], dtype, granularity, group_size=64)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


def test_gather_quantize_errors_and_poison(gen):
    x = torch.randn(6, 128, generator=gen)
    ids = torch.tensor([0, 5, 2])
    with pytest.raises(ValueError, match=r"gather_quantize: index: values must lie in \[0, x.shape\[0\]\) = \[0, 6\)"):
        qbackend.gather_quantize(x, torch.tensor([0, 6]))
    with pytest.raises(TypeError, match="gather_quantize: index: dtype must be int64 or int32"):
        qbackend.gather_quantize(x, ids.float())
    with pytest.raises(ValueError, match="gather_quantize: index: must be 1-D"):
        qbackend.gather_quantize(x, ids.reshape(1, 3))
    with pytest.raises(ValueError, match="gather_quantize: x: must be 2-D"):
        qbackend.gather_quantize(x.reshape(2, 3, 128), ids)
    with pytest.raises(ValueError, match="gather_quantize: granularity: must be 'token' or 'group'"):
        qbackend.gather_quantize(x, ids, granularity="tensor")
    with pytest.raises(ValueError, match="gather_quantize: x: must have at least one row"):
        qbackend.gather_quantize(x[:0], ids)
    with pytest.raises(TypeError, match="gather_quantize: x: dtype must be"):
        qbackend.gather_quantize(x.to(torch.float8_e4m3fn), ids)
    # Where the values are not checked (a GPU), a provider without a fused gather must not read out of
    # bounds either: the bad row gets NaN scales, the others are exact.
    problem = validate_gather_quantize(x, ids, torch.float8_e4m3fn, "token", 128)
    bad = torch.tensor([0, 9, -1, 3])
    q, s = ops._gather_then_quantize(registry.get().providers["reference"], x, bad, torch.float8_e4m3fn,
                                     "token", 128, problem)
    q_ref, s_ref = qbackend.quantize(x[[0, 3]], torch.float8_e4m3fn, "token")
    assert s[1:3].isnan().all() and torch.equal(s[[0, 3]], s_ref)
    assert torch.equal(q[[0, 3]].view(torch.uint8), q_ref.view(torch.uint8))


def test_gather_quantize_compiles_fullgraph(gen):
    x = torch.randn(9, 256, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, 9, (17,), generator=gen)
    fn = torch.compile(lambda x, i: qbackend.gather_quantize(x, i, granularity="group"), fullgraph=True,
                       backend="eager")
    q, s = fn(x, ids)
    q_ref, s_ref = qbackend.quantize(x[ids], granularity="group")
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


# ---------------------------------------------------------------------------- silu_mul_quantize

def _silu_mul_f64(h):
    """SiLU(gate) * up in float64: an independent account of the activation."""
    i = h.shape[1] // 2
    g, u = h[:, :i].double(), h[:, i:].double()
    return g * torch.sigmoid(g) * u


@pytest.mark.parametrize("provider", ["reference", "torch"])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8])
@pytest.mark.parametrize("hdtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("granularity, inter", [("token", 200), ("group", 320), ("group", 100)])
def test_silu_mul_quantize_quantizes_the_gated_activation(gen, monkeypatch, provider, dtype, hdtype, granularity,
                                                           inter):
    monkeypatch.setenv("QBACKEND_PROVIDER", provider)
    registry.reload()
    wide = (torch.randn(13, 2 * inter + 6, generator=gen) * 3).to(hdtype)
    wide[4, 9] = 300.0  # an outlier gate: its row (group) gets a larger scale
    h = wide[:, 3:3 + 2 * inter]  # row-strided, offset columns
    q, s = qbackend.silu_mul_quantize(h, dtype, granularity, group_size=64)
    groups = -(-inter // 64)
    assert q.shape == (13, inter) and q.dtype == dtype
    assert s.shape == ((13, groups) if granularity == "group" else (13, 1)) and s.dtype == torch.float32
    # The same bits as quantize of the activation rounded to h's dtype, ...
    q_ref, s_ref = qbackend.quantize(ops.silu_mul(h), dtype, granularity, group_size=64)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    # ... which is SiLU(gate) * up within the quantization's own error (half a step of the format at
    # each element's scale, plus the rounding to h's dtype).
    act = _silu_mul_f64(h)
    scale = s.double().repeat_interleave(64, 1)[:, :inter] if granularity == "group" else s.double()
    err = (q.double() * scale - act).abs() if dtype == torch.int8 else (q.to(torch.float64) * scale - act).abs()
    step = {torch.float8_e4m3fn: 2.0**-3, torch.float8_e5m2: 2.0**-2, torch.int8: None}[dtype]
    bound = (0.5 * scale + 1e-12) if step is None else (act.abs() * step + scale * 2.0**-9)
    bound = bound + act.abs() * 2.0**-7
    assert (err <= bound).all(), float((err - bound).max())


def test_silu_mul_quantize_errors_and_empty(gen):
    h = torch.randn(4, 256, generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"silu_mul_quantize: h: must have an even, non-zero number of columns"):
        qbackend.silu_mul_quantize(h[:, :255])
    with pytest.raises(ValueError, match=r"silu_mul_quantize: h: must be 2-D"):
        qbackend.silu_mul_quantize(h.reshape(2, 2, 256))
    with pytest.raises(TypeError, match=r"silu_mul_quantize: h: dtype must be bfloat16, float16 or float32"):
        qbackend.silu_mul_quantize(h.to(torch.float8_e4m3fn))
    with pytest.raises(TypeError, match=r"silu_mul_quantize: h: must be a torch.Tensor"):
        qbackend.silu_mul_quantize([[1.0, 2.0]])
    with pytest.raises(ValueError, match="silu_mul_quantize: granularity: must be 'token' or 'group'"):
        qbackend.silu_mul_quantize(h, granularity="tensor")
    with pytest.raises(ValueError, match="silu_mul_quantize: group_size: must be a positive int"):
        qbackend.silu_mul_quantize(h, granularity="group", group_size=0)
    q, s = qbackend.silu_mul_quantize(h[:0], granularity="group")
    assert q.shape == (0, 128) and s.shape == (0, 1)


def test_silu_mul_quantize_compiles_fullgraph(gen):
    h = torch.randn(9, 512, generator=gen).to(torch.bfloat16)
    fn = torch.compile(lambda h: qbackend.silu_mul_quantize(h, granularity="group"), fullgraph=True, backend="eager")
    q, s = fn(h)
    q_ref, s_ref = qbackend.quantize(ops.silu_mul(h), granularity="group")
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


# ------------------------------------------------------------------------------------- QuantMoE

def float_experts(gen, experts=E, hidden=H, inter=INTER):
    router = torch.randn(experts, hidden, generator=gen)
    w_gate = torch.randn(experts, inter, hidden, generator=gen) / hidden**0.5
    w_up = torch.randn(experts, inter, hidden, generator=gen) / hidden**0.5 * 2
    w_down = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    return router, w_gate, w_up, w_down


def dense_moe(x, router, w_gate, w_up, w_down, top_k):
    """fp32, token by token, expert by expert: the block's meaning, with no routing machinery."""
    x = x.float()
    probs = torch.softmax(x @ router.t(), dim=-1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        w, ids = probs[t].topk(top_k)
        w = w / w.sum()
        for weight, e in zip(w.tolist(), ids.tolist()):
            h = F.silu(x[t] @ w_gate[e].t()) * (x[t] @ w_up[e].t())
            out[t] += weight * (h @ w_down[e].t())
    return out


def dequantized(moe: QuantMoE):
    """The stacked quantized weights as float [E, N, K], to run dense_moe on the same numbers."""
    def deq(w, s):
        if s.dim() == 3:
            return torch.stack([qbackend.dequantize(w[e], s[e], torch.float32) for e in range(w.shape[0])])
        scale = s.reshape(s.shape[0], -1, 1) if s.dim() == 2 else s.reshape(-1, 1, 1)
        return w.float() * scale
    w13, w2 = deq(moe.w13, moe.w13_scale), deq(moe.w2, moe.w2_scale)
    return w13[:, :moe.intermediate], w13[:, moe.intermediate:], w2


@pytest.mark.parametrize("provider", ["reference", "torch"])
@pytest.mark.parametrize("scheme", ["fp8_dynamic", "fp8_dynamic_tensor", "fp8_block"])
def test_quant_moe_against_dense(gen, monkeypatch, provider, scheme):
    monkeypatch.setenv("QBACKEND_PROVIDER", provider)
    registry.reload()
    router, w_gate, w_up, w_down = float_experts(gen)
    moe = QuantMoE.from_float(router, w_gate, w_up, w_down, TOP_K, scheme)
    # The references take the bf16 activations the block takes: routed on the fp32 originals, a token
    # whose two best router scores nearly tie may pick another expert (one token in a few dozen runs).
    x = torch.randn(37, H, generator=gen).to(torch.bfloat16)
    out = moe(x)
    assert out.shape == (37, H) and out.dtype == torch.bfloat16
    g, u, d = dequantized(moe)
    # Against the same weights in fp32, the activations quantized to fp8 twice (about 2^-4 each).
    ref = dense_moe(x, router, g, u, d, TOP_K)
    assert ((out.float() - ref).norm() / ref.norm()) < 0.06
    # And against the float weights it was quantized from: the weights' rounding adds a little.
    ref_float = dense_moe(x, router, w_gate, w_up, w_down, TOP_K)
    assert ((out.float() - ref_float).norm() / ref_float.norm()) < 0.08


def test_quant_moe_shapes_and_errors(gen):
    router, w_gate, w_up, w_down = float_experts(gen)
    moe = QuantMoE.from_float(router, w_gate, w_up, w_down, TOP_K)
    assert moe(torch.randn(2, 3, H, generator=gen)).shape == (2, 3, H)
    assert moe(torch.randn(0, H, generator=gen)).shape == (0, H)
    with pytest.raises(ValueError, match="x: last dimension must be hidden size 128"):
        moe(torch.randn(2, 64))
    with pytest.raises(ValueError, match="top_k: must be an int in"):
        QuantMoE.from_float(router, w_gate, w_up, w_down, E + 1)
    with pytest.raises(ValueError, match="w2: shape must be"):
        QuantMoE(router, moe.w13, moe.w13_scale, moe.w2[:, :64], moe.w2_scale, TOP_K)


def test_quant_moe_compiles_fullgraph(gen):
    router, w_gate, w_up, w_down = float_experts(gen)
    moe = QuantMoE.from_float(router, w_gate, w_up, w_down, TOP_K)
    x = torch.randn(6, H, generator=gen).to(torch.bfloat16)
    compiled = torch.compile(moe, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), moe(x), rtol=0, atol=0)


# -------------------------------------------------------------------------------------- routing

def deepseek_route(logits, bias, top_k, n_group, topk_group, renormalize, scaling, group_score):
    """DeepSeek's routing token by token in Python lists: the groups ranked, the eligible experts
    ranked by their biased scores, the weights from the unbiased ones."""
    ids_out, weights_out = [], []
    for row in logits.tolist():
        scores = [1 / (1 + torch.tensor(v).neg().exp().item()) for v in row]
        biased = [s + b for s, b in zip(scores, bias.tolist())]
        size = len(row) // n_group
        groups = [sorted(biased[g * size:(g + 1) * size], reverse=True) for g in range(n_group)]
        rank = [sum(g[:2]) if group_score == "top2_sum" else g[0] for g in groups]
        eligible = sorted(range(n_group), key=lambda g: -rank[g])[:topk_group]
        experts = [e for g in eligible for e in range(g * size, (g + 1) * size)]
        chosen = sorted(experts, key=lambda e: -biased[e])[:top_k]
        w = [scores[e] for e in chosen]
        if renormalize:
            w = [v / sum(w) for v in w]
        ids_out.append(chosen)
        weights_out.append([v * scaling for v in w])
    return torch.tensor(weights_out), torch.tensor(ids_out)


@pytest.mark.parametrize("group_score", ["top2_sum", "max"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_deepseek_routing_against_token_loop(gen, group_score, renormalize):
    experts, hidden, top_k = 32, 64, 6
    routing = Routing(scoring="sigmoid", renormalize=renormalize, n_group=8, topk_group=3,
                      group_score=group_score, scaling=2.5)
    router, w_gate, w_up, w_down = float_experts(gen, experts, hidden, 128)
    bias = torch.randn(experts, generator=gen) * 0.5
    moe = QuantMoE.from_float(router, w_gate, w_up, w_down, top_k, routing=routing, score_bias=bias)
    x = torch.randn(50, hidden, generator=gen)
    weights, ids = moe.route(x)
    ref_w, ref_ids = deepseek_route(x @ router.t(), bias, top_k, 8, 3, renormalize, 2.5, group_score)
    # Same experts in the same order (distinct random scores: no ties), same weights.
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
    # Each token's experts come from at most topk_group groups.
    assert int((ids // (experts // 8)).sort(dim=1).values.diff(dim=1).ne(0).sum(dim=1).max()) + 1 <= 3
    # The bias moves the choice, not the weights: a large bias on expert 0 puts it in every row
    # with its unbiased sigmoid weight.
    big = bias.clone()
    big[0] = 100.0
    moe_big = QuantMoE.from_float(router, w_gate, w_up, w_down, top_k, routing=routing, score_bias=big)
    w_big, ids_big = moe_big.route(x)
    assert bool((ids_big == 0).any(dim=1).all())
    ref_w, ref_ids = deepseek_route(x @ router.t(), big, top_k, 8, 3, renormalize, 2.5, group_score)
    assert torch.equal(ids_big, ref_ids)
    torch.testing.assert_close(w_big, ref_w, rtol=1e-5, atol=1e-6)


def test_routing_errors(gen):
    router, w_gate, w_up, w_down = float_experts(gen)
    with pytest.raises(ValueError, match="scoring must be 'softmax' or 'sigmoid'"):
        Routing(scoring="relu")
    with pytest.raises(ValueError, match="topk_group <= n_group"):
        Routing(n_group=2, topk_group=3)
    with pytest.raises(ValueError, match="8 experts in n_group=4 groups of which topk_group=1 are eligible"):
        QuantMoE.from_float(router, w_gate, w_up, w_down, 3, routing=Routing(n_group=4, topk_group=1))
    with pytest.raises(ValueError, match=r"score_bias: shape must be \[E\] = \[8\]"):
        QuantMoE.from_float(router, w_gate, w_up, w_down, 2, score_bias=torch.zeros(7))


# ---------------------------------------------------------------------------------- checkpoints

def expert_tensors(gen, prefix, scheme, names=("gate_proj", "up_proj", "down_proj"), scale_name="weight_scale"):
    """Per-expert quantized Linears and a float router, as a checkpoint stores them."""
    router, w_gate, w_up, w_down = float_experts(gen)
    tensors = {f"{prefix}.gate.weight": router}
    parts = {n: [] for n in names}
    for e in range(E):
        for name, w in zip(names, (w_gate[e], w_up[e], w_down[e])):
            qw = QuantizedWeight.from_float(w, SCHEMES[scheme])
            tensors[f"{prefix}.experts.{e}.{name}.weight"] = qw.weight
            tensors[f"{prefix}.experts.{e}.{name}.{scale_name}"] = qw.weight_scale
            parts[name].append(qw)
    expected = QuantMoE.from_experts(router, *(parts[n] for n in names), TOP_K)
    return tensors, expected


CHECKPOINTS = {
    # Qwen3-MoE FP8 (quant_method fp8, per-tensor static scales in the vLLM layout).
    "qwen3_fp8_tensor": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_dynamic_tensor",
                         ("gate_proj", "up_proj", "down_proj"), "weight_scale"),
    # compressed-tensors, per-channel weights and dynamic per-token activations.
    "compressed_tensors_channel": (_ct_config("float", "channel", "token"), "fp8_dynamic",
                                   ("gate_proj", "up_proj", "down_proj"), "weight_scale"),
    # Mixtral FP8 names its expert projections w1 (gate), w3 (up), w2 (down).
    "mixtral_fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_dynamic_tensor",
                    ("w1", "w3", "w2"), "weight_scale"),
    # DeepSeek-V3: 128 x 128 blocks, weight_scale_inv.
    "deepseek_v3_block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
                          "fp8_block", ("gate_proj", "up_proj", "down_proj"), "weight_scale_inv"),
}


@pytest.mark.parametrize("layout", list(CHECKPOINTS))
def test_moe_checkpoints_load_stacked(tmp_path, gen, layout):
    config, scheme, names, scale_name = CHECKPOINTS[layout]
    prefix = "model.layers.0.mlp"
    tensors, expected = expert_tensors(gen, prefix, scheme, names, scale_name)
    tensors["model.embed_tokens.weight"] = torch.randn(10, H, generator=gen)
    folder = write_folder(tmp_path / layout, tensors, config)
    moe = load_moe(folder, prefix, TOP_K, expert_names=names)
    for name in ("router_weight", "w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(moe, name), getattr(expected, name)), name
    assert moe.block_size == expected.block_size
    x = torch.randn(5, H, generator=gen).to(torch.bfloat16)
    torch.testing.assert_close(moe(x), expected(x), rtol=0, atol=0)


def test_moe_checkpoint_errors(tmp_path, gen):
    prefix = "mlp"
    config = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    tensors, _ = expert_tensors(gen, prefix, "fp8_dynamic_tensor")
    for name in [n for n in tensors if n.startswith(f"{prefix}.experts.3.")]:
        del tensors[name]
    with pytest.raises(CheckpointError, match=r"numbered 0..E-1; missing \[3\]"):
        load_moe(write_folder(tmp_path / "gap", tensors, config), prefix, TOP_K)
    tensors, _ = expert_tensors(gen, prefix, "fp8_dynamic_tensor")
    del tensors[f"{prefix}.gate.weight"]
    with pytest.raises(CheckpointError, match="mlp.gate.weight"):
        load_moe(write_folder(tmp_path / "norouter", tensors, config), prefix, TOP_K)
    with pytest.raises(CheckpointError, match="no quantized expert layers other.experts"):
        load_moe(write_folder(tmp_path / "ok", expert_tensors(gen, prefix, "fp8_dynamic_tensor")[0], config),
                 "other", TOP_K)


def test_deepseek_v3_checkpoint_routing(tmp_path, gen):
    """config.json's routing keys and the router's e_score_correction_bias reach the block."""
    prefix = "model.layers.3.mlp"
    config, scheme, names, scale_name = CHECKPOINTS["deepseek_v3_block"]
    tensors, _ = expert_tensors(gen, prefix, scheme, names, scale_name)
    bias = torch.randn(E, generator=gen)
    tensors[f"{prefix}.gate.e_score_correction_bias"] = bias
    folder = write_folder(tmp_path / "v3", tensors, config)
    model_config = json.loads((folder / "config.json").read_text())
    model_config.update(num_experts_per_tok=3, scoring_func="sigmoid", topk_method="noaux_tc", n_group=4,
                        topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    (folder / "config.json").write_text(json.dumps(model_config))
    moe = load_moe(folder, prefix)
    assert moe.top_k == 3 and torch.equal(moe.score_bias, bias)
    assert moe.routing == Routing(scoring="sigmoid", renormalize=True, n_group=4, topk_group=2, scaling=2.5)
    x = torch.randn(20, H, generator=gen)
    weights, ids = moe.route(x)
    ref_w, ref_ids = deepseek_route(x @ moe.router_weight.float().t(), bias, 3, 4, 2, True, 2.5, "top2_sum")
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
    # Qwen2-MoE style: norm_topk_prob false; the argument overrides config.json.
    model_config = {"model_type": "toy", "quantization_config": config, "num_experts_per_tok": 2,
                    "norm_topk_prob": False}
    (folder / "config.json").write_text(json.dumps(model_config))
    assert load_moe(folder, prefix).routing == Routing(renormalize=False)
    assert load_moe(folder, prefix, renormalize=True).routing == Routing(renormalize=True)
    for key, value, rule in [("scoring_func", "sqrtsoftplus", "scoring_func 'sqrtsoftplus' is not supported"),
                             ("topk_method", "top_p", "topk_method 'top_p' is not supported")]:
        (folder / "config.json").write_text(json.dumps({**model_config, key: value}))
        with pytest.raises(CheckpointError, match=rule):
            load_moe(folder, prefix)
    del model_config["num_experts_per_tok"]
    (folder / "config.json").write_text(json.dumps(model_config))
    with pytest.raises(CheckpointError, match="no num_experts_per_tok: pass top_k"):
        load_moe(folder, prefix)
