"""What the GPU tests of the public API share: poisoned outputs, forced providers, the reference
provider's answer for the same call, and the error measure they are compared with."""
import os

import pytest
import torch

from helpers import rel_err  # noqa: F401  (the GPU tests' error measure, shared with the CPU tests)
from qbackend import registry

DEV = "cuda"


def poison(shape_bytes=64 << 20):
    """Fill a large block with NaN and free it: the next allocations reuse poisoned memory."""
    torch.empty(shape_bytes // 2, dtype=torch.bfloat16, device=DEV).fill_(float("nan"))


def with_provider(monkeypatch, name, **env):
    monkeypatch.setenv("QBACKEND_PROVIDER", name)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    registry.reload()


def captured(step):
    """step() run once eagerly, then captured in a CUDA graph: (the graph, what the captured call
    returned, which each replay rewrites)."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def reference(fn, *args, **kw):
    """Call fn with the reference provider forced, then restore the caller's selection."""
    saved = os.environ.get("QBACKEND_PROVIDER")
    os.environ["QBACKEND_PROVIDER"] = "reference"
    registry.reload()
    try:
        return fn(*args, **kw)
    finally:
        if saved is None:
            del os.environ["QBACKEND_PROVIDER"]
        else:
            os.environ["QBACKEND_PROVIDER"] = saved
        registry.reload()


def needs_sm(least: tuple, what: str):
    """Skip unless a CUDA GPU of compute capability `least` or newer is present; the reason says
    which of the two is missing."""
    if not torch.cuda.is_available():
        return pytest.mark.skipif(True, reason="needs a CUDA GPU")
    sm = torch.cuda.get_device_capability()
    reason = f"{what} need sm_{least[0]}{least[1]}+ (this GPU is sm_{sm[0]}{sm[1]})"
    return pytest.mark.skipif(sm < least, reason=reason)


def check_within_bound(out, ref, s_abs, r_out, r_acc, rel_max, what):
    """out against a float64 ref, element-wise |out - ref| <= r_out |ref| + r_acc S (S = s_abs, the
    scaled sum of |a b| terms: what fast accumulation's error scales with), no NaN, and the relative
    error norm-wise within rel_max (the bounds are stated in test_native_scaled_mm.py)."""
    o = out.double()
    assert not torch.isnan(o).any(), f"{what}: NaN in output (unwritten element?)"
    err = (o - ref).abs()
    tol = r_out * ref.abs() + r_acc * s_abs
    bad = err > tol
    if bad.any():
        i = bad.nonzero()[0].tolist()
        j = tuple(i)
        pytest.fail(f"{what}: {int(bad.sum())} elements out of tolerance; first at {i}: "
                    f"out={o[j].item()} ref={ref[j].item()} tol={tol[j].item()}")
    rel = (o - ref).norm() / ref.norm().clamp_min(1e-30)
    assert rel <= rel_max, f"{what}: relative error {rel:.3e} > {rel_max}"
