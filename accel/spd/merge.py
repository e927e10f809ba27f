"""``Merge``: several proposers' trees for a row joined into one tree (e.g. n-gram lookup's chain inside a draft's
dynamic tree), so one target call verifies every candidate.

``FirstOf`` gives a row the first proposal offered; ``Merge`` asks every proposer and joins what they return as a
prefix tree: the first tree whole, then each later tree's nodes in its own order, a node sharing its merged parent's
child of the same token where there is one, else appended as a new child after the existing ones (while the row's
node budget ``run.max_nodes`` lasts; a node whose parent did not fit is dropped with its subtree). Every candidate's
path is kept, so a row accepts at least as much as with any single proposer's tree (greedy: exactly the longest
match), at the price of a wider target call.

Exactness: only *deterministic* trees (every node a point mass: ``DraftTree``, ``NgramLookup``, Hydra heads' top-k,
greedy ``DraftChain``) are merged: a deterministic node is exact wherever it sits (``accel.spd.tree``). A *sampled*
node's proposal law depends on its siblings, so a tree with sampled nodes is never merged: a row whose first tree is
sampled gets that tree alone, and later sampled trees are left out.

Each proposer is told (``update``) how its *own* tree fared: the accepted path of the merged tree, cut where it leaves
that proposer's tree, in that tree's own (laid-out) node indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from accel.backends.base import BackendInfo
from accel.errors import SpdError
from accel.spd.proposers import Proposer, ProposerInfo, RowOutcome, RunState, proposals
from accel.spd.tree import TokenTree, check_structure, layout, layout_order

__all__ = ["Merge"]


class Merge:
    """Every proposer's tree for a row, joined into one prefix tree (module docstring)."""

    def __init__(self, *proposers: Proposer) -> None:
        if len(proposers) < 2:
            raise SpdError("Merge needs at least two proposers (use the proposer itself for one)")
        self.proposers = proposers
        # per row, per proposer: (own laid-out tree, merged laid-out index -> own index or -1), or None
        self._maps: list[list[tuple[TokenTree, np.ndarray] | None]] = []

    @property
    def info(self) -> ProposerInfo:
        infos = [p.info for p in self.proposers]
        limits = [i.ctx_len for i in infos if i.ctx_len is not None]
        return ProposerInfo(
            " + ".join(i.name for i in infos),
            sum(i.max_nodes for i in infos),
            max(i.max_depth for i in infos),
            branching=True,
            needs_hidden=any(i.needs_hidden for i in infos),
            ctx_len=min(limits) if limits else None,
        )

    def check(self, target: BackendInfo) -> None:
        for p in self.proposers:
            p.check(target)

    def start(self, run: RunState) -> None:
        self._maps = [[None] * len(self.proposers) for _ in range(run.batch)]
        for p in self.proposers:
            p.start(run)

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        trees = [proposals(p, run, rows) for p in self.proposers]
        out: list[TokenTree | None] = [None] * run.batch
        for b in np.flatnonzero(rows).tolist():
            self._maps[b] = [None] * len(self.proposers)
            own = [None if t[b] is None else layout(check_structure(t[b], f"row {b}: a tree to merge")) for t in trees]
            out[b] = self._merge_row(b, own, int(run.max_nodes[b]))
        return out

    def _merge_row(self, b: int, own: list[TokenTree | None], budget: int) -> TokenTree | None:
        """Join one row's trees (already laid out); records each contributor's index map for ``update``."""
        present = [i for i, t in enumerate(own) if t is not None]
        if not present:
            return None
        first = own[present[0]]
        assert first is not None
        if first.dists is not None:  # a sampled tree is never merged with others
            self._maps[b][present[0]] = (first, np.arange(first.size))
            return first
        tokens, parents = first.tokens.tolist(), first.parents.tolist()
        kids: list[dict[int, int]] = [{} for _ in tokens]
        for i, p in enumerate(parents[1:], start=1):
            kids[p].setdefault(tokens[i], i)
        where = {present[0]: list(range(first.size))}  # proposer -> own index -> merged index (-1: dropped)
        for k in present[1:]:
            t = own[k]
            assert t is not None
            if t.dists is not None or int(t.tokens[0]) != tokens[0]:
                continue
            idx = [0]
            for i in range(1, t.size):
                mp, tok = idx[int(t.parents[i])], int(t.tokens[i])
                j = -1 if mp < 0 else kids[mp].get(tok, -1)
                if j < 0 and mp >= 0 and len(tokens) - 1 < budget:
                    j = len(tokens)
                    tokens.append(tok)
                    parents.append(mp)
                    kids.append({})
                    kids[mp][tok] = j
                idx.append(j)
            where[k] = idx
        sources = {own[k].source for k in where}  # type: ignore[union-attr]
        merged = TokenTree(
            np.asarray(tokens, dtype=np.int64),
            np.asarray(parents, dtype=np.int64),
            source=first.source if len(sources) == 1 else "merged",
        )
        order = layout_order(merged)
        new_index = np.empty_like(order)
        new_index[order] = np.arange(order.size)
        for k, idx in where.items():
            t = own[k]
            assert t is not None
            back = np.full(merged.size, -1, dtype=np.int64)
            for own_i, m in enumerate(idx):
                if m >= 0:
                    back[new_index[m]] = own_i
            self._maps[b][k] = (t, back)
        return layout(merged)

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        for k, p in enumerate(self.proposers):
            mine: list[RowOutcome | None] = [None] * run.batch
            for b, o in enumerate(outcomes):
                entry = self._maps[b][k] if b < len(self._maps) else None
                if o is None or entry is None:
                    continue
                tree, back = entry
                path = []
                for m in o.path:
                    if back[m] < 0:
                        break
                    path.append(int(back[m]))
                mine[b] = RowOutcome(o.n_old, tree, path)
            p.update(run, mine)
