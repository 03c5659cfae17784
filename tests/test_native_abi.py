"""libqbackend_cuda's C ABI on a machine without a GPU: the library loads without creating a CUDA
context, describes itself, and answers malformed requests with a status and a message, never an
abort. (The kernels themselves are tested on a GPU in tests/gpu/.)"""
import pytest
import torch

from qbackend_providers import native

if native.load() is None:
    pytest.skip(f"native library not built: {native.load_error()}", allow_module_level=True)

F8 = torch.float8_e4m3fn
E4M3, BF16 = 3, 2   # qb_dtype codes


def test_build_info_lists_archs_and_families():
    info = native.build_info()
    assert info["archs"] and info["variants"]["quantize"] == [0]
    assert set(info["variants"]["scaled_mm_fp8"]) <= {89, 90}


def test_sm90_configs_are_listed_once_each():
    if not native.has_variant("scaled_mm_fp8", 90):
        pytest.skip("sm_90a family not built")
    names = native.config_names(F8, 90)
    assert len(names) == len(set(names))
    # one swapped ping-pong config per token-tile width the dispatcher uses for M <= 128
    for width in (16, 32, 64, 96, 128):
        assert f"swap_64x{width}x128_ping" in names


# (M, N, K) -> (config, decomposition, splits, swizzle) of the automatic choice on 132 SMs, as
# fp8_sm90_dispatch.cu and bench/results/performance_history.md describe it. None: not checked.
SM90_AUTO = [
    # the small-M kernel: config, 0, CTAs per cluster, tiles per CTA before the cluster's shared one
    ((1, 4096, 4096), ("stream_64", 0, 1, 0)),         # 64-row tiles, one per CTA
    ((1, 10240, 8192), ("stream_128", 0, 1, 0)),       # 160 tiles of 64 rows > 132 SMs: 128-row tiles
    ((16, 28672, 4096), ("stream_64", 0, 1, 3)),       # 448 and 224 tiles: 4 tiles of 64 rows per CTA
    ((16, 4096, 14336), ("stream_64", 0, 2, 0)),       # few tiles and long K: a cluster of 2 splits K
    ((1, 57344, 8192), ("swap_64x16x128_ping", 0, None, None)),  # over 4 tiles per SM: CUTLASS
    ((64, 10240, 8192), ("64x80x128_ping", 0, None, 1)),   # 128 tiles of 80: one wave; 160 of 64: two
    ((64, 8192, 8192), ("stream_64", 0, 1, 0)),        # 33 to 64 tokens on one wave of 64-row tiles
    ((48, 6144, 4096), ("stream_64", 0, 1, 0)),
    ((64, 4096, 4096), ("swap_64x64x128_ping", 0, None, None)),   # ... but not on N = 4096
    ((64, 57344, 8192), ("swap_64x64x128_ping", 0, None, None)),  # nor past one wave
    ((64, 8192, 28672), ("swap_64x64x128_ping", 0, None, None)),  # nor with K > 8192
    ((72, 4096, 14336), ("swap_64x96x128_ping", 0, None, None)),  # 64 < M <= 96: 96-token tiles
    ((72, 10240, 8192), ("swap_64x96x128_ping", 0, None, None)),  # no 96-wide wave fit on partial tiles
    ((72, 57344, 8192), ("128x224x128_coop", 0, None, 1)),        # but the 224-wide one
    ((97, 4096, 4096), ("swap_64x64x128_ping_c1x2", 0, None, None)),   # 64-token tiles in pairs: 128 CTAs
    ((128, 4096, 4096), ("swap_64x64x128_ping_c1x2", 0, None, None)),
    ((128, 6144, 4096), ("64x96x128_ping_c2x1", 0, None, 1)),     # swapped pairs would need 192 CTAs;
    ((128, 10240, 8192), ("64x160x128_ping_c2x1", 0, None, 1)),   # token pairs sharing 96 / 160 / 224
    ((112, 28672, 4096), ("64x224x128_ping_c2x1", 0, None, 1)),   # channels fill one wave (two at 28672)
    ((128, 57344, 8192), ("64x224x128_ping_c2x1", 0, None, 1)),   # equal fill with 128x224: the pairs
    ((90, 57344, 8192), ("128x224x128_coop", 0, None, 1)),        # no pairs up to M = 96
    ((128, 8192, 8192), ("swap_64x128x128_ping", 0, None, None)),  # 224 wide fills worse
    ((256, 6144, 4096), ("128x96x128_coop", 0, None, 1)),
    ((256, 10240, 8192), ("128x160x128_ping_c2x1", 0, None, 1)),  # 128 tiles of 160: one wave
    ((256, 57344, 8192), ("128x128x128_ping_c2x1", 0, None, 1)),   # 160 wide fills worse
    ((256, 4096, 4096), ("swap_64x128x128_ping", 0, None, 1)),    # two 128-token tiles, nearly whole
    ((200, 4096, 4096), ("swap_128x64x128_coop", 0, None, 1)),
    ((150, 6144, 4096), ("swap_64x192x128_ping", 0, None, None)),   # one 192-token tile: equal load
    ((192, 8192, 8192), ("swap_64x192x128_ping", 0, None, None)),   # with 128x96, the weight read once
    ((129, 57344, 8192), ("swap_64x192x128_ping", 0, None, None)),
    ((176, 28672, 4096), ("swap_64x192x128_ping", 0, None, None)),
    ((150, 10240, 8192), ("128x160x128_ping_c2x1", 0, None, 1)),    # one wave of 160 against two of 64
    ((176, 4096, 14336), ("swap_128x64x128_coop", 0, None, 1)),     # N <= 4096: as before
    ((193, 8192, 8192), ("128x128x128_ping_c2x1", 0, None, 1)),     # past one 192-token tile
    ((512, 10240, 8192), ("128x160x128_ping_c2x1", 0, None, 1)),  # two waves of 160 against three
    ((1024, 10240, 8192), ("128x160x128_ping_c2x1", 0, None, 1)),  # equal fill: the wider tile
    ((2048, 8192, 8192), ("128x128x128_ping_c2x1", 0, None, 1)),
    ((4096, 10240, 8192), ("128x128x128_ping_c2x1", 0, None, 8)),  # no wave fit above M = 2048
    ((512, 6144, 4096), ("128x192x128_coop", 0, None, 1)),        # 96 and 192 fill equally: the wider
    ((512, 8192, 8192), ("128x128x128_ping_c2x1", 0, None, None)),  # 256 tiles: two full waves already
    ((2048, 57344, 8192), ("128x160x128_ping_c2x1", 0, None, 1)),   # equal fill; swizzle 8 only from 4096
    ((8192, 8192, 8192), ("128x256x128_coop_c2x1", 2, None, 8)),   # stream-K: M >= 8192, K >= 8192
    ((4096, 8192, 8192), ("128x128x128_ping_c2x1", 0, None, 8)),    # M = 4096: ping-pong, swizzle 8
    ((16384, 28672, 4096), ("128x128x128_ping_c2x1", 0, None, 8)),  # K = 4096: ping-pong, swizzle 8
    ((8192, 6144, 4096), ("128x128x128_ping_c2x1", 0, None, 1)),    # N < 8192: swizzle 1
]


@pytest.mark.parametrize("mnk,want", SM90_AUTO, ids=[f"{m}x{n}x{k}" for (m, n, k), _ in SM90_AUTO])
def test_sm90_automatic_choice_follows_the_dispatch_rules(mnk, want):
    if not native.has_variant("scaled_mm_fp8", 90):
        pytest.skip("sm_90a family not built")
    got = native.auto_config(*mnk, sm_count=132)
    keys = ("config", "decomposition", "splits", "swizzle")
    assert {k: got[k] for k, w in zip(keys, want) if w is not None} == \
        {k: w for k, w in zip(keys, want) if w is not None}, got


def test_sm90_automatic_choice_is_a_listed_config_everywhere():
    """Over a sweep of shapes and SM counts, every answer names a listed config with a valid
    decomposition, and the wave-fit tiles appear only where the rule allows them."""
    if not native.has_variant("scaled_mm_fp8", 90):
        pytest.skip("sm_90a family not built")
    names = set(native.config_names(F8, 90))
    for sms in (78, 114, 132):
        for M in (1, 3, 16, 17, 33, 64, 65, 100, 128, 129, 150, 192, 193, 200, 256, 300, 512, 513, 1000, 4096,
                  5000):
            for N, K in ((16, 16), (2064, 1040), (4096, 14336), (6144, 4096), (8192, 28672), (10240, 8192),
                         (57344, 8192)):
                got = native.auto_config(M, N, K, sm_count=sms)
                assert got["config"] in names, (M, N, K, sms, got)
                assert got["decomposition"] in (0, 1, 2, 3), got
                if got["config"].startswith("stream"):  # swizzle: tiles per CTA before the shared one
                    assert 0 <= got["swizzle"] < 4 and 1 <= got["splits"] <= 2, (M, N, K, sms, got)
                    assert M <= 32 or (M <= 64 and N > 4096 and -(-N // 64) <= sms and K <= 8192), \
                        (M, N, K, sms, got)
                else:
                    assert got["swizzle"] in (1, 2, 4, 8), got
                if got["config"] in ("128x96x128_coop", "128x192x128_coop"):
                    assert 96 < M <= 512, (M, N, K, sms, got)
                if got["config"] == "swap_64x64x128_ping_c1x2":
                    assert 96 < M <= 128 and 2 * -(-N // 64) <= sms, (M, N, K, sms, got)
                if got["config"] == "64x80x128_ping":
                    assert 32 < M <= 64, (M, N, K, sms, got)
                if got["config"] == "128x224x128_coop":
                    assert 64 < M <= 128, (M, N, K, sms, got)
                if got["config"].startswith("64x") and got["config"].endswith("_c2x1"):  # two token tiles
                    assert 96 < M <= 128, (M, N, K, sms, got)
                if got["config"] == "128x160x128_ping_c2x1":  # its 2x1 clusters pair two token tiles
                    assert 128 < M <= 2048, (M, N, K, sms, got)
                if got["config"] == "swap_64x192x128_ping":  # one token tile covering all of M
                    assert 128 < M <= 192 and N > 4096, (M, N, K, sms, got)


# Whole token tiles: (M, N, K, rows the storage holds) -> rows to run, on 132 SMs.
TOKEN_ROWS = [
    ((72, 4096, 14336, 128), 96),    # 96-token tiles, 24 rows missing: the whole tile
    ((66, 8192, 8192, 128), 96),
    ((72, 4096, 14336, 95), 72),     # the storage stops short of the tile
    ((80, 4096, 14336, 128), 80),    # 16 rows missing: no cost measured, so not padded
    ((80, 10240, 8192, 128), 128),   # a wave-fit tile would take all 128 tokens
    ((80, 10240, 8192, 96), 80),     # ... but there is no room for them
    ((72, 57344, 8192, 128), 128),   # the 224-wide wave-fit tile runs 128 tokens anyway
    ((100, 4096, 4096, 128), 128),   # 128-token tiles, 28 missing
    ((105, 4096, 4096, 128), 105),   # 23 missing
    ((36, 4096, 4096, 64), 64),      # 64-token tiles
    ((41, 4096, 4096, 64), 41),
    ((16, 4096, 4096, 64), 16),      # the small-M kernel: no cost measured
    ((36, 6144, 4096, 64), 36),      # the small-M kernel reads rows past M as zeros
    ((200, 4096, 4096, 256), 256),   # four 64-token tiles missing 56 rows: 256, on two 128-token tiles
    ((150, 4096, 4096, 256), 192),   # three 64-token tiles, the last missing 42 rows
    ((200, 10240, 8192, 256), 256),  # two 128-token tiles
    ((150, 8192, 8192, 256), 192),   # one 192-token tile, 42 rows missing
    ((170, 8192, 8192, 256), 170),   # 22 missing
    ((150, 8192, 8192, 191), 150),   # the storage stops short of the tile
    ((200, 4096, 4096, 255), 200),
    ((240, 4096, 4096, 256), 240),   # 16 rows missing
    ((300, 4096, 4096, 512), 300),   # above 256: not measured, not padded
    ((72, 100, 4096, 128), 72),      # N not a multiple of 16: not an error here, just no padding
]


@pytest.mark.parametrize("case,want", TOKEN_ROWS, ids=[f"{m}x{n}x{k}in{r}" for (m, n, k, r), _ in TOKEN_ROWS])
def test_sm90_token_rows(case, want):
    if not native.has_variant("scaled_mm_fp8", 90):
        pytest.skip("sm_90a family not built")
    M, N, K, available = case
    assert native.token_rows(M, N, K, 132, available) == want


def test_sm90_token_rows_for_an_activation_buffer():
    """N = 0: the rows quantize gives FP8 activations, the most any GEMM of M tokens asks for."""
    if not native.has_variant("scaled_mm_fp8", 90):
        pytest.skip("sm_90a family not built")
    rows = {M: native.token_rows(M) for M in range(1, 400)}
    assert {M for M, r in rows.items() if r != M} == set(range(33, 41)) | set(range(65, 105)) | set(range(129, 233))
    assert {rows[M] for M in range(33, 41)} == {64} and {rows[M] for M in range(65, 105)} == {128}
    assert {rows[M] for M in range(129, 233)} == {256}
    for M in range(33, 257):  # never fewer rows than some N asks for
        for N, K in ((4096, 14336), (10240, 8192), (57344, 8192), (6144, 4096)):
            assert native.token_rows(M, N, K, 132, 1 << 20) <= rows[M], (M, N, K)


def test_token_rows_is_m_where_nothing_pads():
    assert native.token_rows(72, 4096, 4096, 132, 128, a_dtype=torch.int8, variant=80) == 72
    assert native.token_rows(72, 4096, 4096, 132, 128, a_dtype=torch.int8, variant=90) == 72
    assert native.token_rows(72, variant=89) == 72
    assert native.token_rows(0) == 0


def test_auto_config_rejects_bad_requests_with_a_message():
    if not native.has_variant("scaled_mm_fp8", 90):
        pytest.skip("sm_90a family not built")
    with pytest.raises(RuntimeError, match="multiple of 16"):
        native.auto_config(16, 100, 4096)
    with pytest.raises(RuntimeError, match="sm_count"):
        native.auto_config(16, 4096, 4096, sm_count=0)
    with pytest.raises(RuntimeError, match="M .* must be >= 1"):
        native.auto_config(0, 4096, 4096)
    if native.has_variant("scaled_mm_fp8", 89):
        with pytest.raises(RuntimeError, match="QB_ERR_UNSUPPORTED"):
            native.auto_config(16, 4096, 4096, variant=89)


def test_programmatic_launch_switch_is_callable_without_a_gpu():
    native.set_programmatic_launch(False)
    native.set_programmatic_launch(True)


def _scaled_mm_status(M, N, K, a_dtype=E4M3, out_dtype=BF16, kind_a=0):
    lib = native.load()
    buf = native._errbuf()
    st = lib.qb_scaled_mm_ws(None, K, None, K, None, N, M, N, K, a_dtype, a_dtype, out_dtype, None, kind_a, None, 0,
                             None, 0, None, 0, None, buf, native._ERR_LEN)
    return st, buf.value.decode()


@pytest.mark.parametrize("M,N,K,kind_a,needle", [
    (4, 32, 15, 0, "K (=15) must be a multiple of 16"),
    (4, 24, 32, 0, "N (=24) must be a multiple of 16"),
    (4, 32, 32, 7, "scale_a_kind 7"),
    (-1, 32, 32, 0, "M"),
])
def test_malformed_scaled_mm_is_an_error_code(M, N, K, kind_a, needle):
    st, msg = _scaled_mm_status(M, N, K, kind_a=kind_a)
    assert st == 1, (st, msg)             # QB_ERR_INVALID_ARGUMENT
    assert needle in msg, msg


def test_malformed_quantize_is_an_error_code():
    lib = native.load()
    buf = native._errbuf()
    st = lib.qb_quantize(None, 16, None, 16, None, 4, 16, BF16, E4M3, 7, None, None, None, buf, native._ERR_LEN)
    assert st == 1 and "mode 7" in buf.value.decode(), buf.value


def _grouped_status(M=4, N=32, K=32, groups=2, a_dtype=E4M3, out_dtype=BF16, kind_a=0, kind_b=0, lda=None):
    lib = native.load()
    if not hasattr(lib, "qb_grouped_scaled_mm"):
        pytest.skip(f"{native.library_path()} predates qb_grouped_scaled_mm")
    buf = native._errbuf()
    st = lib.qb_grouped_scaled_mm(None, K if lda is None else lda, None, K, N * K, None, N, None, M, N, K, groups,
                                  a_dtype, a_dtype, out_dtype, None, kind_a, None, kind_b, None, 0, None, buf,
                                  native._ERR_LEN)
    return st, buf.value.decode()


@pytest.mark.parametrize("change,needle", [
    (dict(K=24), "K (=24) must be a multiple of 16"),
    (dict(N=20), "N (=20) of 8"),
    (dict(groups=0), "groups (=0) must be 1 to 1024"),
    (dict(groups=1025), "groups (=1025) must be 1 to 1024"),
    (dict(kind_a=2, kind_b=1), "both block (2)"),
    (dict(kind_a=5), "scale kinds"),
    (dict(M=-1), "0 <= M"),
    (dict(a_dtype=BF16), "must be e4m3"),
    (dict(), "must be non-NULL"),           # sizes fine, pointers missing
    (dict(lda=8), "must be non-NULL"),      # pointers are checked before strides
])
def test_malformed_grouped_scaled_mm_is_an_error_code(change, needle):
    st, msg = _grouped_status(**change)
    assert st == 1, (st, msg)             # QB_ERR_INVALID_ARGUMENT
    assert needle in msg, msg


def test_grouped_scaled_mm_with_no_rows_is_a_no_op():
    assert _grouped_status(M=0) == (0, "")


def test_grouped_configs_are_named():
    if not native.has_variant("grouped_scaled_mm_fp8", 89):
        pytest.skip("sm_89 family not built")
    assert native.grouped_config_names(89) == ["sm89_grouped_32x64x128_s4", "sm89_grouped_128x128x128_s3"]


def test_sm90_grouped_configs_are_named():
    if not native.has_variant("grouped_scaled_mm_fp8", 90):
        pytest.skip("sm_90a grouped family not built")
    assert native.grouped_config_names(90) == ["sm90_grouped_block_swap_128x32x128", "sm90_grouped_block_128x128x128",
                                              "sm90_grouped_swap_128x32x128", "sm90_grouped_128x128x128",
                                              "sm90_grouped_128x256x128_c2x1"]


def test_grouped_workspace_is_checked_before_the_device():
    """A misaligned workspace is refused by name; a query without a GPU wants none."""
    lib = native.load()
    if not hasattr(lib, "qb_grouped_scaled_mm_ws"):
        pytest.skip(f"{native.library_path()} predates qb_grouped_scaled_mm_ws")
    buf = native._errbuf()
    fake = 1 << 20  # aligned addresses the host never dereferences
    st = lib.qb_grouped_scaled_mm_ws(fake, 256, fake, 256, 256 * 128, fake, 128, fake, 8, 128, 256, 2, E4M3, E4M3,
                                     BF16, fake, 2, fake, 2, None, 0, fake + 4, 4096, None, buf, native._ERR_LEN)
    assert st == 1 and "256-byte aligned" in buf.value.decode(), buf.value
    if not torch.cuda.is_available():
        assert native.grouped_workspace_size(8, 128, 256, 2, torch.bfloat16, block=True) == 0


def _gather_status(x_rows=4, index=None, rows=3, cols=256, group=0, ld_scale=0, q_dtype=E4M3):
    lib = native.load()
    if not hasattr(lib, "qb_quantize_gather"):
        pytest.skip(f"{native.library_path()} predates qb_quantize_gather")
    buf = native._errbuf()
    st = lib.qb_quantize_gather(None, cols, x_rows, index, None, cols, None, ld_scale, rows, cols, group, BF16,
                                q_dtype, None, buf, native._ERR_LEN)
    return st, buf.value.decode()


@pytest.mark.parametrize("change,needle", [
    (dict(group=-1), "group (=-1) must be 0 (per token) or in [1, 2^30]"),
    (dict(group=128, ld_scale=1), "ld_scale (=1) must be >= ceil(cols / group) (=2)"),
    (dict(), "index must be a non-NULL, 8-byte aligned int64 array"),
    (dict(index=12), "index must be a non-NULL, 8-byte aligned int64 array"),
    (dict(index=16, x_rows=0), "x_rows (=0) must be >= 1 when rows > 0"),
    (dict(index=16), "x, q and scale must be non-NULL"),
    (dict(index=16, q_dtype=9), "q_dtype 9"),
])
def test_malformed_quantize_gather_is_an_error_code(change, needle):
    st, msg = _gather_status(**change)
    assert st == 1, (st, msg)             # QB_ERR_INVALID_ARGUMENT
    assert needle in msg, msg


def test_quantize_gather_with_no_rows_is_a_no_op():
    assert _gather_status(rows=0) == (0, "")


def _silu_status(rows=3, cols=256, ldx=512, group=0, ld_scale=0, x_dtype=BF16, q_dtype=E4M3, x=None):
    lib = native.load()
    if not hasattr(lib, "qb_quantize_silu_mul"):
        pytest.skip(f"{native.library_path()} predates qb_quantize_silu_mul")
    buf = native._errbuf()
    st = lib.qb_quantize_silu_mul(x, ldx, None, cols, None, ld_scale, rows, cols, group, x_dtype, q_dtype, None, buf,
                                  native._ERR_LEN)
    return st, buf.value.decode()


@pytest.mark.parametrize("change,needle", [
    (dict(x_dtype=0), "x_dtype 0 must be f16 (1) or bf16 (2)"),
    (dict(group=-1), "group (=-1) must be 0 (per token) or in [1, 2^30]"),
    (dict(ldx=511), "ldx (=511) must be >= 2 * cols (=512): a row of x is [gate | up]"),
    (dict(group=128, ld_scale=1), "ld_scale (=1) must be >= ceil(cols / group) (=2)"),
    (dict(), "x, q and scale must be non-NULL"),
    (dict(q_dtype=9), "q_dtype 9"),
    (dict(cols=0), "cols (=0) > 0"),
])
def test_malformed_quantize_silu_mul_is_an_error_code(change, needle):
    st, msg = _silu_status(**change)
    assert st == 1, (st, msg)             # QB_ERR_INVALID_ARGUMENT
    assert needle in msg, msg


def test_quantize_silu_mul_with_no_rows_is_a_no_op():
    assert _silu_status(rows=0) == (0, "")
