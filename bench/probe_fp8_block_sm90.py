"""The sm_90a block-scaled FP8 kernels on this GPU: every config and decomposition against bf16
torch.mm and torch's own blockwise path (torch.nn.functional.scaled_mm, cuBLASLt), under CUDA graphs
with weight copies well over L2. Activations already quantized (1 x 128 groups), weights with
128 x 128 block scales.

    python bench/probe_fp8_block_sm90.py [--shapes 4096:4096,28672:4096] [--ms 1,16,256,4096] [--out F.json]
"""
from __future__ import annotations

import argparse
import json

import torch

from qbackend.benchmark import graph_time
from qbackend_providers import native
from qbackend_providers.torch_fallback import blockwise_mm, blockwise_scale_b

F8 = torch.float8_e4m3fn
DECOMPS = {"dp": 0, "streamk": 2}
dev = "cuda"


def variants(M, N, sms):
    """(label, config id, decomposition, splits) worth timing at M: data-parallel and stream-K
    always, split-K in 2 and 4 where the output tiles fill less than half the GPU."""
    out = []
    for ci, name in enumerate(native.block_config_names(90)):
        swap = "swap" in name
        tile_tokens = int(name.split("_")[-1].split("x")[1]) if swap else 128
        if swap and (M > 128 or tile_tokens > 4 * max(M, 16)):
            continue
        out += [(f"{name}/{d}", ci, code, -1) for d, code in DECOMPS.items()]
        tiles = -(-N // 128) * -(-M // tile_tokens)
        if 2 * tiles < sms:
            out += [(f"{name}/splitk{s}", ci, 1, s) for s in (2, 4)]
    return out


def bench(shapes, ms, g):
    rows = []
    for N, K in shapes:
        kb, nb = -(-K // 128), -(-N // 128)
        n = max(2, min(16, (512 * 2**20) // (N * K)))
        ws = [(torch.randn(N, K, device=dev, generator=g) / 2).to(F8) for _ in range(n)]
        sbs = [torch.rand(kb, nb, device=dev, generator=g) * 0.01 + 1e-3 for _ in range(n)]
        torch_sbs = [blockwise_scale_b(s) for s in sbs]
        wb = [torch.randn(N, K, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(n)]
        for M in ms:
            a = (torch.randn(M, K, device=dev, generator=g) * 4).to(F8)
            sa = torch.rand(M, kb, device=dev, generator=g) * 0.01 + 1e-3
            ab = torch.randn(M, K, device=dev, generator=g, dtype=torch.bfloat16)
            t_bf16 = graph_time([lambda w=w: torch.mm(ab, w.t()) for w in wb], 3.0)
            row = {"M": M, "N": N, "K": K, "bf16_us": t_bf16, "configs": {}}
            try:
                row["torch_us"] = graph_time([lambda w=w, s=s: blockwise_mm(a, w.t(), sa, s, None, torch.bfloat16)
                                              for w, s in zip(ws, torch_sbs)], 3.0)
            except RuntimeError as e:
                row["torch_us"] = float("nan")
                print(f"  torch blockwise: {e}")
            outs = [torch.empty(M, N, dtype=torch.bfloat16, device=dev) for _ in ws]
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            for label, ci, d, splits in variants(M, N, sms) + [("auto", -1, -1, -1)]:
                native.override(ci, d, splits)
                try:
                    wsz = native.block_workspace_size(M, N, K, torch.bfloat16, 90)
                    work = torch.empty(max(wsz, 1), dtype=torch.uint8, device=dev)
                    fns = [lambda w=w, s=s, o=o: native.scaled_mm(a, w.t(), sa, s, None, o, 90, work, block=True)
                           for w, s, o in zip(ws, sbs, outs)]
                    row["configs"][label] = graph_time(fns, 3.0)
                except RuntimeError as e:
                    print(f"  {label}: {e}")
                finally:
                    native.override()
            auto = row["configs"].pop("auto", float("nan"))
            row["auto_us"] = auto
            best = min(row["configs"].items(), key=lambda kv: kv[1]) if row["configs"] else ("-", float("nan"))
            row["best"] = best[0]
            tflops = 2 * M * N * K / auto / 1e6
            print(f"N={N:5d} K={K:5d} M={M:5d} bf16 {t_bf16:8.2f}  torch {row['torch_us']:8.2f} "
                  f"(x{t_bf16 / row['torch_us']:5.2f})  auto {auto:8.2f} (x{t_bf16 / auto:5.2f}, {tflops:6.1f} TFLOP/s)"
                  f"  best {best[1]:8.2f} (x{t_bf16 / best[1]:5.2f}) {best[0]}", flush=True)
            rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="4096:4096,28672:4096,7168:2048")
    ap.add_argument("--ms", default="1,16,64,128,256,1024,4096")
    ap.add_argument("--out")
    args = ap.parse_args()
    g = torch.Generator(device=dev).manual_seed(0)
    print("configs:", ", ".join(native.block_config_names(90)))
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    rows = bench(shapes, [int(m) for m in args.ms.split(",")], g)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
