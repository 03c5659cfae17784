"""Seeded random calls through the public API on a CUDA GPU, each against the reference provider.

The other GPU tests pin the shapes and layouts the kernels were written for. These cases draw what
a user may pass instead, within the API's rules:
- M from 1 to 4096 (log-uniform; less where N x K is large), sometimes as a batch [B, M / B, K];
- N up to 12288 and K up to 16384, mostly multiples of 16 (of 8 for marlin's N: what the kernels
  take) and sometimes any size from 1 (what the kernels refuse, so that the reference must serve);
- activations and weights as windows of larger tensors: a row offset, a column offset and a row
  stride in whole 16-byte units, the layouts the API accepts;
- every scale shape the kernels take (and the 0-d, [1], [N] and [1, N] spellings of them), bias on
  and off, both half output dtypes;
- the kernel families forced at random: sm_90a and sm_89 FP8, sm_90a, sm_80 and sm_75 INT8, sm_90a
  and sm_89 block-scaled FP8, marlin's sm_80 and sm_75 paths (the older ones through their PTX on a
  newer GPU);
- quantize + linear (W8A8 per-token / per-tensor or block-scaled) or linear (W8A16) captured in a
  CUDA graph and replayed on new activations, and quantize + scaled_mm or linear through
  torch.compile(fullgraph=True), block-scaled included;
- grouped_scaled_mm (MoE): 1 to 512 groups, routing uniform, to a hot group or to few groups, every
  scale family, the default selection or cutlass forced, sometimes replayed after new routing;
- the torch provider forced on every kind it serves (fp8 and int8 W8A8, W8A16, block scales with
  partial blocks), eager, replayed from a graph or compiled, each case counted by the path it took.
Outputs outside graphs are poisoned first; a GEMM must be NaN-free and within the stated tolerance
of the fp32 reference, a quantization bit for bit equal to it. The last test prints which provider served each
family's cases and, from 50 cases on, checks that at least a third of them ran on the native
kernels.

    QBACKEND_RANDOM_CASES=N (cases per family, default 60)   QBACKEND_RANDOM_SEED=S (default 0)

A case's id names its family and number; its inputs depend on nothing else, so a failing case
reruns alone: pytest tests/gpu/test_random_cases.py -k "fp8-17".
"""
from __future__ import annotations

import collections
import math
import os
import random

import pytest
import torch

import qbackend
from gpu_helpers import DEV, captured, needs_sm, poison, reference, rel_err, with_provider
from helpers import window
from qbackend import registry
from qbackend.validate import validate_quantize, validate_scaled_mm
from qbackend.validate_grouped import validate_grouped_scaled_mm
from qbackend.weights import weight_scale_to_b
from qbackend_providers import torch_paths

pytestmark = pytest.mark.gpu
F8 = torch.float8_e4m3fn
SM = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
CASES = range(int(os.environ.get("QBACKEND_RANDOM_CASES", "60")))
SEED = os.environ.get("QBACKEND_RANDOM_SEED", "0")
MAX_MACS = 3 * 10**10  # keeps each case, its fp32 reference included, to milliseconds
COMPILED_CASES = 24  # each compiles a graph (seconds), so fewer of them

# (family, provider that served the case) -> cases; reported and checked by the last test.
SERVED: collections.Counter = collections.Counter()

# Kernel families to force, "" = the automatic choice.
FP8_FAMILIES = [""] + (["90"] if SM == (9, 0) else []) + (["89"] if SM >= (8, 9) else [])
INT8_FAMILIES = [""] + (["90"] if SM == (9, 0) else []) + (["80", "75"] if SM >= (8, 0) else ["75"])
BLOCK_FAMILIES = [""] + (["90"] if SM == (9, 0) else []) + (["89"] if SM >= (8, 9) else [])
MARLIN_FAMILIES = ["80", "75"] if SM >= (8, 0) else ["75"]
# W8A16 kernels: marlin's families, and on sm_90 the cutlass provider's mixed-input ones.
W8A16_FAMILIES = MARLIN_FAMILIES + (["cutlass"] if SM == (9, 0) else [])


def case_random(family: str, i: int):
    """The case's own random streams (Python for the draws, torch for the data), from its id alone."""
    r = random.Random(f"{SEED}:{family}:{i}")
    g = torch.Generator(device=DEV).manual_seed(r.getrandbits(62))
    return r, g


def log_uniform(r, lo: int, hi: int) -> int:
    return int(round(math.exp(r.uniform(math.log(lo), math.log(hi)))))


def draw_dim(r, hi: int, align: int) -> int:
    """A GEMM dimension: mostly a multiple of `align`, sometimes any size."""
    if r.random() < 0.8:
        return align * log_uniform(r, 1, hi // align)
    return log_uniform(r, 1, hi)


def draw_mnk(r, max_m: int, n_align: int):
    N, K = draw_dim(r, 12288, n_align), draw_dim(r, 16384, 16)
    M = min(log_uniform(r, 1, max_m), max(1, MAX_MACS // (N * K)))
    return M, N, K


def cut(t: torch.Tensor, offset, rows: int, cols: int) -> torch.Tensor:
    return t[offset[0]:offset[0] + rows, offset[1]:offset[1] + cols]


def batch_split(r, M: int):
    """Leading dimensions for M rows: (M,) or, sometimes, a batch (B, M / B)."""
    divisors = [b for b in (2, 3, 4) if M % b == 0]
    if divisors and r.random() < 0.25:
        b = r.choice(divisors)
        return (b, M // b)
    return (M,)


def quantized_weight(r, g, N: int, K: int, dtype):
    """A row-major [N, K] weight quantized per channel, and its [N, 1] scale, cut from a larger
    quantized tensor (so with a row stride and offsets)."""
    (NR, KC), at = window(r, N, K, 1)
    qw_all, sw_all = qbackend.quantize(torch.randn(NR, KC, device=DEV, generator=g), dtype, "channel")
    return cut(qw_all, at, N, K), sw_all[at[0]:at[0] + N]


def quantized_operands(r, g, M: int, N: int, K: int, dtype):
    """A [M, K] quantized activation with its scale and a column-major [K, N] weight with its
    per-channel scale, each cut from a larger quantized tensor (so with a row stride and offsets)."""
    (R, C), at = window(r, M, K, 1)
    act_gran = r.choice(["token", "tensor"])
    qx_all, sx_all = qbackend.quantize(torch.randn(R, C, device=DEV, generator=g), dtype, act_gran)
    qx = cut(qx_all, at, M, K)
    sx = sx_all[at[0]:at[0] + M] if act_gran == "token" else sx_all
    qw, sw = quantized_weight(r, g, N, K, dtype)
    return qx, sx, act_gran, qw, sw


def weight_scale(r, sw: torch.Tensor):
    """One spelling of a per-channel ([N, 1] as [1, N] or [N]) or per-tensor ([] or [1]) scale."""
    return r.choice([lambda: sw.t(), lambda: sw.reshape(-1), lambda: sw.max(), lambda: sw.max().reshape(1)])()


def served_by(family: str, problem) -> str:
    """The provider selected for the case's problem, counted in SERVED."""
    name = qbackend.select(problem, torch.device(DEV)).name
    SERVED[(family, name)] += 1
    return name


def check_w8a8(monkeypatch, family: str, i: int, dtype, families):
    r, g = case_random(family, i)
    forced = r.choice(families)
    with_provider(monkeypatch, "cutlass", QBACKEND_CUTLASS_VARIANT=forced)
    M, N, K = draw_mnk(r, 4096, 16)
    qx, sx, act_gran, qw, sw = quantized_operands(r, g, M, N, K, dtype)
    lead = batch_split(r, M)
    a = qx.reshape(lead + (K,))
    scale_a = sx.reshape(lead + (1,)) if act_gran == "token" else sx
    scale_b = weight_scale(r, sw)
    out_dtype = r.choice([torch.bfloat16, torch.float16])
    bias = torch.randn(N, device=DEV, generator=g).to(out_dtype) if r.random() < 0.5 else None
    prepared = r.random() < 0.3
    what = dict(M=M, N=N, K=K, lead=lead, a_stride=tuple(a.stride()), b_stride=tuple(qw.t().stride()),
                scale_a=tuple(scale_a.shape), scale_b=tuple(scale_b.shape), out=out_dtype,
                bias=bias is not None, family=forced or "auto", prepared=prepared,
                provider=served_by(family, validate_scaled_mm(a, qw.t(), scale_a, scale_b, out_dtype, bias)))
    poison()
    if prepared:  # the weight laid out once (prepare_weight), then linear
        w_scale = sw if scale_b.numel() > 1 else scale_b  # the weight's own [N, 1] form, or one value
        pw = qbackend.prepare_weight(qw, w_scale, dtype, act_gran, out_dtype, bias=bias is not None)
        scale_b = pw.scale
        out = qbackend.linear(a, pw, scale_a, bias, out_dtype)
    else:
        out = qbackend.scaled_mm(a, qw.t(), scale_a, scale_b, out_dtype=out_dtype, bias=bias)
    ref = reference(qbackend.scaled_mm, a, qw.t(), scale_a, scale_b, out_dtype=torch.float32,
                    bias=None if bias is None else bias.float())
    assert out.shape == lead + (N,) and out.dtype == out_dtype, what
    # FP8 with fast accumulation (as cuBLASLt's use_fast_accum): up to 3e-3 of max|out| measured at
    # K = 4096 and 1.3e-2 at K = 28672 (test_providers_gpu.py); INT8 accumulates exactly.
    tol = 1e-2 if dtype == torch.int8 or K <= 8192 else 2e-2
    assert rel_err(out, ref) < tol, what


@needs_sm((8, 9), "fp8 tensor cores")
@pytest.mark.parametrize("i", CASES, ids=lambda i: f"fp8-{i}")
def test_random_fp8_scaled_mm(monkeypatch, i):
    check_w8a8(monkeypatch, "fp8", i, F8, FP8_FAMILIES)


def block_operands(r, g, M: int, N: int, K: int):
    """A [M, K] activation quantized in 1 x 128 groups, as a window of a wider quantized tensor (so
    with a row stride), its [M, ceil(K/128)] scales, and a [N, K] weight quantized in 128 x 128 blocks
    with its [ceil(N/128), ceil(K/128)] scales, as a checkpoint holds them."""
    (R, C), at = window(r, M, K, 1)
    qx_all, sx_all = qbackend.quantize(torch.randn(R, C, device=DEV, generator=g), F8, "group")
    first_group = at[1] // 128
    if at[1] % 128:  # the window must start on a group boundary to keep its scales
        at = (at[0], first_group * 128)
    qx = cut(qx_all, at, M, K)
    sx = sx_all[at[0]:at[0] + M, first_group:first_group + -(-K // 128)]
    qw, sw = qbackend.quantize(torch.randn(N, K, device=DEV, generator=g), F8, "block")
    return qx, sx, qw, sw


# Block-scaled FP8 sums each 128-deep block exactly in fp32 and rounds once to the output (no fast
# accumulation): the error is that rounding, 2^-8 (bf16) or 2^-11 (fp16) relative, of max|out| here.
BLOCK_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


@needs_sm((8, 9), "fp8 tensor cores")
@pytest.mark.parametrize("i", CASES, ids=lambda i: f"block-{i}")
def test_random_block_scaled_mm(monkeypatch, i):
    """1 x 128 activation groups with 128 x 128 weight blocks on the cutlass kernels (a family forced
    at random), through scaled_mm or a prepared weight and linear."""
    r, g = case_random("block", i)
    forced = r.choice(BLOCK_FAMILIES)
    with_provider(monkeypatch, "cutlass", QBACKEND_CUTLASS_VARIANT=forced)
    M, N, K = draw_mnk(r, 4096, 8)
    K = K // 16 * 16 or 16  # scaled_mm's rule: a column-major weight's column stride is 16-byte aligned
    qx, sx, qw, sw = block_operands(r, g, M, N, K)
    lead = batch_split(r, M)
    a, scale_a = qx.reshape(lead + (K,)), sx.reshape(lead + (sx.shape[-1],))
    out_dtype = r.choice([torch.bfloat16, torch.float16])
    bias = torch.randn(N, device=DEV, generator=g).to(out_dtype) if r.random() < 0.5 else None
    prepared = r.random() < 0.3
    what = dict(M=M, N=N, K=K, lead=lead, a_stride=tuple(a.stride()), out=out_dtype, bias=bias is not None,
                family=forced or "auto", prepared=prepared,
                provider=served_by("block", validate_scaled_mm(a, qw.t(), scale_a, sw.t(), out_dtype, bias, 128)))
    poison()
    if prepared:
        pw = qbackend.prepare_weight(qw, sw, F8, "group", out_dtype, bias=bias is not None)
        out = qbackend.linear(a, pw, scale_a, bias, out_dtype)
    else:
        out = qbackend.scaled_mm(a, qw.t(), scale_a, sw.t(), out_dtype=out_dtype, bias=bias)
    ref = reference(qbackend.scaled_mm, a, qw.t(), scale_a, sw.t(), out_dtype=torch.float32,
                    bias=None if bias is None else bias.float())
    assert out.shape == lead + (N,) and out.dtype == out_dtype, what
    # Shapes the block kernels do not take (N not a multiple of 8, one scale over N <= 128) fall to
    # the torch provider, whose paths (cuBLASLt blockwise, or operands dequantized to bf16) carry
    # bf16-level error: its tolerance in test_random_torch_provider.
    tol = BLOCK_TOL[out_dtype] if what["provider"] == "cutlass" else 1e-2
    err = rel_err(out, ref)
    assert err < tol, {**what, "err": err, "tol": tol}


GROUPED_SCALES = ("tensor", "token_channel", "block")


def host_free(provider: str, a, problem) -> bool:
    """Whether the provider serving a grouped problem keeps offsets on the device."""
    if provider == "reference":
        return False
    served = registry.get().providers[provider]
    return not hasattr(served, "plan") or served.plan(a.device, problem)[0] != torch_paths.GROUPED_LOOP


@needs_sm((8, 9), "fp8 tensor cores")
@pytest.mark.parametrize("i", CASES, ids=lambda i: f"grouped-{i}")
def test_random_grouped_scaled_mm(monkeypatch, i):
    """grouped_scaled_mm (MoE) with 1 to 512 groups, rows routed uniformly, to one hot group or to
    few groups, per-tensor / per-token x channel / block scales; the default selection or cutlass
    forced; eager or replayed from a CUDA graph after new routing is written in place."""
    r, g = case_random("grouped", i)
    forced = r.choice(["", "cutlass"])
    if forced:
        with_provider(monkeypatch, forced)
    G = log_uniform(r, 1, 512)
    rows = log_uniform(r, 1, 4096)
    N, K = draw_dim(r, 4096, 8) // 8 * 8 or 8, draw_dim(r, 8192, 16) // 16 * 16 or 16
    rows = min(rows, max(1, MAX_MACS // (N * K)))
    G = min(G, max(1, (1 << 30) // (N * K)))  # the experts' weights within 1 GB
    scales = r.choice(GROUPED_SCALES)
    how = r.choice(["uniform", "hot", "few"])

    def routing():
        weights = torch.ones(G)
        if how == "hot":
            weights[r.randrange(G)] = 8.0 * G
        elif how == "few":
            weights = torch.zeros(G)
            weights[[r.randrange(G) for _ in range(3)]] = 1.0
        draw = torch.Generator().manual_seed(r.getrandbits(31))
        picks = torch.multinomial(weights, rows, replacement=True, generator=draw)
        return picks.bincount(minlength=G).cumsum(0).to(torch.int32).to(DEV)

    (R, C), at = window(r, rows, K, 1)
    a = cut((torch.randn(R, C, device=DEV, generator=g) * 30).to(F8), at, rows, K)
    b = (torch.randn(G, N, K, device=DEV, generator=g) * 30).to(F8).transpose(-2, -1)
    kb, nb = -(-K // 128), -(-N // 128)
    sa_shape, sb_shape = {"tensor": ((), (G,)), "token_channel": ((rows, 1), (G, N)),
                          "block": ((rows, kb), (G, kb, nb))}[scales]
    sa = torch.rand(sa_shape, device=DEV, generator=g) * 0.01 + 1e-4
    sb = torch.rand(sb_shape, device=DEV, generator=g) * 0.01 + 1e-4
    out_dtype = r.choice([torch.bfloat16, torch.float16])
    bias = torch.randn(G, N, device=DEV, generator=g).to(out_dtype) if r.random() < 0.3 else None
    offsets = routing()
    graphed = r.random() < 0.3
    what = dict(G=G, rows=rows, N=N, K=K, scales=scales, routing=how, a_stride=tuple(a.stride()), out=out_dtype,
                bias=bias is not None, forced=forced or "auto", graphed=graphed,
                provider=served_by("grouped", validate_grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype, bias)))
    call = lambda: qbackend.grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype=out_dtype, bias=bias)  # noqa: E731
    # The paths that read offsets on the host (the reference, the torch provider's per-group loop)
    # decline under capture; the test captures only where a device-side path serves.
    if graphed and host_free(what["provider"], a, validate_grouped_scaled_mm(a, b, sa, sb, offsets, out_dtype, bias)):
        graph, out = captured(call)
        offsets.copy_(routing())
        graph.replay()
        torch.cuda.synchronize()
    else:
        poison()
        out = call()
    ref = reference(qbackend.grouped_scaled_mm, a, b, sa, sb, offsets, out_dtype=torch.float32,
                    bias=None if bias is None else bias.float())
    assert out.shape == (rows, N) and out.dtype == out_dtype, what
    assert rel_err(out, ref) < (1e-2 if K <= 8192 else 2e-2), what


@needs_sm((7, 5), "int8 tensor cores")
@pytest.mark.parametrize("i", CASES, ids=lambda i: f"int8-{i}")
def test_random_int8_scaled_mm(monkeypatch, i):
    check_w8a8(monkeypatch, "int8", i, torch.int8, INT8_FAMILIES)


@pytest.mark.parametrize("i", CASES, ids=lambda i: f"quantize-{i}")
def test_random_quantize(monkeypatch, i):
    r, g = case_random("quantize", i)
    with_provider(monkeypatch, "cutlass")
    x_dtype = r.choice([torch.bfloat16, torch.float16, torch.float32])
    dtype = r.choice([F8, torch.float8_e5m2, torch.int8])
    M, K = log_uniform(r, 1, 8192), draw_dim(r, 16384, 16)
    M = min(M, max(1, 2 * 10**8 // K))
    shape, at = window(r, M, K, torch.finfo(x_dtype).bits // 8)
    magnitude = 10.0 ** r.uniform(-3, 3)
    x = cut((torch.randn(shape, device=DEV, generator=g) * magnitude).to(x_dtype), at, M, K)
    if M > 1 and r.random() < 0.3:
        x[r.randrange(M)] = 0  # an all-zero row takes the smallest scale
    x = x.reshape(batch_split(r, M) + (K,))
    kw = r.choice([dict(granularity="token"), dict(granularity="tensor"),
                   dict(granularity="token", scale_ub=torch.tensor([magnitude], device=DEV)),
                   dict(granularity="tensor", scale_ub=torch.tensor(magnitude / 2, device=DEV)),
                   dict(scale=torch.tensor(magnitude / 100, device=DEV)),
                   dict(granularity="group", group_size=r.choice([64, 128]))])
    what = dict(shape=tuple(x.shape), stride=tuple(x.stride()), x=x_dtype, q=dtype, **kw)
    problem = validate_quantize(x, dtype, kw.get("granularity", "tensor"), kw.get("scale"), kw.get("scale_ub"),
                                kw.get("group_size", 128), (128, 128))
    what["provider"] = served_by("quantize", problem)
    poison()
    q, s = qbackend.quantize(x, dtype, **kw)
    rq, rs = reference(qbackend.quantize, x, dtype, **kw)
    assert q.shape == x.shape and s.shape == rs.shape, what
    assert torch.equal(s, rs), what
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), what


@pytest.mark.parametrize("i", CASES, ids=lambda i: f"marlin-{i}")
def test_random_marlin(monkeypatch, i):
    """W8A16 on a native kernel family: marlin's sm_80 / sm_75, or the cutlass provider's sm_90a one
    (M up to 1100 reaches both its small-M kernel and its CUTLASS configs)."""
    r, g = case_random("marlin", i)
    variant, act = r.choice(W8A16_FAMILIES), r.choice([torch.float16, torch.bfloat16])
    if variant == "cutlass":
        with_provider(monkeypatch, "cutlass")
    else:
        with_provider(monkeypatch, "marlin", QBACKEND_MARLIN_VARIANT=variant)
    M, N, K = draw_mnk(r, 1100, 8)
    qw, sw = quantized_weight(r, g, N, K, F8)
    per_channel = r.random() < 0.7
    (R, C), at = window(r, M, K, 2)
    x = cut(torch.randn(R, C, device=DEV, generator=g).to(act), at, M, K)
    bias = torch.randn(N, device=DEV, generator=g).to(act) if r.random() < 0.5 else None
    prepared = r.random() < 0.7
    what = dict(M=M, N=N, K=K, x_stride=tuple(x.stride()), w_stride=tuple(qw.stride()), act=act,
                per_channel=per_channel, bias=bias is not None, variant=variant, prepared=prepared)
    poison()
    if prepared:
        pw = qbackend.prepare_weight(qw, sw if per_channel else sw.max(), act, bias=bias is not None)
        scale_b = pw.scale
        what["provider"] = pw.provider
        SERVED[("marlin", pw.provider)] += 1
        out = qbackend.linear(x, pw, None, bias)
    else:
        scale_b = sw.t() if per_channel else sw.max()
        what["provider"] = served_by("marlin", validate_scaled_mm(x, qw.t(), None, scale_b, act, bias))
        out = qbackend.scaled_mm(x, qw.t(), None, scale_b, out_dtype=act, bias=bias)
    ref = reference(qbackend.scaled_mm, x, qw.t(), None, scale_b, out_dtype=torch.float32,
                    bias=None if bias is None else bias.float())
    assert out.shape == (M, N) and out.dtype == act, what
    # as test_providers_gpu.py: bf16 carries 8 significant bits, fp16 11
    tol = 1e-2 if act == torch.bfloat16 else 2e-3
    assert rel_err(out, ref) < tol, what


@pytest.mark.parametrize("i", CASES, ids=lambda i: f"graph-{i}")
def test_random_graph_replay(monkeypatch, i):
    """quantize + linear (W8A8 on the cutlass kernels) or linear alone (W8A16 on marlin's or cutlass's) captured in
    a CUDA graph, replayed on new activations: each replay equals the same calls run eagerly, bit for
    bit, and the reference within tolerance."""
    r, g = case_random("graph", i)
    w8a8 = SM >= (8, 9) and r.random() < 0.6
    block = w8a8 and r.random() < 0.35  # 1 x 128 activation groups, 128 x 128 weight blocks
    M, N, K = draw_mnk(r, 512, 16 if w8a8 else 8)
    if w8a8:  # quantize's output has rows of K bytes, which scaled_mm takes only in 16-byte units
        K = -(-K // 16) * 16
    out_dtype = r.choice([torch.bfloat16, torch.float16])
    if w8a8:
        with_provider(monkeypatch, "cutlass")
        dtype, act_gran = F8, "group" if block else r.choice(["token", "tensor"])
    else:
        variant = r.choice(W8A16_FAMILIES)
        if variant == "cutlass":
            with_provider(monkeypatch, "cutlass")
        else:
            with_provider(monkeypatch, "marlin", QBACKEND_MARLIN_VARIANT=variant)
        dtype, act_gran = out_dtype if variant != "75" else torch.float16, "tensor"
        out_dtype = dtype
    if block:
        qw, w_scale = qbackend.quantize(torch.randn(N, K, device=DEV, generator=g), F8, "block")
    else:
        qw, sw = quantized_weight(r, g, N, K, F8)
        w_scale = sw if r.random() < 0.7 else sw.max()
    bias = torch.randn(N, device=DEV, generator=g).to(out_dtype) if r.random() < 0.5 else None
    pw = qbackend.prepare_weight(qw, w_scale, dtype, act_gran, out_dtype, bias=bias is not None)
    SERVED[("graph", pw.provider)] += 1
    (R, C), at = window(r, M, K, 2)
    x_all = torch.randn(R, C, device=DEV, generator=g).to(torch.bfloat16 if w8a8 else dtype)
    x = cut(x_all, at, M, K)

    def step():
        if not w8a8:
            return qbackend.linear(x, pw, None, bias)
        qx, sx = qbackend.quantize(x, dtype, act_gran)
        return qbackend.linear(qx, pw, sx, bias, out_dtype)

    what = dict(M=M, N=N, K=K, w8a8=w8a8, block=block, act=act_gran, out=out_dtype, bias=bias is not None,
                w_scale=tuple(w_scale.shape), provider=pw.provider, x_stride=tuple(x.stride()))
    graph, out = captured(step)
    for _ in range(2):
        x_all.copy_(torch.randn(R, C, device=DEV, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step()), what
        if w8a8:
            qx, sx = qbackend.quantize(x, dtype, act_gran)
            ref = reference(qbackend.scaled_mm, qx, qw.t(), sx, pw.scale, out_dtype=torch.float32,
                            bias=None if bias is None else bias.float())
        else:
            ref = reference(qbackend.scaled_mm, x, qw.t(), None, pw.scale, out_dtype=torch.float32,
                            bias=None if bias is None else bias.float())
        if block:
            tol = BLOCK_TOL[out_dtype]
        else:
            tol = (1e-2 if K <= 8192 else 2e-2) if w8a8 else (1e-2 if dtype == torch.bfloat16 else 2e-3)
        assert rel_err(out, ref) < tol, what


@needs_sm((8, 9), "fp8 tensor cores")
@pytest.mark.parametrize("i", CASES[:COMPILED_CASES], ids=lambda i: f"compile-{i}")
def test_random_compiled(monkeypatch, i):
    """quantize + scaled_mm (or linear) and an elementwise op after them, through
    torch.compile(fullgraph=True): the compiled function equals the eager one bit for bit, so the
    ops' fake implementations describe what the kernels return (shapes, strides, dtypes)."""
    r, g = case_random("compile", i)
    with_provider(monkeypatch, "cutlass")
    torch._dynamo.reset()  # a fresh cache per case: no recompile limit reached across cases
    M, N, K = draw_mnk(r, 512, 16)
    K = -(-K // 16) * 16  # quantize's output rows must be whole 16-byte units for scaled_mm
    lead = batch_split(r, M)
    (R, C), at = window(r, M, K, 2)
    x = cut(torch.randn(R, C, device=DEV, generator=g).to(torch.bfloat16), at, M, K).reshape(lead + (K,))
    act_gran = r.choice(["token", "tensor", "group"])  # group: block-scaled (1 x 128, 128 x 128)
    out_dtype = r.choice([torch.bfloat16, torch.float16])
    bias = torch.randn(N, device=DEV, generator=g).to(out_dtype) if r.random() < 0.5 else None
    prepared = r.random() < 0.5
    if act_gran == "group":
        qw, sw = qbackend.quantize(torch.randn(N, K, device=DEV, generator=g), F8, "block")
        scale_b, w_scale = sw.t(), sw
    else:
        qw, sw = quantized_weight(r, g, N, K, F8)
        scale_b = weight_scale(r, sw)
        w_scale = sw if scale_b.numel() > 1 else scale_b
    pw = qbackend.prepare_weight(qw, w_scale, F8, act_gran, out_dtype, bias=bias is not None) if prepared else None

    def f(x):
        qx, sx = qbackend.quantize(x, F8, act_gran)
        if prepared:
            y = qbackend.linear(qx, pw, sx, bias, out_dtype)
        else:
            y = qbackend.scaled_mm(qx, qw.t(), sx, scale_b, out_dtype=out_dtype, bias=bias)
        return torch.relu(y.float()) * 0.5, sx  # exact in both (no sum that could round otherwise)

    what = dict(M=M, N=N, K=K, lead=lead, x_stride=tuple(x.stride()), act=act_gran, out=out_dtype,
                bias=bias is not None, prepared=prepared, scale_b=tuple(scale_b.shape))
    (y, sx), (y_eager, sx_eager) = torch.compile(f, fullgraph=True, dynamic=False)(x), f(x)
    assert torch.equal(sx, sx_eager) and torch.equal(y, y_eager), what


TORCH_KINDS = ["fp8", "fp8-mixed", "e5m2", "int8", "w8a16", "block"]
TORCH_COMPILED = 12  # compiled cases are slow (a graph each): the first ones of the family only


def torch_operands(r, g, kind: str, M: int, N: int, K: int):
    """(a, scale_a, weight [N, K], weight scale as a checkpoint has it, activation dtype and
    granularity for prepare_weight) for one torch-provider case."""
    if kind == "w8a16":
        act = r.choice([torch.bfloat16, torch.float16])
        (R, C), at = window(r, M, K, 2)
        qw, sw = quantized_weight(r, g, N, K, F8)
        return cut(torch.randn(R, C, device=DEV, generator=g).to(act), at, M, K), None, qw, sw, act, "tensor"
    if kind == "block":
        x = torch.randn(M, K, device=DEV, generator=g)
        width = -(-K // 128) * 128  # quantize takes whole groups: a padded row, then a K-wide window
        qa, sa = qbackend.quantize(torch.nn.functional.pad(x, (0, width - K)), F8, "group")
        qw, sw = qbackend.quantize(torch.randn(N, K, device=DEV, generator=g), F8, "block")
        return qa[:, :K], sa, qw, sw, F8, "group"
    a_dtype, w_dtype = {"fp8": (F8, F8), "fp8-mixed": (F8, torch.float8_e5m2),
                        "e5m2": (torch.float8_e5m2, torch.float8_e5m2), "int8": (torch.int8, torch.int8)}[kind]
    (R, C), at = window(r, M, K, 1)
    act_gran = r.choice(["token", "tensor"])
    qx_all, sx_all = qbackend.quantize(torch.randn(R, C, device=DEV, generator=g), a_dtype, act_gran)
    qw, sw = quantized_weight(r, g, N, K, w_dtype)
    sx = sx_all[at[0]:at[0] + M] if act_gran == "token" else sx_all
    if r.random() < 0.3:
        sw = sw.max()  # a per-tensor weight scale
    return cut(qx_all, at, M, K), sx, qw, sw, a_dtype, act_gran


@pytest.mark.parametrize("i", CASES, ids=lambda i: f"torch-{i}")
def test_random_torch_provider(monkeypatch, i):
    """The torch provider forced, on every kind it serves: torch._scaled_mm (tensorwise, rowwise,
    blockwise, unit scales), torch._int_mm, and dequantize + one GEMM; eager, replayed from a CUDA
    graph, or through torch.compile(fullgraph=True); prepared weights or not."""
    r, g = case_random("torch", i)
    with_provider(monkeypatch, "torch")
    kind = r.choice(TORCH_KINDS)
    M, N, K = draw_mnk(r, 4096, 16)
    if kind == "block" and r.random() < 0.7:  # mostly whole 128 blocks, as checkpoints have them
        N, K = -(-N // 128) * 128, -(-K // 128) * 128
    if kind != "w8a16":
        K = -(-K // 16) * 16  # quantized rows of K bytes: scaled_mm takes them in 16-byte units
    a, sa, qw, sw, act, gran = torch_operands(r, g, kind, M, N, K)
    weight_only = kind == "w8a16"
    out_dtype = act if weight_only else r.choice([torch.bfloat16, torch.float16, torch.float32])
    bias = torch.randn(N, device=DEV, generator=g).to(out_dtype) if r.random() < 0.5 else None
    mode = "compile" if i < TORCH_COMPILED and r.random() < 0.5 else r.choice(["eager", "eager", "graph"])
    prepared = mode != "eager" or r.random() < 0.5
    pw = qbackend.prepare_weight(qw, sw, act, gran, out_dtype, bias=bias is not None) if prepared else None
    scale_b = pw.scale if prepared else weight_scale_to_b(sw, N, K)
    problem = validate_scaled_mm(a, qw.t(), sa, scale_b, out_dtype, bias)
    path = torch_paths.path(qbackend.device_info(torch.device(DEV)), problem)
    SERVED[("torch", served_by_path(problem, path))] += 1
    what = dict(kind=kind, path=path, M=M, N=N, K=K, out=out_dtype, bias=bias is not None, mode=mode,
                prepared=prepared, a_stride=tuple(a.stride()), w_stride=tuple(qw.stride()),
                scale_a=None if sa is None else tuple(sa.shape), scale_b=tuple(scale_b.shape))

    def call():
        if prepared:
            return qbackend.linear(a, pw, sa, bias, out_dtype)
        return qbackend.scaled_mm(a, qw.t(), sa, scale_b, out_dtype=out_dtype, bias=bias)

    if mode == "graph":
        graph, out = captured(call)
        out.fill_(float("nan"))  # every element must be written by the replay
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call()), what
    elif mode == "compile":
        torch._dynamo.reset()
        out = torch.compile(call, fullgraph=True, dynamic=False)()
        assert torch.equal(out, call()), what
    else:
        poison()
        try:
            out = call()
        except RuntimeError as e:
            raise AssertionError(f"{what}: {e}") from e
    ref = reference(qbackend.scaled_mm, a, qw.t(), sa, scale_b, out_dtype=torch.float32,
                    bias=None if bias is None else bias.float())
    assert out.shape == (M, N) and out.dtype == out_dtype, what
    # bf16 carries 8 significant bits, fp16 11: the dequantized path rounds each scaled operand to
    # its compute dtype (bf16 for W8A8, the activation dtype for W8A16), int_mm only the output. The
    # fp8 tensor cores behind torch._scaled_mm accumulate with less than fp32 precision even in
    # torch's precise mode (1.6e-4 to 2.5e-4 of max|out| at K = 512 with an fp32 output,
    # bench/results/torch_paths_h200.txt): those paths get the W8A8 tolerance of the cutlass cases.
    compute = torch_paths.compute_dtype(qbackend.device_info(torch.device(DEV)), problem)
    rounding = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}
    if path == torch_paths.DEQUANT:
        tol = max(rounding[out_dtype], rounding[compute])
    elif path == torch_paths.INT_MM:
        tol = rounding[out_dtype]
    else:
        tol = 1e-2 if K <= 8192 else 2e-2
    err = rel_err(out, ref)
    assert err < tol, {**what, "err": err, "tol": tol}


@pytest.mark.parametrize("i", CASES, ids=lambda i: f"torchq-{i}")
def test_random_torch_quantize(monkeypatch, i):
    """The torch provider's quantize (every granularity, dynamic and static, scale_ub) bit for bit
    equal to the reference's on the GPU."""
    r, g = case_random("torchq", i)
    with_provider(monkeypatch, "torch")
    granularity = r.choice(["tensor", "token", "channel", "group", "block"])
    x_dtype = r.choice([torch.bfloat16, torch.float16, torch.float32])
    dtype = r.choice([F8, torch.float8_e5m2, torch.int8])
    rows = log_uniform(r, 1, 4096)
    cols = 128 * log_uniform(r, 1, 64) + (r.randrange(1, 128) if granularity in ("block",) else 0)
    magnitude = 10.0 ** r.uniform(-3, 3)
    (R, C), at = window(r, rows, cols, torch.finfo(x_dtype).bits // 8)
    x = cut((torch.randn(R, C, device=DEV, generator=g) * magnitude).to(x_dtype), at, rows, cols)
    kw = dict(granularity=granularity)
    if granularity in ("tensor", "token") and r.random() < 0.3:
        kw["scale_ub"] = torch.tensor(magnitude, device=DEV)
    elif granularity == "tensor" and r.random() < 0.3:
        kw["scale"] = torch.tensor(magnitude / 100, device=DEV)
    SERVED[("torchq", qbackend.select(validate_quantize(x, dtype, granularity, kw.get("scale"), kw.get("scale_ub"),
                                                        128, (128, 128)), torch.device(DEV)).name)] += 1
    poison()
    q, s = qbackend.quantize(x, dtype, **kw)
    rq, rs = reference(qbackend.quantize, x, dtype, **kw)
    what = dict(shape=(rows, cols), stride=tuple(x.stride()), x=x_dtype, q=dtype, **kw)
    assert torch.equal(s, rs), what
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), what


def served_by_path(problem, path: str) -> str:
    """The provider selected for a torch-family case, named with the path it took."""
    name = qbackend.select(problem, torch.device(DEV)).name
    return f"{name}:{path}" if name == "torch" else name


def test_the_cases_reached_the_kernels(capsys):
    """Runs last: which provider served each family's cases (printed), and a check that the draws
    keep a third of them at least on the native kernels rather than on the reference fallback."""
    families = sorted({f for f, _ in SERVED})
    cases = {fam: sum(n for (f, _), n in SERVED.items() if f == fam) for fam in families}
    if not families or min(cases.values()) < len(CASES):
        pytest.skip("counts every case of the file: run it whole")
    with capsys.disabled():
        for fam in families:
            counts = {p: n for (f, p), n in sorted(SERVED.items()) if f == fam}
            print(f"\n{fam}: {len(CASES)} cases served by {counts}", end="")
        print()
    if len(CASES) >= 50:  # fewer are too few to judge a share by
        for fam in families:
            native = sum(n for (f, p), n in SERVED.items() if f == fam and p != "reference")
            assert native >= len(CASES) / 3, (fam, dict(SERVED))
