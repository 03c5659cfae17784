"""A Triton block-scaled FP8 GEMM: the algorithm vLLM and SGLang run for DeepSeek-style checkpoints
when DeepGEMM is not there, written here as a benchmark baseline (not a qbackend provider).

    out[M, N] = sum over K blocks kb of (a[:, kb] @ b[kb, :]) * scale_a[:, kb] * scale_b[kb, n // 128]

a: [M, K] e4m3fn (row-major); b: [K, N] e4m3fn, any strides (pass w.t() of a row-major [N, K] weight);
scale_a: [M, ceil(K/128)] fp32; scale_b: [ceil(K/128), ceil(N/128)] fp32. Each program owns a
BLOCK_M x BLOCK_N tile and walks K in 128-wide steps (one scale group each), scaling every step's
fp32 partial product before adding it: the two-level accumulation the CUDA kernels do. Tiles are
visited in groups of SWIZZLE rows of tiles so that neighbouring programs share B in L2. The launch
config is autotuned over a short list per (M bucket, N, K).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP = 128

# (BLOCK_M, BLOCK_N, num_warps, num_stages): narrow-M tiles for decode, 64/128-row tiles for prefill.
_CONFIGS = [(16, 64, 4, 4), (16, 128, 4, 3), (32, 64, 4, 4), (32, 128, 4, 3), (64, 64, 4, 4),
            (64, 128, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 256, 8, 3)]


def _m_bucket(M: int) -> int:
    return 1 << max(4, (M - 1).bit_length())


@triton.autotune(configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                          for bm, bn, w, s in _CONFIGS],
                 key=["M_BUCKET", "N", "K"],
                 do_bench=lambda fn, quantiles: triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles))
@triton.jit
def _block_fp8_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, M_BUCKET,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      stride_sam, stride_sak, stride_sbk, stride_sbn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SWIZZLE: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = SWIZZLE * tiles_n
    first_m = (pid // per_group) * SWIZZLE
    rows_here = tl.minimum(tiles_m - first_m, SWIZZLE)
    pid_m = first_m + (pid % per_group) % rows_here
    pid_n = (pid % per_group) // rows_here

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_m = offs_m < M
    in_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    sa_ptrs = sa_ptr + offs_m * stride_sam
    sb_ptrs = sb_ptr + (offs_n // BLOCK_K) * stride_sbn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        in_k = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=in_m[:, None] & in_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=in_k[:, None] & in_n[None, :], other=0.0)
        sa = tl.load(sa_ptrs + kb * stride_sak, mask=in_m, other=0.0)
        sb = tl.load(sb_ptrs + kb * stride_sbk, mask=in_n, other=0.0)
        acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_m[:, None] & in_n[None, :])


def block_fp8_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    kb, nb = -(-K // GROUP), -(-N // GROUP)
    assert b.shape[0] == K and scale_a.shape == (M, kb) and scale_b.shape == (kb, nb), "operand shapes"
    out = torch.empty((M, N), dtype=out_dtype, device=a.device) if out is None else out

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    _block_fp8_kernel[grid](a, b, out, scale_a, scale_b, M, N, K, _m_bucket(M),
                            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
                            scale_a.stride(0), scale_a.stride(1), scale_b.stride(0), scale_b.stride(1),
                            BLOCK_K=GROUP, SWIZZLE=8)
    return out
