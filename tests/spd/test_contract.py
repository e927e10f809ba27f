"""The proposer contract checked at the verification boundary (docs/spd.md, "A custom proposer"): a tree that
breaks it is a named ``SpdError``, never an IndexError/TypeError from inside the walk or a silently wrong law."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import SpdError
from accel.spd import FirstOf, ProposerInfo, TokenTree, generate, generate_ar, verify_greedy, verify_sampled
from accel.spd.tree import check_dists
from tests.helpers.decoders import backend, random_model

V = 8
Q = np.full(V, 1.0 / V)


def _sampled_chain(dist: np.ndarray, token: int = 3) -> TokenTree:
    """The chain root 0 -> ``token``, the child marked as drawn from ``dist``."""
    return TokenTree.chain(0, [token], dists=dist[None])


def _verify(tree: TokenTree):
    return verify_sampled(tree, lambda i: Q, np.random.default_rng(0))


def test_a_normalised_proposal_is_verified():
    out = _verify(_sampled_chain(np.full(V, 1.0 / V)))
    assert out.path[0] == 0 and 0 <= out.next_token < V


@pytest.mark.parametrize(
    ("dist", "match"),
    [
        (np.full(V, 2.0 / V), "sums to 2"),  # the rows summing to 2: output law off by TV 0.35
        (np.full(V, 0.5 / V), "sums to 0.5"),
        (np.r_[np.nan, np.full(V - 1, 1.0 / (V - 1))], "NaN or infinite"),
        (np.r_[np.inf, np.zeros(V - 1)], "NaN or infinite"),
        (np.r_[-0.5, 1.5, np.zeros(V - 2)], "negative"),
        (np.r_[1.0, np.zeros(V - 1)], "probability 0 under its own"),  # token 3 cannot have been drawn from it
    ],
)
def test_verify_sampled_refuses_a_broken_proposal(dist, match):
    with pytest.raises(SpdError, match=match):
        _verify(_sampled_chain(dist))


def test_tolerance_allows_float32_rounding():
    p = np.random.default_rng(0).dirichlet(np.ones(50_000)).astype(np.float32)  # sums to 1 +- ~1e-6
    check_dists(TokenTree.chain(0, [int(np.argmax(p))], dists=p[None]))
    with pytest.raises(SpdError, match="sums to"):
        check_dists(TokenTree.chain(0, [int(np.argmax(p))], dists=(p * 1.01)[None]))


def test_deterministic_nodes_need_no_distribution():
    """Rows of point-mass nodes (``sampled=False``) are not proposals: they are not checked."""
    dists = np.zeros((2, V))
    tree = TokenTree(np.array([0, 3]), np.array([-1, 0]), dists, np.array([False, False]))
    assert _verify(tree).path[0] == 0


@pytest.mark.parametrize(
    ("parents", "match"),
    [
        ([-1, 5], "does not come before it"),
        ([-1, 1], "a cycle"),
        ([-1, -1], "two roots"),
        ([0, 0], "node 0's parent must be -1"),
        ([-1, -7], "does not come before it"),
    ],
)
def test_verify_greedy_refuses_a_malformed_parent_list(parents, match):
    tree = TokenTree(np.array([0, 3]), np.array(parents))
    with pytest.raises(SpdError, match=match):
        verify_greedy(tree, lambda i: 3)
    with pytest.raises(SpdError, match=match):
        _verify(tree)


def test_tokens_outside_the_vocabulary():
    tree = TokenTree(np.array([0, V + 2]), np.array([-1, 0]))
    with pytest.raises(SpdError, match=f"token {V + 2} outside the vocabulary"):
        verify_greedy(tree, lambda i: 3, vocab_size=V)
    with pytest.raises(SpdError, match="outside the vocabulary"):
        _verify(tree)  # the vocabulary is the target distribution's length
    with pytest.raises(SpdError, match=r"not an accel\.spd\.TokenTree"):
        verify_greedy([0, 3], lambda i: 3)  # type: ignore[arg-type]


class _Returns:
    """A custom proposer whose ``propose`` returns ``value`` (the contract: one TokenTree or None per row)."""

    def __init__(self, value) -> None:
        self.value = value

    @property
    def info(self) -> ProposerInfo:
        return ProposerInfo("returns", 2, 2)

    def check(self, target) -> None:
        pass

    def start(self, run) -> None:
        pass

    def propose(self, run, rows):
        return self.value

    def update(self, run, outcomes) -> None:
        pass


@pytest.fixture(scope="module")
def target():
    return backend(random_model(0), 1)


@pytest.mark.parametrize(("value", "got"), [(None, "got None"), ([], "got 0 entries"), ((None, None), "2 entries")])
def test_a_proposer_returning_no_list_is_named(target, value, got):
    for proposer in (_Returns(value), FirstOf(_Returns(value))):
        with pytest.raises(SpdError, match=f"returns's propose\\(\\) must return a list of 1 entries.*{got}"):
            generate(target, proposer, [[1, 2, 3]], max_new_tokens=3)


def test_a_proposer_with_a_broken_distribution_is_refused_in_generate(target):
    class Unnormalised(_Returns):
        def propose(self, run, rows):
            root = int(run.tokens[0, run.n[0] - 1])
            return [TokenTree.chain(root, [1], dists=np.full((1, 32), 2.0 / 32))]

    with pytest.raises(SpdError, match="sums to 2"):
        generate(target, Unnormalised(None), [[1, 2, 3]], max_new_tokens=3)


@pytest.mark.parametrize("eos", [10**30, 32, [10**30], [40, 99]])
def test_eos_that_no_row_can_end_on(target, eos):
    with pytest.raises(SpdError, match="outside the vocabulary"):
        generate_ar(target, [[1, 2, 3]], max_new_tokens=3, eos_token_id=eos)


def test_eos_lists_may_name_ids_beyond_the_vocabulary(target):
    assert len(generate_ar(target, [[1, 2, 3]], max_new_tokens=3, eos_token_id=[5, 10_000]).tokens[0]) >= 1
    with pytest.raises(SpdError, match="not a token id"):
        generate_ar(target, [[1, 2, 3]], max_new_tokens=3, eos_token_id=[5, 10**30])


def test_speculative_accept_refuses_an_unnormalised_draft_law():
    """The chain's modified rejection sampling has the same rule for ``p`` (only the proposed slots count)."""
    from accel.spd import speculative_accept

    p, q = np.full((2, 2, V), 1.0 / V), np.full((2, 3, V), 1.0 / V)
    p[1, 1] *= 2
    drafts = np.zeros((2, 2), dtype=np.int64)
    with pytest.raises(SpdError, match=r"p\[1, 1\] is not a probability distribution \(sums to 2"):
        speculative_accept(drafts, p, q, np.random.default_rng(0))
    out = speculative_accept(drafts, p, q, np.random.default_rng(0), num_drafts=np.array([2, 1]))  # slot 1 unused
    assert out.num_accepted.tolist() == [2, 1]
