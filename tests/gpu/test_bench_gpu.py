"""`qbackend bench` on a real GPU, on a tiny shape: every kind this device serves is captured in a
CUDA graph, timed against its baselines, and reported under the provider the selection names."""
import json
import subprocess
import sys

import pytest
import torch

import qbackend
from qbackend import bench_cli, bench_report

pytestmark = pytest.mark.gpu


def test_bench_times_every_served_kind_and_writes_json(tmp_path):
    path = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "qbackend", "bench", "--shapes", "256x512,384x256", "--m", "1,16",
            "--trials", "1", "--trial-ms", "0.2", "--json", str(path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    kinds = bench_cli.default_kinds(None)
    assert "fp8_w8a8_per_tensor" in kinds or torch.cuda.get_device_capability() < (8, 9)
    res = json.loads(path.read_text())
    assert res["skipped"] == []
    rows = res["rows"]
    assert sorted((r["N"], r["kind"], r["M"]) for r in rows) == \
        sorted((n, k, m) for n in (256, 384) for k in kinds for m in (1, 16))
    lines = out.stdout.splitlines()
    assert lines[1] == bench_report.header()
    for r in rows:
        assert r["provider"] == qbackend.select(r["kind"]).name
        assert 0 < r["us"] < 1e4 and 0 < r["bf16_us"] < 1e4
        assert (r["scaled_mm_us"] is not None) == (r["kind"] in bench_cli.SCALED_MM_MODES), r
        assert r["speedup_vs_bf16"] == pytest.approx(r["bf16_us"] / r["us"])
        assert any(line.split()[:4] == [f"{r['N']}x{r['K']}", str(r["M"]), r["kind"], f"{r['us']:.2f}"]
                   for line in lines)


def test_bench_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the PNG option needs matplotlib (the qbackend[bench] extra)")
    path = tmp_path / "bench.png"
    out = subprocess.run([sys.executable, "-m", "qbackend", "bench", "--shapes", "256x512", "--m", "1,16",
                          "--kind", "fp8_w8a8_per_token_channel", "--trials", "1", "--trial-ms", "0.2",
                          "--png", str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
