"""The cutlass provider's whole-token-tile rule, on CPU tensors: which M it pads, and that a view is
only ever extended over rows its own storage holds (the GPU side is tests/gpu/test_providers_gpu.py,
test_whole_token_tiles)."""
import torch

from qbackend_providers.cutlass import _extend_rows, whole_tile_tokens


def test_whole_tile_tokens_pads_33_to_40_and_65_to_104():
    assert [whole_tile_tokens(m) for m in (1, 16, 32, 41, 64, 128, 129, 1000)] == [1, 16, 32, 41, 64, 128, 129, 1000]
    assert {whole_tile_tokens(m) for m in range(33, 41)} == {64}
    assert {whole_tile_tokens(m) for m in range(65, 105)} == {128}
    assert whole_tile_tokens(105) == 105


def test_extend_rows_within_storage():
    buf = torch.arange(128 * 64, dtype=torch.int16).reshape(128, 64)
    ext = _extend_rows(buf[:72], 128)
    assert ext.shape == (128, 64) and ext.data_ptr() == buf.data_ptr() and torch.equal(ext, buf)
    # a row-strided slice of a wider buffer: extended with the same strides
    wide = torch.zeros(300, 100)
    view = wide[10:82, 8:72]
    ext = _extend_rows(view, 128)
    assert ext.stride() == view.stride() and ext.storage_offset() == view.storage_offset()
    ext[127, 63] = 1.0
    assert wide[137, 71] == 1.0
    # a per-token scale column
    scale = torch.empty(128, 1)[:72]
    assert _extend_rows(scale, 128).shape == (128, 1)


def test_extend_rows_refuses_rows_past_the_storage():
    assert _extend_rows(torch.empty(72, 64), 128) is None
    assert _extend_rows(torch.empty(127, 64)[:72], 128) is None
    # the last extended row would end one element past the storage
    assert _extend_rows(torch.empty(128 * 64 - 1)[:72 * 64].view(72, 64), 128) is None
    # an offset view whose extension would run past the end
    assert _extend_rows(torch.empty(150, 64)[30:102], 128) is None
    assert _extend_rows(torch.empty(72, 64), 72) is None and _extend_rows(torch.empty(72), 128) is None
