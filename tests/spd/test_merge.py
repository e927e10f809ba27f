"""``Merge``: proposers' trees joined into one prefix tree. The join itself (shared prefixes, sibling order, the node
budget, sampled trees left alone), each proposer's view of the outcome, greedy equality with AR for lookup merged
into the draft's dynamic tree (torch and onnxruntime, batch 3, ragged), and distribution exactness under sampling
(chi-square against exact enumeration, with the wrong sibling rule failing)."""

from __future__ import annotations

import numpy as np
import pytest

import accel.spd.verify as verify_module
from accel.errors import SpdError
from accel.spd import GREEDY, DraftTree, Merge, NgramLookup, ProposerInfo, RowOutcome, TokenTree, generate, generate_ar
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import ALPHA, SETTINGS, chi_square, exact_law, sample_counts

torch = pytest.importorskip("torch")

CTX = 64


class Fixed:
    """Proposes the same tree (tokens below the row's last token, parents) every round; records its outcomes."""

    def __init__(self, tokens: list[int], parents: list[int], nodes: int = 16, dists=None) -> None:
        self.tokens, self.parents, self.nodes, self.dists = tokens, parents, nodes, dists
        self.seen: list[RowOutcome | None] = []

    @property
    def info(self):
        return ProposerInfo("fixed", self.nodes, 8, branching=True)

    def check(self, target) -> None:
        pass

    def start(self, run) -> None:
        pass

    def propose(self, run, rows):
        out = [None] * run.batch
        for b in np.flatnonzero(rows):
            root = int(run.tokens[b, run.n[b] - 1])
            out[b] = TokenTree(np.array([root, *self.tokens]), np.array([-1, *self.parents]), self.dists)
        return out

    def update(self, run, outcomes) -> None:
        self.seen = list(outcomes)


class _Run:
    """The few ``RunState`` fields ``Merge`` reads (one row whose last token is 7)."""

    def __init__(self, max_nodes: int = 16) -> None:
        self.batch = 1
        self.tokens = np.array([[7]])
        self.n = np.array([1])
        self.max_nodes = np.array([max_nodes])


def merged(*fixed: Fixed, max_nodes: int = 16) -> tuple[Merge, TokenTree]:
    m = Merge(*fixed)
    run = _Run(max_nodes)
    m.start(run)  # type: ignore[arg-type]
    tree = m.propose(run, np.array([True]))[0]  # type: ignore[arg-type]
    assert tree is not None
    return m, tree


def edges(tree: TokenTree) -> set[tuple[int, ...]]:
    """Every node's token path from the root (order-free description of a tree)."""
    paths: list[tuple[int, ...]] = []
    for i, p in enumerate(tree.parents.tolist()):
        paths.append((int(tree.tokens[i]),) if p < 0 else (*paths[p], int(tree.tokens[i])))
    return set(paths)


def test_merge_shares_prefixes_and_keeps_every_path():
    a = Fixed([1, 2, 3, 4], [0, 0, 1, 2])  # 7 -> {1 -> 3, 2 -> 4}
    b = Fixed([1, 3, 5, 6], [0, 1, 2, 0])  # 7 -> {1 -> 3 -> 5, 6}
    _, tree = merged(a, b)
    assert edges(tree) == {(7,), (7, 1), (7, 2), (7, 1, 3), (7, 2, 4), (7, 1, 3, 5), (7, 6)}
    assert tree.size == 7  # 1 and 1 -> 3 shared
    kids = tree.children()
    assert [int(tree.tokens[c]) for c in kids[0]] == [1, 2, 6]  # the first tree's siblings first, new ones after
    assert tree.dists is None


def test_merge_respects_the_node_budget():
    a = Fixed([1, 2], [0, 0])
    b = Fixed([5, 6, 7], [0, 1, 2])  # a chain 5 -> 6 -> 7: only what fits is kept, parents before children
    _, tree = merged(a, b, max_nodes=3)
    assert edges(tree) == {(7,), (7, 1), (7, 2), (7, 5)}


def test_sampled_trees_are_never_merged():
    dists = np.full((3, 9), 1 / 9)
    sampled = Fixed([1, 2], [0, 0], dists=dists)
    plain = Fixed([3], [0])
    _, tree = merged(sampled, plain)
    assert edges(tree) == {(7,), (7, 1), (7, 2)} and tree.dists is not None
    _, tree = merged(plain, sampled)
    assert edges(tree) == {(7,), (7, 3)} and tree.dists is None


def test_each_proposer_sees_its_own_path():
    a = Fixed([1, 2], [0, 1])  # 7 -> 1 -> 2
    b = Fixed([1, 5, 6], [0, 1, 2])  # 7 -> 1 -> 5 -> 6
    m, tree = merged(a, b)
    path = [0]
    for tok in (1, 5, 6):  # the merged path 7 -> 1 -> 5 -> 6
        path.append(next(c for c in tree.children()[path[-1]] if int(tree.tokens[c]) == tok))
    m.update(_Run(), [RowOutcome(1, tree, path)])  # type: ignore[arg-type]
    oa, ob = a.seen[0], b.seen[0]
    assert oa is not None and ob is not None
    assert [int(oa.tree.tokens[i]) for i in oa.path] == [7, 1]  # a's tree ends after 1
    assert [int(ob.tree.tokens[i]) for i in ob.path] == [7, 1, 5, 6]


def test_merge_needs_two_proposers():
    with pytest.raises(SpdError, match="at least two"):
        Merge(NgramLookup())


@pytest.fixture(scope="module")
def models():
    target = random_model(seed=1, std=0.5)
    return target, perturbed(target, seed=3, rel=0.3)


@pytest.mark.parametrize("kind", ["torch", "onnxruntime"])
def test_lookup_merged_into_tree_equals_greedy_ar(models, kind, tmp_path):
    target, draft = models
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [9], [3, 30, 11, 4, 3, 30]]
    if kind == "torch":
        tb, db = backend(target, 3, ctx_len=CTX), backend(draft, 3, ctx_len=CTX)
    else:
        from accel.backends import OrtBackend, export_onnx

        tb, db = (
            OrtBackend(export_onnx(m, tmp_path / f"{n}.onnx", ctx_len=CTX, batch_size=3, progress=False, tree=True))
            for n, m in (("target", target), ("draft", draft))
        )
    want = generate_ar(tb, prompts, max_new_tokens=24, sampling=GREEDY).tokens
    res = generate(
        tb, Merge(NgramLookup(2, 3), DraftTree(db, nodes=4, top_k=2)), prompts, max_new_tokens=24, sampling=GREEDY
    )
    assert res.tokens == want
    s = res.stats
    assert s.tree_rounds > 0 and s.accepted_drafts > 0
    assert max(i for i, c in enumerate(s.tree_nodes_histogram) if c) > 4  # lookup nodes beyond the tree's budget


def merged_proposer(db):
    return Merge(NgramLookup(1, 2), DraftTree(db, nodes=2, top_k=2, depth=2))


@pytest.fixture(scope="module")
def pair():
    target = random_model(seed=21, vocab_size=8, std=0.3)
    return target, perturbed(target, seed=22, rel=0.15)


def test_merged_tree_sampling_is_exact(pair):
    target, draft = pair
    sampling = SETTINGS["temperature"]
    counts, stats = sample_counts(target, draft, sampling, seed=203, runs=10, proposer=merged_proposer)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [lookup merged into a top-k tree]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert sum(s.tree_rounds for s in stats) > 0
    assert max(max(i for i, c in enumerate(s.tree_nodes_histogram) if c) for s in stats) > 2  # lookup joined


def test_merged_tree_wrong_rule_fails(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(verify_module, "after_rejection", lambda r, tree, child: r)
    sampling = SETTINGS["temperature"]
    counts, _ = sample_counts(target, draft, sampling, seed=203, runs=5, proposer=merged_proposer)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [merged tree, wrong rule]: {pvalue:.4g}")
    assert pvalue < ALPHA
