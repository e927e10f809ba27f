"""``DraftTree(min_prob=..., expand_prob=...)``, the dynamic tree: no proposed node's cumulative draft probability
is below ``min_prob`` and no expanded node's below ``expand_prob`` (recomputed from the draft model itself), the
trees shrink and the expansion stops early, greedy output stays identical to greedy AR, and a bad threshold is an
``SpdError``. And ``DraftTree`` on a draft with a
restricted LM head ranks only the head's columns, with the same trees as ranking the whole vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from accel.errors import SpdError  # noqa: E402
from accel.spd import GREEDY, DraftTree, Merge, NgramLookup, Sampling, generate, generate_ar  # noqa: E402
from tests.helpers.decoders import backend, oracle_feature_draft, perturbed, random_model  # noqa: E402
from tests.helpers.spd import MAX_NEW, PROMPTS_3  # noqa: E402

CTX = 64


@pytest.fixture(scope="module")
def target():
    return random_model(seed=1, std=0.5)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed(target, seed=3, rel=0.3)


class _Recording(DraftTree):
    """A ``DraftTree`` that keeps every row's proposed tree with the row's tokens before it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[tuple[list[int], object]] = []

    def propose(self, run, rows):
        out = super().propose(run, rows)
        for b, tree in enumerate(out):
            if tree is not None:
                self.seen.append(([int(t) for t in run.tokens[b, : run.n[b]]], tree))
        return out


def _path_probs(draft, prefix: list[int], tree) -> np.ndarray:
    """Each node's cumulative draft probability (the product along its path), from full causal passes."""
    out = np.ones(tree.size)
    for i in range(1, tree.size):
        path = []
        j = i
        while j > 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        seq = prefix + path[::-1]
        with torch.no_grad():
            logp = torch.log_softmax(draft.causal_forward(torch.tensor([seq]))[0].double(), dim=-1)
        steps = [float(logp[len(prefix) - 1 + d, tok]) for d, tok in enumerate(path[::-1])]
        out[i] = float(np.exp(sum(steps)))
    return out


@pytest.mark.parametrize("min_prob", [0.0, 0.15])
def test_no_node_below_the_threshold(target, draft, min_prob):
    """With min_prob every node's path probability is >= it; without, the same run proposes nodes below it (so this
    test can fail)."""
    prop = _Recording(backend(draft, 3, ctx_len=CTX), nodes=10, top_k=3, min_prob=min_prob)
    tb = backend(target, 3, ctx_len=CTX)
    generate(tb, prop, PROMPTS_3, max_new_tokens=12, sampling=GREEDY)
    probs = np.concatenate([_path_probs(draft, prefix, tree)[1:] for prefix, tree in prop.seen])
    if min_prob:
        assert probs.min() >= min_prob * (1 - 1e-4), probs.min()
    else:
        assert (probs < 0.15).mean() > 0.2  # the fixed budget fills up with unlikely nodes


def test_threshold_shrinks_trees_and_draft_calls_and_keeps_greedy_exact(target, draft):
    tb, db = backend(target, 3, ctx_len=CTX), backend(draft, 3, ctx_len=CTX)
    want = generate_ar(tb, PROMPTS_3, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    fixed = generate(tb, DraftTree(db, nodes=8, top_k=3), PROMPTS_3, max_new_tokens=MAX_NEW, sampling=GREEDY)
    dyn = generate(
        tb, DraftTree(db, nodes=8, top_k=3, min_prob=0.2), PROMPTS_3, max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    assert fixed.tokens == want and dyn.tokens == want
    s, d = fixed.stats, dyn.stats

    def mean(hist):
        return sum(i * c for i, c in enumerate(hist)) / sum(hist)

    assert mean(d.tree_nodes_histogram) < 0.8 * mean(s.tree_nodes_histogram)
    assert d.draft_calls_per_loop < s.draft_calls_per_loop
    assert d.accepted_drafts > 0 and "min_prob=0.2" in d.proposer


def test_merged_with_lookup_stays_exact(target, draft):
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [9], [3, 30, 11, 4]]
    tb, db = backend(target, 3, ctx_len=CTX), backend(draft, 3, ctx_len=CTX)
    want = generate_ar(tb, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    prop = Merge(NgramLookup(2, 3), DraftTree(db, nodes=6, top_k=3, min_prob=0.3))
    res = generate(tb, prop, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == want


@pytest.mark.parametrize("expand_prob", [None, 0.3])
def test_only_likely_candidates_are_expanded(target, draft, expand_prob):
    """A node with children in the tree was expanded: its path probability is >= expand_prob. Without expand_prob
    the same run expands nodes below 0.3 (so this test can fail), with more draft calls per round."""
    prop = _Recording(backend(draft, 3, ctx_len=CTX), nodes=10, top_k=3, min_prob=0.02, expand_prob=expand_prob)
    res = generate(backend(target, 3, ctx_len=CTX), prop, PROMPTS_3, max_new_tokens=12, sampling=GREEDY)
    parents = []
    for prefix, tree in prop.seen:
        probs = _path_probs(draft, prefix, tree)
        parents += [probs[p] for p in set(tree.parents[1:].tolist()) - {0}]
    assert parents  # some trees were deeper than one level
    if expand_prob:
        assert min(parents) >= expand_prob * (1 - 1e-4)
        assert "expand_prob=0.3" in res.stats.proposer
    else:
        assert min(parents) < 0.3


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2, True, "0.1", None])
def test_bad_threshold(draft, bad):
    with pytest.raises(SpdError, match="min_prob"):
        DraftTree(backend(draft, 1, ctx_len=CTX), nodes=4, min_prob=bad)
    if bad is not None:
        with pytest.raises(SpdError, match="expand_prob"):
            DraftTree(backend(draft, 1, ctx_len=CTX), nodes=4, expand_prob=bad)


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(temperature=0.7)])
def test_restricted_head_ranks_only_its_columns(target, sampling):
    head = np.arange(0, 32, 3)  # 11 of 32 tokens; the others' logits are MASKED_LOGIT
    draft = oracle_feature_draft(target, head, feature_weight=0.3)
    fast = _Recording(backend(draft, 3, ctx_len=CTX), nodes=6, top_k=3)
    full = _Recording(backend(draft, 3, ctx_len=CTX), nodes=6, top_k=3)
    full._support_known = True  # no support found: ranks all 32 columns
    runs = [
        generate(backend(target, 3, ctx_len=CTX), p, PROMPTS_3, max_new_tokens=16, sampling=sampling, seed=5)
        for p in (fast, full)
    ]
    assert fast._support is not None and fast._support.tolist() == head.tolist()
    assert runs[0].tokens == runs[1].tokens
    shapes = [[(prefix, t.tokens.tolist(), t.parents.tolist()) for prefix, t in p.seen] for p in (fast, full)]
    assert shapes[0] == shapes[1] and any(len(t) > 2 for _, t, _ in shapes[0])
