"""qbackend.benchmark on the CPU: the round orders every benchmark's comparisons rely on, the weight
rotation, and the weights and activations each problem kind is timed with."""
import itertools
from collections import Counter

import pytest
import torch

import qbackend
from qbackend import benchmark as timing


@pytest.mark.parametrize("n", range(1, 10))
def test_balanced_orders_are_a_williams_design(n):
    orders = timing.balanced_orders(n)
    reps = 1 if n % 2 == 0 else 2
    assert len(orders) == reps * n
    assert all(sorted(o) == list(range(n)) for o in orders)
    assert Counter(o[0] for o in orders) == {i: reps for i in range(n)}  # each first equally often
    follows = Counter((o[k], o[k + 1]) for o in orders for k in range(n - 1))
    assert follows == {pair: reps for pair in itertools.permutations(range(n), 2)}


def test_interleaved_times_each_candidate_once_per_round_and_reports_its_median():
    calls = []
    fake = {"a": [5.0, 1.0, 3.0, 2.0], "b": [7.0, 9.0, 8.0, 6.0], "c": [1.0] * 4, "d": [4.0] * 4}

    def timer(label):
        def t():
            calls.append(label)
            return fake[label][sum(1 for c in calls if c == label) - 1]
        return t

    med = timing.interleaved({k: timer(k) for k in fake})
    assert len(calls) == 16 and Counter(calls) == {k: 4 for k in fake}
    assert med == {"a": 2.5, "b": 7.5, "c": 1.0, "d": 4.0}
    calls.clear()
    fake.update(a=[1.0, 2.0], b=[3.0, 4.0], c=[5.0, 6.0], d=[7.0, 8.0])
    timing.interleaved({k: timer(k) for k in fake}, rounds=2)
    assert calls == ["a", "b", "d", "c", "b", "c", "a", "d"]  # the design's first two orders


def test_weight_copies_fill_the_rotation_within_bounds():
    assert timing.weight_copies(16 * 2**20) == 16              # 512 MB of 16 MB copies: 32, capped at 16
    assert timing.weight_copies(100 * 2**20) == 5
    assert timing.weight_copies(2**30) == 2                    # never fewer than two copies
    assert timing.weight_copies(2**20, total_bytes=3 * 2**20, most=64) == 3


@pytest.mark.parametrize("kind", qbackend.PROBLEM_KINDS)
def test_each_kind_gets_a_weight_and_activation_the_selected_provider_takes(kind):
    g = torch.Generator().manual_seed(0)
    q, s, act_dtype, granularity = timing.checkpoint_weight(kind, 256, 384, g)
    assert q.shape == (256, 384) and q.dtype in (torch.float8_e4m3fn, torch.int8)
    a, sa = timing.activation(5, 384, act_dtype, granularity, g)
    assert a.shape == (5, 384) and a.dtype == act_dtype and (sa is None) == (act_dtype == torch.bfloat16)
    pw = qbackend.prepare_weight(q, s, act_dtype, granularity)
    w = qbackend.dequantize(q, s, torch.float32)
    x = a.float() if sa is None else qbackend.dequantize(a, sa, torch.float32)
    y = qbackend.linear(a, pw, sa).float()
    assert torch.allclose(y, x @ w.t(), rtol=2e-2, atol=2e-2)


def test_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="kind: unknown problem kind 'fp4'"):
        timing.checkpoint_weight("fp4", 128, 128, torch.Generator())
