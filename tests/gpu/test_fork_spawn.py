"""CUDA in multiprocessing children after the parent imported qbackend and ran `qbackend info` and
the probe: the parent never initialises CUDA (NVML and the driver API only), so a forked child can
use it; a spawned one starts clean. Each child quantizes and runs scaled_mm on the GPU with the
native providers and must give the result the parent computes afterwards (same provider, same
bits). The parent is a fresh interpreter (tests/fork_spawn_parent.py): this pytest process may have
initialised CUDA already."""
import pytest
import torch
from fork_spawn_parent import run_parent

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def test_children_use_cuda_after_info_in_the_parent():
    report = run_parent("cuda")
    assert report["parent_cuda_initialized"] is False, "qbackend info / the probe initialised CUDA"
    for method in ("fork", "spawn"):
        status, result = report[method]
        assert status == "ok", f"{method} child: {result}"
        assert result == report["parent"], f"{method} child computed another result"
