"""Token-tree test helpers: tree-call inputs built the simple way (an independent construction of what
``accel.spd.tree`` lays out), the paths of a tree, and the tree shapes the tests use."""

from __future__ import annotations

import numpy as np

# parents of each node (node 0 = the root, the row's last committed token; parents come first)
SHAPES = {
    "single": [-1],  # just the root: a plain target step
    "chain": [-1, 0, 1, 2],
    "wide": [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7],  # width 3 at depth 1, 2 at depths 2 and 4
    "bushy": [-1, 0, 0, 1, 1, 2, 2, 3, 5, 5, 8],
}


def path(parents: list[int], node: int) -> list[int]:
    """Node indices from the root down to ``node``."""
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]


def tree_inputs(parents: list[int], committed: int, ctx_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(position_ids [T], slot_ids [T], tree_mask [T, ctx])`` of one row's tree call: node i at slot
    ``committed + i`` and position ``committed + depth``; it sees slots ``0 .. committed - 1`` and its path."""
    t = len(parents)
    slots = committed + np.arange(t)
    pos = np.array([committed + len(path(parents, i)) - 1 for i in range(t)])
    mask = np.zeros((t, ctx_len), dtype=bool)
    mask[:, :committed] = True
    for i in range(t):
        mask[i, slots[path(parents, i)]] = True
    return pos, slots, mask


def prune(parents: list[int], max_nodes: int, max_depth: int) -> list[int]:
    """The nodes of a tree that fit a round's limits: at most ``max_nodes`` below the root (a prefix: parents come
    first, so any prefix is a tree) and ``max_depth`` levels. Value-independent, so it keeps sampling exact."""
    keep: list[int] = []
    for i in range(len(parents)):
        if len(keep) > max_nodes:
            break
        if len(path(parents, i)) - 1 <= max_depth:
            keep.append(i)
    return keep


def _subtree(parents: list[int], keep: list[int]) -> np.ndarray:
    index = {old: new for new, old in enumerate(keep)}
    return np.array([-1] + [index[parents[i]] for i in keep[1:]], dtype=np.int64)


class OracleShapes:
    """A test proposer (the ``accel.spd.Proposer`` protocol) that knows each row's greedy continuation ``reference``
    and proposes trees of a fixed shape (``parents``): under a node on the reference path one child, at a random
    sibling rank, carries the reference token with probability ``hit``; every other node carries a random wrong
    token. Greedy verification must then accept exactly the reference path, whatever rank it sits at."""

    def __init__(self, parents: list[int], reference: list[list[int]], vocab: int, hit: float = 0.8, seed: int = 0):
        self.parents, self.reference, self.vocab, self.hit = parents, reference, vocab, hit
        self.rng = np.random.default_rng(seed)

    @property
    def info(self):
        from accel.spd import ProposerInfo

        depth = max(len(path(self.parents, i)) - 1 for i in range(len(self.parents)))
        return ProposerInfo("oracle", len(self.parents) - 1, max(depth, 1), branching=True)

    def check(self, target) -> None:
        pass

    def start(self, run) -> None:
        pass

    def propose(self, run, rows):
        from accel.spd import TokenTree

        out = [None] * run.batch
        for b in np.flatnonzero(rows):
            keep = prune(self.parents, int(run.max_nodes[b]), int(run.max_depth[b]))
            parents = _subtree(self.parents, keep)
            done = int(run.n[b] - run.prompt_len[b])  # reference tokens emitted so far
            ref = self.reference[b][done:]
            tokens = np.zeros(len(keep), dtype=np.int64)
            tokens[0] = run.tokens[b, run.n[b] - 1]
            on_path = {0: 0}  # node -> its depth, for nodes on the reference path
            kids: dict[int, list[int]] = {}
            for i in range(1, len(keep)):
                kids.setdefault(int(parents[i]), []).append(i)
            for v in range(len(keep)):  # parents first
                children = kids.get(v, [])
                if not children:
                    continue
                right = -1
                if v in on_path and on_path[v] < len(ref) and self.rng.random() < self.hit:
                    right = int(self.rng.choice(children))
                    tokens[right] = ref[on_path[v]]
                    on_path[right] = on_path[v] + 1
                for c in children:
                    if c != right:
                        wrong = [
                            t
                            for t in range(self.vocab)
                            if v not in on_path or on_path[v] >= len(ref) or t != ref[on_path[v]]
                        ]
                        tokens[c] = int(self.rng.choice(wrong))
            out[b] = TokenTree(tokens, parents, source="oracle")
        return out

    def update(self, run, outcomes) -> None:
        pass


class SampledShapes:
    """A test proposer whose children are *sampled*: every node below the root is drawn, independently and with
    replacement among siblings, from a fixed distribution ``dists[i]`` ``[V]`` of its index in ``parents`` (any
    distribution will do for exactness, as long as the tree reports the one each node was drawn from)."""

    def __init__(self, parents: list[int], dists: np.ndarray):
        self.parents, self.dists = parents, dists

    @property
    def info(self):
        from accel.spd import ProposerInfo

        depth = max(len(path(self.parents, i)) - 1 for i in range(len(self.parents)))
        return ProposerInfo("sampled shapes", len(self.parents) - 1, depth, branching=True)

    def check(self, target) -> None:
        pass

    def start(self, run) -> None:
        pass

    def propose(self, run, rows):
        from accel.spd import TokenTree

        out = [None] * run.batch
        cdf = np.cumsum(self.dists, axis=1)
        u = run.rng.random((run.batch, len(self.parents)))  # every node of every row drawn at once (inverse CDF)
        drawn = np.minimum((u[:, :, None] > cdf[None]).sum(-1), self.dists.shape[1] - 1)
        for b in np.flatnonzero(rows):
            keep = prune(self.parents, int(run.max_nodes[b]), int(run.max_depth[b]))
            tokens = drawn[b, keep].astype(np.int64)
            tokens[0] = run.tokens[b, run.n[b] - 1]
            out[b] = TokenTree(tokens, _subtree(self.parents, keep), self.dists[keep], source="sampled")
        return out

    def update(self, run, outcomes) -> None:
        pass
