"""A corpus of bad inputs: each must raise TypeError/ValueError naming the argument and the rule."""
import pytest
import torch

import qbackend

F8, F5, FZ, I8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.int8
M, K, N = 8, 64, 32


def A(dtype=F8, m=M, k=K):
    return torch.zeros(m, k, dtype=dtype)


def B(dtype=F8, k=K, n=N):
    return torch.zeros(n, k, dtype=dtype).t()


ONE = torch.ones(())
ROW = torch.ones(M, 1)
COL = torch.ones(1, N)


def mm(**kw):
    args = dict(a=A(), b=B(), scale_a=ONE, scale_b=ONE)
    args.update(kw)
    return lambda: qbackend.scaled_mm(**args)


def misaligned(dtype, rows, cols):
    buf = torch.zeros(rows * cols + 16, dtype=dtype)
    return buf[1:1 + rows * cols].view(rows, cols)


SCALED_MM_CASES = {
    "a_not_tensor": (mm(a=[[1.0]]), TypeError, ["a:", "torch.Tensor", "list"]),
    "b_not_tensor": (mm(b=3), TypeError, ["b:", "torch.Tensor", "int"]),
    "scale_a_python_float": (mm(scale_a=0.5), TypeError, ["scale_a:", "torch.Tensor", "float"]),
    "bias_numpy_like": (mm(bias=[0.0] * N), TypeError, ["bias:", "torch.Tensor"]),
    "a_rank1": (mm(a=torch.zeros(K, dtype=F8)), ValueError, ["a:", "rank >= 2", "rank 1"]),
    "b_rank3": (mm(b=torch.zeros(1, K, N, dtype=F8)), ValueError, ["b:", "rank 2", "rank 3"]),
    "a_float64": (mm(a=A(torch.float64)), TypeError, ["a:", "dtype", "float64"]),
    "a_int32": (mm(a=A(torch.int32)), TypeError, ["a:", "dtype", "int32"]),
    "b_bf16": (mm(b=B(torch.bfloat16)), TypeError, ["b:", "dtype", "bfloat16"]),
    "fp8_with_int8": (mm(b=B(I8)), TypeError, ["a, b", "int8 pairs only with int8"]),
    "int8_with_fp8": (mm(a=A(I8)), TypeError, ["a, b", "int8"]),
    "ocp_with_fnuz": (mm(b=B(FZ)), TypeError, ["a, b", "cannot mix", "fnuz"]),
    "w8a16_int8_weight": (mm(a=A(torch.bfloat16), b=B(I8), scale_a=None), TypeError,
                          ["b:", "weight-only", "float8"]),
    "w8a16_fp32_activation": (mm(a=A(torch.float32), scale_a=None), TypeError, ["a:", "dtype", "float32"]),
    "k_mismatch": (mm(b=B(k=K + 16)), ValueError, ["b:", "K rows", f"({K})"]),
    "b_row_major": (mm(b=torch.zeros(K, N, dtype=F8)), ValueError, ["b:", "column-major", "strides"]),
    "a_column_major": (mm(a=torch.zeros(K, M, dtype=F8).t()), ValueError, ["a:", "row-major"]),
    "a_row_stride_unaligned": (mm(a=torch.zeros(M, K + 8, dtype=F8)[:, :K]), ValueError,
                               ["a:", "row stride", "16 bytes"]),
    "b_col_stride_unaligned": (mm(b=torch.zeros(N, K + 4, dtype=F8)[:, :K].t()), ValueError,
                               ["b:", "column stride", "16 bytes"]),
    "a_pointer_unaligned": (mm(a=misaligned(F8, M, K)), ValueError, ["a:", "16-byte aligned"]),
    "b_pointer_unaligned": (mm(b=misaligned(F8, N, K).t()), ValueError, ["b:", "16-byte aligned"]),
    "a_rows_overlap": (mm(a=torch.zeros(K, dtype=F8).expand(M, K)), ValueError, ["a:", "stride"]),
    "k_zero": (mm(a=A(k=0), b=B(k=0)), ValueError, ["K and N must be positive"]),
    "int8_k_overflow": (mm(a=A(I8, m=1, k=131088), b=B(I8, k=131088, n=1)), ValueError,
                        ["a:", "overflow int32", "K=131088"]),
    "scale_a_missing": (mm(scale_a=None), ValueError, ["scale_a:", "required for W8A8"]),
    "scale_a_given_w8a16": (mm(a=A(torch.bfloat16)), ValueError, ["scale_a:", "must be None"]),
    "scale_b_missing": (mm(scale_b=None), ValueError, ["scale_b:", "required"]),
    "scale_a_fp16": (mm(scale_a=ROW.half()), TypeError, ["scale_a:", "float32", "float16"]),
    "scale_b_fp64": (mm(scale_b=COL.double()), TypeError, ["scale_b:", "float32", "float64"]),
    "scale_a_wrong_rows": (mm(scale_a=torch.ones(M + 1, 1)), ValueError, ["scale_a:", "per-token", f"[{M + 1}, 1]"]),
    "scale_a_bad_groups": (mm(scale_a=torch.ones(M, 3)), ValueError, ["scale_a:", "per-group", "[8, 3]"]),
    "scale_a_3d_mismatch": (mm(scale_a=torch.ones(2, 4, 2, 1)), ValueError, ["scale_a:", "shape"]),
    "scale_b_wrong_len": (mm(scale_b=torch.ones(N + 1)), ValueError, ["scale_b:", "per-channel", f"[{N + 1}]"]),
    "scale_b_column_vector": (mm(scale_b=torch.ones(N, 1)), ValueError, ["scale_b:", "weight_scale.t()"]),
    "scale_b_3d": (mm(scale_b=torch.ones(1, 1, N)), ValueError, ["scale_b:", "shape"]),
    "scale_b_bad_blocks": (mm(scale_b=torch.ones(3, 5)), ValueError, ["scale_b:", "blocks"]),
    "group_size_zero": (mm(group_size=0), ValueError, ["group_size:", "positive int", "0"]),
    "scale_a_groups_vs_group_size": (mm(scale_a=torch.ones(M, 2), group_size=16), ValueError,
                                     ["scale_a:", "group_size=16", "[8, 4]"]),
    "bias_wrong_dtype": (mm(bias=torch.zeros(N, dtype=torch.float16)), TypeError,
                         ["bias:", "out_dtype", "bfloat16", "float16"]),
    "bias_wrong_shape": (mm(bias=torch.zeros(N + 1, dtype=torch.bfloat16)), ValueError, ["bias:", f"[{N}]"]),
    "bias_2d": (mm(bias=torch.zeros(1, N, dtype=torch.bfloat16)), ValueError, ["bias:", "shape"]),
    "bias_strided": (mm(bias=torch.zeros(2 * N, dtype=torch.bfloat16)[::2]), ValueError, ["bias:", "contiguous"]),
    "out_dtype_int8": (mm(out_dtype=torch.int8), ValueError, ["out_dtype:", "bfloat16", "int8"]),
    "out_dtype_string": (mm(out_dtype="bf16"), TypeError, ["out_dtype:", "torch.dtype", "str"]),
    "scale_on_meta_device": (mm(scale_b=torch.ones((), device="meta")), ValueError,
                             ["scale_b:", "same device", "meta"]),
    "b_on_meta_device": (mm(b=torch.zeros(N, K, dtype=F8, device="meta").t()), ValueError, ["b:", "same device"]),
    "bias_on_meta_device": (mm(bias=torch.zeros(N, dtype=torch.bfloat16, device="meta")), ValueError,
                            ["bias:", "same device"]),
}


def q(**kw):
    args = dict(x=torch.randn(4, 64), dtype=F8)
    args.update(kw)
    return lambda: qbackend.quantize(**args)


QUANTIZE_CASES = {
    "x_not_tensor": (q(x=[1.0]), TypeError, ["x:", "torch.Tensor"]),
    "x_int": (q(x=torch.zeros(4, 64, dtype=torch.int32)), TypeError, ["x:", "dtype", "int32"]),
    "x_scalar": (q(x=torch.tensor(1.0)), ValueError, ["x:", "rank >= 1"]),
    "dtype_string": (q(dtype="fp8"), TypeError, ["dtype:", "torch.dtype", "str"]),
    "dtype_fp16": (q(dtype=torch.float16), ValueError, ["dtype:", "float8_e4m3fn", "float16"]),
    "granularity_unknown": (q(granularity="row"), ValueError, ["granularity:", "tensor, token", "'row'"]),
    "group_size_zero": (q(granularity="group", group_size=0), ValueError, ["group_size:", "positive"]),
    "block_on_3d": (q(x=torch.randn(2, 4, 64), granularity="block"), ValueError, ["x:", "2-D"]),
    "block_size_bad": (q(granularity="block", block_size=(128,)), ValueError, ["block_size:", "two positive"]),
    "channel_on_1d": (q(x=torch.randn(64), granularity="channel"), ValueError, ["x:", "2-D", "rank 1"]),
    "static_scale_fp16": (q(scale=torch.ones((), dtype=torch.float16)), TypeError, ["scale:", "float32"]),
    "static_scale_shape": (q(granularity="token", scale=torch.ones(5, 1)), ValueError, ["scale:", "[4, 1]", "[5, 1]"]),
    "static_scale_meta": (q(scale=torch.ones((), device="meta")), ValueError, ["scale:", "same device"]),
    "scale_ub_with_static": (q(scale=ONE, scale_ub=ONE), ValueError, ["scale_ub:", "dynamic"]),
    "scale_ub_group": (q(granularity="group", group_size=32, scale_ub=ONE), ValueError,
                       ["scale_ub:", "per-tensor and per-token"]),
    "scale_ub_two_values": (q(granularity="token", scale_ub=torch.ones(2)), ValueError, ["scale_ub:", "one value"]),
    "scale_ub_int": (q(granularity="token", scale_ub=torch.ones(1, dtype=torch.int32)), TypeError,
                     ["scale_ub:", "float32"]),
}

ALL = {f"scaled_mm:{k}": v for k, v in SCALED_MM_CASES.items()}
ALL.update({f"quantize:{k}": v for k, v in QUANTIZE_CASES.items()})


def test_corpus_is_large_and_distinct():
    assert len(ALL) >= 40
    fragments = [tuple(v[2]) for v in ALL.values()]
    assert len(set(fragments)) == len(fragments), "each bad input should be told apart by its message"


@pytest.mark.parametrize("name", sorted(ALL))
def test_bad_input_message(name):
    call, exc, fragments = ALL[name]
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert msg.startswith("qbackend."), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} missing from: {msg}"


def test_dequantize_rejects_mismatched_scale():
    qt = torch.zeros(4, 64, dtype=F8)
    with pytest.raises(ValueError, match="scale: shape"):
        qbackend.dequantize(qt, torch.ones(3, 7))
    with pytest.raises(TypeError, match="q: dtype"):
        qbackend.dequantize(torch.zeros(4, 4), torch.ones(()))
