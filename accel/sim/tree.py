"""Token trees for speculative decoding: expected tokens per round, the best tree for a node budget, its draft calls.

A tree round (Medusa, SpecInfer, EAGLE-2; docs/reference.md §9): a proposer builds a tree of T draft tokens below
the last committed token (the root); one target call scores the root and the T nodes (T + 1 tokens, a tree mask);
the longest path whose every node equals the target's own next token is accepted, plus one target token.

Acceptance model (per-rank rates): ``P[d, r]`` = probability that the target's next token at depth d + 1 equals the
draft's rank-(r + 1) candidate there (0-based arrays), the same for every parent at that depth, independent across
depths. Candidates at one position are distinct tokens, so at most one matches: ``sum_r P[d, r] <= 1``. Then

    E[tokens per round] = 1 + sum over nodes of the product of P[depth, rank] along the node's path      (exact)

and the tree of N nodes with the largest E is the one that keeps the N nodes of highest path probability: a child's
path probability never exceeds its parent's, so the greedy that repeatedly adds the frontier node of highest path
probability (EAGLE-2's dynamic tree) is optimal under this model. A chain of K is the tree whose nodes all have rank 1.

Building the tree with a draft model: one draft call per level; the root call feeds the last committed token, the
call for depth d feeds the depth-d nodes that get children (width = their number). A head proposer (Medusa/Hydra
heads) is priced the same way with the head as the "draft" model: one small call per level.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
from pydantic import ConfigDict, model_validator

from accel.errors import SimError
from accel.sim._base import MAX_TREE_NODES, SimModel, check_int

DEFAULT_WIDTH = 8  # candidates per position considered by best_tree (ranks 1..8)
MAX_BEST_TREE_WIDTH = 64


class TokenTree(SimModel):
    """A token tree below the root (the last committed token). ``parents[i]`` is the index of node i's parent (-1 =
    the root; parents come before children), ``ranks[i]`` its 1-based rank among the parent's draft candidates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parents: list[int]
    ranks: list[int]

    @model_validator(mode="after")
    def _check(self) -> TokenTree:
        n = len(self.parents)
        if not 1 <= n <= MAX_TREE_NODES:
            raise SimError(f"a token tree needs 1 to {MAX_TREE_NODES} nodes, got {n}")
        if len(self.ranks) != n:
            raise SimError(f"token tree: {n} parents but {len(self.ranks)} ranks")
        seen = set()
        for i, (p, r) in enumerate(zip(self.parents, self.ranks, strict=True)):
            if not -1 <= p < i:
                raise SimError(
                    f"token tree: node {i} has parent {p}; a parent must be -1 (the root) or an earlier node"
                )
            if not 1 <= r <= MAX_TREE_NODES:
                raise SimError(f"token tree: node {i} has rank {r}; ranks are 1 .. {MAX_TREE_NODES}")
            if (p, r) in seen:
                raise SimError(f"token tree: two children of node {p} have rank {r}")
            seen.add((p, r))
        return self

    @classmethod
    def chain(cls, k: int) -> TokenTree:
        """A chain of K rank-1 nodes (ordinary speculative decoding)."""
        k = check_int("chain length K", k, 1, MAX_TREE_NODES)
        return cls(parents=list(range(-1, k - 1)), ranks=[1] * k)

    @property
    def n_nodes(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        """Depth of each node (children of the root have depth 1)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    @property
    def depth(self) -> int:
        return max(self.depths)

    def level_widths(self) -> list[int]:
        """Nodes per depth 1 .. depth."""
        return np.bincount(self.depths, minlength=self.depth + 1)[1:].tolist()

    def draft_call_widths(self) -> list[int]:
        """Tokens fed by each draft call that builds the tree: the root (1), then per depth d >= 1 the depth-d nodes
        that have children (levels without such nodes need no call)."""
        d = self.depths
        parents = {p for p in self.parents if p >= 0}
        counts = np.bincount([d[p] for p in parents], minlength=self.depth + 1) if parents else [0]
        return [1] + [int(c) for c in counts[1:] if c > 0]


def rank_acceptance(acceptance: Any, depth: int, width: int = DEFAULT_WIDTH) -> np.ndarray:
    """Per-rank acceptance matrix ``P`` of shape (depth, width) from a single alpha (rank r matches with
    ``alpha (1 - alpha)^(r-1)``: rank 1 = alpha, the rest share the remainder geometrically - an assumption; measure
    the ranks when you can), a per-rank vector (the same at every depth), or a (depths, ranks) matrix (its last row
    repeats below). Each row must sum to at most 1."""
    depth = check_int("tree depth", depth, 1, MAX_TREE_NODES)
    width = check_int("tree width", width, 1, MAX_TREE_NODES)
    try:
        bad = isinstance(acceptance, (str, bool)) or np.asarray(acceptance).dtype == bool
        a = np.asarray(np.nan) if bad else np.asarray(acceptance, dtype=np.float64)
    except (TypeError, ValueError):
        a = np.asarray(np.nan)
    if a.ndim > 2 or a.size == 0 or a.size > MAX_TREE_NODES**2 or np.any(~np.isfinite(a)) or np.any((a < 0) | (a > 1)):
        msg = (
            f"rank acceptance must be probabilities in [0, 1] (a scalar, per rank, or depth x rank), got {acceptance!r}"
        )
        raise SimError(msg[:300])
    if a.ndim == 0:
        row = float(a) * (1.0 - float(a)) ** np.arange(width)
        return np.tile(row, (depth, 1))
    m = a[None, :] if a.ndim == 1 else a
    if np.any(m.sum(axis=1) > 1.0 + 1e-9):
        raise SimError(
            f"rank acceptance rows must sum to at most 1 (one candidate matches at most), got {m.sum(axis=1)}"
        )
    rows = np.concatenate([m, np.repeat(m[-1:], max(0, depth - len(m)), axis=0)])[:depth]
    out = np.zeros((depth, width))
    out[:, : min(width, rows.shape[1])] = rows[:, :width]
    return out


def rank_acceptance_from_counts(available: Any, accepted: Any) -> np.ndarray:
    """The per-rank acceptance matrix ``P`` (depth x rank, as ``rank_acceptance`` takes it) from a tree run's counts.

    ``available[d][r]`` = reached depth-d nodes (0 = the root) whose rank-(r + 1) child was *tried* (verification
    tries a node's children in rank order and stops at the first match, so a rank is tried only when every rank
    before it missed); ``accepted[d][r]`` = times that child matched. ``accepted / available`` is therefore the
    conditional rate ``c_r = P(rank r matches | ranks before it missed)``, and the unconditional probability the
    model needs is ``P[d, r] = c_r * prod_{j<r} (1 - c_j)`` (rows sum to ``1 - prod (1 - c_j)`` <= 1). A rank never
    tried counts as never matching; depths below the last one with data are dropped (``rank_acceptance`` repeats
    the last row). Passing the conditional rates themselves as acceptance overstates every rank after the first."""
    try:
        n = np.asarray(available, dtype=np.float64)
        a = np.asarray(accepted, dtype=np.float64)
    except (TypeError, ValueError):
        raise SimError("rank counts must be (depth x rank) arrays of counts") from None
    if n.ndim != 2 or n.shape != a.shape or n.size == 0 or n.size > MAX_TREE_NODES**2:
        raise SimError(
            f"rank counts must be two (depth x rank) arrays of one shape, at most {MAX_TREE_NODES} x "
            f"{MAX_TREE_NODES}; got shapes {n.shape} and {a.shape}"
        )
    if np.any(~np.isfinite(n)) or np.any(~np.isfinite(a)) or np.any(a < 0) or np.any(a > n):
        raise SimError("rank counts must be finite with 0 <= accepted <= available at every (depth, rank)")
    rows = np.flatnonzero(n.sum(axis=1) > 0)
    if rows.size == 0:
        raise SimError("the rank counts hold no tried candidate (no tree or chain round was verified)")
    n, a = n[: rows[-1] + 1], a[: rows[-1] + 1]
    c = np.divide(a, n, out=np.zeros_like(a), where=n > 0)
    missed_before = np.cumprod(np.concatenate([np.ones((len(c), 1)), 1.0 - c[:, :-1]], axis=1), axis=1)
    return c * missed_before


def rank_acceptance_from_stats(stats: Any) -> np.ndarray:
    """``rank_acceptance_from_counts`` of an ``accel.spd.GenerationStats`` (its ``rank_available`` and
    ``rank_accepted``): the acceptance for ``best_tree``, ``tree_expected_tokens`` and ``predict_speedup(tree=...,
    acceptance=...)``."""
    if not (hasattr(stats, "rank_available") and hasattr(stats, "rank_accepted")):
        raise SimError(f"expected GenerationStats (rank_available, rank_accepted), got {type(stats).__name__}")
    return rank_acceptance_from_counts(stats.rank_available, stats.rank_accepted)


def path_probabilities(tree: TokenTree, acceptance: Any) -> np.ndarray:
    """Probability that each node's whole path is accepted (the product of ``P[depth, rank]`` along it)."""
    p = rank_acceptance(acceptance, tree.depth, max(tree.ranks))
    out = np.empty(tree.n_nodes)
    for i, (par, r, d) in enumerate(zip(tree.parents, tree.ranks, tree.depths, strict=True)):
        out[i] = p[d - 1, r - 1] * (1.0 if par < 0 else out[par])
    return out


def tree_expected_tokens(tree: TokenTree, acceptance: Any) -> float:
    """E[tokens per round] = 1 + sum of the nodes' path probabilities (module docstring)."""
    return 1.0 + float(path_probabilities(tree, acceptance).sum())


def leaf_end_probability(tree: TokenTree, acceptance: Any) -> float:
    """Probability that the accepted path ends at a leaf (a node the draft never fed): the draft's next call then
    feeds it along with the bonus token (the chain's all-accepted catch-up)."""
    probs = path_probabilities(tree, acceptance)
    inner = {p for p in tree.parents if p >= 0}
    return float(sum(probs[i] for i in range(tree.n_nodes) if i not in inner))


def best_tree(acceptance: Any, nodes: int, *, width: int = DEFAULT_WIDTH, max_depth: int | None = None) -> TokenTree:
    """The tree of ``nodes`` nodes with the highest expected tokens per round (greedy by path probability; ties
    favour shallower, lower-rank nodes). ``width`` = ranks considered per position; ``max_depth`` caps the depth."""
    nodes = check_int("tree nodes", nodes, 1, MAX_TREE_NODES)
    width = check_int("tree width", width, 1, MAX_BEST_TREE_WIDTH)
    depth_cap = nodes if max_depth is None else check_int("max_depth", max_depth, 1, MAX_TREE_NODES)
    p = rank_acceptance(acceptance, depth_cap, width)
    heap: list[tuple[float, int, int, int]] = [(-p[0, r], 1, r + 1, -1) for r in range(p.shape[1])]
    heapq.heapify(heap)
    parents: list[int] = []
    ranks: list[int] = []
    path: list[float] = []
    while len(parents) < nodes and heap:
        neg, depth, rank, parent = heapq.heappop(heap)
        parents.append(parent)
        ranks.append(rank)
        path.append(-neg)
        if depth < depth_cap:
            i = len(parents) - 1
            for r in range(p.shape[1]):
                heapq.heappush(heap, (neg * p[depth, r], depth + 1, r + 1, i))
    return TokenTree(parents=parents, ranks=ranks)
