"""What torch's own scaled and integer GEMMs take on this GPU, and what each costs: the facts behind
providers/torch_paths.py.

    python bench/probe_torch_paths.py [--facts] [--timing]

--facts: each variant of torch._scaled_mm (tensorwise, rowwise, blockwise with several scale
layouts, partial blocks, out dtypes, bias, fp8 pairs, fast accumulation) and torch._int_mm (small
M, K and N alignment) is called once on random data; it prints "ok" with the error against an fp32
computation of the same product, or the exception's first line.
--timing: the candidate paths of each kind at M in {1, 16, 256, 4096} on (4096, 4096) and
(28672, 4096), under CUDA-graph replay with weight copies rotated past the L2 (qbackend/benchmark.py),
against bf16 torch.mm in the same rounds.
"""
import argparse
from functools import partial

import torch

from qbackend.benchmark import graph_time, interleaved
from qbackend_providers import torch_fallback as tf

dev = "cuda"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def err(out, ref):
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return "NaN"
    return f"{((out - ref).abs().max() / ref.abs().max()).item():.1e}"


def attempt(label, fn, ref):
    try:
        out = fn()
        torch.cuda.synchronize()
        print(f"  ok   {label:70s} err {err(out, ref)}")
    except Exception as e:  # the point is to see what torch refuses, and why
        print(f"  --   {label:70s} {type(e).__name__}: {str(e).splitlines()[0][:160]}")


def fp8(shape, dtype=E4M3):
    return (torch.randn(shape, device=dev) * 2).to(dtype)


def facts():
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
    M, N, K = 64, 256, 512
    a, w = fp8((M, K)), fp8((N, K))
    ref = a.float() @ w.float().t()
    one = torch.ones((), device=dev)
    print("tensorwise")
    for out in (torch.bfloat16, torch.float16, torch.float32):
        attempt(f"e4m3 x e4m3 -> {out}", lambda: torch._scaled_mm(a, w.t(), one, one, out_dtype=out), ref)
        bias = torch.randn(N, device=dev).to(out)
        attempt(f"e4m3 x e4m3 -> {out} + bias {out}",
                lambda: torch._scaled_mm(a, w.t(), one, one, bias=bias, out_dtype=out), ref + bias.float())
    for pa, pb in ((E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)):
        a2, w2 = fp8((M, K), pa), fp8((N, K), pb)
        attempt(f"{pa} x {pb} -> bf16", lambda: torch._scaled_mm(a2, w2.t(), one, one, out_dtype=torch.bfloat16),
                a2.float() @ w2.float().t())
    print("rowwise")
    sa, sb = torch.rand(M, 1, device=dev) + 0.5, torch.rand(1, N, device=dev) + 0.5
    rref = ref * sa * sb
    for out in (torch.bfloat16, torch.float16, torch.float32):
        for fast in (False, True):
            attempt(f"e4m3 x e4m3 -> {out} fast_accum={fast}",
                    lambda: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=out, use_fast_accum=fast), rref)
    bias = torch.randn(N, device=dev).to(torch.bfloat16)
    attempt("bf16 + bias bf16", lambda: torch._scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16),
            rref + bias.float())
    bias32 = torch.randn(N, device=dev)
    attempt("bf16 + bias fp32", lambda: torch._scaled_mm(a, w.t(), sa, sb, bias=bias32, out_dtype=torch.bfloat16),
            rref + bias32)
    a5 = fp8((M, K), E5M2)
    attempt("e5m2 x e4m3 -> bf16", lambda: torch._scaled_mm(a5, w.t(), sa, sb, out_dtype=torch.bfloat16),
            (a5.float() @ w.float().t()) * sa * sb)
    attempt("M=1", lambda: torch._scaled_mm(a[:1], w.t(), sa[:1], sb, out_dtype=torch.bfloat16), rref[:1])
    print("blockwise 1x128 x 128x128 (torch.nn.functional.scaled_mm, the provider's layouts)")
    for (M, N, K) in ((64, 256, 512), (1, 256, 512), (3, 256, 512), (17, 2112, 7168), (64, 256, 7232),
                      (5, 4160, 384), (64, 320, 512)):
        kb, nb = -(-K // 128), -(-N // 128)
        a, w = fp8((M, K)), fp8((N, K))
        sa = torch.rand(M, kb, device=dev) + 0.5
        sb = torch.rand(kb, nb, device=dev) + 0.5
        full_a = sa.repeat_interleave(128, 1)[:, :K]
        full_b = sb.repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
        bref = (a.float() * full_a) @ (w.float().t() * full_b)
        layout = tf.blockwise_scale_b(sb)
        for out in (torch.bfloat16, torch.float16, torch.float32):
            attempt(f"M={M} N={N} K={K} -> {out}", lambda: tf.blockwise_mm(a, w.t(), sa, layout, None, out), bref)
        bias = torch.randn(N, device=dev).to(torch.bfloat16)
        attempt(f"M={M} N={N} K={K} -> bf16 + bias",
                lambda: tf.blockwise_mm(a, w.t(), sa, layout, bias, torch.bfloat16), bref + bias.float())
        sbc = torch.rand(kb, N, device=dev) + 0.5
        cref = (a.float() * full_a) @ (w.float().t() * sbc.repeat_interleave(128, 0)[:K])
        attempt(f"M={M} N={N} K={K} 1x128 x 1x128 -> bf16",
                lambda: tf.blockwise_mm(a, w.t(), sa, sbc.t(), None, torch.bfloat16, per_column=True), cref)
    print("_int_mm")
    for (M, N, K) in ((1, 256, 512), (16, 256, 512), (17, 256, 512), (32, 256, 512), (32, 264, 520),
                      (32, 256, 520)):
        ai = torch.randint(-128, 128, (M, K), device=dev, dtype=torch.int8)
        wi = torch.randint(-128, 128, (N, K), device=dev, dtype=torch.int8)
        attempt(f"M={M} N={N} K={K}", lambda: torch._int_mm(ai, wi.t()), ai.float() @ wi.float().t())


def timing():
    print("method: CUDA-graph replay, weights rotated past the L2, medians of interleaved rounds (us)")
    for (N, K) in ((4096, 4096), (28672, 4096)):
        n = max(2, min(16, (512 * 2**20) // (N * K)))
        w8 = [fp8((N, K)) for _ in range(n)]
        wi = [torch.randint(-128, 128, (N, K), device=dev, dtype=torch.int8) for _ in range(n)]
        wb = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(n)]
        sb = torch.rand(1, N, device=dev) + 0.5
        kb, nb = K // 128, N // 128
        sbb = tf.blockwise_scale_b(torch.rand(kb, nb, device=dev) + 0.5)
        one = torch.ones((), device=dev)
        for M in (1, 16, 256, 4096):
            a8, ab = fp8((M, K)), torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ai = torch.randint(-128, 128, (M, K), device=dev, dtype=torch.int8)
            sa = torch.rand(M, 1, device=dev) + 0.5
            sab = torch.rand(M, kb, device=dev) + 0.5

            def unscaled(w):
                acc = torch._scaled_mm(a8, w.t(), one, one, out_dtype=torch.float32)
                return torch.mul(acc, sa * sb, out=torch.empty(M, N, device=dev, dtype=torch.bfloat16))

            def int_dequant(w_bf16):
                a_dq = torch.mul(ai, sa, out=torch.empty(M, K, device=dev, dtype=torch.bfloat16))
                return torch.mm(a_dq, w_bf16.t())

            cands = {
                "bf16 mm": [lambda w=w: torch.mm(ab, w.t()) for w in wb],
                "tensorwise": [lambda w=w: torch._scaled_mm(a8, w.t(), one, one, out_dtype=torch.bfloat16) for w in w8],
                "rowwise": [lambda w=w: torch._scaled_mm(a8, w.t(), sa, sb, out_dtype=torch.bfloat16) for w in w8],
                "unscaled+epilogue": [lambda w=w: unscaled(w) for w in w8],
                "blockwise": [lambda w=w: tf.blockwise_mm(a8, w.t(), sab, sbb, None, torch.bfloat16) for w in w8],
                "int_mm alone": [lambda w=w: tf.int_mm(ai, w.t()) for w in wi],
                "int_mm+epilogue": [lambda w=w: tf.epilogue(tf.int_mm(ai, w.t()), sa, sb, None, torch.bfloat16)
                                    for w in wi],
                "int8 dequant+bf16 mm": [lambda w=w: int_dequant(w) for w in wb],
            }
            timers = {}
            for label, fns in cands.items():
                try:
                    graph_time(fns, 1.0)
                    timers[label] = partial(graph_time, fns, 5.0)
                except Exception as e:
                    print(f"  {label}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            med = interleaved(timers)
            line = " | ".join(f"{k} {v:8.2f} (x{med['bf16 mm'] / v:5.2f})" for k, v in med.items())
            print(f"N={N:5d} K={K} M={M:4d} | {line}", flush=True)
        del w8, wi, wb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--facts", action="store_true")
    ap.add_argument("--timing", action="store_true")
    args = ap.parse_args()
    if args.facts or not args.timing:
        facts()
    if args.timing or not args.facts:
        timing()
