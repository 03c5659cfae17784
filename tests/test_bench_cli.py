"""`qbackend bench` without a GPU: its arguments, its refusal on a GPU-less machine, the calls it
builds for each kind (run on the CPU under a counting timer), and its table, JSON and PNG outputs fed
with synthetic timings. The GPU run itself is tests/gpu/test_bench_gpu.py."""
import json
import os
import subprocess
import sys

import pytest
import torch

import qbackend
from qbackend import bench_cli, bench_report
from qbackend.cli import main


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["bench"] + argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "4096x"], "argument --shapes: shape '4096x' is not NxK"),
    (["--shapes", "x4096"], "argument --shapes: shape 'x4096' is not NxK"),
    (["--shapes", "4096"], "argument --shapes: shape '4096' is not NxK"),
    (["--shapes", "4096x4096x2"], "argument --shapes: shape '4096x4096x2' is not NxK"),
    (["--shapes", "0x5"], "argument --shapes: N in shape '0x5' must be a positive integer; got '0'"),
    (["--shapes", "64x-5"], "argument --shapes: K in shape '64x-5' must be a positive integer; got '-5'"),
    (["--shapes", "64xabc"], "argument --shapes: K in shape '64xabc' must be a positive integer; got 'abc'"),
    (["--shapes", "64x64,"], "argument --shapes: shapes: a comma-separated list with no empty items"),
    (["--shapes", "64x64", "--m", "0"], "argument --m: M must be a positive integer; got '0'"),
    (["--shapes", "64x64", "--m", "1,-16"], "argument --m: M must be a positive integer; got '-16'"),
    (["--shapes", "64x64", "--m", "1.5"], "argument --m: M must be a positive integer; got '1.5'"),
    (["--shapes", "64x64", "--kind", "fp8_w8a8_per_tensor,fp4"], "argument --kind: unknown kind 'fp4'; known: "),
    (["--shapes", "64x64", "--out-dtype", "fp8"], "argument --out-dtype: invalid choice: 'fp8'"),
    (["--shapes", "64x64", "--trials", "0"], "argument --trials: trials must be a positive integer"),
    (["--shapes", "64x64", "--trial-ms", "nan"], "argument --trial-ms: must be a positive number of milliseconds"),
    (["--m", "1"], "the following arguments are required: --shapes"),
])
def test_bad_arguments_are_refused_naming_the_argument_and_the_rule(capsys, argv, message):
    assert message in _refused(capsys, argv)


def test_arguments_parse_to_shapes_ms_and_kinds():
    args = qbackend.cli.build_parser().parse_args(
        ["bench", "--shapes", "4096x4096, 14336X4096,4096x4096", "--m", "1,16,256,16",
         "--kind", "int8_w8a8", "--kind", "fp8_block,fp8_w8a16", "--out-dtype", "fp16", "--trial-ms", "0.5"])
    assert args.shapes == [(4096, 4096), (14336, 4096)]   # a repeated shape or M is timed once
    assert args.m == [1, 16, 256]
    assert args.kind == ["int8_w8a8", "fp8_block", "fp8_w8a16"]
    assert (args.out_dtype, args.trials, args.trial_ms) == ("fp16", 3, 0.5)
    defaults = qbackend.cli.build_parser().parse_args(["bench", "--shapes", "64x128"])
    assert (defaults.m, defaults.kind, defaults.out_dtype, defaults.json, defaults.png) == \
        ([1, 16, 256], None, "bf16", None, None)


def test_without_a_gpu_one_line_error_exit_2_and_no_traceback(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "qbackend", "bench", "--shapes", "64x64", "--json",
                          str(tmp_path / "r.json")], capture_output=True, text=True, env=env)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.startswith("qbackend bench: error: no GPU to time on: this torch (")
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "r.json").exists()


def test_no_gpu_is_checked_in_process_too(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--shapes", "64x64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qbackend bench: error: no GPU to time on") and err.count("\n") == 1


def test_png_without_matplotlib_is_refused_before_timing(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # an import of it now fails
    monkeypatch.setattr(bench_cli, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(bench_cli, "run", lambda *a, **k: pytest.fail("timed although the PNG cannot be written"))
    assert main(["bench", "--shapes", "64x64", "--png", str(tmp_path / "b.png")]) == 2
    err = capsys.readouterr().err
    assert "qbackend bench: error: --png: matplotlib is not installed; pip install matplotlib" in err
    with pytest.raises(ImportError, match="qbackend\\[bench\\]"):
        bench_report.pyplot()


def test_an_output_in_a_missing_directory_is_refused_before_timing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bench_cli, "no_gpu_reason", lambda: None)
    assert main(["bench", "--shapes", "64x64", "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert f"--json: directory '{tmp_path / 'no'}' does not exist" in capsys.readouterr().err


# ---- the calls each kind is timed with, run on the CPU -------------------------------------------

class CountingTimer:
    """Stands in for the GPU timer: runs every call once, checks qbackend's against bf16 torch.mm's
    shape, and answers made-up microseconds (10, 20, 30 in the order of the labels)."""

    def __init__(self):
        self.labels = []

    def __call__(self, calls: dict) -> dict:
        self.labels.append(list(calls))
        outs = {label: [f() for f in fns] for label, fns in calls.items()}
        assert all(len(o) == len(outs["torch.mm"]) for o in outs.values())
        assert {o.shape for o in outs["qbackend"]} == {outs["torch.mm"][0].shape}
        return {label: 10.0 * (i + 1) for i, label in enumerate(calls)}


@pytest.mark.parametrize("provider", ["reference", "torch"])
def test_every_kind_is_timed_against_its_baselines_and_named_by_the_selection(monkeypatch, provider):
    monkeypatch.setenv("QBACKEND_PROVIDER", provider)
    qbackend.registry.reload()
    timer = CountingTimer()
    rows, skipped = bench_cli.run([(256, 384)], [1, 16], list(qbackend.PROBLEM_KINDS), torch.bfloat16, timer,
                                  torch.device("cpu"))
    assert skipped == []
    assert [(r["kind"], r["M"]) for r in rows] == [(k, m) for k in qbackend.PROBLEM_KINDS for m in (1, 16)]
    for r in rows:
        decision = qbackend.select(r["kind"], "cpu")
        assert (r["provider"], r["how"]) == (decision.name, decision.how) == (provider, "forced")
        assert r["flops"] == 2 * r["M"] * 256 * 384
        act = {"fp8_w8a16": 2}.get(r["kind"], 1)
        # the prepared weight's bytes: quantized ("nk") or dequantized by the torch provider's CPU path
        weight = 256 * 384 * {"nk": 1, "dequant-bfloat16": 2, "dequant-float32": 4}[r["layout"]]
        assert r["bytes"] == weight + r["M"] * 384 * act + r["M"] * 256 * 2
        assert r["rotated_bytes"] == r["weight_copies"] * weight and r["weight_copies"] == 16
        assert (r["us"], r["bf16_us"]) == (10.0, 20.0)
        assert r["scaled_mm"] == bench_cli.SCALED_MM_MODES.get(r["kind"])
    # torch._scaled_mm is a baseline of exactly the W8A8 fp8 kinds it has a mode for (where this
    # torch runs it; on a CPU it may refuse, which the row's note then says)
    for labels, r in zip(timer.labels, rows):
        has_smm = "torch._scaled_mm" in labels
        assert has_smm == (r["scaled_mm_us"] == 30.0)
        assert has_smm or r["kind"] not in bench_cli.SCALED_MM_MODES or r["note"].startswith("torch._scaled_mm")


def test_the_command_prints_its_table_as_it_goes_and_writes_json(monkeypatch, capsys, tmp_path):
    """The command end to end on the CPU, the GPU check, the device and the timer stood in for;
    the torch provider forced, so that every kind is served by something other than the reference."""
    monkeypatch.setenv("QBACKEND_PROVIDER", "torch")
    qbackend.registry.reload()
    monkeypatch.setattr(bench_cli, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(bench_cli, "_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(bench_cli, "gpu_timer", lambda trials, trial_ms: CountingTimer())
    path = tmp_path / "r.json"
    assert main(["bench", "--shapes", "256x384,128x256", "--m", "1,8", "--json", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    res = json.loads(path.read_text())
    assert [(r["N"], r["kind"], r["M"]) for r in res["rows"]] == \
        [(n, k, m) for n in (256, 128) for k in qbackend.PROBLEM_KINDS for m in (1, 8)]
    assert res["skipped"] == [] and res["out_dtype"] == "bf16" and res["arch"] == "cpu"
    assert out[0] == bench_report.title(res) and out[1] == bench_report.header()
    assert out[2:22] == [bench_report.line(r) for r in res["rows"]]
    assert out[22:] == bench_report.notes(res["rows"]) + [f"wrote {path}"]


def test_a_kind_that_cannot_take_a_shape_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.setenv("QBACKEND_PROVIDER", "reference")
    qbackend.registry.reload()
    measure = bench_cli.measure_kind

    def refuse_block(kind, *args):
        if kind == "fp8_block":
            raise ValueError("qbackend.scaled_mm: b: this shape is refused\nsecond line")
        return measure(kind, *args)

    monkeypatch.setattr(bench_cli, "measure_kind", refuse_block)
    skips = []
    rows, skipped = bench_cli.run([(256, 128)], [4], ["fp8_block", "fp8_w8a8_per_tensor"], torch.bfloat16,
                                  CountingTimer(), torch.device("cpu"), on_skip=skips.append)
    assert [r["kind"] for r in rows] == ["fp8_w8a8_per_tensor"]
    assert skipped == skips and [s["kind"] for s in skipped] == ["fp8_block"]
    assert skipped[0]["error"] == "ValueError: qbackend.scaled_mm: b: this shape is refused"


def test_default_kinds_leave_out_what_only_the_reference_serves(monkeypatch):
    monkeypatch.setenv("QBACKEND_SIMULATE", "sm_90")
    qbackend.registry.reload()
    assert bench_cli.default_kinds(None) == [k for k in qbackend.PROBLEM_KINDS
                                             if qbackend.select(k).name != "reference"]
    assert "fp8_w8a8_per_tensor" in bench_cli.default_kinds(None)
    monkeypatch.setenv("QBACKEND_PROVIDER", "reference")
    qbackend.registry.reload()
    assert bench_cli.default_kinds(None) == []


# ---- formatting synthetic timings ----------------------------------------------------------------

def _row(**over):
    M, N, K = 16, 4096, 4096
    row = {"kind": "fp8_w8a8_per_token_channel", "N": N, "K": K, "M": M, "out_dtype": "bfloat16",
           "provider": "cutlass", "path": "", "how": "priority", "layout": "nk", "weight_copies": 16,
           "rotated_bytes": 16 * N * K, "l2_bytes": 60 * 2**20, "flops": 2 * M * N * K,
           "bytes": N * K + M * K + 2 * M * N, "us": 8.0, "bf16_us": 20.0, "scaled_mm": "rowwise",
           "scaled_mm_us": 10.0, "note": ""}
    row.update(over)
    return row


def test_rates_and_speedups_follow_from_the_timings():
    r = bench_report.rates(_row())
    assert r["tflops"] == pytest.approx(2 * 16 * 4096 * 4096 / 8e-6 / 1e12)
    assert r["tbps"] == pytest.approx((4096 * 4096 + 16 * 4096 + 2 * 16 * 4096) / 8e-6 / 1e12)
    assert (r["speedup_vs_bf16"], r["speedup_vs_scaled_mm"], r["weights_from"]) == (2.5, 1.25, "HBM")
    slow = bench_report.rates(_row(us=40.0, scaled_mm_us=None, rotated_bytes=100 * 2**20))
    assert (slow["speedup_vs_bf16"], slow["speedup_vs_scaled_mm"], slow["weights_from"]) == (0.5, None, "L2")


def test_table_lines_show_times_rates_speedups_and_who_served():
    line = bench_report.line(_row())
    cells = line.split()
    assert cells[:10] == ["4096x4096", "16", "fp8_w8a8_per_token_channel", "8.00", "67.1", "2.12", "20.00",
                          "x2.50", "10.00", "x1.25"]
    assert line.endswith("  cutlass")
    header = bench_report.header()
    for name in ("µs", "TFLOP/s", "TB/s", "vs bf16", "vs _scaled_mm", "served by"):
        assert name in header
    assert header.index("TFLOP/s") + len("TFLOP/s") == line.index("67.1") + len("67.1")   # columns line up
    other = bench_report.line(_row(kind="fp8_block", provider="torch", how="forced", scaled_mm=None,
                                   scaled_mm_us=None, path="torch.nn.functional.scaled_mm with block scales",
                                   rotated_bytes=2**20))
    assert other.split()[7:10] == ["x2.50", "-", "-"]
    assert other.endswith("torch (torch.nn.functional.scaled_mm with block scales) [forced] [L2]")


def test_table_notes_explain_markers_and_refused_baselines():
    rows = [_row(), _row(M=1, how="hook", rotated_bytes=2**20, note="torch._scaled_mm rowwise refused: no")]
    text = bench_report.table(rows, [{"kind": "fp8_block", "N": 64, "K": 100, "error": "ValueError: K"}])
    lines = text.splitlines()
    assert lines[0] == bench_report.header() and len(lines) == 1 + 2 + 1 + 3
    assert lines[3].split() == ["64x100", "fp8_block", "skipped:", "ValueError:", "K"]
    assert lines[4].startswith("[L2]: ") and lines[5].startswith("[forced] / [hook]: ")
    assert lines[6] == "fp8_w8a8_per_token_channel: torch._scaled_mm rowwise refused: no"
    assert bench_report.notes([_row()]) == []


def test_json_holds_the_settings_rows_with_rates_and_skips(tmp_path):
    meta = bench_report.metadata("sm_90", "NVIDIA H200", "2.11.0", "0.1.0", 3, 2.0, "bf16")
    path = tmp_path / "b.json"
    skipped = [{"kind": "fp8_block", "N": 64, "K": 100, "error": "ValueError: K"}]
    bench_report.write_json(str(path), meta, [_row(), _row(M=1, us=4.0)], skipped)
    res = json.loads(path.read_text())
    assert {k: res[k] for k in ("device", "arch", "torch", "out_dtype", "trials", "trial_ms")} == \
        {"device": "NVIDIA H200", "arch": "sm_90", "torch": "2.11.0", "out_dtype": "bf16", "trials": 3,
         "trial_ms": 2.0}
    assert "CUDA-graph replay" in res["method"] and res["skipped"] == skipped
    assert [(r["M"], r["speedup_vs_bf16"], r["speedup_vs_scaled_mm"]) for r in res["rows"]] == [(16, 2.5, 1.25),
                                                                                                (1, 5.0, 2.5)]
    assert res["rows"][0]["tflops"] == pytest.approx(bench_report.rates(_row())["tflops"])
    assert "qbackend bench: NVIDIA H200 (sm_90), torch 2.11.0" in bench_report.title(meta)


def test_png_is_written_from_synthetic_rows(tmp_path):
    pytest.importorskip("matplotlib", reason="the PNG option needs matplotlib (the qbackend[bench] extra)")
    meta = bench_report.metadata("sm_90", "NVIDIA H200", "2.11.0", "0.1.0", 3, 2.0, "bf16")
    rows = [_row(M=m, us=8.0 * m ** 0.5, N=n) for m in (1, 16, 256) for n in (4096, 8192)]
    rows += [_row(kind="fp8_w8a16", provider="marlin", scaled_mm=None, scaled_mm_us=None, M=m) for m in (1, 16)]
    path = tmp_path / "b.png"
    bench_report.write_png(str(path), meta, rows)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
