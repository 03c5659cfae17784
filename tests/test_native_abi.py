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
    for width in (16, 32, 64, 128):
        assert f"swap_64x{width}x128_ping" in names


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
