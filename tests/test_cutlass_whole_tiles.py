"""The cutlass provider's whole-token-tile path, on CPU tensors: how many rows a view's storage
holds, and that a view is only ever extended over those (which M are padded is the library's rule:
tests/test_native_abi.py; the GPU side is tests/gpu/test_providers_gpu.py, test_whole_token_tiles)."""
import torch

from qbackend_providers.cutlass import _extend_rows, _rows_held


def test_rows_held():
    assert _rows_held(torch.empty(128, 64)[:72]) == 128
    assert _rows_held(torch.empty(72, 64)) == 72
    assert _rows_held(torch.empty(300, 100)[10:82, 8:72]) == 290   # row 299 still holds columns 8 to 71
    assert _rows_held(torch.empty(300, 100)[10:82, 40:]) == 290
    assert _rows_held(torch.empty(128 * 64 - 1)[:72 * 64].view(72, 64)) == 127
    assert _rows_held(torch.empty(128, 1)[:72]) == 128              # a per-token scale column
    assert _rows_held(torch.empty(1, 64).expand(72, 64)) == 72      # broadcast rows: no room to claim
    assert _rows_held(torch.empty(0, 64)) == 0


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


def test_gemm_rows_asks_the_library_with_the_rows_both_storages_hold(monkeypatch):
    """The provider's glue, on CPU tensors: the rows A's and scale_a's storages hold go to
    native.token_rows, whose answer (the library's rule, when it is built) is the GEMM's row count."""
    from qbackend_providers import cutlass, native
    asked = []

    def token_rows(M, N=0, K=0, sm_count=0, rows_available=0, **kw):
        asked.append((M, N, K, sm_count, rows_available))
        return 128 if N == 0 else min(96, rows_available)

    monkeypatch.setattr(native, "token_rows", token_rows)
    provider = cutlass.CutlassProvider()
    monkeypatch.setattr(provider, "_sm90", lambda device: 132)
    a = torch.empty(128, 4096, dtype=torch.float8_e4m3fn)[:72]
    assert provider._gemm_rows(a, torch.empty(128, 1)[:72], 4096) == 96
    assert asked[-1] == (72, 4096, 4096, 132, 128)
    assert provider._gemm_rows(a, torch.empty(100, 1)[:72], 4096) == 96     # scale_a holds 100 rows
    assert asked[-1][-1] == 100
    assert provider._gemm_rows(a, torch.empty(72, 1), 4096) == 72           # no spare scale rows: not asked
    assert provider._gemm_rows(a, torch.empty(()), 4096) == 96              # a per-tensor scale has no rows
    assert provider._gemm_rows(a.view(torch.int8), torch.empty(128, 1)[:72], 4096) == 72   # int8: never
    monkeypatch.setattr(provider, "_sm90", lambda device: None)
    assert provider._gemm_rows(a, torch.empty(128, 1)[:72], 4096) == 72     # not an sm_90a device
