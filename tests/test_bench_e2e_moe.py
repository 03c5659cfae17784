"""bench/bench_e2e.py --model moe (issue 38's end-to-end MoE shape) as a CPU smoke test: a tiny Qwen3-MoE
config, eager timing, no CUDA graphs. The GPU run itself is `bash bench/run_h200.sh e2e_moe`."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qbackend.problem import ALL_KINDS, GROUPED_KINDS

transformers = pytest.importorskip("transformers", reason="bench/bench_e2e.py builds its models with transformers")
if not hasattr(transformers, "Qwen3MoeForCausalLM"):
    pytest.skip(f"transformers {transformers.__version__} has no Qwen3-MoE model (4.51 or newer has)",
                allow_module_level=True)

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_e2e.py"
KEYS = {"model", "projections", "device", "torch", "qbackend", "transformers", "config", "targets", "bf16_moe",
        "fp8_moe", "grouped_explain", "providers", "moe_served", "logits_cosine_fp8_vs_bf16",
        "hidden_state_cosine_by_layer", "attention", "decode_context", "decode", "prefill", "notes"}
CONFIG_KEYS = {"hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob",
               "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size"}


def _finite_positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_tiny_moe_cpu_run_writes_the_json(tmp_path):
    # No --out: the default name, e2e_moe_<device>.json under bench/results of the working directory.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "moe", "--tiny", "--device", "cpu", "--layers", "2",
                          "--prefill-batch", "1", "--prefill-len", "32", "--context", "16", "--iters", "2",
                          "--decode-batches", "1", "2"], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads((tmp_path / "bench" / "results" / "e2e_moe_cpu.json").read_text())
    assert KEYS <= set(res), KEYS - set(res)
    assert res["model"].startswith("Qwen3-30B-A3B-shaped MoE, 2 layers") and res["device"] == "cpu"
    assert set(res["config"]) == CONFIG_KEYS and res["config"]["num_hidden_layers"] == 2
    assert res["config"]["num_experts"] == 16 and res["config"]["num_experts_per_tok"] == 4
    assert res["targets"] == {"decode_speedup_batch_1_16": 1.4}

    # The bf16 blocks: torch._grouped_mm where this torch has it, checked against transformers' block.
    if hasattr(torch, "_grouped_mm"):
        assert res["bf16_moe"]["impl"].startswith("GroupedBf16MoE")
        assert res["bf16_moe"]["check_rel_err"] < 2e-2
    else:
        assert res["bf16_moe"]["impl"].startswith("transformers") and res["bf16_moe"]["why"]

    # Who serves the grouped GEMMs: every grouped kind explained, the model's two calls decided.
    assert set(res["grouped_explain"]) == set(GROUPED_KINDS)
    assert all(any("chosen:" in line for line in lines) for lines in res["grouped_explain"].values())
    assert set(res["providers"]) == set(ALL_KINDS)
    assert set(res["moe_served"]) == {"gate_up", "down"}
    assert all(s["provider"] and s["routed_rows"] == 16 * 4 for s in res["moe_served"].values())
    assert (res["moe_served"]["gate_up"]["N"], res["moe_served"]["gate_up"]["K"]) == (2 * 64, 128)
    assert (res["moe_served"]["down"]["N"], res["moe_served"]["down"]["K"]) == (128, 64)

    # The fp8 model computes the same function as the bf16 one.
    assert res["logits_cosine_fp8_vs_bf16"] > 0.95
    assert len(res["hidden_state_cosine_by_layer"]) == 2

    assert [r["batch"] for r in res["decode"]] == [1, 2]
    for row in res["decode"]:
        assert {"batch", "bf16_ms", "fp8_ms", "speedup", "graphs"} <= set(row) and row["graphs"] is False
        assert _finite_positive(row["bf16_ms"]) and _finite_positive(row["fp8_ms"]) and _finite_positive(row["speedup"])
    p = res["prefill"]
    assert {"bf16_tok_s", "fp8_tok_s", "speedup", "mode", "batch", "seq_len"} <= set(p)
    assert (p["batch"], p["seq_len"], p["mode"]) == (1, 32, "eager")
    assert _finite_positive(p["bf16_tok_s"]) and _finite_positive(p["fp8_tok_s"])
    for row in res["decode"]:   # a missed target is named in the notes
        missed = row["batch"] == 1 and row["speedup"] < 1.4
        assert missed == any(n.startswith(f"decode batch {row['batch']} ") for n in res["notes"])
    assert '"decode"' in out.stdout


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")
def test_grouped_bf16_moe_from_per_expert_modules_matches_a_loop():
    """The bf16 baseline block, made from transformers 4's layout (a Linear router and one MLP module per
    expert), against each token's experts computed one by one in fp32."""
    spec = importlib.util.spec_from_file_location("bench_e2e", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    E, H, inter, top_k, T = 8, 64, 32, 2, 12
    g = torch.Generator().manual_seed(0)

    def linear(n, k):
        layer = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(n, k, generator=g) / math.sqrt(k))
        return layer

    block = torch.nn.Module()
    block.gate = linear(E, H)
    block.experts = torch.nn.ModuleList()
    for _ in range(E):
        mlp = torch.nn.Module()
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = linear(inter, H), linear(inter, H), linear(H, inter)
        block.experts.append(mlp)
    moe = bench.GroupedBf16MoE.from_block(block, top_k, renormalize=True)
    assert (moe.num_experts, moe.hidden, moe.intermediate) == (E, H, inter)

    x = torch.randn(1, T, H, generator=g).to(torch.bfloat16)
    out = moe(x)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    xf = x.reshape(T, H).float()
    probs = torch.softmax(xf @ block.gate.weight.float().t(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    ref = torch.zeros(T, H)
    for t in range(T):
        for w, e in zip(weights[t], ids[t].tolist()):
            mlp = block.experts[e]
            gate, up = xf[t] @ mlp.gate_proj.weight.float().t(), xf[t] @ mlp.up_proj.weight.float().t()
            h = torch.nn.functional.silu(gate) * up
            ref[t] += w * (h @ mlp.down_proj.weight.float().t())
    err = (out.reshape(T, H).float() - ref).norm() / ref.norm()
    assert err < 2e-2, err
