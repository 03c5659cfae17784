"""bench/bench_tp.py (tensor parallelism) as a CPU test: two ranks over gloo, tiny shapes. The split
must reproduce the whole model: bf16 within the all-reduce's rounding, FP8 within its tolerance (the
row-parallel layers' scales cover half of K). The GPU run is `torchrun --nproc-per-node N` on N GPUs."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_tp.py"


def test_two_cpu_ranks_match_the_whole_model(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads((tmp_path / "tp_cpux2.json").read_text())
    assert res["world_size"] == 2 and res["device"] == "cpu"
    acc = res["accuracy"]
    assert acc["bf16"]["rel_err"] < 0.02 and acc["bf16"]["top1_agree"] == 1.0
    assert acc["fp8"]["rel_err"] < 0.1
    for name in ("bf16", "fp8"):
        assert res[name]["prefill_tok_s"] > 0 and set(res[name]["decode_ms"]) == {"1", "16"}
    assert all(math.isfinite(v) and v > 0 for v in res["fp8_over_bf16"].values())
