"""A short workload for `compute-sanitizer --tool memcheck` over libqbackend_cuda's kernels.

    compute-sanitizer --tool memcheck python tests/gpu/memcheck_native.py

Runs every built scaled_mm family (partial tiles in M, N and K, sliced A, bias, split-K) and every
quantize mode (vector and scalar paths, sliced rows) once; prints "memcheck workload done". The
sanitizer's own summary ("ERROR SUMMARY: 0 errors") is the verdict. Not collected by pytest.
"""

import torch

from qbackend_providers import native

F8 = torch.float8_e4m3fn
dev = "cuda"
for dtype, variants in ((F8, (90, 89)), (torch.int8, (80, 75))):
    for v in variants:
        if not native.has_variant("scaled_mm_fp8" if dtype == F8 else "scaled_mm_int8", v):
            continue
        for M, N, K in ((1, 4096, 4096), (17, 2064, 1040), (300, 1040, 272)):
            a_big = (torch.randn(M, K + 32, device=dev) * 2).to(dtype)
            a = a_big[:, 16:16 + K]
            w = (torch.randn(N, K, device=dev) * 2).to(dtype)
            out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            sa, sb = torch.rand(M, 1, device=dev) + 0.5, torch.rand(1, N, device=dev) + 0.5
            bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
            native.scaled_mm(a, w.t(), sa, sb, bias, out, variant=v)
            native.scaled_mm(a, w.t(), sa[0], sb[0, 0], None, out, variant=v)
            torch.cuda.synchronize()
for xdtype in (torch.bfloat16, torch.float16, torch.float32):
    for qdtype in (F8, torch.float8_e5m2, torch.int8):
        for rows, cols, off in ((7, 4096, 0), (5, 1001, 1), (3, 20000, 0)):
            x = torch.randn(rows, cols + off + 8, device=dev).to(xdtype)[:, off:off + cols]
            q = torch.empty(rows, cols, device=dev, dtype=qdtype)
            s = torch.empty(rows, 1, device=dev)
            native.quantize(x, q, s, native.DYNAMIC_TOKEN)
            s1 = torch.empty(1, device=dev)
            native.quantize(x, q, s1, native.DYNAMIC_TENSOR)
            ws = torch.empty(16, dtype=torch.uint8, device=dev)
            native.quantize(x, q, s1, native.DYNAMIC_TENSOR, None, ws)
            native.quantize(x, q, s1, native.STATIC_TENSOR)
torch.cuda.synchronize()
print("memcheck workload done")
