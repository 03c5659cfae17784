"""bench/timing.py's round orders on the CPU: the balance every benchmark's comparisons rely on."""
import itertools
import os
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import timing  # noqa: E402


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
