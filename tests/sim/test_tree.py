"""Token trees (issue 16): expected tokens per round against Monte Carlo, the greedy best tree against brute force,
chains as the width-1 special case, tree rounds priced level by level, measured tree runs, `accel predict`."""

import itertools
import json

import numpy as np
import pytest

from accel.cli import main
from accel.errors import SimError
from accel.sim import (
    Deployment,
    LoopStats,
    TokenTree,
    best_tree,
    expected_tokens,
    predict_speedup,
    rank_acceptance,
    rank_acceptance_from_counts,
    rank_acceptance_from_stats,
    step_time,
    tree_expected_tokens,
    tree_speedups,
)
from accel.sim.roofline import CallShape
from accel.sim.tree import leaf_end_probability, path_probabilities

T, D, HW = "llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra"
P = np.array([[0.55, 0.2, 0.1], [0.5, 0.2, 0.1], [0.45, 0.15, 0.1], [0.4, 0.15, 0.05]])  # depth x rank


def _simulate(tree: TokenTree, p: np.ndarray, n: int, rng) -> np.ndarray:
    """Tokens per round: at each depth the target's token is rank r with probability p[d, r] (else unmatched); walk
    down the tree while the matching child exists."""
    children: dict[int, dict[int, int]] = {}
    for i, (par, r) in enumerate(zip(tree.parents, tree.ranks, strict=True)):
        children.setdefault(par, {})[r] = i
    out = np.empty(n)
    cum = np.cumsum(p, axis=1)
    for t in range(n):
        node, depth, tokens = -1, 0, 1
        while node in children and depth < len(p):
            u = rng.random()
            rank = int(np.searchsorted(cum[depth], u, side="right")) + 1  # > width: no candidate matched
            if rank > p.shape[1] or rank not in children[node]:
                break
            node, depth, tokens = children[node][rank], depth + 1, tokens + 1
        out[t] = tokens
    return out


def test_expected_tokens_vs_monte_carlo():
    rng = np.random.default_rng(7)
    tree = TokenTree(parents=[-1, -1, -1, 0, 0, 1, 3, 3, 6], ranks=[1, 2, 3, 1, 2, 1, 1, 2, 1])
    x = _simulate(tree, P, 60_000, rng)
    se = x.std() / np.sqrt(x.size)
    assert abs(x.mean() - tree_expected_tokens(tree, P)) < 4.5 * se


def test_a_chain_is_a_rank_one_tree():
    for a in (0.3, 0.8):
        for k in (1, 4, 7):
            chain = TokenTree.chain(k)
            assert tree_expected_tokens(chain, a) == pytest.approx(expected_tokens(a, k), rel=1e-12)
            assert leaf_end_probability(chain, a) == pytest.approx(a**k, rel=1e-12)
            assert chain.draft_call_widths() == [1] * k and chain.depth == k


def test_greedy_tree_is_optimal_by_brute_force():
    """Every rooted subtree of up to 5 nodes (ranks <= 3, depth <= 4): none beats best_tree's expected tokens."""
    cands = [(d, r) for d in range(4) for r in range(3)]  # not used directly; enumerate trees by parent lists
    del cands
    for n in range(1, 6):
        best = 0.0
        for parents in itertools.product(range(-1, n), repeat=n):
            if any(p >= i for i, p in enumerate(parents)):
                continue
            for ranks in itertools.product((1, 2, 3), repeat=n):
                pairs = list(zip(parents, ranks, strict=True))
                if len(set(pairs)) < n:
                    continue
                tree = TokenTree(parents=list(parents), ranks=list(ranks))
                if tree.depth > 4:
                    continue
                best = max(best, tree_expected_tokens(tree, P))
        greedy = best_tree(P, n, width=3)
        assert tree_expected_tokens(greedy, P) == pytest.approx(best, rel=1e-12), n


def test_best_tree_grows_wide_when_the_top_candidate_is_unsure():
    sure, unsure = best_tree(0.9, 8), best_tree(0.4, 8)
    assert sure.depth == 8 and sure.level_widths() == [1] * 8  # a confident draft: a chain
    assert unsure.depth < 8 and max(unsure.level_widths()) > 1
    e = [tree_expected_tokens(best_tree(0.5, n), 0.5) for n in (1, 2, 4, 8, 16)]
    assert np.all(np.diff(e) > 0)


def test_rank_acceptance_inputs_and_bad_trees():
    assert rank_acceptance(0.6, 2, 3) == pytest.approx(np.array([[0.6, 0.24, 0.096]] * 2))
    assert rank_acceptance([0.5, 0.3], 3, 2).shape == (3, 2)
    assert rank_acceptance(P, 6, 3)[5] == pytest.approx(P[-1])  # the last row repeats below
    with pytest.raises(SimError, match="sum to at most 1"):
        rank_acceptance([0.8, 0.5], 2)
    with pytest.raises(SimError, match="probabilities"):
        rank_acceptance(True, 2)
    for parents, ranks, match in [
        ([0], [1], "parent"),  # a node cannot be its own parent
        ([-1, 2, 1], [1, 1, 1], "parent"),  # parents come first
        ([-1, -1], [1, 1], "rank 1"),  # two siblings with one rank
        ([-1], [0], "ranks are"),
        ([-1] * 1025, list(range(1, 1026)), "1 to 1024"),
        ([-1, 0], [1], "ranks"),
    ]:
        with pytest.raises(SimError, match=match):
            TokenTree(parents=parents, ranks=ranks)
    assert path_probabilities(TokenTree(parents=[-1, 0], ranks=[2, 1]), 0.5) == pytest.approx([0.25, 0.125])


def test_tree_rounds_are_priced_level_by_level():
    """A tree of T nodes: one target call scoring T + 1 tokens, one draft call per expanded level (its width), and
    the catch-up of a leaf-ending path; a chain priced as a tree equals the chain prediction."""
    tree = TokenTree(parents=[-1, -1, 0, 0, 2], ranks=[1, 2, 1, 2, 1])  # levels: 2, 2, 1; expanded: root, 0, 2
    assert tree.draft_call_widths() == [1, 1, 1]
    L, a = 300, 0.6
    p = predict_speedup(T, D, HW, tree=tree, acceptance=a, prompt_len=L, gen_len=2)
    score = step_time(T, HW, CallShape(new_tokens=6, num_logits=6, context_len=L), weight_format="mxfp6").time_s
    drafts = sum(step_time(D, HW, CallShape(context_len=L + j), devices=4).time_s for j in range(3))
    more = (
        step_time(D, HW, CallShape(context_len=L, new_tokens=2), devices=4).time_s
        - step_time(D, HW, CallShape(context_len=L), devices=4).time_s
    )
    spd = p.config("mxfp6 + SpD")
    assert spd.loop_s == pytest.approx(score + drafts + leaf_end_probability(tree, a) * more, rel=1e-12)
    assert spd.expected_tokens_per_loop == pytest.approx(tree_expected_tokens(tree, a))
    wide = TokenTree(parents=[-1, -1, -1, 0, 1, 2], ranks=[1, 2, 3, 1, 1, 1])
    assert wide.draft_call_widths() == [1, 3]  # the depth-1 call feeds three tokens
    chain_as_tree = predict_speedup(T, D, HW, tree=TokenTree.chain(5), acceptance=0.7)
    chain = predict_speedup(T, D, HW, k=5, acceptance=0.7)
    assert chain_as_tree.config("mxfp6 + SpD").tpot_s == pytest.approx(chain.config("mxfp6 + SpD").tpot_s, rel=1e-12)


def test_which_tree_size():
    dep = Deployment(target=T, draft=D, hardware=HW, draft_devices=1)  # a draft on one SoC: its calls cost time
    budgets = [1, 2, 4, 8, 16, 32, 64]
    sp = tree_speedups(dep, 0.6, budgets)
    assert sp.shape == (7,) and np.argmax(sp) not in (0, 6)  # an interior optimum: trees cost target time too
    p = predict_speedup(dep, tree=8, acceptance=0.6)
    assert (
        p.best_tree_nodes
        == [1, 2, 4, 8, 16, 32, 64, 128][int(np.argmax(tree_speedups(dep, 0.6, [1, 2, 4, 8, 16, 32, 64, 128])))]
    )
    assert p.k == 8 and p.tree is not None and "best tree size" in p.table()
    with pytest.raises(SimError, match="not both"):
        predict_speedup(dep, tree=8, loop_stats={"tokens_per_loop": 2.0, "drafts_per_loop": 8.0})


def test_measured_tree_runs_reproduce_the_tree_prediction():
    """LoopStats of a tree run (tokens per call, tree size, draft calls and their width) price the same round."""
    tree = TokenTree(parents=[-1, -1, 0, 1, 2, 2], ranks=[1, 2, 1, 1, 1, 2])
    a = 0.6
    widths = tree.draft_call_widths()
    stats = LoopStats(
        tokens_per_loop=tree_expected_tokens(tree, a),
        drafts_per_loop=tree.n_nodes,
        draft_calls_per_loop=len(widths),
        draft_tokens_per_call=float(np.mean(widths)),
        all_accepted_fraction=leaf_end_probability(tree, a),
    )
    kw = dict(prompt_len=200, gen_len=64)
    analytic = predict_speedup(T, D, HW, tree=tree, acceptance=a, **kw).config("mxfp6 + SpD")
    measured = predict_speedup(T, D, HW, k=tree.n_nodes, loop_stats=stats, **kw).config("mxfp6 + SpD")
    # the draft calls are costed at the mean past length and mean width: the cost is linear in both here
    assert measured.tpot_s == pytest.approx(analytic.tpot_s, rel=2e-3)
    assert measured.expected_tokens_per_loop == pytest.approx(analytic.expected_tokens_per_loop)


def test_cli_tree_nodes(capsys):
    args = ["predict", "--target", T, "--draft", D, "--hardware", HW, "--acceptance", "0.6"]
    assert main([*args, "--tree-nodes", "12"]) == 0
    out = capsys.readouterr().out
    assert "tree of 12 nodes" in out and "tree size (best tree per budget)" in out and "64 nodes" in out
    assert main([*args, "--tree-nodes", "12", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["tree"]["parents"]) == 12 and data["best_tree_nodes"] in (1, 2, 4, 8, 12, 16, 32, 64, 128)
    assert main([*args, "--tree-nodes", "5000"]) != 0
    assert "1024" in capsys.readouterr().err
    assert main(["predict", "--target", T, "--hardware", HW, "--tree-nodes", "4"]) != 0  # no draft
    assert "need --draft" in capsys.readouterr().err


def test_rank_acceptance_from_counts_undoes_rank_order_verification():
    """Verification tries ranks in order, so accepted / tried is conditional on the earlier ranks missing."""
    got = rank_acceptance_from_counts([[100, 50, 40]], [[50, 10, 4]])  # c = 0.5, 0.2, 0.1
    np.testing.assert_allclose(got, [[0.5, 0.5 * 0.2, 0.5 * 0.8 * 0.1]])
    got = rank_acceptance_from_counts([[10, 0], [0, 0], [4, 2], [0, 0]], [[5, 0], [0, 0], [2, 1], [0, 0]])
    assert got.shape == (3, 2) and got[1].sum() == 0  # a depth without data in between: never matching
    for avail, acc, words in (
        ([[1, 2]], [[2, 0]], "accepted <= available"),
        ([[1, 2]], [[1]], "one shape"),
        ([[0, 0]], [[0, 0]], "no tried candidate"),
        ([1, 2], [1, 0], "one shape"),
        ([["x"]], [[0]], "counts"),
    ):
        with pytest.raises(SimError, match=words):
            rank_acceptance_from_counts(avail, acc)
    with pytest.raises(SimError, match="GenerationStats"):
        rank_acceptance_from_stats({"rank_available": [[1]]})


def test_rank_acceptance_from_a_real_tree_run_prices_its_tokens_per_round():
    """accel.spd's own greedy tree verification and statistics, on a target whose token at each depth is the rank-r
    candidate with probability P[d, r]: the matrix read back from GenerationStats recovers P and predicts the run's
    tokens per round; the per-rank accepted / tried rates taken as P (the wrong variant) overstate it."""
    from accel.spd.stats import StatsAccumulator
    from accel.spd.tree import TokenTree as SpdTree
    from accel.spd.verify import verify_greedy

    p = P[:3]
    tree = best_tree(p, 10, width=3, max_depth=3)
    spd_tree = SpdTree(
        tokens=np.arange(100, 101 + tree.n_nodes, dtype=np.int64),
        parents=np.array([-1, *[q + 1 for q in tree.parents]], dtype=np.int64),
    )
    kids, depths = spd_tree.children(), spd_tree.depths()
    assert all(tree.ranks[c - 1] == r + 1 for ks in kids for r, c in enumerate(ks))  # sibling order = rank
    rng = np.random.default_rng(7)
    cum = np.cumsum(p, axis=1)
    acc = StatsAccumulator("spd", k=tree.n_nodes, batch_size=1, slots=tree.depth)
    for _ in range(20_000):
        outcome = verify_greedy(spd_tree, lambda v: _target_token(v, kids, depths, cum, spd_tree.tokens, rng))
        m = outcome.accepted
        acc.add_round(tree.n_nodes + 1)
        acc.add_row(tree.n_nodes, tree.depth, True, outcome, not kids[outcome.path[-1]], m + 1, m)
    stats = acc.finish()
    measured = rank_acceptance_from_stats(stats)
    has_rank = {(d - 1, r - 1) for d, r in zip(tree.depths, tree.ranks, strict=True)}
    for d, r in has_rank:
        assert measured[d, r] == pytest.approx(p[d, r], abs=0.015), (d, r)
    assert tree_expected_tokens(tree, measured) == pytest.approx(stats.mean_tokens_per_loop, rel=0.01)
    exact = tree_expected_tokens(tree, p)
    assert stats.mean_tokens_per_loop == pytest.approx(exact, rel=0.02)
    conditional = np.divide(stats.rank_accepted, np.maximum(stats.rank_available, 1))[: tree.depth]
    assert tree_expected_tokens(tree, conditional / conditional.sum(axis=1, keepdims=True).clip(1)) > 1.05 * exact


def _target_token(v, kids, depths, cum, tokens, rng) -> int:
    """The target's token after node v: its rank-r candidate with probability P[depth, r], else an outside token."""
    rank = int(np.searchsorted(cum[min(depths[v], len(cum) - 1)], rng.random(), side="right"))
    return int(tokens[kids[v][rank]]) if rank < len(kids[v]) else 0
