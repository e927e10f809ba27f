"""Distribution exactness of the whole loop: speculative sampling draws the target's own continuations.

Model pair: a random target and a perturbed copy as the draft, vocabulary 8. The exact law of the 3-token continuation
of a fixed prompt is computed by enumeration (the target run on all 8^3 continuations, warps applied to every prefix's
logits); 20,000 continuations are sampled with ``generate`` (K = 2, batch 2,000 rows of the same prompt, so one run is
~3 batched rounds), and compared with a chi-square test at significance level ALPHA = 0.001 (fixed seed; cells merged
to expected counts >= 5). A deliberately wrong loop (modified rejection sampling told the unwarped draft
probabilities, HF's old bug) must fail the same test. Trees (width >= 2): test_tree_exactness.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import accel.spd.loop as loop_module
from accel.spd import DraftChain, NgramLookup, Sampling, generate
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import ALPHA, NEW, PROMPT, ROWS, SETTINGS, VOCAB, K, chi_square, exact_law, sample_counts

torch = pytest.importorskip("torch")


def with_lookup(db):
    """Lookup drafts (n 1, 2 tokens) where a row's last token occurred before, the draft model elsewhere."""
    return [NgramLookup(1, 2), DraftChain(db, k=K)]


@pytest.fixture(scope="module")
def pair():
    # std 0.3: next-token entropy ~1.3 nats of 2.1; the draft accepts ~0.5 per token (both MRS paths are frequent)
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    draft = perturbed(target, seed=22, rel=0.15)
    return target, draft


@pytest.mark.parametrize("name", list(SETTINGS))
def test_spd_continuations_match_target_exactly(pair, name):
    target, draft = pair
    sampling = SETTINGS[name]
    law = exact_law(target, sampling)
    counts, stats = sample_counts(target, draft, sampling, seed=100)
    pvalue = chi_square(counts, law)
    print(f"chi-square p-value [{name}]: {pvalue:.4g}")
    assert pvalue > ALPHA, (name, pvalue)
    # both paths of the algorithm ran: rejections (residual samples) and all-accepted rounds (bonus + catch-up)
    hist = np.sum([s.accepted_histogram for s in stats], axis=0)
    assert hist[0] > 1000 and hist[K] > 1000, hist


def test_wrong_variant_fails(pair, monkeypatch):
    """Verification given unwarped draft probabilities (the drafts were sampled at temperature 0.6) is not exact."""
    target, draft = pair
    sampling = dict(temperature=0.6)
    real = loop_module.verify_sampled

    def unwarped_p(tree, q_of, rng):
        if tree.dists is None:  # a plain target step
            return real(tree, q_of, rng)
        # p = softmax(l / T)  =>  p**T / sum(p**T) = softmax(l): the draft's unwarped distribution
        pt = tree.dists ** sampling["temperature"]
        unwarped = pt / np.maximum(pt.sum(-1, keepdims=True), 1e-300)
        return real(dataclasses.replace(tree, dists=unwarped), q_of, rng)

    monkeypatch.setattr(loop_module, "verify_sampled", unwarped_p)
    counts, _ = sample_counts(target, draft, sampling, seed=100, runs=5)  # 10,000 samples are plenty here
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [wrong variant]: {pvalue:.4g}")
    assert pvalue < ALPHA


def test_draft_alone_fails(pair):
    """Power check: the draft's own samples are distinguishable from the target's by the same test."""
    target, draft = pair
    counts, _ = sample_counts(draft, draft, SETTINGS["plain"], seed=100, spd=False, runs=5)
    assert chi_square(counts, exact_law(target, SETTINGS["plain"])) < ALPHA


def test_restricted_head_draft_is_exact(pair):
    """A draft whose LM head scores only 5 of the 8 tokens (``head_vocab``; p(x) = 0 for the other 3, which the
    target does produce) still yields the target's law: the residual (q - p)+ carries that mass. Same chi-square
    test."""
    from accel.drafts import restrict_head

    target, draft = pair
    restricted = restrict_head(draft, [0, 2, 3, 5, 6]).eval()
    sampling = SETTINGS["temperature"]
    law = exact_law(target, sampling)
    assert law.sum(axis=(0, 1))[[1, 4, 7]].sum() > 0.2  # the unreachable tokens matter for the last position
    counts, stats = sample_counts(target, restricted, sampling, seed=101, runs=5)
    pvalue = chi_square(counts, law)
    print(f"chi-square p-value [restricted head]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert sum(s.accepted_drafts for s in stats) > 0  # the draft is still accepted where it can be


def test_dynamic_draft_length_is_exact(pair):
    """``min_draft_prob``: rows stop drafting after a proposal the draft gave low probability. The decision uses the
    draft's side only, so the continuations keep the target's law (same chi-square test), while fewer drafts are
    proposed than with a fixed K."""
    target, draft = pair
    sampling = SETTINGS["all"]
    dynamic = lambda d: DraftChain(d, k=K, min_draft_prob=0.4)  # noqa: E731
    counts, stats = sample_counts(target, draft, sampling, seed=102, runs=5, proposer=dynamic)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [min_draft_prob]: {pvalue:.4g}")
    assert pvalue > ALPHA
    _, fixed = sample_counts(target, draft, sampling, seed=102, runs=1)

    def second(st):
        return sum(s.proposed_per_position[1] for s in st) / sum(s.proposed_per_position[0] for s in st)

    assert second(stats) < 0.8 * second(fixed), (second(stats), second(fixed))


def test_ngram_lookup_is_exact(pair):
    """n-gram lookup drafts (``ngram=1`` here: with 8 tokens the prompt's and the continuation's tokens recur, so most
    rows find a match) are point-mass proposals; mixed with model-drafted rows in the same batch they keep the target's
    law (same chi-square test)."""
    target, draft = pair
    sampling = SETTINGS["all"]
    counts, stats = sample_counts(target, draft, sampling, seed=103, runs=5, proposer=with_lookup)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [ngram lookup]: {pvalue:.4g}")
    assert pvalue > ALPHA
    rounds = sum(s.row_calls for s in stats)
    assert 0.2 * rounds < sum(s.lookup_rounds for s in stats) < rounds
    assert sum(s.lookup_accepted for s in stats) > 1000


def test_ngram_lookup_wrong_variant_fails(pair, monkeypatch):
    """Power check: verifying lookup drafts as if they had been sampled from a uniform distribution (instead of as
    point masses) is not exact, and the same test sees it."""
    target, draft = pair
    sampling = SETTINGS["all"]
    real = loop_module.verify_sampled

    def as_if_uniform(tree, q_of, rng):
        if tree.source != "lookup":
            return real(tree, q_of, rng)
        uniform = np.full((tree.size, VOCAB), 1.0 / VOCAB)
        return real(dataclasses.replace(tree, dists=uniform, sampled=None), q_of, rng)

    monkeypatch.setattr(loop_module, "verify_sampled", as_if_uniform)
    counts, _ = sample_counts(target, draft, sampling, seed=103, runs=5, proposer=with_lookup)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [ngram wrong variant]: {pvalue:.4g}")
    assert pvalue < ALPHA


def test_lookup_only_is_exact(pair):
    """Lookup drafts without a draft model (``generate(target, None, ngram=1)``): the same chi-square test."""
    target, _ = pair
    sampling = SETTINGS["all"]
    tb = backend(target, ROWS, ctx_len=8)
    rng = np.random.default_rng(104)
    counts = np.zeros((VOCAB,) * NEW, dtype=np.int64)
    looked = 0
    for _ in range(5):
        res = generate(
            tb, NgramLookup(1, 2), [PROMPT] * ROWS, max_new_tokens=NEW, seed=rng, sampling=Sampling(**sampling)
        )
        np.add.at(counts, tuple(np.array(res.tokens).T), 1)
        looked += res.stats.lookup_accepted
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [lookup only]: {pvalue:.4g}")
    assert pvalue > ALPHA and looked > 1000
