"""``accel generate``'s per-rank acceptance line: unconditional rates, the form ``accel predict --acceptance`` takes."""

from types import SimpleNamespace

import numpy as np
import pytest

from accel.apps.printing import _rank_rates


def test_rank_rates_are_unconditional():
    # depth 0: 100 nodes reached, rank 1 tried at all, matched 60; rank 2 tried at the 40 misses, matched 30;
    # rank 3 tried at the 10 left, matched 5. Conditional rates 0.6, 0.75, 0.5 sum above 1.
    stats = SimpleNamespace(rank_available=[[100, 40, 10], [50, 20, 0]], rank_accepted=[[60, 30, 5], [30, 10, 0]])
    rates = _rank_rates(stats)
    avail, acc = np.array([150.0, 60.0, 10.0]), np.array([90.0, 40.0, 5.0])
    c = acc / avail
    want = [c[0], c[1] * (1 - c[0]), c[2] * (1 - c[0]) * (1 - c[1])]
    assert rates == pytest.approx(want)
    assert sum(rates) <= 1.0 < sum(c)  # the conditional rates themselves would not be a distribution


def test_rank_rates_without_tree_rounds():
    assert _rank_rates(SimpleNamespace(rank_available=[], rank_accepted=[])) == []
