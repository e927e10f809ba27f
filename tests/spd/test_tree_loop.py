"""Greedy token-tree speculative decoding equals greedy autoregressive decoding of the target, token for token, on
torch and onnxruntime, batch 1 and batch 3 with ragged prompts, for several tree shapes (width > 1 at several
depths, a chain, the root alone), with the draft model's dynamic tree (``DraftTree``) and with an oracle proposer
that puts the right token at random sibling ranks (so accepted paths leave the first-child chain and the cache is
compacted every round)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from accel.backends import OrtBackend, export_onnx  # noqa: E402
from accel.errors import SpdError  # noqa: E402
from accel.spd import GREEDY, DraftChain, DraftTree, FirstOf, NgramLookup, TokenTree, generate, generate_ar  # noqa: E402
from tests.helpers.decoders import backend, perturbed, random_model  # noqa: E402
from tests.helpers.spd import MAX_NEW, PROMPTS_1, PROMPTS_3  # noqa: E402
from tests.helpers.trees import SHAPES, OracleShapes  # noqa: E402

CTX = 64
BATCHES = {"b1": PROMPTS_1, "b3": PROMPTS_3}


@pytest.fixture(scope="module")
def target():
    return random_model(seed=1, std=0.5)


@pytest.fixture(scope="module")
def draft(target):
    # close enough that the draft's top-1 is often right, far enough that its rank-2/3 candidates are taken too
    return perturbed(target, seed=3, rel=0.3)


@pytest.fixture(scope="module")
def onnx_files(target, draft, tmp_path_factory):
    d = tmp_path_factory.mktemp("tree_loop")
    out = {}
    for b in (1, 3):
        for name, model in (("target", target), ("draft", draft)):
            out[(name, b)] = export_onnx(
                model, d / f"{name}{b}.onnx", ctx_len=CTX, batch_size=b, progress=False, tree=True
            )
    return out


def make(kind, name, model, files, batch):
    if kind == "torch":
        return backend(model, batch, ctx_len=CTX)
    return OrtBackend(files[(name, batch)], threads=1)


@pytest.fixture(scope="module")
def ar(target, onnx_files):
    """Greedy AR of the target per backend kind and batch (the references)."""
    return {
        (kind, b): generate_ar(
            make(kind, "target", target, onnx_files, len(p)), p, max_new_tokens=MAX_NEW, sampling=GREEDY
        )
        for kind in ("torch", "onnxruntime")
        for b, p in BATCHES.items()
    }


@pytest.mark.parametrize("kind", ["torch", "onnxruntime"])
@pytest.mark.parametrize("batch", ["b1", "b3"])
@pytest.mark.parametrize("shape", ["wide", "bushy", "chain", "single"])
def test_oracle_trees_equal_greedy_ar(target, onnx_files, ar, kind, batch, shape):
    prompts = BATCHES[batch]
    tb = make(kind, "target", target, onnx_files, len(prompts))
    ref = ar[(kind, batch)].tokens
    proposer = OracleShapes(SHAPES[shape], ref, vocab=target.config.vocab_size, seed=7)
    res = generate(tb, proposer, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ref
    s = res.stats
    if shape == "single":
        assert s.accepted_drafts == 0 and s.tokens_per_target_call == 1.0
        return
    assert s.accepted_drafts > MAX_NEW * len(prompts) // 4  # the oracle's paths were taken
    if shape in ("wide", "bushy"):
        assert s.tree_rounds > 0
        beyond_first = sum(sum(r[1:]) for r in s.rank_accepted)
        assert beyond_first > 3, s.rank_accepted  # off the first-child chain: the cache was compacted


@pytest.mark.parametrize("kind", ["torch", "onnxruntime"])
@pytest.mark.parametrize("batch", ["b1", "b3"])
@pytest.mark.parametrize(("nodes", "top_k", "depth"), [(10, 3, 4), (6, 2, None), (4, 1, None), (1, 1, 1)])
def test_draft_tree_equals_greedy_ar(target, draft, onnx_files, ar, kind, batch, nodes, top_k, depth):
    """The draft's dynamic tree: wide (width 3), binary, a chain (top_k 1) and a single node."""
    prompts = BATCHES[batch]
    tb = make(kind, "target", target, onnx_files, len(prompts))
    db = make(kind, "draft", draft, onnx_files, len(prompts))
    res = generate(
        tb, DraftTree(db, nodes=nodes, top_k=top_k, depth=depth), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    assert res.tokens == ar[(kind, batch)].tokens
    s = res.stats
    assert s.accepted_drafts > 0 and s.accepted_histogram[0] > 0
    assert max(i for i, c in enumerate(s.tree_nodes_histogram) if c) <= nodes
    if top_k > 1:
        assert s.tree_rounds > 0 and sum(sum(r[1:]) for r in s.rank_accepted) > 0
    else:
        assert s.tree_rounds == 0


def test_lookup_then_tree_equals_greedy_ar(target, draft, onnx_files, ar):
    """Proposers compose: n-gram lookup where it matches, the draft's tree elsewhere."""
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [9], [3, 30, 11, 4]]
    tb, db = backend(target, 3, ctx_len=CTX), backend(draft, 3, ctx_len=CTX)
    want = generate_ar(tb, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    res = generate(
        tb,
        FirstOf(NgramLookup(2, 3), DraftTree(db, nodes=8, top_k=2)),
        prompts,
        max_new_tokens=MAX_NEW,
        sampling=GREEDY,
    )
    assert res.tokens == want
    assert res.stats.lookup_rounds > 0 and res.stats.tree_rounds > 0


class _Fixed:
    """A proposer returning one given (possibly malformed) tree for every row."""

    def __init__(self, make_tree, branching=True):
        self.make_tree, self.branching = make_tree, branching

    @property
    def info(self):
        from accel.spd import ProposerInfo

        return ProposerInfo("fixed", 4, 4, branching=self.branching)

    def check(self, target):
        pass

    def start(self, run):
        pass

    def propose(self, run, rows):
        return [self.make_tree(int(run.tokens[b, run.n[b] - 1])) if rows[b] else None for b in range(run.batch)]

    def update(self, run, outcomes):
        pass


def _tree(tokens, parents):
    return TokenTree(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64))


@pytest.mark.parametrize(
    ("make_tree", "message"),
    [
        (lambda r: _tree([r, 1, 2, 3], [-1, 0, 3, 0]), "must precede"),  # a parent after its child
        (lambda r: _tree([r, 1, 2], [-1, 0, -1]), "two roots"),
        (lambda r: _tree([r, 1, 2], [-1, 2, 1]), "must precede"),  # a cycle
        (lambda r: _tree([r, 1, 2], [-1, 1, 0]), "cycle"),  # its own parent
        (lambda r: _tree([r, 1, 2, 3, 4, 5], [-1, 0, 0, 0, 0, 0]), "at most 4"),  # over the budget
        (lambda r: _tree([r, 1, 99], [-1, 0, 0]), "outside the vocabulary"),
        (lambda r: _tree([r + 1, 1], [-1, 0]), "must start with the root"),
        (lambda r: [r, 1, 2], "not an accel.spd.TokenTree"),
        (lambda r: TokenTree(np.array([r, 1]), np.array([-1, 0]), np.ones((2, 5))), "dists of shape"),
    ],
)
def test_malformed_trees_raise_before_any_call(target, make_tree, message):
    tb = backend(target, 1, ctx_len=CTX)
    calls = []
    real = tb.forward

    def counted(*a, **kw):
        calls.append(a[0].shape)
        return real(*a, **kw)

    tb.forward = counted
    with pytest.raises(SpdError, match=message):
        generate(tb, _Fixed(make_tree), [[5, 17, 2]], max_new_tokens=4, sampling=GREEDY)
    assert len(calls) == 1  # the prefill only: no decode call was made with the bad tree


def test_tree_proposer_needs_a_tree_target(target, draft, tmp_path):
    chain_graph = OrtBackend(export_onnx(target, tmp_path / "t.onnx", ctx_len=CTX, progress=False), threads=1)
    with pytest.raises(SpdError, match="tree inputs"):
        generate(
            chain_graph,
            DraftTree(backend(draft, 1, ctx_len=CTX), nodes=4, top_k=2),
            [[5, 17, 2]],
            max_new_tokens=4,
            sampling=GREEDY,
        )
    # a chain proposer keeps working on a chain graph
    out = generate(
        chain_graph, DraftChain(backend(draft, 1, ctx_len=CTX), k=2), [[5, 17, 2]], max_new_tokens=4, sampling=GREEDY
    )
    assert len(out.tokens[0]) == 4
