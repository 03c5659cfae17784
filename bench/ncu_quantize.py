"""A target for Nsight Compute: qbackend's per-token-group and per-token quantize and torch.compile's
group quantize, bf16 -> e4m3fn at 1024 x 7168 and 8192 x 7168, each called once inside the profiled
range after two warm-up calls outside it.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        --section Occupancy --section LaunchStats --section InstructionStats python bench/ncu_quantize.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_quantize  # noqa: E402

from qbackend_providers import native  # noqa: E402

F8 = torch.float8_e4m3fn
K = 7168


def main():
    compiled = torch.compile(bench_quantize.torch_group_quant)
    calls = []
    for M in (1024, 8192):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 3
        q = torch.empty(M, K, device="cuda", dtype=F8)
        s_group = torch.empty(M, K // 128, device="cuda")
        s_token = torch.empty(M, 1, device="cuda")
        calls += [lambda x=x, q=q, s=s_group: native.quantize_group(x, q, s, 128),
                  lambda x=x: compiled(x),
                  lambda x=x, q=q, s=s_token: native.quantize(x, q, s, native.DYNAMIC_TOKEN)]
    for call in calls:
        call()
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
