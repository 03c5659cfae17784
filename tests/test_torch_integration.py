"""torch.library ops: opcheck, torch.compile(fullgraph=True), fake tensors."""
import pytest
import torch

import qbackend
from qbackend import ops


def _operands(gen, M=16, K=64, N=32):
    x = torch.randn(M, K, generator=gen)
    w = torch.randn(N, K, generator=gen)
    qw, sw = qbackend.quantize(w, torch.float8_e4m3fn, "channel")
    bias = torch.randn(N, generator=gen).to(torch.bfloat16)
    return x, qw, sw, bias


# opcheck's schema test compares inputs before and after the call with arithmetic that torch's
# CPU kernels do not implement for float8 tensors; float8 calls run every other opcheck test, and
# the schema test runs on the int8 calls (same op, same schema).
FP8_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")


def test_opcheck_scaled_mm(gen):
    x, qw, sw, bias = _operands(gen)
    qx, sx = qbackend.quantize(x, torch.float8_e4m3fn, "token")
    cases = [(qx, qw.t(), sx, sw.t(), torch.bfloat16, bias),
             (qx, qw.t(), torch.ones(()), torch.ones(()), None, None),
             (x.to(torch.bfloat16), qw.t(), None, sw.t(), None, None),
             (qx.reshape(2, 8, 64), qw.t(), sx.reshape(2, 8, 1), sw.t(), torch.float32, None)]
    for args in cases:
        torch.library.opcheck(ops.scaled_mm_op, args, test_utils=FP8_UTILS)
    ix, isx = qbackend.quantize(x, torch.int8, "token")
    iw, isw = qbackend.quantize(torch.randn(32, 64, generator=gen), torch.int8, "channel")
    torch.library.opcheck(ops.scaled_mm_op, (ix, iw.t(), isx, isw.t(), torch.bfloat16, bias))
    torch.library.opcheck(ops.scaled_mm_op, (ix.reshape(4, 4, 64), iw.t(), isx.reshape(4, 4, 1),
                                             isw.t(), torch.float16, None))


@pytest.mark.parametrize("gran", ["tensor", "token", "group", "block"])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_opcheck_quantize(gran, dtype, gen):
    x = torch.randn(8, 256, generator=gen)
    torch.library.opcheck(ops.quantize_op, (x, dtype, gran, None, 128, 128, 128))
    q, s = qbackend.quantize(x, dtype, gran)
    torch.library.opcheck(ops.quantize_static_op, (x, dtype, gran, s, 128, 128, 128))


def test_opcheck_quantize_scale_ub(gen):
    x = torch.randn(8, 64, generator=gen).to(torch.bfloat16)
    torch.library.opcheck(ops.quantize_op, (x, torch.float8_e4m3fn, "token", torch.tensor([0.5]), 128, 128, 128))


def test_compile_fullgraph_quantize_and_scaled_mm(gen):
    x, qw, sw, bias = _operands(gen)

    def linear(x, qw, sw, bias):
        qx, sx = qbackend.quantize(x, torch.float8_e4m3fn, "token")
        y = qbackend.scaled_mm(qx, qw.t(), sx, sw.t(), out_dtype=torch.bfloat16, bias=bias)
        qs, _ = qbackend.quantize(x, torch.float8_e4m3fn, scale=torch.tensor(0.1))
        return y.float().relu() + qs.float().sum()

    eager = linear(x, qw, sw, bias)
    compiled = torch.compile(linear, fullgraph=True, backend="inductor")
    out = compiled(x, qw, sw, bias)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    x2 = torch.randn(16, 64, generator=gen)
    torch.testing.assert_close(compiled(x2, qw, sw, bias), linear(x2, qw, sw, bias), rtol=0, atol=0)


def test_compile_surfaces_validation_errors(gen):
    x, qw, sw, bias = _operands(gen)

    @torch.compile(fullgraph=True, backend="eager")
    def bad(x, qw, sw):
        qx, sx = qbackend.quantize(x, torch.float8_e4m3fn, "token")
        return qbackend.scaled_mm(qx, qw.t().contiguous(), sx, sw.t())  # b row-major

    with pytest.raises(Exception, match="column-major"):
        bad(x, qw, sw)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(3, 5, 64, dtype=torch.float8_e4m3fn)
        b = torch.empty(48, 64, dtype=torch.float8_e4m3fn).t()
        out = ops.scaled_mm_op(a, b, torch.empty(3, 5, 1), torch.empty(48), torch.float16, None)
        assert out.shape == (3, 5, 48) and out.dtype == torch.float16
        q, s = ops.quantize_op(torch.empty(300, 256), torch.int8, "block", None, 128, 128, 128)
        assert q.shape == (300, 256) and s.shape == (3, 2)
