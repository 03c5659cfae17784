"""bench/bench_moe.py (the MoE grouped-GEMM benchmark of issue 38) as a CPU smoke test: tiny shapes of
the three model families, eager timing, every impl this torch runs on the CPU. The GPU run itself is
`bash bench/run_h200.sh moe`."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_moe.py"
IMPLS = {"qbackend.grouped", "torch._scaled_grouped_mm", "loop.scaled_mm", "torch._grouped_mm.bf16"}
ROW_KEYS = {"shape", "tokens", "impl", "us", "model", "layer", "G", "topk", "N", "K", "scales", "routed_rows",
            "experts_touched", "tflops", "touched_weight_bytes", "touched_tbps", "provider", "path",
            "calls_per_graph", "routings", "weight_copies", "rotated_fp8_bytes", "check_rel_err"}


def test_tiny_cpu_run_writes_finite_rows_for_every_impl(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--rounds", "1",
                          "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads((tmp_path / "moe_cpu.json").read_text())
    assert res["tiny"] and res["device"].startswith("cpu") and res["wrong"] == []
    rows = res["rows"]
    assert rows and all(ROW_KEYS <= set(r) for r in rows)
    assert all(r["impl"] in IMPLS and math.isfinite(r["us"]) and r["us"] > 0 for r in rows)
    assert all(math.isfinite(r["tflops"]) and math.isfinite(r["touched_tbps"]) for r in rows)
    assert all(r["routed_rows"] == r["tokens"] * r["topk"] and r["check_rel_err"] < 2e-2 for r in rows)

    # Three families, two layers each, at 1, 16 and 64 tokens: the qbackend call and the per-expert
    # loop run everywhere on the CPU; torch._grouped_mm where this torch has it there (2.9+).
    points = {(r["shape"], r["tokens"]) for r in rows}
    assert len(points) == 6 * 3
    timed = {r["impl"] for r in rows}
    assert {"qbackend.grouped", "loop.scaled_mm"} <= timed
    if hasattr(torch, "_grouped_mm"):
        assert "torch._grouped_mm.bf16" in timed
    for impl in ("qbackend.grouped", "loop.scaled_mm"):
        assert {(r["shape"], r["tokens"]) for r in rows if r["impl"] == impl} == points
    # An impl that did not run has its reason recorded for every point it missed, and printed once.
    for impl in IMPLS - timed:
        missed = [s for s in res["skipped"] if s["impl"] == impl]
        assert {(s["shape"], s["tokens"]) for s in missed} == points and all(s["why"] for s in missed)
        assert f"skip {impl} " in out.stdout
    assert {s["impl"] for s in res["skipped"]} <= IMPLS

    assert set(res["method"]["l2"]) == {r["shape"] for r in rows}
    assert "summary against the issue's targets" in out.stdout and "summary" in res
    assert res["summary"]["vs_loop_decode"]["points"] == 2 * 3   # the G >= 64 family (tiny Qwen3)
