"""Modified rejection sampling: the Qualcomm toy example, edge cases, and exactness of one round.

Statistical tests use a chi-square goodness-of-fit test at significance level ALPHA = 0.001 with a fixed seed, cells
merged so that every expected count is >= 5 (see ``chi_square``). A deliberately wrong variant must fail the same test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from accel.errors import SpdError
from accel.spd import GREEDY, Sampling
from accel.spd.mrs import acceptance_probs, greedy_accept, residual, sample, sample_logits, speculative_accept
from tests.helpers.spd import ALPHA, chi_square

scipy_stats = pytest.importorskip("scipy.stats")


# Qualcomm AI Research blog, "speculative decoding" toy example: draft p, target q over a 4-token vocabulary
P_TOY = np.array([0.4, 0.3, 0.2, 0.1])
Q_TOY = np.array([0.3, 0.45, 0.1, 0.15])


def test_toy_example_acceptance_and_residual():
    np.testing.assert_allclose(acceptance_probs(P_TOY, Q_TOY), [0.75, 1.0, 0.5, 1.0], rtol=1e-15)
    np.testing.assert_allclose(residual(P_TOY, Q_TOY), [0.0, 0.75, 0.0, 0.25], rtol=1e-15)
    assert np.minimum(P_TOY, Q_TOY).sum() == pytest.approx(0.8)  # alpha = 1 - TV distance


def _toy_round(n: int, rng: np.random.Generator, p_for_mrs: np.ndarray = P_TOY):
    drafts = sample(np.broadcast_to(P_TOY, (n, 4)), rng)[:, None]
    p = np.broadcast_to(p_for_mrs, (n, 1, 4))
    q = np.broadcast_to(Q_TOY, (n, 2, 4))
    return drafts, speculative_accept(drafts, p, q, rng)


def test_toy_example_one_round_is_exact():
    rng = np.random.default_rng(1)
    drafts, res = _toy_round(40_000, rng)
    first = np.where(res.num_accepted == 1, drafts[:, 0], res.next_token)
    # the first emitted token is distributed as q; acceptance is Bernoulli(sum min(p, q) = 0.8)
    p_first = chi_square(np.bincount(first, minlength=4), Q_TOY)
    p_accept = chi_square(np.bincount(res.num_accepted, minlength=2), [0.2, 0.8])
    # per drafted token, acceptance frequency is min(1, q/p)
    for x, a in enumerate([0.75, 1.0, 0.5, 1.0]):
        sel = drafts[:, 0] == x
        assert chi_square(np.bincount(res.num_accepted[sel], minlength=2), [1 - a, a]) > ALPHA
    assert p_first > ALPHA and p_accept > ALPHA, (p_first, p_accept)


def test_toy_example_wrong_p_fails():
    # MRS told a different p from the one the drafts came from (e.g. unwarped draft probabilities): not exact
    wrong_p = np.array([0.25, 0.25, 0.25, 0.25])
    drafts, res = _toy_round(40_000, np.random.default_rng(1), p_for_mrs=wrong_p)
    first = np.where(res.num_accepted == 1, drafts[:, 0], res.next_token)
    assert chi_square(np.bincount(first, minlength=4), Q_TOY) < ALPHA


def _markov(vocab: int, seed: int, scale: float) -> np.ndarray:
    """A random row-stochastic matrix T[a, b] = prob(next = b | last = a)."""
    logits = np.random.default_rng(seed).normal(size=(vocab, vocab)) * scale
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _exact_round_law(P: np.ndarray, Q: np.ndarray, c: int, k: int) -> dict[tuple[int, ...], float]:
    """Exact law of the tokens one MRS round emits from context token ``c`` (Chen et al. Alg. 2, by enumeration).

    Emitting ``e_1..e_n``: the first ``n-1`` are accepted drafts (each with probability ``min(p, q)``), then either a
    residual sample ``(q - p)+`` (if ``n - 1 < k``) or a bonus ``q`` (if ``n - 1 == k``).
    """
    law: dict[tuple[int, ...], float] = {}
    vocab = P.shape[0]
    for n in range(1, k + 2):
        for seq in itertools.product(range(vocab), repeat=n):
            prob, last = 1.0, c
            for tok in seq[:-1]:
                prob *= min(P[last, tok], Q[last, tok])
                last = tok
            t = seq[-1]
            prob *= Q[last, t] if n - 1 == k else max(Q[last, t] - P[last, t], 0.0)
            if prob > 0:
                law[seq] = prob
    return law


def _markov_round(P, Q, c, k, n, rng, p_for_mrs=None):
    """Run one batched round of K drafts from context ``c`` with Markov draft P and target Q."""
    vocab = P.shape[0]
    drafts = np.zeros((n, k), dtype=np.int64)
    p = np.zeros((n, k, vocab))
    last = np.full(n, c)
    for i in range(k):
        p[:, i] = P[last]
        drafts[:, i] = sample(p[:, i], rng)
        last = drafts[:, i]
    ctx = np.concatenate([np.full((n, 1), c), drafts], axis=1)  # q_i conditions on the token before slot i
    q = Q[ctx]
    res = speculative_accept(drafts, p if p_for_mrs is None else p_for_mrs(p), q, rng)
    return [(*tuple(drafts[b, : res.num_accepted[b]]), int(res.next_token[b])) for b in range(n)]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_round_law_and_marginals_exact(k):
    P, Q = _markov(4, 10, 1.5), _markov(4, 11, 1.5)
    law = _exact_round_law(P, Q, 0, k)
    assert sum(law.values()) == pytest.approx(1.0)
    outs = _markov_round(P, Q, 0, k, 30_000, np.random.default_rng(k))
    cells = sorted(law)
    counts = {c: 0 for c in cells}
    for o in outs:
        counts[o] = counts.get(o, 0) + 1
    assert set(counts) == set(cells)  # nothing emitted outside the support of the law
    p_joint = chi_square([counts[c] for c in cells], [law[c] for c in cells])
    # what exactness means: first token ~ q(.|c); second token given the first ~ q(.|e1)
    p_first = chi_square(np.bincount([o[0] for o in outs], minlength=4), Q[0])
    assert p_joint > ALPHA and p_first > ALPHA, (p_joint, p_first)
    if k >= 1:
        a = int(np.argmax(np.bincount([o[0] for o in outs if len(o) > 1], minlength=4)))
        seconds = [o[1] for o in outs if len(o) > 1 and o[0] == a]
        assert chi_square(np.bincount(seconds, minlength=4), Q[a]) > ALPHA


def test_round_wrong_p_fails():
    P, Q = _markov(4, 10, 1.5), _markov(4, 11, 1.5)
    # "unwarped" draft probabilities: the drafts were sampled from P at temperature 0.5, MRS is told P
    P_warm = P**2 / (P**2).sum(1, keepdims=True)
    outs = _markov_round(
        P_warm,
        Q,
        0,
        2,
        30_000,
        np.random.default_rng(2),
        p_for_mrs=lambda p: np.sqrt(p) / np.sqrt(p).sum(-1, keepdims=True),
    )
    assert chi_square(np.bincount([o[0] for o in outs], minlength=4), Q[0]) < ALPHA


def test_greedy_accept_equals_mrs_on_one_hot():
    rng = np.random.default_rng(0)
    batch, k, vocab = 200, 4, 3
    q_logits = rng.normal(size=(batch, k + 1, vocab))
    q = np.eye(vocab)[q_logits.argmax(-1)]
    drafts = rng.integers(0, vocab, size=(batch, k))
    p = np.eye(vocab)[drafts]
    nd = rng.integers(0, k + 1, size=batch)
    g = greedy_accept(drafts, q_logits, nd)
    m = speculative_accept(drafts, p, q, rng, nd)
    np.testing.assert_array_equal(g.num_accepted, m.num_accepted)
    np.testing.assert_array_equal(g.next_token, m.next_token)
    assert np.all(g.num_accepted <= nd) and np.any(g.num_accepted > 0) and np.any(g.num_accepted < nd)


def test_edge_cases():
    rng = np.random.default_rng(0)
    q = np.array([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])
    # drafted token with p(x) = 0: rejected; residual (q - p)+ = [0.5, 0, 0] / 0.5 -> token 0
    res = speculative_accept(np.array([[2]]), np.array([[[0.0, 1.0, 0.0]]]), q, rng)
    assert res.num_accepted[0] == 0 and res.next_token[0] == 0
    # p == q: always accepted (ratio 1), then the bonus comes from q[1]
    for _ in range(50):
        res = speculative_accept(np.array([[1]]), q[:, :1], q, rng)
        assert res.num_accepted[0] == 1 and res.overlap[0, 0] == pytest.approx(1.0)
    # residual mass 0 falls back to q
    np.testing.assert_array_equal(residual(np.array([0.5, 0.5, 0.0]), np.array([0.5, 0.5, 0.0])), [0.5, 0.5, 0.0])
    # num_drafts = 0 emits a sample of q[0]
    res = speculative_accept(np.array([[1]]), q[:, :1], q, rng, num_drafts=np.array([0]))
    assert res.num_accepted[0] == 0 and res.next_token[0] in (0, 1) and np.isnan(res.overlap[0, 0])
    # sampling never returns a zero-probability token
    assert set(sample(np.tile([0.0, 1.0, 0.0, 0.0], (1000, 1)), rng)) == {1}


def test_bad_inputs_raise():
    rng = np.random.default_rng(0)
    d, p, q = np.zeros((2, 3), int), np.full((2, 3, 4), 0.25), np.full((2, 4, 4), 0.25)
    speculative_accept(d, p, q, rng)
    with pytest.raises(SpdError, match="K\\+1"):
        speculative_accept(d, p, q[:, :3], rng)
    with pytest.raises(SpdError, match="draft probs"):
        speculative_accept(d, p[:, :, :3], q, rng)
    with pytest.raises(SpdError, match="num_drafts"):
        speculative_accept(d, p, q, rng, num_drafts=np.array([4, 0]))
    with pytest.raises(SpdError, match="token ids"):
        speculative_accept(d + 4, p, q, rng)
    bad = q.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(SpdError, match="NaN"):
        speculative_accept(d, p, bad, rng)


def test_seeded_reproducible():
    P, Q = _markov(4, 10, 1.5), _markov(4, 11, 1.5)
    a = _markov_round(P, Q, 0, 3, 500, np.random.default_rng(7))
    b = _markov_round(P, Q, 0, 3, 500, np.random.default_rng(7))
    c = _markov_round(P, Q, 0, 3, 500, np.random.default_rng(8))
    assert a == b and a != c


def _one_running_sum(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The reference inverse CDF: per row, the first index whose running sum reaches ``u * total``."""
    cdf = np.cumsum(probs, axis=-1)
    return np.array([np.searchsorted(row, t * row[-1], side="left") for row, t in zip(cdf, u, strict=True)])


def _sampled_with(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``sample(probs, rng)`` with an rng whose draws give the uniforms ``u`` in (0, 1] (``sample`` uses 1 - r)."""

    class Fixed:
        def random(self, shape):
            return (1.0 - u).reshape(shape)

    return sample(probs, Fixed())  # type: ignore[arg-type]


@pytest.mark.parametrize("vocab", [49152, 5000])
def test_two_level_inverse_cdf_equals_one_running_sum(vocab):
    """A large vocabulary's inverse CDF is found in two levels (block sums, then one block: ~0.06 ms against ~0.22
    ms for one running sum of 49,152 tokens). Dense random rows with random uniforms: the same index as one running sum
    (they could differ only within rounding, ~1e-16 of the mass, of a boundary). Integer weights, most blocks zero,
    with uniforms in eighths, where every sum is exact and the threshold often falls exactly on a boundary: the same
    index everywhere, never a zero-weight token. 5000 tokens end in a partial block."""
    rng = np.random.default_rng(3)
    for _ in range(4):
        dense = np.exp(3.0 * rng.standard_normal((64, vocab)))
        u = 1.0 - rng.random(64)
        np.testing.assert_array_equal(_sampled_with(dense, u), _one_running_sum(dense, u))
    counts = rng.integers(1, 5, size=(64, vocab)).astype(np.float64)
    counts[rng.random((64, vocab)) < 0.9] = 0.0
    counts[:, 256:4096] = 0.0  # whole blocks without mass
    counts[:, -1] += (-counts.sum(axis=1)) % 8  # totals divisible by 8: a threshold k/8 x total is an integer
    for k in range(1, 9):
        u = np.full(64, k / 8)
        got = _sampled_with(counts, u)
        np.testing.assert_array_equal(got, _one_running_sum(counts, u))
        assert np.all(counts[np.arange(64), got] > 0)


def test_two_level_inverse_cdf_never_returns_a_zero_probability_token():
    """Where a block holds a large weight and many tiny ones (its running sum and its pairwise sum differ in the last
    bits), every uniform, 1 included, gives a token of positive probability."""
    rng = np.random.default_rng(4)
    row = np.zeros(49152)
    row[300] = 1.0
    row[301:512:3] = 1e-17
    row[40000:40100] = rng.random(100) * 1e-3
    probs = np.tile(row, (500, 1))
    u = np.concatenate([[1.0, np.nextafter(1.0, 0.0)], 1.0 - rng.random(498)])
    got = _sampled_with(probs, u)
    assert np.all(row[got] > 0) and got[0] == 40099
    # 1 then 100 x 1e-16: a running sum stays at 1.0, the block's sum is above it; at u = 1 the threshold lies
    # beyond the block's running sum, and the draw is the block's last token of positive probability, not a zero
    edge = np.zeros(49152)
    edge[512], edge[513:613] = 1.0, 1e-16
    assert _sampled_with(edge[None], np.array([1.0]))[0] == 612


def _logit_rows(vocab: int, n: int, seed: int) -> np.ndarray:
    """``n`` float32 rows of raw logits shaped like a language model's: a few large, a long low tail."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, vocab)) * 2.5 + 6.0 * (rng.random((n, vocab)) < 0.001)).astype(np.float32)


@pytest.mark.parametrize("sampling", [Sampling(temperature=0.8), Sampling(), Sampling(temperature=1.7)])
def test_sample_logits_draws_what_warp_then_sample_draws(sampling):
    """``sample_logits`` (a root's token: shift, scale and exponentiate once, never normalise) draws from the same
    generator the token that ``sample(warp(logits))`` draws: 300 rows of a 49,152-token vocabulary, one seed per row,
    every token equal (they could differ only where a uniform falls within ~1e-15 of a token's CDF boundary)."""
    rows = _logit_rows(49152, 300, 5)
    for i, row in enumerate(rows):
        want = int(sample(sampling.probs(row)[None], np.random.default_rng(i))[0])
        assert sample_logits(row, sampling, np.random.default_rng(i)) == want


def test_sample_logits_is_the_warped_law():
    """Exactness by chi-square (ALPHA, fixed seed) on a 40-token row at T = 0.7: 20,000 draws against ``warp``'s
    law, computed exactly; the law without the temperature (a wrong variant) fails the same test."""
    row = _logit_rows(40, 1, 6)[0]
    sampling = Sampling(temperature=0.7)
    rng = np.random.default_rng(8)
    draws = np.array([sample_logits(row, sampling, rng) for _ in range(20_000)])
    counts = np.bincount(draws, minlength=40)
    assert chi_square(counts, sampling.probs(row)) > ALPHA
    assert chi_square(counts, Sampling().probs(row)) < ALPHA


def test_sample_logits_other_warps_and_masked_rows():
    """Greedy: the first arg-max, no random number drawn. Top-k / top-p: ``sample(warp(logits))`` itself. A row
    whose masked entries sit at -1e9 (a restricted head): never one of them."""
    row = _logit_rows(49152, 1, 9)[0]
    row[[7, 9]] = row.max() + 1.0
    rng = np.random.default_rng(0)
    assert sample_logits(row, GREEDY, rng) == 7 and rng.random() == np.random.default_rng(0).random()
    for sampling in (Sampling(temperature=0.9, top_k=20), Sampling(top_p=0.5)):
        want = int(sample(sampling.probs(row)[None], np.random.default_rng(3))[0])
        assert sample_logits(row, sampling, np.random.default_rng(3)) == want
    masked = np.full(49152, -1e9, dtype=np.float32)
    masked[100:110] = np.arange(10, dtype=np.float32)
    rng = np.random.default_rng(1)
    assert all(100 <= sample_logits(masked, Sampling(temperature=0.5), rng) < 110 for _ in range(200))


@pytest.mark.parametrize("sampling", [Sampling(temperature=0.8), GREEDY, Sampling(top_k=3)])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_sample_logits_refuses_broken_logits(sampling, bad):
    row = _logit_rows(64, 1, 2)[0]
    row[17] = bad
    with pytest.raises(SpdError, match="NaN or inf"):
        sample_logits(row, sampling, np.random.default_rng(0))


def test_sample_logits_refuses_bad_shapes_and_settings():
    rows = _logit_rows(64, 2, 2)
    with pytest.raises(SpdError, match="one row"):
        sample_logits(rows, Sampling(temperature=0.8), np.random.default_rng(0))
    with pytest.raises(SpdError, match="temperature"):
        sample_logits(rows[0], Sampling(temperature=0.0), np.random.default_rng(0))
