"""Device and stream placement of every native call (issue: several GPUs in one process).

One GPU: each call runs on the caller's current stream. The test queues a long sleep and then the
write of new inputs on a side stream, and makes the call on that stream: a call launched on any
other stream runs before the write and reads the old inputs, so its output differs from the same
call made on the new inputs alone.

Two or more GPUs: tensors on cuda:1 while cuda:0 is current give the same bits as on cuda:0, for
scaled_mm, quantize, linear, grouped_scaled_mm, gather_quantize and marlin, and a graph captured on
cuda:1 replays there. With one GPU these skip, naming why.
"""
import pytest
import torch
from test_threads_cpu import same

import qbackend
from qbackend import registry

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

E4M3 = torch.float8_e4m3fn
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason=f"needs two GPUs; this machine has {torch.cuda.device_count()}")


class Calls:
    """Calls that read one bf16 activation buffer `x` [64, 512] (weights fixed), each returning a tuple."""

    def __init__(self, device):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(64, 512, generator=g).to(torch.bfloat16).to(device)
        w = torch.randn(384, 512, generator=g).to(device)
        self.w8, self.ws = qbackend.quantize(w, E4M3, "channel")
        self.wi, self.wis = qbackend.quantize(w, torch.int8, "channel")
        self.wb, self.wbs = qbackend.quantize(w, E4M3, "block")
        self.p8 = qbackend.prepare_weight(self.w8, self.ws, activation=E4M3)
        self.p16 = qbackend.prepare_weight(self.w8, self.ws, activation=torch.bfloat16)
        experts = torch.randn(4, 384, 512, generator=g).to(device)
        self.ew, self.ews = zip(*(qbackend.quantize(e, E4M3, "block") for e in experts))
        self.ew, self.ews = torch.stack(self.ew), torch.stack(self.ews)
        self.offsets = torch.tensor([10, 10, 40, 64], dtype=torch.int32, device=device)
        self.index = torch.randint(0, 64, (48,), generator=g).to(device)

    NAMES = ["quantize token", "quantize group", "gather_quantize", "fp8 scaled_mm", "int8 scaled_mm",
             "block scaled_mm", "W8A16 linear", "fp8 linear", "grouped block"]

    def all(self):
        x = self.x
        fns = [lambda: qbackend.quantize(x, E4M3, "token"),
               lambda: qbackend.quantize(x, E4M3, "group"),
               lambda: qbackend.gather_quantize(x, self.index, E4M3, "group"),
               self._fp8, self._int8, self._block,
               lambda: (qbackend.linear(x, self.p16),),
               self._linear, self._grouped]
        return list(zip(self.NAMES, fns))

    def _fp8(self):
        q, s = qbackend.quantize(self.x, E4M3, "token")
        return (qbackend.scaled_mm(q, self.w8.t(), s, self.ws.t()),)

    def _int8(self):
        q, s = qbackend.quantize(self.x, torch.int8, "token")
        return (qbackend.scaled_mm(q, self.wi.t(), s, self.wis.t()),)

    def _block(self):
        q, s = qbackend.quantize(self.x, E4M3, "group")
        return (qbackend.scaled_mm(q, self.wb.t(), s, self.wbs.t()),)

    def _linear(self):
        q, s = qbackend.quantize(self.x, E4M3, "token")
        return (qbackend.linear(q, self.p8, s),)

    def _grouped(self):
        q, s = qbackend.quantize(self.x, E4M3, "group")
        return (qbackend.grouped_scaled_mm(q, self.ew.transpose(-2, -1), s, self.ews.transpose(-2, -1),
                                           self.offsets),)


@pytest.fixture(scope="module")
def calls():
    registry.reload()
    return Calls("cuda:0")


@pytest.mark.parametrize("name", Calls.NAMES)
def test_call_runs_on_the_current_stream(calls, name):
    fn = dict(calls.all())[name]
    g = torch.Generator().manual_seed(7)
    old = calls.x.clone()
    new = torch.randn(calls.x.shape, generator=g).to(torch.bfloat16).to(calls.x.device)
    calls.x.copy_(new)
    expected = fn()
    calls.x.copy_(old)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)   # tens of ms: a call on another stream would run first
        calls.x.copy_(new)
        got = fn()
    side.synchronize()
    calls.x.copy_(old)
    assert all(same(a, b) for a, b in zip(got, expected)), f"{name}: not ordered after the side stream's write"


def test_tensors_on_another_device_are_refused(calls):
    q, s = qbackend.quantize(calls.x, E4M3, "token")
    with pytest.raises(ValueError, match="b: must be on the same device as a"):
        qbackend.scaled_mm(q, calls.w8.t().cpu(), s, calls.ws.t())
    with pytest.raises(ValueError, match="scale_a: must be on the same device as a"):
        qbackend.scaled_mm(q, calls.w8.t(), s.cpu(), calls.ws.t())
    with pytest.raises(ValueError, match="index: must be on the same device as x"):
        qbackend.gather_quantize(calls.x, calls.index.cpu())


@TWO_GPUS
def test_calls_on_the_second_gpu_while_the_first_is_current(calls):
    torch.cuda.set_device(0)
    other = Calls("cuda:1")
    for (name, fn0), (_, fn1) in zip(calls.all(), other.all()):
        want = fn0()
        got = fn1()
        assert torch.cuda.current_device() == 0, f"{name} changed the current device"
        assert all(t.device == torch.device("cuda:1") for t in got), name
        assert all(same(a, b) for a, b in zip(got, want)), f"{name}: cuda:1 differs from cuda:0"


@TWO_GPUS
def test_marlin_on_the_second_gpu(monkeypatch, calls):
    monkeypatch.setenv("QBACKEND_PROVIDER", "marlin")
    registry.reload()
    try:
        want = qbackend.linear(calls.x, qbackend.prepare_weight(calls.w8, calls.ws, activation=torch.bfloat16))
        other = Calls("cuda:1")
        got = qbackend.linear(other.x, qbackend.prepare_weight(other.w8, other.ws, activation=torch.bfloat16))
    finally:
        monkeypatch.delenv("QBACKEND_PROVIDER")
        registry.reload()
    assert got.device == torch.device("cuda:1") and same(got, want)


@TWO_GPUS
def test_graph_captured_on_the_second_gpu_replays_there(calls):
    torch.cuda.set_device(0)
    other = Calls("cuda:1")
    fns = [fn for _, fn in other.all()]
    with torch.cuda.device(1):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for fn in fns:
                fn()                                  # warm-up: workspaces, plans
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            outs = [fn() for fn in fns]
    g = torch.Generator().manual_seed(9)
    for _ in range(2):
        new = torch.randn(other.x.shape, generator=g).to(torch.bfloat16)
        other.x.copy_(new.to("cuda:1"))
        calls.x.copy_(new.to("cuda:0"))
        graph.replay()
        torch.cuda.synchronize(1)
        for (name, fn0), got in zip(calls.all(), outs):
            assert all(same(a, b) for a, b in zip(got, fn0())), f"{name}: graph replay on cuda:1 differs"
