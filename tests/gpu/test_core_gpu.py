"""Core behaviour on a real GPU: the probe, and the reference provider against the CPU."""
import json
import subprocess
import sys

import pytest
import torch

import qbackend
from qbackend import registry

pytestmark = pytest.mark.gpu


def test_probe_uses_nvml_without_initializing_cuda():
    code = ("import torch, qbackend, json; i = qbackend.device_info(); "
            "print(json.dumps([i.arch, i.probe, i.multiprocessors, torch.cuda.is_initialized()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    arch, probe_name, sms, initialized = json.loads(out.stdout)
    major, minor = torch.cuda.get_device_capability()
    assert arch == f"sm_{major}{minor}" and probe_name == "nvml" and initialized is False
    assert sms == torch.cuda.get_device_properties(0).multi_processor_count


def test_info_reports_nvml():
    out = subprocess.run([sys.executable, "-m", "qbackend", "info", "--json"], capture_output=True,
                         text=True, check=True)
    report = json.loads(out.stdout)
    assert report["device"]["probe"] == "nvml" and report["device"]["backend"] == "cuda"


@pytest.mark.parametrize("a_dtype", [torch.float8_e4m3fn, torch.int8, torch.bfloat16])
def test_reference_gpu_matches_cpu(a_dtype, monkeypatch):
    monkeypatch.setenv("QBACKEND_PROVIDER", "reference")
    registry.reload()
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    M, K, N = 67, 512, 144
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    wdtype = torch.int8 if a_dtype == torch.int8 else torch.float8_e4m3fn
    outs = {}
    for dev in ("cpu", "cuda"):
        qw, sw = qbackend.quantize(w.to(dev), wdtype, "channel")
        bias = torch.linspace(-1, 1, N, device=dev).to(torch.bfloat16)
        if a_dtype == torch.bfloat16:
            a, sa = x.to(dev, torch.bfloat16), None
        else:
            a, sa = qbackend.quantize(x.to(dev), a_dtype, "token")
        outs[dev] = (qbackend.scaled_mm(a, qw.t(), sa, sw.t(), bias=bias), qw, sw, a)
    # Quantization is bit-identical across devices; GEMMs differ only by fp32 summation order.
    assert torch.equal(outs["cpu"][1].view(torch.uint8), outs["cuda"][1].cpu().view(torch.uint8))
    assert torch.equal(outs["cpu"][2], outs["cuda"][2].cpu())
    ref, got = outs["cpu"][0].double(), outs["cuda"][0].cpu().double()
    assert not torch.isnan(got).any()
    assert ((ref - got).abs().max() / ref.abs().max()).item() < 8e-3
