"""The parent process of the fork and spawn checks, run as a script in a fresh interpreter:

    python tests/fork_spawn_parent.py cpu|cuda

It imports qbackend, runs `qbackend info` and the selection queries (the probe), records whether
that initialised CUDA in this process (it must not: a forked child could not use CUDA then), starts
one child with fork and one with spawn that each import qbackend and run quantize + scaled_mm on
`device`, and finally runs the same call itself. Prints one JSON line:
{"parent_cuda_initialized": bool, "fork": [status, result], "spawn": [...], "parent": result}.
"""
import json
import multiprocessing as mp
import os
import subprocess
import sys


def run_parent(device: str) -> dict:
    """This script in a fresh interpreter (the caller's may have touched CUDA already), without
    the caller's QBACKEND_ settings; its report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QBACKEND_")}
    done = subprocess.run([sys.executable, os.path.abspath(__file__), device], capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def compute(device: str) -> list:
    import torch

    import qbackend
    e4m3 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g).to(device)
    w = torch.randn(32, 64, generator=g).to(device)
    w_q, w_s = qbackend.quantize(w, e4m3, "channel")
    x_q, x_s = qbackend.quantize(x, e4m3, "token")
    return qbackend.scaled_mm(x_q, w_q.t(), x_s, w_s.t()).float().cpu().tolist()


def child(device: str, queue) -> None:
    try:
        queue.put(["ok", compute(device)])
    except BaseException as exc:  # reported to the parent, which fails the test with it
        queue.put(["error", f"{type(exc).__name__}: {exc}"])


def main(device: str) -> None:
    import torch

    import qbackend
    from qbackend import cli
    cli.main(["info"])
    qbackend.selection_table()
    qbackend.explain("fp8_w8a8_per_token_channel")
    report = {"parent_cuda_initialized": torch.cuda.is_initialized()}
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(device, queue))
        proc.start()
        try:
            report[method] = queue.get(timeout=600)
        except Exception as exc:  # the child died without answering
            report[method] = ["error", f"no answer ({type(exc).__name__}), exit code {proc.exitcode}"]
        proc.join(60)
    report["parent"] = compute(device)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
