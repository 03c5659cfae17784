"""The sm_90a W8A16 kernels (CUTLASS mixed-input: e4m3 weights converted in registers, bf16/fp16
WGMMA) on this GPU: every config and split against bf16 torch.mm and the marlin provider, under
CUDA graphs with weight copies well over L2; plus an exactness check of each config against the
reference on odd shapes, strided activations, bias and both activation dtypes.

    python bench/probe_w8a16_sm90.py [--shapes 4096:4096,28672:4096] [--ms 1,16,256] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import qbackend
from qbackend import registry
from qbackend.benchmark import graph_time
from qbackend_providers import native

F8 = torch.float8_e4m3fn
DECOMPS = {"dp": 0, "streamk": 2, "heuristic": 3}
dev = "cuda"


def configs(dtype=torch.bfloat16):
    return native.config_names(dtype, native.VARIANT_SM90)


def variants(M=None):
    """(label, config id, decomposition, splits) of every forced choice worth timing at M (all at None).
    The small-M kernel ("stream") reads splits as its cluster size."""
    out = []
    for ci, name in enumerate(configs()):
        if "stream" in name:
            if M is None or M <= 64:
                out += [(f"{name}/c{c}", ci, -1, c) for c in (1, 2, 4)]
            continue
        tile_n = int(name.split("_")[1].split("x")[1])
        if M is not None and (tile_n > 4 * max(M, 16) or (tile_n < 64 and M > 256)):
            continue
        for dname in (("dp", "streamk") if name.endswith("coop") else ("dp",)):
            out.append((f"{name}/{dname}", ci, DECOMPS[dname], -1))
    return out


def run(a, w, s, bias, config=-1, decomp=-1, splits=-1):
    native.override(config, decomp, splits)
    try:
        out = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
        return native.scaled_mm(a, w.t(), None, s, bias, out, native.VARIANT_SM90)
    finally:
        native.override()


def reference(a, w, s, bias):
    y = a.double() @ (w.double() * s.double().reshape(-1, 1)).t()
    if bias is not None:
        y = y + bias.double()
    return y


def check(g) -> list:
    """Each config on odd shapes against float64; returns failures (empty when all pass)."""
    failures = []
    cases = [(1, 4096, 4096), (37, 200, 272), (130, 2112, 7168 + 64), (300, 136, 16), (16, 8, 32), (5, 520, 8192)]
    for dtype in (torch.bfloat16, torch.float16):
        for M, N, K in cases:
            w = (torch.randn(N, K, device=dev, generator=g) * 3).to(F8)
            s = torch.rand(N, device=dev, generator=g) * 0.02 + 1e-3
            big = torch.randn(M, K + 24, device=dev, generator=g).to(dtype)
            a = big[:, 8:8 + K]  # strided rows (lda = K + 24) at a 16-byte offset
            bias = torch.randn(N, device=dev, generator=g).to(dtype)
            ref = reference(a, w, s, bias)
            for label, ci, d, splits in variants() + [("auto", -1, -1, -1)]:
                out = torch.full((M, N), float("nan"), dtype=dtype, device=dev)
                native.override(ci, d, splits)
                try:
                    wsz = native.scaled_mm_workspace_size(M, N, K, dtype, dtype, 90)
                    work = torch.empty(max(wsz, 1), dtype=torch.uint8, device=dev)
                    native.scaled_mm(a, w.t(), None, s, bias, out, native.VARIANT_SM90, work)
                    torch.cuda.synchronize()
                except RuntimeError as e:
                    failures.append(f"{label} {dtype} M={M} N={N} K={K}: {e}")
                    continue
                finally:
                    native.override()
                err = ((out.double() - ref).norm() / ref.norm()).item()
                if not (err < 8e-3) or out.isnan().any():
                    failures.append(f"{label} {dtype} M={M} N={N} K={K}: rel err {err:.2e}")
    return failures


def bench(shapes, ms, g):
    rows = []
    for N, K in shapes:
        n = max(2, min(16, (512 * 2**20) // (N * K)))
        ws = [(torch.randn(N, K, device=dev, generator=g) / K**0.5).to(F8) for _ in range(n)]
        ss = [torch.rand(N, device=dev, generator=g) * 0.01 + 1e-3 for _ in range(n)]
        wb = [torch.randn(N, K, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(n)]
        os.environ["QBACKEND_PROVIDER"] = "marlin"
        registry.reload()
        marlin_w = [qbackend.prepare_weight(w, s.reshape(N, 1), torch.bfloat16, "tensor") for w, s in zip(ws, ss)]
        os.environ.pop("QBACKEND_PROVIDER")
        registry.reload()
        for M in ms:
            a = torch.randn(M, K, device=dev, generator=g, dtype=torch.bfloat16)
            t_bf16 = graph_time([lambda w=w: torch.mm(a, w.t()) for w in wb], 3.0)
            t_marlin = graph_time([lambda pw=pw: qbackend.linear(a, pw) for pw in marlin_w], 3.0)
            row = {"M": M, "N": N, "K": K, "bf16_us": t_bf16, "marlin_us": t_marlin, "configs": {}}
            for label, ci, d, splits in variants(M):
                native.override(ci, d, splits)
                try:
                    outs = [torch.empty(M, N, dtype=torch.bfloat16, device=dev) for _ in ws]
                    wsz = native.scaled_mm_workspace_size(M, N, K, torch.bfloat16, torch.bfloat16, 90)
                    work = torch.empty(max(wsz, 1), dtype=torch.uint8, device=dev)
                    fns = [lambda w=w, s=s, o=o: native.scaled_mm(a, w.t(), None, s, None, o, 90, work)
                           for w, s, o in zip(ws, ss, outs)]
                    t = graph_time(fns, 3.0)
                except RuntimeError as e:
                    print(f"  {label}: {e}")
                    continue
                finally:
                    native.override()
                row["configs"][label] = t
            t_auto = graph_time([lambda w=w, s=s: run(a, w, s, None) for w, s in zip(ws, ss)], 3.0)
            row["auto_us"] = t_auto
            best = min(row["configs"].items(), key=lambda kv: kv[1]) if row["configs"] else ("-", float("nan"))
            row["best"] = best[0]
            print(f"N={N:5d} K={K:5d} M={M:5d} bf16 {t_bf16:8.2f}  marlin {t_marlin:8.2f} (x{t_bf16 / t_marlin:5.2f})"
                  f"  auto {t_auto:8.2f} (x{t_bf16 / t_auto:5.2f})  best {best[1]:8.2f} (x{t_bf16 / best[1]:5.2f})"
                  f" {best[0]}", flush=True)
            rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="4096:4096,28672:4096,4096:14336")
    ap.add_argument("--ms", default="1,16,32,64,128,256,512,1024,4096")
    ap.add_argument("--out")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    g = torch.Generator(device=dev).manual_seed(0)
    print("configs:", ", ".join(configs()))
    if not args.no_check:
        failures = check(g)
        print(f"exactness: {len(failures)} failures", *failures[:20], sep="\n  ")
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    rows = bench(shapes, [int(m) for m in args.ms.split(",")], g)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
