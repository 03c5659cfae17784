"""import qbackend, `qbackend info` and the probe never initialise CUDA, and multiprocessing children
started with fork and with spawn import qbackend and compute the parent's result (on the CPU here;
tests/gpu/test_fork_spawn.py does the same with CUDA in the children)."""
import torch
from fork_spawn_parent import run_parent


def test_info_does_not_initialise_cuda_and_children_work_on_the_cpu():
    report = run_parent("cpu")
    assert report["parent_cuda_initialized"] is False
    for method in ("fork", "spawn"):
        status, result = report[method]
        assert status == "ok", f"{method} child: {result}"
        assert result == report["parent"], f"{method} child computed another result"


def test_probe_in_this_process_does_not_initialise_cuda():
    import qbackend
    from qbackend import probe
    was = torch.cuda.is_initialized()
    probe.reset()
    qbackend.device_info()
    qbackend.selection_table()
    assert torch.cuda.is_initialized() == was
