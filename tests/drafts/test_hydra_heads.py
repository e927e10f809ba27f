"""Hydra heads in torch (``accel.drafts.hydra.model``), tree growing (``tree``) and evaluation (``evaluate``)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from accel.drafts.architecture import causal_hidden  # noqa: E402
from accel.drafts.hydra import TreeShape, build_hydra, evaluate_heads, grow_trees, load_hydra, save_hydra  # noqa: E402
from accel.errors import DraftError  # noqa: E402
from accel.models.decoder import new_cache  # noqa: E402
from tests.helpers.hydra import VOCAB, random_heads, tiny_target  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def seq(target):
    tokens = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return tokens, causal_hidden(target, tokens)


@pytest.mark.parametrize("prefix", [False, True])
def test_shapes_and_distinct_layers(target, seq, prefix):
    heads = random_heads(target, num_heads=3, mlp_layers=3, prefix=prefix, head_ids=torch.arange(2, VOCAB))
    tokens, hidden = seq
    with torch.no_grad():
        states = heads.teacher_forced(hidden, tokens)
        assert [tuple(s.shape) for s in states] == [(3, 11 - i, 32) for i in (1, 2, 3)]
        logp = heads.level_logp(2, hidden[:, 4:5], torch.zeros(3, 5, 2, dtype=torch.long))
    assert logp.shape == (3, 5, VOCAB - 2)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(3, 5), atol=1e-5)
    # head i's first block reads (i + 1) x hidden; every block has its own weights (no [ResBlock] * n aliasing)
    assert [h.blocks[0].linear.in_features for h in heads.heads] == [64, 96, 128]
    weights = [b.linear.weight for h in heads.heads for b in h.blocks]
    assert len({w.data_ptr() for w in weights}) == len(weights) == 9
    assert (heads.prefix is not None) == prefix


@pytest.mark.parametrize("prefix", [False, True])
def test_sequential_dependence(target, seq, prefix):
    """Changing speculated token i changes head i+1's logits (and only heads that read it)."""
    heads = random_heads(target, num_heads=3, prefix=prefix)
    tokens, hidden = seq
    base = heads.base_states(hidden)[:, 5:6]
    path = tokens[:, 6:9][:, None, :]  # root, then 2 speculated tokens
    changed = path.clone()
    changed[..., 1] = (changed[..., 1] + 7) % VOCAB  # the first speculated token
    with torch.no_grad():
        same1 = heads.level_logp(1, base, path[..., :1]), heads.level_logp(1, base, changed[..., :1])
        h2 = heads.level_logp(2, base, path[..., :2]), heads.level_logp(2, base, changed[..., :2])
        h3 = heads.level_logp(3, base, path), heads.level_logp(3, base, changed)
    assert torch.equal(*same1)
    assert (h2[0] - h2[1]).abs().max() > 1e-2 and (h3[0] - h3[1]).abs().max() > 1e-2


def test_untrained_heads_are_the_target_head(target, seq):
    """Initialised as the identity on the base state: every head predicts what the target predicts next."""
    tokens, hidden = seq
    heads = build_hydra(target, num_heads=2, mlp_layers=2, prefix=True)
    with torch.no_grad():
        want = torch.log_softmax(target.logits(hidden[:, 3:4]), -1)
        for i in (1, 2):
            got = heads.level_logp(i, hidden[:, 3:4], tokens[:, 4 : 4 + i][:, None, :])
            assert torch.allclose(got, want, atol=1e-5)


def test_prefix_cache_equals_causal_pass(target, seq):
    heads = random_heads(target, num_heads=1, prefix=True)
    _, hidden = seq
    keys, values = new_cache(heads.target_config, 3, 16)
    pos = torch.arange(11).expand(3, 11)
    with torch.no_grad():
        a, k, v = heads.prefix_step(hidden[:, :4], pos[:, :4], keys[0], values[0])
        b, k, v = heads.prefix_step(hidden[:, 4:], pos[:, 4:], k, v)
        ref = heads.base_states(hidden)
    assert torch.allclose(torch.cat([a, b], 1), ref, atol=1e-5)


def test_save_load_roundtrip_and_errors(target, tmp_path, seq):
    heads = random_heads(target, num_heads=2, mlp_layers=2, prefix=True, head_ids=torch.arange(3, VOCAB))
    save_hydra(heads, tmp_path / "h")
    back = load_hydra(tmp_path / "h", target)
    for name, value in heads.state_dict().items():
        assert torch.equal(value, back.state_dict()[name]), name
    other = tiny_target(seed=9)
    with pytest.raises(DraftError, match="another target"):
        load_hydra(tmp_path / "h", other)
    with pytest.raises(DraftError, match="does not exist"):
        load_hydra(tmp_path / "missing", target)
    (tmp_path / "h" / "config.json").write_text('{"kind": "something"}')
    with pytest.raises(DraftError, match="not a Hydra heads config"):
        load_hydra(tmp_path / "h", target)


def test_mxfp6_heads_load(target, tmp_path):
    from accel.formats import compress_checkpoint

    heads = random_heads(target, num_heads=2, prefix=True)
    save_hydra(heads, tmp_path / "h")
    compress_checkpoint(tmp_path / "h", tmp_path / "mx", "mxfp6", progress=False)
    back = load_hydra(tmp_path / "mx", target)
    w, w6 = heads.heads[1].blocks[0].res.weight, back.heads[1].blocks[0].res.weight
    assert not torch.equal(w, w6) and torch.allclose(w, w6, atol=0.05 * float(w.detach().abs().max()))


def _toy_expand(level: int, paths: np.ndarray):
    """A deterministic fake head: children (path sum + j) mod 50 for j = 0..3, log-probs from a fixed table."""
    base = paths.sum(-1, keepdims=True)
    ids = (base + np.arange(4)) % 50
    logp = np.log(np.array([0.5, 0.25, 0.15, 0.1]) ** (1 + 0.1 * level))
    return ids, np.broadcast_to(logp, ids.shape).copy()


def test_grow_trees_budget_order_and_limits():
    shape = TreeShape(depth=3, top_k=4, beam=2, budget=7)
    trees = grow_trees(_toy_expand, np.array([3, 10]), shape, max_nodes=np.array([7, 2]), max_depth=np.array([3, 1]))
    full, small = trees
    assert len(full.tokens) == 8 and len(small.tokens) == 3
    for tree in trees:
        assert tree.parents[0] == -1 and np.all(tree.parents[1:] < np.arange(1, len(tree.parents)))
        assert np.all(tree.scores[1:] <= tree.scores[tree.parents[1:]] + 1e-12)  # scores fall down a path
        for v in range(len(tree.tokens)):  # siblings best first
            kids = np.flatnonzero(tree.parents == v)
            assert np.all(np.diff(tree.scores[kids]) <= 1e-12)
    assert np.all(small.parents[1:] == 0)  # max_depth 1
    chain = grow_trees(_toy_expand, np.array([3]), TreeShape.chain(3))[0]
    assert chain.parents.tolist() == [-1, 0, 1, 2] and chain.tokens.tolist() == [3, 3, 6, 12]
    with pytest.raises(DraftError, match="beam"):
        TreeShape(beam=0)


def _random_expand(seed: int, calls: list[int]):
    """Distinct sibling ids, random (continuous) log-probs, best first, a function of the path alone (as the heads'
    are); counts the calls."""

    def one(path: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, *path.tolist()])
        ids = (int(path.sum()) * 7 + np.arange(5)) % 997
        return ids, np.sort(np.log(rng.dirichlet(np.full(5, 0.3)) + 1e-9))[::-1]

    def expand(level: int, paths: np.ndarray):
        calls.append(level)
        out = [one(p) for p in paths.reshape(-1, level)]
        ids = np.stack([o[0] for o in out]).reshape(*paths.shape[:2], 5)
        return ids, np.stack([o[1] for o in out]).reshape(*paths.shape[:2], 5)

    return expand


def _paths(tree) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for i in range(len(tree.tokens)):
        path, v = [], i
        while v >= 0:
            path.append(int(tree.tokens[v]))
            v = int(tree.parents[v])
        out[tuple(path[::-1])] = float(tree.scores[i])
    return out


@pytest.mark.parametrize("budget", [1, 2, 4, 7])
@pytest.mark.parametrize("top_k,beam", [(1, 1), (2, 2), (4, 1), (5, 3)])
def test_early_stop_keeps_the_tree(budget, top_k, beam):
    """Stopping once nothing deeper can enter gives the tree of the full growth (the budget best of all nodes)."""
    roots = np.array([3, 10, 50])
    for seed in range(4):
        calls: list[int] = []
        shape = TreeShape(depth=4, top_k=top_k, beam=beam, budget=budget)
        trees = grow_trees(_random_expand(seed, calls), roots, shape)
        full_shape = TreeShape(depth=4, top_k=top_k, beam=beam, budget=10_000)
        full = grow_trees(_random_expand(seed, []), roots, full_shape)  # same log-probs per call: same seed
        for tree, ref in zip(trees, full, strict=True):
            every = _paths(ref)
            best = sorted(every.items(), key=lambda kv: (-kv[1], len(kv[0])))[: budget + 1]  # the root has score 0
            assert _paths(tree) == dict(best)
        assert len(calls) <= 4


def test_early_stop_saves_levels():
    """Sure first head, unsure deeper heads, budget 2: the third and fourth levels cannot enter the tree."""
    calls: list[int] = []

    def expand(level: int, paths: np.ndarray):
        calls.append(level)
        ids = paths.sum(-1, keepdims=True) + np.arange(3)
        logp = np.array([-0.01, -5.0, -5.1]) if level == 1 else np.array([-3.0, -3.1, -3.2])
        return ids, np.broadcast_to(logp, ids.shape).copy()

    tree = grow_trees(expand, np.array([1]), TreeShape(depth=4, top_k=3, beam=3, budget=2))[0]
    assert calls == [1, 2]
    assert tree.parents.tolist() == [-1, 0, 1] and tree.scores.tolist() == pytest.approx([0.0, -0.01, -3.01])


def test_evaluate_heads_chain_equals_tree_of_chain(target, seq):
    heads = random_heads(target, num_heads=3, prefix=True, head_ids=torch.arange(2, VOCAB))
    tokens, hidden = seq
    seqs, hid = list(tokens), list(hidden)
    chain = evaluate_heads(heads, seqs, [2, 3, 2], hid, shape=TreeShape.chain(3))
    assert chain.tree_tokens_per_call == pytest.approx(chain.chain_tokens_per_call[2])
    assert chain.chain_tokens_per_call[0] == pytest.approx(1 + chain.top1[0])
    # every node expanded (4 + 16 + 64 nodes): the tree holds the chain, so it accepts at least as much
    tree = evaluate_heads(heads, seqs, [2, 3, 2], hid, shape=TreeShape(depth=3, top_k=4, beam=16, budget=84))
    assert tree.tree_tokens_per_call >= chain.tree_tokens_per_call and tree.tree_nodes > chain.tree_nodes
    assert all(c >= t for c, t in zip(tree.topk_coverage, tree.top1, strict=True))
    with pytest.raises(DraftError, match="prompt length"):
        evaluate_heads(heads, seqs, [1, 3, 2], hid)
    with pytest.raises(DraftError, match="prompt length"):
        evaluate_heads(heads, seqs, [2, 8, 2], hid)  # no room for 3 heads' tokens after the prompt


@pytest.mark.parametrize("min_prob,expand_prob", [(0.02, None), (0.0, 0.1), (0.05, 0.2), (0.1, 0.01)])
@pytest.mark.parametrize("budget", [2, 4, 8])
def test_thresholds_filter_the_full_tree(min_prob, expand_prob, budget):
    """With ``min_prob`` / ``expand_prob`` the tree is the ``budget`` best of the full growth's nodes whose path
    probability is at least ``min_prob`` and whose ancestors below the root were all scored at least ``expand_prob``
    (``min_prob`` when None): only the heads' outputs decide."""
    keep, grow = np.log(min_prob or 1e-300), np.log((min_prob if expand_prob is None else expand_prob) or 1e-300)
    roots = np.array([3, 10, 50])
    for seed in range(4):
        shape = TreeShape(depth=4, top_k=5, beam=5, budget=budget).with_thresholds(min_prob, expand_prob)
        trees = grow_trees(_random_expand(seed, []), roots, shape)
        full = grow_trees(_random_expand(seed, []), roots, TreeShape(depth=4, top_k=5, beam=125, budget=10_000))
        for tree, ref in zip(trees, full, strict=True):
            every = _paths(ref)
            allowed = {
                p: s
                for p, s in every.items()
                if len(p) == 1 or (s >= keep and all(every[p[:i]] >= grow for i in range(2, len(p))))
            }
            best = sorted(allowed.items(), key=lambda kv: (-kv[1], len(kv[0])))[: budget + 1]
            assert _paths(tree) == dict(best)
            assert np.all(tree.scores >= keep)


def test_expand_prob_saves_levels_and_min_prob_empties_unsure_rounds():
    """``_toy_expand``'s best level-1 node has probability 0.5 ** 1.1 = 0.47."""
    calls: list[int] = []

    def expand(level: int, paths: np.ndarray):
        calls.append(level)
        return _toy_expand(level, paths)

    shape = TreeShape(depth=4, top_k=4, beam=4, budget=8)
    grow_trees(expand, np.array([3]), shape)
    assert len(calls) > 1
    calls.clear()
    tree = grow_trees(expand, np.array([3]), shape.with_thresholds(0.0, 0.5))[0]
    assert calls == [1] and len(tree.tokens) == 5  # nothing scores 0.5: no node is expanded, four children kept
    tree = grow_trees(expand, np.array([3]), shape.with_thresholds(0.5))[0]
    assert tree.tokens.tolist() == [3]  # the root alone: the proposer proposes nothing this round
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(DraftError, match="probability in"):
            shape.with_thresholds(bad)
        with pytest.raises(DraftError, match="expand_prob"):
            shape.with_thresholds(0.0, bad)
    assert (
        shape.with_thresholds() == shape and shape.as_dict() == TreeShape(depth=4, top_k=4, beam=4, budget=8).as_dict()
    )
    assert shape.with_thresholds(0.1, 0.2).as_dict()["expand_prob"] == 0.2
