"""Predictive Pipelined Decoding (Theorem 4.1) against an event-level Monte Carlo."""

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import predict_ppd, step_time
from accel.sim.ppd import ppd_expected_compute, ppd_expected_latency


def _simulate_latency(d, dbar, p, n_tok, runs, rng):
    """Timeline per run: token i starts at s_i; its early prediction is ready at s_i + dbar. If the prediction matches
    (prob p) the next token was already started then (s_{i+1} = s_i + dbar); otherwise it starts at s_i + d.
    The run ends when the last token's d layers finish."""
    start = np.zeros(runs)
    for _ in range(n_tok - 1):
        hit = rng.random(runs) < p
        start += np.where(hit, dbar, d)
    return start + d


@pytest.mark.parametrize("d,dbar,p,n_tok", [(32, 16, 0.6, 50), (40, 30, 0.9, 20), (24, 24, 0.5, 10), (12, 8, 0.0, 5)])
def test_expected_latency_vs_monte_carlo(d, dbar, p, n_tok):
    rng = np.random.default_rng(99)
    x = _simulate_latency(d, dbar, p, n_tok, 100_000, rng)
    se = max(x.std() / np.sqrt(x.size), 1e-12)
    assert abs(x.mean() - ppd_expected_latency(d, dbar, p, n_tok)) <= 4.5 * se


def test_compute_and_approximations():
    d, dbar, k, p, n_tok = 32, 16, 3, 0.7, 10_000
    assert (
        ppd_expected_compute(d, dbar, k, p, n_tok) == ppd_expected_latency(d, dbar, p, n_tok) + k * (d - dbar) * n_tok
    )
    r = predict_ppd("llama-2-7b", "a100-80gb", dbar=dbar, k=k, p=p, gen_len=n_tok)
    assert r.approx_latency_units_per_token == pytest.approx(d * (1 - p / 2))
    assert r.approx_busy_units == pytest.approx((k + 2 - p) / (2 - p))
    assert r.expected_latency_units / n_tok == pytest.approx(r.approx_latency_units_per_token, rel=1e-3)


def test_device_mapping():
    ar = step_time("llama-2-7b", "a100-80gb", context_len=128).time_s
    none = predict_ppd("llama-2-7b", "a100-80gb", dbar=20, k=2, p=0.0, gen_len=100)
    assert none.latency_s == pytest.approx(100 * ar) and none.speedup == pytest.approx(1.0)
    half = predict_ppd("llama-2-7b", "a100-80gb", dbar=16, k=2, p=1.0, gen_len=100)
    assert 1.5 < half.speedup < 2.0  # layers twice as fast at most; per-token head/overhead not saved
    assert half.layer_s * 32 + half.per_token_fixed_s == pytest.approx(ar)


def test_bad_input():
    with pytest.raises(SimError, match="dbar"):
        predict_ppd("llama-2-7b", "l4", dbar=8, k=2, p=0.5, gen_len=10)  # < d/2
    with pytest.raises(SimError, match="p "):
        predict_ppd("llama-2-7b", "l4", dbar=20, k=2, p=1.5, gen_len=10)
    with pytest.raises(SimError, match="k "):
        predict_ppd("llama-2-7b", "l4", dbar=20, k=0, p=0.5, gen_len=10)
