"""Mixture of experts on the CPU: moe_align's routing, QuantMoE against a dense fp32 computation on
every provider that serves here, and FP8 MoE checkpoints (Qwen3-MoE / Mixtral / DeepSeek-V3 layouts)
loading into QuantMoE."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_checkpoints import _ct_config, write_folder

import qbackend
from qbackend import registry
from qbackend.formats import CheckpointError, load_moe
from qbackend.nn import QuantizedWeight, QuantMoE
from qbackend.nn.schemes import SCHEMES

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
    x = torch.randn(37, H, generator=gen)
    out = moe(x.to(torch.bfloat16))
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
