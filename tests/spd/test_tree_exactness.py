"""Distribution exactness of token-tree speculative sampling (recursive rejection sampling over siblings).

Same setting as test_exactness.py: a random target over 8 tokens, the exact law of the 3-token continuation of a
fixed prompt by enumeration, 2,000 rows per run, a chi-square test at significance ALPHA = 0.001 at a fixed seed.
Trees of width >= 2:

- *sampled* siblings (``SampledShapes``): every node drawn i.i.d. (with replacement) from a fixed distribution and
  reported as such; width 3 at depth 1, 2 at depth 2;
- *deterministic* siblings: the draft model's dynamic top-k tree (``DraftTree``), verified as point masses;
- a deliberately wrong sibling rule (a rejected sibling leaves the residual as it was, instead of ``(r - p)+``)
  must fail the same test, for both kinds.
"""

from __future__ import annotations

import numpy as np
import pytest

import accel.spd.verify as verify_module
from accel.spd import DraftTree, Sampling, generate
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import ALPHA, NEW, PROMPT, ROWS, SETTINGS, VOCAB, chi_square, exact_law, sample_counts
from tests.helpers.trees import SampledShapes

torch = pytest.importorskip("torch")

WIDE = [-1, 0, 0, 0, 1, 1, 2]  # width 3 under the root, 2 under its first child, 1 under its second


@pytest.fixture(scope="module")
def pair():
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    return target, perturbed(target, seed=22, rel=0.15)


def proposal_dists(seed: int = 5) -> np.ndarray:
    """One fixed, non-uniform proposal distribution per node of WIDE (node 0, the root, is not sampled)."""
    return np.random.default_rng(seed).dirichlet(np.full(VOCAB, 0.7), size=len(WIDE))


def sampled_counts(target, sampling: dict, seed: int, runs: int):
    tb = backend(target, ROWS, ctx_len=8)
    rng = np.random.default_rng(seed)
    counts = np.zeros((VOCAB,) * NEW, dtype=np.int64)
    stats = []
    for _ in range(runs):
        res = generate(
            tb,
            SampledShapes(WIDE, proposal_dists()),
            [PROMPT] * ROWS,
            max_new_tokens=NEW,
            seed=rng,
            sampling=Sampling(**sampling),
        )
        np.add.at(counts, tuple(np.array(res.tokens).T), 1)
        stats.append(res.stats)
    return counts, stats


def without_residual_update(monkeypatch):
    """The wrong sibling rule: try the next sibling against the same residual."""
    monkeypatch.setattr(verify_module, "after_rejection", lambda r, tree, child: r)


@pytest.mark.parametrize("name", ["plain", "all"])
def test_sampled_siblings_are_exact(pair, name):
    target, _ = pair
    sampling = SETTINGS[name]
    counts, stats = sampled_counts(target, sampling, seed=200, runs=10)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [sampled siblings, {name}]: {pvalue:.4g}")
    assert pvalue > ALPHA
    # the sibling rule ran: second and third children at depth 0 were accepted after their elder siblings' rejection
    accepted = np.sum([s.rank_accepted[0] for s in stats], axis=0)
    assert len(accepted) == 3 and accepted[1] > 300 and accepted[2] > 300, accepted


def test_sampled_siblings_wrong_rule_fails(pair, monkeypatch):
    target, _ = pair
    without_residual_update(monkeypatch)
    counts, _ = sampled_counts(target, SETTINGS["plain"], seed=200, runs=5)
    pvalue = chi_square(counts, exact_law(target, SETTINGS["plain"]))
    print(f"chi-square p-value [sampled siblings, wrong rule]: {pvalue:.4g}")
    assert pvalue < ALPHA


def draft_tree(db):
    return DraftTree(db, nodes=6, top_k=2, depth=2)


def test_deterministic_top_k_tree_is_exact(pair):
    target, draft = pair
    sampling = SETTINGS["temperature"]
    counts, stats = sample_counts(target, draft, sampling, seed=201, runs=10, proposer=draft_tree)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [top-k tree]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert sum(s.tree_rounds for s in stats) > 0
    assert sum(s.rank_accepted[0][1] for s in stats) > 500  # second siblings accepted


def test_deterministic_top_k_tree_wrong_rule_fails(pair, monkeypatch):
    target, draft = pair
    without_residual_update(monkeypatch)
    sampling = SETTINGS["temperature"]
    counts, _ = sample_counts(target, draft, sampling, seed=201, runs=5, proposer=draft_tree)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [top-k tree, wrong rule]: {pvalue:.4g}")
    assert pvalue < ALPHA


def dynamic_tree(db):
    return DraftTree(db, nodes=6, top_k=2, depth=2, min_prob=0.1, expand_prob=0.3)


def test_dynamic_tree_is_exact(pair):
    """min_prob / expand_prob decide which top-k candidates are proposed from the draft's outputs alone: the output
    law stays the target's (the wrong sibling rule fails this setting as it fails the fixed tree above)."""
    target, draft = pair
    sampling = SETTINGS["temperature"]
    counts, stats = sample_counts(target, draft, sampling, seed=202, runs=10, proposer=dynamic_tree)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [dynamic tree]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert sum(s.tree_rounds for s in stats) > 0
    nodes = np.sum([s.tree_nodes_histogram[:7] + [0] * (7 - len(s.tree_nodes_histogram)) for s in stats], axis=0)
    assert nodes[:6].sum() > nodes[6], nodes  # the thresholds shrank most trees below the budget


def test_dynamic_tree_wrong_rule_fails(pair, monkeypatch):
    target, draft = pair
    without_residual_update(monkeypatch)
    sampling = SETTINGS["temperature"]
    counts, _ = sample_counts(target, draft, sampling, seed=202, runs=5, proposer=dynamic_tree)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [dynamic tree, wrong rule]: {pvalue:.4g}")
    assert pvalue < ALPHA
