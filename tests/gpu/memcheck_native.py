"""A short workload for `compute-sanitizer --tool memcheck` over libqbackend_cuda's kernels.

    compute-sanitizer --tool memcheck python tests/gpu/memcheck_native.py [scaled_mm] [block] [quantize] [marlin]

Runs every built scaled_mm family (partial tiles in M, N and K, sliced A, bias, split-K; the SM90
small-M kernel forced at two cluster splits, the wave-fit tiles and the swapped 96-token and paired
64-token tiles forced), every block-scaled FP8 config of each family this GPU runs (partial token
tiles, N blocks and K blocks; data-parallel and, on sm_90a, stream-K), every quantize mode
(vector and scalar paths, sliced rows) and both marlin families (every m16-tile count, partial
tiles, split-K with several contributors per column, column-aligned block runs, sliced A) once;
prints "memcheck workload done".
The sanitizer's own summary ("ERROR SUMMARY: 0 errors") is the verdict; the same
workload serves `--tool racecheck` and `--tool synccheck`. Arguments narrow it to some of its parts
(default: all). Not collected by pytest.
"""
import sys

import torch

from qbackend_providers import marlin_native as mn
from qbackend_providers import native

F8 = torch.float8_e4m3fn
dev = "cuda"
parts = sys.argv[1:] or ["scaled_mm", "block", "quantize", "marlin"]


def _scaled_mm_calls(dtype, v, shapes):
    for M, N, K in shapes:
        a_big = (torch.randn(M, K + 32, device=dev) * 2).to(dtype)
        a = a_big[:, 16:16 + K]
        w = (torch.randn(N, K, device=dev) * 2).to(dtype)
        out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        sa, sb = torch.rand(M, 1, device=dev) + 0.5, torch.rand(1, N, device=dev) + 0.5
        bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
        native.scaled_mm(a, w.t(), sa, sb, bias, out, variant=v)
        native.scaled_mm(a, w.t(), sa[0], sb[0, 0], None, out, variant=v)
        torch.cuda.synchronize()


def scaled_mm_part():
    for dtype, variants in ((F8, (90, 89)), (torch.int8, (80, 75))):
        for v in variants:
            if not native.has_variant("scaled_mm_fp8" if dtype == F8 else "scaled_mm_int8", v):
                continue
            _scaled_mm_calls(dtype, v, ((1, 4096, 4096), (17, 2064, 1040), (300, 1040, 272)))
    # The SM90 small-M kernel forced, with and without a cluster split, with one tile per CTA and with
    # several: every token tile, several of them, rows and K past the ends of the last tiles.
    if native.has_variant("scaled_mm_fp8", 90):
        names = native.config_names(F8, 90)
        try:
            for name in (n for n in names if n.startswith("stream")):
                for splits, whole in ((1, -1), (3, -1), (1, 2), (3, 2)):
                    native.override(names.index(name), 1, splits, whole)
                    _scaled_mm_calls(F8, 90, ((9, 2064, 1040), (40, 528, 16), (70, 1040, 4112), (200, 272, 1040)))
            # The wave-fit tiles (80, 96, 160, 192 and 224 channels wide), data-parallel and (the
            # cooperative ones) stream-K, with N not a multiple of any width.
            for name in ("128x96x128_coop", "128x192x128_coop", "128x224x128_coop", "128x160x128_ping_c2x1",
                         "64x80x128_ping"):
                for decomp in (0, 2):
                    native.override(names.index(name), decomp, -1, -1)
                    _scaled_mm_calls(F8, 90, ((70, 1040, 4112), (300, 2064, 1040)))
            # The swapped 96- and 192-token tiles and the 64-token tiles in clusters of two (swapped
            # 1x2, and 2x1 pairs 96, 160 and 224 channels wide): partial token tiles, a cluster whose
            # second CTA has no tokens (M <= 64), N and K past the tiles' ends, and M past one tile.
            for name in ("swap_64x96x128_ping", "swap_64x192x128_ping", "swap_64x64x128_ping_c1x2",
                         "64x96x128_ping_c2x1", "64x160x128_ping_c2x1", "64x224x128_ping_c2x1"):
                native.override(names.index(name), 0, -1, -1)
                _scaled_mm_calls(F8, 90, ((40, 1040, 4112), (70, 2064, 1040), (113, 4080, 272), (300, 272, 1040)))
        finally:
            native.override()


def block_part():
    cc = torch.cuda.get_device_capability()
    for v, runs in ((90, cc == (9, 0)), (89, cc >= (8, 9))):
        if not runs or not native.has_variant("scaled_mm_fp8_block", v):
            continue
        for config in range(len(native.block_config_names(v))):
            for decomp in ((0, 2) if v == 90 else (0,)):
                native.override(config, decomp, -1, -1)
                try:
                    for M, N, K in ((3, 520, 1040), (77, 2064, 272), (200, 136, 4112)):
                        a = (torch.randn(M, K + 32, device=dev) * 2).to(F8)[:, 16:16 + K]
                        w = (torch.randn(N, K, device=dev) * 2).to(F8)
                        sa = torch.rand(M, -(-K // 128), device=dev) + 0.5
                        sb = torch.rand(-(-K // 128), -(-N // 128), device=dev) + 0.5
                        out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
                        bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
                        native.scaled_mm(a, w.t(), sa, sb, bias, out, variant=v, block=True)
                        torch.cuda.synchronize()
                finally:
                    native.override()


def quantize_part():
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


def marlin_part():
    for v in (80, 75):
        if not mn.has_variant(v):
            continue
        for dtype in ((torch.float16, torch.bfloat16) if v == 80 else (torch.float16,)):
            # 1536x4096 and 25600x384: block runs rounded up to a column-aligned length (on 132 SMs:
            # 3 -> 4 tiles of a 32-tile column; 5 -> 6 tiles, two whole 3-tile columns, no split-K)
            for M, N, K in ((1, 1024, 4096), (17, 264, 1040), (40, 128, 136), (64, 520, 392), (100, 136, 2056),
                            (1, 1536, 4096), (3, 25600, 384)):
                codes = torch.randint(0, 256, (N, K), dtype=torch.uint8, device=dev)
                w = torch.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).view(F8)
                a = torch.randn(M, K + 16, device=dev).to(dtype)[:, 8:8 + K]
                out = torch.empty(M, N, device=dev, dtype=dtype)
                bias = torch.randn(N, device=dev).to(dtype)
                packed = mn.prepare(w, dtype)
                mn.mm(a, packed, torch.rand(N, device=dev) + 0.5, bias, out, N, K, variant=v)
                mn.mm(a, packed, torch.rand(1, device=dev) + 0.5, None, out, N, K, variant=v)
                # 7 blocks: runs that start in one column and end in another (two partial slots and
                # counters per block); scales one element into their buffer
                scale_view = (torch.rand(N + 1, device=dev) + 0.5)[1:]
                mn.mm(a, packed, scale_view, bias, out, N, K, variant=v, max_blocks=7)


for name, part in (("scaled_mm", scaled_mm_part), ("block", block_part), ("quantize", quantize_part),
                   ("marlin", marlin_part)):
    if name in parts:
        part()
torch.cuda.synchronize()
print("memcheck workload done")
