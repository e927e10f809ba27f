"""Token trees: what a proposer returns, how a tree is checked and laid out, and the target call that scores it.

A tree (``TokenTree``) holds one row's candidates for one round. Node 0 is the *root*: the row's last token, which
the target has not consumed yet (its K/V are written by this round's call). ``parents[i]`` is the index of node i's
parent (``parents[0] = -1``; every other parent comes earlier, ``0 <= parents[i] < i``). A chain of K drafts is the
tree ``parents = [-1, 0, 1, ..., K - 1]``; a root alone is a plain target step.

Siblings are ordered: verification tries them in order (``accel.spd.verify``), so a proposer puts its best
candidate first. For exact sampling each non-root node says how it was proposed (docs/spd.md, "Exactness"):

- *sampled*: drawn from ``dists[i]`` (float ``[V]``), the proposer's distribution for that node given its parent's
  path and the siblings before it (with replacement: the same distribution for every sibling; without replacement:
  the earlier siblings removed and the rest renormalised). Whether a sampled node is kept must not depend on its own
  value.
- *deterministic* (``sampled[i] = False``): any function of the row's tokens and the proposer's own computations
  (top-k of a draft, an n-gram lookup), verified as a point mass on ``tokens[i]``.

``layout`` orders a tree depth first with each node's children in sibling order, so the first-child chain (the
proposer's top-1 path) occupies nodes ``0 .. depth``: laid out at cache slots ``n - 1 + i``, that chain ends up at
the slots of its positions and needs no compaction when it is accepted (``TreeCall``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from accel.backends.base import TreeInputs
from accel.errors import SpdError

__all__ = [
    "DIST_SUM_TOLERANCE",
    "TokenTree",
    "TreeCall",
    "check_dists",
    "check_structure",
    "check_tree",
    "layout",
    "layout_order",
    "log_floor",
]


@dataclass(frozen=True)
class TokenTree:
    """One row's candidates (module docstring). Arrays: ``tokens`` int ``[N]`` (``tokens[0]`` = the row's last token),
    ``parents`` int ``[N]``, ``dists`` float ``[N, V]`` or None (every node deterministic), ``sampled`` bool ``[N]`` or
    None (all nodes sampled when ``dists`` is given). ``source`` names the proposer (statistics)."""

    tokens: np.ndarray
    parents: np.ndarray
    dists: np.ndarray | None = None
    sampled: np.ndarray | None = None
    source: str = "draft"
    depth_cache: list[int] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def chain(
        cls, root: int, drafts: Sequence[int] | np.ndarray, dists: np.ndarray | None = None, source: str = "draft"
    ) -> TokenTree:
        """The chain ``root -> drafts[0] -> drafts[1] ...``; ``dists [K, V]``: the distribution each draft was
        sampled from (None: deterministic guesses)."""
        d = np.asarray(drafts, dtype=np.int64).reshape(-1)
        tokens = np.concatenate(([int(root)], d)).astype(np.int64)
        parents = np.arange(-1, d.size, dtype=np.int64)
        full = None
        if dists is not None:
            full = np.zeros((d.size + 1, dists.shape[-1]))
            full[1:] = dists
        return cls(tokens, parents, full, None, source)

    @property
    def size(self) -> int:
        """Nodes, the root included (the tokens the target scores)."""
        return int(self.tokens.size)

    def depths(self) -> list[int]:
        """Depth of every node (root 0); valid after ``check_tree``."""
        if not self.depth_cache:
            out: list[int] = []
            for p in self.parents.tolist():
                out.append(0 if p < 0 else out[p] + 1)
            self.depth_cache.extend(out)
        return self.depth_cache

    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parents, np.arange(-1, self.size - 1)))

    def is_sampled(self, i: int) -> bool:
        """Whether node i was sampled from ``dists[i]`` (else it is a point mass)."""
        return self.dists is not None and (self.sampled is None or bool(self.sampled[i]))

    def children(self) -> list[list[int]]:
        """Children of every node, in sibling order."""
        out: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents.tolist()[1:], start=1):
            out[p].append(i)
        return out


def check_tree(tree: object, row: int, root: int, vocab: int, max_nodes: int, max_depth: int) -> TokenTree:
    """``SpdError`` naming the problem unless ``tree`` is a well-formed ``TokenTree`` for this row: root token =
    the row's last token, one root, parents before children (which rules out cycles), at most ``max_nodes`` nodes
    below the root and ``max_depth`` levels, tokens in the vocabulary, distributions of the right shape."""
    where = f"row {row}: the proposed tree"
    tree = check_structure(tree, where, vocab)
    tok = np.asarray(tree.tokens)
    if tok.size - 1 > max_nodes:
        raise SpdError(f"{where} has {tok.size - 1} nodes below the root; at most {max_nodes} fit this round")
    if int(tok[0]) != root:
        raise SpdError(f"{where} must start with the root: the row's last token {root} with parent -1")
    if max(tree.depths()) > max_depth:
        raise SpdError(f"{where} is {max(tree.depths())} levels deep; at most {max_depth} fit this round")
    return tree


def check_structure(tree: object, where: str = "the tree", vocab: int | None = None) -> TokenTree:
    """``SpdError`` naming the problem unless ``tree`` is a ``TokenTree`` with 1-D integer tokens and parents of one
    length, node 0 the one root (parent -1), every other parent an earlier node (no cycles), tokens in
    ``[0, vocab)`` (``>= 0`` when ``vocab`` is None), and ``dists [N, V]`` / ``sampled [N]`` of matching shapes.
    O(nodes): what verification needs to walk the tree without an IndexError."""
    if not isinstance(tree, TokenTree):
        raise SpdError(f"{where} is a {type(tree).__name__}, not an accel.spd.TokenTree")
    tok, par = np.asarray(tree.tokens), np.asarray(tree.parents)
    if tok.ndim != 1 or par.shape != tok.shape or tok.size < 1:
        raise SpdError(f"{where} needs 1-D tokens and parents of one length >= 1; got {tok.shape} and {par.shape}")
    if not (np.issubdtype(tok.dtype, np.integer) and np.issubdtype(par.dtype, np.integer)):
        raise SpdError(f"{where} has non-integer tokens or parents ({tok.dtype}, {par.dtype})")
    if int(par[0]) != -1:
        raise SpdError(f"{where} must start with the root: node 0's parent must be -1, got {int(par[0])}")
    idx = np.arange(tok.size)
    if np.any(par[1:] == -1):
        raise SpdError(f"{where} has two roots (node {int(np.flatnonzero(par[1:] == -1)[0]) + 1} has parent -1 too)")
    late = np.flatnonzero((par[1:] >= idx[1:]) | (par[1:] < -1)) + 1
    if late.size:
        i = int(late[0])
        kind = "itself (a cycle)" if par[i] == i else f"node {int(par[i])}, which does not come before it"
        raise SpdError(f"{where}: node {i}'s parent is {kind}; parents must precede their children")
    hi = np.iinfo(np.int64).max if vocab is None else vocab
    if np.any((tok < 0) | (tok >= hi)):
        bad = int(tok[(tok < 0) | (tok >= hi)][0])
        raise SpdError(f"{where} has token {bad} outside the vocabulary [0, {vocab if vocab is not None else 'V'})")
    if tree.dists is not None:
        d = np.asarray(tree.dists)
        want = (tok.size, vocab if vocab is not None else (d.shape[-1] if d.ndim == 2 else -1))
        if d.shape != want:
            raise SpdError(f"{where} has dists of shape {d.shape}; expected {want} (nodes, vocabulary)")
        if tree.sampled is not None and np.shape(tree.sampled) != tok.shape:
            raise SpdError(f"{where} has sampled flags of shape {np.shape(tree.sampled)}; expected {tok.shape}")
    return tree


#: how far a sampled node's proposal distribution may sum from 1 (float32 softmax over 10^5 tokens: ~1e-5)
DIST_SUM_TOLERANCE = 1e-3


def check_dists(tree: TokenTree, where: str = "the tree") -> None:
    """``SpdError`` unless every sampled node's proposal ``dists[i]`` is a probability distribution (finite, >= 0,
    summing to 1 within ``DIST_SUM_TOLERANCE``) that gives the node's own token a positive probability: what exact
    rejection sampling assumes of the law a node was drawn from (docs/spd.md, "A custom proposer"). Two passes over
    the sampled rows (a sum and a min). Call after ``check_structure``."""
    if tree.dists is None:
        return
    nodes = np.arange(1, tree.size)
    if tree.sampled is not None:
        nodes = nodes[np.asarray(tree.sampled, dtype=bool)[1:]]
    if nodes.size == 0:
        return
    d = np.asarray(tree.dists)[nodes]
    sums = d.sum(axis=1, dtype=np.float64)
    bad = ~np.isfinite(sums)
    if bad.any():
        raise SpdError(f"{where}: node {int(nodes[bad][0])}'s proposal distribution has NaN or infinite entries")
    low = d.min(axis=1) < 0
    if low.any():
        raise SpdError(f"{where}: node {int(nodes[low][0])}'s proposal distribution has negative entries")
    off = np.abs(sums - 1.0) > DIST_SUM_TOLERANCE
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise SpdError(
            f"{where}: node {int(nodes[i])}'s proposal distribution sums to {sums[i]:.6g}, not 1 (tolerance "
            f"{DIST_SUM_TOLERANCE:g}): give each sampled node the normalised law it was drawn from"
        )
    own = d[np.arange(nodes.size), np.asarray(tree.tokens)[nodes]]
    zero = own <= 0
    if zero.any():
        i = int(np.flatnonzero(zero)[0])
        raise SpdError(
            f"{where}: node {int(nodes[i])}'s token {int(tree.tokens[nodes[i]])} has probability 0 under its own "
            "proposal distribution, so it was not drawn from it: mark it deterministic (sampled=False) instead"
        )


def layout_order(tree: TokenTree) -> np.ndarray:
    """The node order ``layout`` uses: depth first, children in sibling order (``order[j]``: the old index of the
    new node j)."""
    kids = tree.children()
    order: list[int] = []
    stack = [0]
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(reversed(kids[v]))
    return np.asarray(order, dtype=np.int64)


def layout(tree: TokenTree) -> TokenTree:
    """The same tree in depth-first order, children in sibling order: the first-child chain becomes nodes
    ``0 .. depth`` (module docstring). A tree already in that order (a chain, for one) is returned as is."""
    perm = layout_order(tree)
    if np.array_equal(perm, np.arange(tree.size)):
        return tree
    new_index = np.empty_like(perm)
    new_index[perm] = np.arange(perm.size)
    parents = np.where(tree.parents[perm] >= 0, new_index[np.maximum(tree.parents[perm], 0)], -1)
    return TokenTree(
        tree.tokens[perm],
        parents,
        None if tree.dists is None else tree.dists[perm],
        None if tree.sampled is None else np.asarray(tree.sampled)[perm],
        tree.source,
    )


@dataclass
class TreeCall:
    """The target call that scores one tree per row, right-aligned in ``width`` columns.

    Row b's node i (laid out) sits in column ``width - T_b + i``, at position ``n_b - 1 + depth_i`` and cache slot
    ``n_b - 1 + i``; it sees the committed slots ``0 .. n_b - 2`` and the slots of its path. Inactive rows are all
    padding (position -1). ``tree_inputs`` is None when every row is a chain: a plain chain call then does the same.
    """

    ids: np.ndarray
    pos: np.ndarray
    tree_inputs: TreeInputs | None
    offsets: np.ndarray  # [B] column of each row's root

    @classmethod
    def build(cls, trees: Sequence[TokenTree | None], n: np.ndarray, ctx_len: int) -> TreeCall:
        sizes = np.array([0 if t is None else t.size for t in trees])
        width = int(max(1, sizes.max(initial=1)))
        batch = len(trees)
        ids = np.zeros((batch, width), dtype=np.int64)
        pos = np.full((batch, width), -1, dtype=np.int64)
        offsets = width - sizes
        chains = all(t is None or t.is_chain() for t in trees)
        slots = np.zeros((batch, width), dtype=np.int64) if not chains else None
        mask = np.zeros((batch, width, ctx_len), dtype=bool) if not chains else None
        for b, t in enumerate(trees):
            if t is None:
                continue
            base, cols = int(n[b]) - 1, slice(int(offsets[b]), width)
            ids[b, cols] = t.tokens
            pos[b, cols] = base + np.asarray(t.depths())
            if slots is not None and mask is not None:
                slots[b, cols] = base + np.arange(t.size)
                mask[b, cols, :base] = True
                own = mask[b, cols]
                for i, p in enumerate(t.parents.tolist()):
                    if p >= 0:
                        own[i, base : base + i] = own[p, base : base + i]
                    own[i, base + i] = True
        return cls(ids, pos, None if slots is None or mask is None else TreeInputs(slots, mask), offsets)

    def compaction(self, paths: Sequence[Sequence[int] | None], n: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``(src, dst)`` slot moves ``[B, M]`` (-1 = none) that bring each row's accepted path (laid-out node indices,
        the root first) to the slots of its positions; None when no row needs a move (the first-child chain)."""
        moves = [
            [(int(n[b]) - 1 + a, int(n[b]) - 1 + j) for j, a in enumerate(p) if a != j] if p else []
            for b, p in enumerate(paths)
        ]
        width = max((len(m) for m in moves), default=0)
        if width == 0:
            return None
        src = np.full((len(paths), width), -1, dtype=np.int64)
        dst = np.full((len(paths), width), -1, dtype=np.int64)
        for b, m in enumerate(moves):
            for j, (s, d) in enumerate(m):
                src[b, j], dst[b, j] = s, d
        return src, dst


def log_floor(prob: float) -> float:
    """A tree's probability threshold as a log-probability floor (0: no floor, ``-inf``); shared by the draft
    model's trees (``accel.spd.DraftTree``) and Hydra's (``accel.drafts.hydra.TreeShape``)."""
    return float(np.log(prob)) if prob > 0 else -np.inf
