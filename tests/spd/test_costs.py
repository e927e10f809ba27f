"""The measured cost model (``accel.spd.costs``): the monotone fit against scipy's isotonic regression, medians that
ignore an outlier and follow a lasting load change within half a window, refused bad timings (zero, negative, NaN,
inf), and the start-up probe on a real backend, including a failing call and a frozen clock."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import isotonic_regression

from accel.errors import SpdError
from accel.spd.costs import CostCurve, monotone_fit, probe_target, valid_seconds
from tests.helpers.decoders import backend, random_model

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("seed", range(20))
def test_monotone_fit_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=rng.integers(1, 12)).cumsum() + rng.normal(scale=2.0, size=1)
    weights = rng.integers(1, 8, size=values.size).astype(float)
    ours = monotone_fit(values, weights)
    ref = isotonic_regression(values, weights=weights, increasing=True).x
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
    assert np.all(np.diff(ours) >= -1e-15)


def test_monotone_fit_keeps_a_monotone_curve():
    values = np.array([1.0, 1.0, 1.2, 1.5, 3.0])
    np.testing.assert_array_equal(monotone_fit(values, np.ones(5)), values)


@pytest.mark.parametrize("bad", [0.0, -1e-3, math.nan, math.inf, -math.inf, None, "1.0", True])
def test_bad_timings_are_refused(bad):
    curve = CostCurve("target call")
    assert not valid_seconds(bad)
    assert curve.observe(3, bad) is False
    assert curve.rejected == 1 and curve.sizes == [] and curve.seconds(3) is None


def test_median_ignores_one_outlier_and_follows_a_load_change():
    curve = CostCurve(window=8)
    for _ in range(7):
        curve.observe(1, 0.010)
    curve.observe(1, 5.0)  # one scheduler hiccup
    assert curve.seconds(1) == pytest.approx(0.010)
    seen = []
    for _ in range(5):  # the machine gets twice as busy: the median moves once the new samples are half the window
        curve.observe(1, 0.020)
        seen.append(curve.seconds(1))
    assert seen == pytest.approx([0.010, 0.010, 0.015, 0.020, 0.020])


def test_curve_is_monotone_interpolated_and_extrapolated():
    curve = CostCurve()
    for size, s in [(1, 1.0), (3, 2.0), (5, 1.8), (9, 4.0)]:  # 5 is noisy-low: pooled with 3
        curve.observe(size, s)
    sizes, secs = curve.fitted()
    assert sizes.tolist() == [1, 3, 5, 9] and secs.tolist() == pytest.approx([1.0, 1.9, 1.9, 4.0])
    assert curve.seconds(2) == pytest.approx(1.45)  # linear between 1 and 3
    assert curve.seconds(0) == pytest.approx(1.0)  # flat below the smallest size
    assert curve.seconds(11) == pytest.approx(4.0 + 2 * (2.1 / 4))  # the last slope continues
    one = CostCurve()
    one.observe(2, 0.5)
    assert one.seconds(1) == one.seconds(9) == 0.5  # one size: flat


def test_window_must_be_positive():
    with pytest.raises(SpdError, match="window"):
        CostCurve(window=0)
    with pytest.raises(SpdError, match="size"):
        CostCurve().observe(-1, 1.0)


@pytest.fixture(scope="module")
def target():
    return random_model(seed=1)


def test_probe_times_every_size(target):
    tb = backend(target, 2, ctx_len=16)
    curve = probe_target(tb, [1, 3, 5], repeats=2)
    assert curve.sizes == [1, 3, 5]
    assert all(len(curve.samples(s)) == 2 for s in (1, 3, 5))
    assert all(curve.seconds(s) > 0 for s in range(1, 8))


def test_probe_refuses_sizes_the_target_cannot_score(target):
    tb = backend(target, 1, ctx_len=16, max_seq_len=4)
    with pytest.raises(SpdError, match=r"1 \.\. 4"):
        probe_target(tb, [1, 5])
    with pytest.raises(SpdError, match="repeats"):
        probe_target(tb, [1], repeats=0)


def test_probe_with_a_frozen_clock_is_a_clear_error(target):
    tb = backend(target, 1, ctx_len=16)
    with pytest.raises(SpdError, match=r"no valid timing .* at \[1, 2\]"):
        probe_target(tb, [1, 2], clock=lambda: 1.0)
    with pytest.raises(SpdError, match="no valid timing"):
        probe_target(tb, [1, 2], clock=lambda: math.nan)


def test_a_failing_probe_names_the_size_and_keeps_the_cause(target):
    tb = backend(target, 1, ctx_len=16)

    class Broken(type(tb)):  # the real backend, whose wide calls fail (e.g. an out-of-memory device)
        def forward(self, ids, pos, **kw):
            if ids.shape[1] > 2:
                raise RuntimeError("device out of memory")
            return super().forward(ids, pos, **kw)

    tb.__class__ = Broken
    with pytest.raises(SpdError, match="at 3 tokens failed: device out of memory") as info:
        probe_target(tb, [1, 3])
    assert isinstance(info.value.__cause__, RuntimeError)
