"""Speculative decoding math against Monte Carlo and exact limits."""

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import expected_tokens, expected_tokens_from, tokens_pmf
from accel.sim.spd import break_even_alpha, loop_time, speedup


def _simulate(acc, k, n, rng):
    """Tokens per loop of n loops: accept draft i with prob acc[i] while all before were accepted, +1 target token."""
    u = rng.random((n, k)) < np.asarray(acc)[None, :]
    accepted = np.cumprod(u, axis=1).sum(axis=1)
    return accepted + 1


@pytest.mark.parametrize("alpha,k", [(0.3, 3), (0.8, 7), (0.95, 4), (0.6, 1)])
def test_expected_tokens_vs_monte_carlo(alpha, k):
    rng = np.random.default_rng(1234)
    x = _simulate(np.full(k, alpha), k, 200_000, rng)
    se = x.std() / np.sqrt(x.size)
    assert abs(x.mean() - expected_tokens(alpha, k)) < 4.5 * se  # two-sided, ~7e-6 false-failure rate


def test_pmf_chi_square_against_monte_carlo():
    acc = [0.9, 0.8, 0.7, 0.5, 0.4]
    k = len(acc)
    rng = np.random.default_rng(7)
    n = 100_000
    counts = np.bincount(_simulate(acc, k, n, rng), minlength=k + 2)[1:]
    expected = n * tokens_pmf(acc, k)
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    # chi-square with K = 5 degrees of freedom: 20.52 is the 0.999 quantile (alpha = 0.001)
    assert chi2 < 20.52
    assert tokens_pmf(acc, k).sum() == pytest.approx(1.0)
    assert expected_tokens_from(acc, k) == pytest.approx(
        1 + 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.7 + 0.9 * 0.8 * 0.7 * 0.5 + 0.9 * 0.8 * 0.7 * 0.5 * 0.4
    )


def test_limits():
    for k in (1, 4, 16):
        assert expected_tokens(1.0, k) == k + 1
        assert expected_tokens(1.0 - 1e-12, k) == pytest.approx(k + 1, rel=1e-9)
        assert expected_tokens(0.0, k) == 1.0
        assert tokens_pmf(0.0, k)[0] == 1.0 and tokens_pmf(1.0, k)[-1] == 1.0
    e = expected_tokens(np.array([0.0, 0.5, 1.0]), np.array([[1], [3]]))
    assert e.shape == (2, 3) and e[1, 1] == pytest.approx(1.875)
    assert expected_tokens_from(0.7, 5) == pytest.approx(expected_tokens(0.7, 5))


def test_break_even_alpha_solves_speedup_one():
    t_t, t_d, t_s = 10e-3, 1.5e-3, 12e-3
    for k in (1, 3, 7):
        a = break_even_alpha(k, t_t, t_d, t_s)
        lt = loop_time(k, t_d, t_s)
        assert speedup(expected_tokens(a, k), lt, t_t) == pytest.approx(1.0, abs=1e-8)
    assert break_even_alpha(3, 10e-3, 0.0, 10e-3) == 0.0  # free draft and scoring: always wins
    assert break_even_alpha(3, 10e-3, 5e-3, 40e-3) is None  # loop costs 5.5 steps > K + 1 = 4 tokens


def test_bad_input():
    for a in (-0.1, 1.5, np.nan):
        with pytest.raises(SimError, match="alpha"):
            expected_tokens(a, 3)
    for k in (0, -1, 2.5):
        with pytest.raises(SimError, match="K"):
            expected_tokens(0.5, k)
    with pytest.raises(SimError, match="at least K=4"):
        tokens_pmf([0.5, 0.5], 4)
