"""Shared test helpers: random quantized operands, a float64 oracle independent of qbackend, the
error measure outputs are compared with, and strided windows to draw operands in."""
from __future__ import annotations

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0,
           torch.float8_e4m3fnuz: 240.0, torch.float8_e5m2fnuz: 57344.0}


def rand_q(shape, dtype, gen, device="cpu"):
    """Random values spread over the format's range (not all near zero)."""
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8).to(device)
    x = torch.randn(shape, generator=gen) * (FP8_MAX[dtype] / 8)
    return x.clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype).to(device)


def rand_scale(shape, gen, device="cpu"):
    return (torch.rand(shape, generator=gen) * 0.01 + 0.001).to(device)


def block_expand(s: torch.Tensor, rows: int, cols: int, g: int = 128) -> torch.Tensor:
    """Independent re-implementation of scale broadcasting: count 1 covers the whole dimension,
    count == dim one per element, otherwise groups of g."""
    s = s.double()
    if s.numel() == 1:
        return s.reshape(1, 1).expand(rows, cols)
    if s.dim() == 1:
        s = s.reshape(1, -1)
    r, c = s.shape

    def size(n, k):
        return n if k == 1 else (1 if k == n else g)

    i = torch.arange(rows) // size(rows, r)
    j = torch.arange(cols) // size(cols, c)
    return s[i][:, j]


def oracle_scaled_mm(a, b, scale_a, scale_b, bias=None, g=128):
    """float64: sum_k sa[m,k] * sb[k,n] * a[m,k] * b[k,n] + bias, on the CPU."""
    a64, b64 = a.cpu().double(), b.cpu().double()
    M, K = a64.shape
    N = b64.shape[1]
    if scale_a is None:
        out = a64 @ (b64 * block_expand(scale_b.cpu(), K, N, g))
    else:
        sa = scale_a.cpu()
        sa = sa.reshape(M, -1) if sa.numel() > 1 else sa
        out = (a64 * block_expand(sa, M, K, g)) @ (b64 * block_expand(scale_b.cpu(), K, N, g))
    if bias is not None:
        out = out + bias.cpu().double()
    return out


def assert_close(out, ref, rtol, what=""):
    """Relative error against the reference's magnitude, plus no NaN."""
    out = out.cpu().double()
    ref = ref.cpu().double()
    assert not torch.isnan(out).any(), f"NaN in output {what}"
    assert out.shape == ref.shape, (out.shape, ref.shape)
    denom = ref.abs().max().clamp_min(1e-30)
    err = ((out - ref).abs().max() / denom).item()
    assert err <= rtol, f"{what}: max error {err:.2e} of max |ref| exceeds {rtol:.1e}"


def rel_err(out, ref) -> float:
    """max |out - ref| / max |ref| in float64, asserting out holds no NaN."""
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN in output"
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def window(r, rows: int, cols: int, elem_bytes: int):
    """(shape of a larger tensor, (row, column) offset) of a [rows, cols] window in it whose row
    stride and column offset are whole 16-byte units: either the whole tensor, where that is a
    legal layout, or a window with spare rows and columns around it. r: a random.Random."""
    unit = 16 // elem_bytes
    if r.random() < 0.4 and (cols % unit == 0 or rows == 1):
        return (rows, cols), (0, 0)
    c0 = unit * r.randint(0, 2)
    spare_rows = r.randint(0, 3)
    width = -(-(c0 + cols + r.randint(0, unit)) // unit) * unit
    return (rows + spare_rows, width), (r.randint(0, spare_rows), c0)

