"""Plugins: the demo third-party provider (installed by the test run), hooks, broken plugins."""
import json
import os
import subprocess
import sys

import pytest
import torch

import qbackend
from qbackend import registry
from qbackend.problem import Op
from qbackend.provider import Provider, Rule, granularities

demo = pytest.importorskip("qbackend_demo_provider",
                           reason="install tests/demo_provider first (the README's test command does)")


def info_json(env_extra=None, path_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    if path_extra:
        env["PYTHONPATH"] = os.pathsep.join([str(path_extra), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "qbackend", "info", "--json"], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def fp8_pair(gen, M=4, K=32, N=16):
    a = (torch.randn(M, K, generator=gen) * 10).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, generator=gen) * 10).to(torch.float8_e4m3fn).t()
    return a, b, torch.tensor(0.5), torch.tensor(0.25)


def test_demo_provider_listed_with_distribution_and_version():
    report = info_json()
    entry = next(p for p in report["providers"] if p["name"] == "demo")
    assert entry["source"].startswith("qbackend-demo-provider 1.2.0")
    assert entry["available"] is True
    builtin = next(p for p in report["providers"] if p["name"] == "reference")
    assert "builtin" in builtin["source"]


def test_demo_provider_forced_by_environment(monkeypatch, gen):
    monkeypatch.setenv("QBACKEND_PROVIDER", "demo")
    registry.reload()
    before = demo.DemoProvider.calls
    a, b, sa, sb = fp8_pair(gen)
    out = qbackend.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    assert demo.DemoProvider.calls == before + 1
    ref = (a.double() @ b.double() * 0.125).float()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    # Problems the forced provider cannot run still go through normal selection.
    out2 = qbackend.scaled_mm(a, b, torch.ones(4, 1), sb)
    assert demo.DemoProvider.calls == before + 1 and out2.shape == (4, 16)
    assert qbackend.select("fp8_w8a8_per_tensor", "cpu").how == "forced"


def test_selection_hook_can_choose(gen):
    class Chooser:
        @qbackend.hookimpl
        def qbackend_select(self, device, problem, verdicts):
            names = [n for n, v in verdicts if v.ok]
            return "demo" if "demo" in names else None

    registry.reload(extra_plugins=[("test-chooser", Chooser())])
    decision = qbackend.select("fp8_w8a8_per_tensor", "cpu")
    assert decision.name == "demo" and decision.how == "hook"
    assert qbackend.select("int8_w8a8", "cpu").name == "reference"


def test_unknown_forced_provider_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("QBACKEND_PROVIDER", "nosuch")
    with pytest.raises(qbackend.NoProviderError, match="QBACKEND_PROVIDER=nosuch: no such provider"):
        registry.reload()


def test_disable_and_no_provider(monkeypatch):
    monkeypatch.setenv("QBACKEND_DISABLE", "reference")
    registry.reload()
    a = torch.zeros(2, 32, dtype=torch.bfloat16)
    b = torch.zeros(16, 32, dtype=torch.float8_e4m3fn).t()
    with pytest.raises(qbackend.NoProviderError, match="reference: disabled by QBACKEND_DISABLE"):
        qbackend.scaled_mm(a, b, None, torch.ones(()))
    assert qbackend.select("fp8_w8a16", "cpu").name is None


def test_autoload_off_keeps_builtins_only():
    report = info_json({"QBACKEND_DISABLE_PLUGIN_AUTOLOAD": "1"})
    names = {p["name"] for p in report["providers"]}
    assert "demo" not in names and "reference" in names
    report = info_json({"QBACKEND_DISABLE_PLUGIN_AUTOLOAD": "1", "QBACKEND_PLUGINS": "demo"})
    assert "demo" in {p["name"] for p in report["providers"]}


class Raising:
    @qbackend.hookimpl
    def qbackend_providers(self):
        raise RuntimeError("plugin bug")


class Invalid:
    @qbackend.hookimpl
    def qbackend_providers(self):
        return ["not a provider", Provider(name="bad name!")]


class Duplicate:
    @qbackend.hookimpl
    def qbackend_providers(self):
        return [Provider(name="reference", rules=())]


class SupportsRaises(Provider):
    def supports(self, device, problem):
        raise ZeroDivisionError("oops")


class RaisingSupports:
    @qbackend.hookimpl
    def qbackend_providers(self):
        return [SupportsRaises(name="flaky", priority=500)]


def test_broken_plugins_are_reported_and_skipped(gen):
    reg = registry.reload(extra_plugins=[("raising", Raising()), ("invalid", Invalid()),
                                         ("duplicate", Duplicate()), ("flaky", RaisingSupports())])
    stages = {(e.source, e.stage) for e in reg.errors}
    assert ("raising", "qbackend_providers") in stages
    assert ("invalid", "invalid provider") in stages
    assert ("duplicate", "invalid provider") in stages
    messages = " | ".join(e.message for e in reg.errors)
    assert "plugin bug" in messages and "not a qbackend.Provider" in messages
    assert "must be an identifier" in messages and "already registered" in messages
    # The provider whose supports() raises is listed with that reason and never chosen.
    a, b, sa, sb = fp8_pair(gen)
    assert qbackend.scaled_mm(a, b, sa, sb).shape == (4, 16)
    verdicts = dict(qbackend.select("fp8_w8a8_per_tensor", "cpu").verdicts)
    assert "ZeroDivisionError" in verdicts["flaky"].reason


def test_plugin_import_error_never_breaks_import(tmp_path):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[qbackend]\nbroken = qbackend_broken_plugin\nmissing = qbackend_no_such_module\n")
    (tmp_path / "qbackend_broken_plugin.py").write_text("raise RuntimeError('broken at import')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    code = "import qbackend, torch; print(qbackend.quantize(torch.ones(2, 16))[0].dtype)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = info_json(path_extra=tmp_path)
    errors = {e["source"]: e for e in report["plugin_errors"]}
    broken = errors["broken-plugin 0.1 [broken]"]
    assert broken["stage"] == "import" and "broken at import" in broken["message"]
    assert "ModuleNotFoundError" in errors["broken-plugin 0.1 [missing]"]["message"]
    assert report["selection"]["fp8_w8a8_per_tensor"] == "reference"
    text = subprocess.run([sys.executable, "-m", "qbackend", "info"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert "plugin errors (skipped):" in text and "broken at import" in text


def test_custom_rule_based_provider_selected_by_priority(gen):
    class Fast(Provider):
        def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, problem):
            return torch.full((a.shape[0], b.shape[1]), 7.0, dtype=out_dtype)

    class Plugin:
        @qbackend.hookimpl
        def qbackend_providers(self):
            rule = Rule(Op.SCALED_MM, frozenset({"cpu"}),
                        frozenset({(torch.float8_e4m3fn, torch.float8_e4m3fn)}),
                        granularities("tensor"), granularities("tensor"), frozenset({torch.bfloat16}))
            return [Fast(name="fast", priority=1000, rules=(rule,))]

    registry.reload(extra_plugins=[("fast", Plugin())])
    a, b, sa, sb = fp8_pair(gen)
    assert qbackend.scaled_mm(a, b, sa, sb).unique().tolist() == [7.0]
    # Cached: a second call does not re-ask providers.
    reg = registry.get()
    assert len(reg._cache) >= 1
    text = qbackend.explain("fp8_w8a8_per_tensor", "cpu")
    assert "-> fast: ok" in text and "chosen: fast (priority)" in text


def test_reference_fallback_on_a_gpu_warns_once_and_only_for_calls(monkeypatch):
    """A real (not simulated) GPU problem that only the reference provider serves warns on the first
    call, once, with the kind, the device, the cost and what would give a fast path; selection
    queries (qbackend info, selection_table) report it without warning."""
    import dataclasses
    import warnings

    from qbackend.probe import simulated
    from qbackend.problem import representative

    gpu = dataclasses.replace(simulated("sm_90"), simulated=False, probe="test")
    problem = representative("fp8_block")
    # (the cutlass provider serves it natively on sm_90)
    monkeypatch.setenv("QBACKEND_DISABLE", "torch,cutlass")
    reg = registry.reload()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert reg.decide(gpu, problem).name == "reference"   # a query: no warning
        with pytest.warns(UserWarning) as caught:
            assert reg.select(gpu, problem).name == "reference"
        text = str(caught[0].message)
        assert text.startswith("qbackend: fp8_block on sm_90 (H100 (simulated)) runs on the reference provider")
        assert "x slower than bf16 torch.mm" in text and "remove torch from QBACKEND_DISABLE" in text
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            reg.select(gpu, problem)                                # once per problem
    finally:
        monkeypatch.delenv("QBACKEND_DISABLE")
        registry.reload()


def test_a_disabled_name_that_is_no_provider_warns(monkeypatch):
    """A typo in QBACKEND_DISABLE would leave the provider meant enabled: one warning names it and
    the known providers."""
    monkeypatch.setenv("QBACKEND_DISABLE", "referense,cutlass")
    try:
        with pytest.warns(UserWarning, match=r"names no provider called 'referense' \(known: .*reference"):
            reg = registry.reload()
        assert "cutlass" in reg.disabled
    finally:
        monkeypatch.delenv("QBACKEND_DISABLE")
        registry.reload()
