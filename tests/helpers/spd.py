"""Statistics and shared settings of the speculative decoding tests: the chi-square test, the exact law of a short
continuation by enumeration, batched sampling of continuations, and the prompts of the loop tests."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import stats as scipy_stats

from accel.spd import DraftChain, Sampling, generate, warp
from tests.helpers.decoders import backend

ALPHA = 0.001  # significance level of every chi-square test in tests/spd

# the loop tests: ragged prompts (left-padded inside the loop) and a generation length
PROMPTS_3 = [[1, 2, 3, 4, 5, 6, 7], [9], [3, 30, 11, 4]]  # ragged: left-padded inside the loop
PROMPTS_1 = [[5, 17, 2]]
MAX_NEW = 24

# the exactness tests: vocabulary, prompt, continuation length, K, and the sample sizes
VOCAB, PROMPT, NEW, K = 8, [1, 2, 3], 3, 2
ROWS, RUNS = 2000, 10  # 20,000 samples

SETTINGS = {
    "plain": dict(temperature=1.0),
    "temperature": dict(temperature=0.6),
    "top_k": dict(temperature=1.0, top_k=3),
    "top_p": dict(temperature=1.0, top_p=0.7),
    "all": dict(temperature=1.4, top_k=5, top_p=0.8),
}


def chi_square(observed: np.ndarray, expected_probs: np.ndarray, min_expected: float = 5.0) -> float:
    """p-value of a chi-square goodness-of-fit test; cells with expected count < ``min_expected`` are merged.

    Cells are sorted by expected count and the small ones pooled into one cell (pooled with the next smallest
    until the pool reaches ``min_expected``). Observations in cells of probability 0 make the p-value 0.
    """
    observed = np.asarray(observed, dtype=np.float64).ravel()
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    n = observed.sum()
    if np.any(observed[probs <= 0] > 0):
        return 0.0
    keep = probs > 0
    observed, expected = observed[keep], probs[keep] / probs[keep].sum() * n
    order = np.argsort(expected)
    observed, expected = observed[order], expected[order]
    cut = 0
    while cut < len(expected) and expected[:cut].sum() < min_expected:
        cut += 1
    if cut > 1:
        observed = np.concatenate(([observed[:cut].sum()], observed[cut:]))
        expected = np.concatenate(([expected[:cut].sum()], expected[cut:]))
    if len(expected) < 2:
        return 1.0
    return float(scipy_stats.chisquare(observed, expected).pvalue)


def exact_law(target, sampling: dict) -> np.ndarray:
    """P(t1, t2, t3 | PROMPT) under the warped target, ``[V, V, V]``, by running every continuation."""
    conts = np.array(list(itertools.product(range(VOCAB), repeat=NEW)))
    seqs = np.concatenate([np.tile(PROMPT, (len(conts), 1)), conts], axis=1)
    with torch.inference_mode():
        logits = target.causal_forward(torch.from_numpy(seqs)).float().numpy()
    law = np.ones(len(conts))
    for i in range(NEW):
        probs = warp(logits[:, len(PROMPT) - 1 + i], **sampling)
        law *= probs[np.arange(len(conts)), conts[:, i]]
    return law.reshape((VOCAB,) * NEW)


def sample_counts(target, draft, sampling: dict, seed: int, spd: bool = True, runs: int = RUNS, proposer=None):
    """Counts ``[V, V, V]`` of ``runs`` x ``ROWS`` sampled continuations of PROMPT and the runs' statistics.
    ``proposer(draft_backend)`` builds the proposer (default: ``DraftChain(draft, k=K)``); ``spd=False``: AR."""
    tb, db = backend(target, ROWS, ctx_len=8), backend(draft, ROWS, ctx_len=8)
    rng = np.random.default_rng(seed)
    counts = np.zeros((VOCAB,) * NEW, dtype=np.int64)
    stats = []
    make = proposer or (lambda d: DraftChain(d, k=K))
    for _ in range(runs):
        prop = make(db) if spd else None
        res = generate(tb, prop, [PROMPT] * ROWS, max_new_tokens=NEW, seed=rng, sampling=Sampling(**sampling))
        toks = np.array(res.tokens)
        np.add.at(counts, tuple(toks.T), 1)
        stats.append(res.stats)
    return counts, stats
