"""Inputs the random cases never draw, for the non-finite rule of docs/api.md ("Non-finite values"),
and the exact comparison every provider must pass on them. Shared by the CPU test and the GPU test.

Each corpus is a [ROWS, COLS] fp32 tensor whose rows are the awkward cases; COLS is two groups of
128 so that per-group and per-block granules hold different cases."""
from __future__ import annotations

import math

import torch

COLS = 256
FP8_NAN_BYTE = 0x7F  # the positive NaN of e4m3fn and e5m2: what every NaN quantizes to
QUANT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INF, NAN = math.inf, math.nan

# (granularity, static scale maker or None, extra keyword arguments)
DYNAMIC = [("tensor", {}), ("token", {}), ("channel", {}), ("group", {}),
           ("block", {"block_size": (128, 128)}), ("block", {"block_size": (4, 64)}),
           ("tensor", {"scale_ub": 3.0}), ("token", {"scale_ub": 3.0}), ("token", {"scale_ub": INF})]


def corpus_rows(gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """(name, one row of COLS fp32 values) for each case."""
    def randn():
        return torch.randn(COLS, generator=gen) * 3

    def with_at(values: dict) -> torch.Tensor:
        r = randn()
        for i, v in values.items():
            r[i] = v
        return r

    ramp = torch.arange(COLS, dtype=torch.float32)
    return [
        ("plain", randn()),
        ("nan", with_at({5: NAN})),
        ("nan in the second group", with_at({200: NAN})),
        ("inf", with_at({7: INF})),
        ("-inf", with_at({130: -INF})),
        ("inf and nan", with_at({1: INF, 2: NAN, 3: -INF})),
        ("negative nan", with_at({9: -NAN})),
        ("all nan", torch.full((COLS,), NAN)),
        ("all inf", torch.full((COLS,), INF)),
        ("all zero", torch.zeros(COLS)),
        ("negative zeros", torch.full((COLS,), -0.0)),
        ("fp32 subnormals", (ramp - 128) * 1e-42),
        ("fp16 subnormals", (ramp - 128) * 1e-8),
        ("bf16-range tiny", (ramp - 128) * 1e-38),
        ("at and past e4m3 max", torch.tensor([448.0, -448.0, 449.0, 464.0, 479.0, 480.0, 500.0, -1000.0]).repeat(32)),
        ("at and past e5m2 max",
         torch.tensor([57344.0, -57344.0, 57345.0, 61439.0, 61440.0, 65504.0, 1e6, -1e30]).repeat(32)),
        ("at and past int8 max", torch.tensor([127.0, -127.0, 127.5, 128.0, -128.0, -128.5, 129.0, -1e9]).repeat(32)),
        ("huge", (ramp - 128) * 1e36),
    ]


def corpus(gen: torch.Generator) -> torch.Tensor:
    return torch.stack([r for _, r in corpus_rows(gen)])


def static_scales(rows: int) -> list[tuple[str, torch.Tensor | float]]:
    """Valid static scales: per-tensor values and a per-token [rows, 1] tensor."""
    per_row = torch.tensor([2.0 ** (i % 7 - 3) for i in range(rows)]).reshape(rows, 1)
    return [("tensor 1", torch.tensor(1.0)), ("tensor 0.5", torch.tensor(0.5)),
            ("tensor tiny", torch.tensor(1e-30)), ("token", per_row)]


def same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-equal, NaN positions included (NaN payloads aside for float tensors: a NaN scale may be
    any NaN; quantized NaNs are bytes, compared exactly)."""
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
    got, want = got.cpu(), want.cpu()
    if got.dtype in (torch.float32, torch.bfloat16, torch.float16):
        nan_g, nan_w = torch.isnan(got), torch.isnan(want)
        assert torch.equal(nan_g, nan_w), f"{what}: NaN positions differ: {nan_g.nonzero()[:8].tolist()} " \
                                          f"vs {nan_w.nonzero()[:8].tolist()}"
        bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[got.dtype]
        g, w = got.masked_fill(nan_g, 0).view(bits), want.masked_fill(nan_w, 0).view(bits)
    else:
        g, w = got.view(torch.uint8), want.view(torch.uint8)
    diff = (g != w).nonzero()
    assert diff.numel() == 0, f"{what}: {diff.shape[0]} element(s) differ, first at {diff[0].tolist()}: " \
                              f"{got[tuple(diff[0])].item()} vs {want[tuple(diff[0])].item()}"


def check_rule(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, granularity: str) -> None:
    """The rule itself on per-token results: a row with a NaN has a NaN scale and every q NaN
    (0 in int8); a row with an inf and no NaN has an inf scale, its finite values +-0 and its
    infinities NaN (0 in int8)."""
    assert granularity in ("token", "channel")
    x, q, s = x.float().cpu(), q.cpu(), scale.cpu().reshape(-1)
    nan_byte = 0 if q.dtype == torch.int8 else FP8_NAN_BYTE
    qb = q.view(torch.uint8)
    for r in range(x.shape[0]):
        row = x[r]
        if torch.isnan(row).any():
            assert torch.isnan(s[r]), f"row {r}: NaN in the row, scale {s[r].item()}"
            assert (qb[r] == nan_byte).all(), f"row {r}: NaN in the row, q {qb[r][:8].tolist()}"
        elif torch.isinf(row).any():
            assert s[r].item() == INF, f"row {r}: inf in the row, scale {s[r].item()}"
            inf = torch.isinf(row)
            assert (qb[r][inf] == nan_byte).all()
            assert (q[r][~inf].float() == 0).all()
            if q.dtype != torch.int8:  # the sign of x survives in the zero
                assert torch.equal(torch.signbit(q[r][~inf].float()), torch.signbit(row[~inf]))
