"""Growing a token tree from Hydra heads' probabilities under a node budget (numpy only; no torch).

One head call per level (EAGLE-2's dynamic tree, with Hydra's heads in place of a draft model):

1. level 1: head 1 on the root (the row's last token) gives ``top_k`` children, each scored by its log-probability;
2. level l = 2..depth: the ``beam`` best-scored nodes of level l-1 are expanded by head l (one call for all of them
   and all rows), ``top_k`` children each, scored by their parent's score + their own log-probability (the log of
   the heads' probability of the whole path);
3. the tree is the ``budget`` best-scored nodes (ties: shallower first). Scores never increase down a path, so the
   kept set is closed under taking parents; siblings are ordered best first (the order verification tries them).

Optional thresholds (``TreeShape.min_prob`` / ``expand_prob``, as ``accel.spd.DraftTree``'s): a node whose path
probability is below ``min_prob`` is left out (with its subtree: its children score no higher), and only nodes
scored at least ``expand_prob`` (default ``min_prob``) are expanded, so rounds where the heads are unsure propose
smaller trees and call fewer levels. Both depend only on the heads' outputs.

Two savings leave the tree unchanged (the same ``budget`` best nodes as expanding every ``beam`` nodes to full
depth; tested):

- at most ``budget // 2`` nodes of a level are expanded: a tree of ``budget`` nodes holds at most that many nodes of
  one level with a child (each such node, one child each, and an ancestor chain), and they are the level's best;
- growth stops early: once a row has ``budget`` nodes scored at least as high as the best node it would expand
  next, no deeper node can enter its tree (a child's score is at most its parent's, and ties go to the shallower
  node), so the row expands nothing more, and a level whose rows have all stopped is not called. With the small
  budgets that pay on a CPU (4 nodes) and heads that grow unsure with depth, that skips a third of the head calls.

("Unchanged" is exact in the heads' math; int8 graphs quantize a level's activations per call, so their
log-probabilities move slightly with the number of paths in a call.)

Every node is a deterministic function of the heads' outputs (top-k, not sampled), so the speculative loop verifies
each as a point mass and stays exact under greedy and sampled decoding (accel.spd.tree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from accel.errors import DraftError
from accel.spd.tree import log_floor

__all__ = ["DECODE_BUDGET", "KERNEL_DECODE_BUDGET", "GrownTree", "TreeShape", "grow_trees"]

#: Nodes below the root of the trees Hydra decodes with by default (``TreeShape.for_decoding``). Chosen by measurement
#: on a 2-core CPU (benchmarks/RESULTS.md, "Hydra heads"): a target call of 5 tokens costs ~1.1x one of 1 token there
#: while 13 tokens cost ~1.9x, and the shipped heads' 4-node tree accepts 1.81 tokens per call against 2.04 for 12
#: nodes (teacher-forced), so 4 nodes give the most tokens per second. Wider accelerators price wider trees lower.
DECODE_BUDGET = 4
#: The default budget on a target whose wider calls cost much more: accel's fused MX kernel (``*-kernel`` exports)
#: is compute-bound on a CPU, where a 5-token call costs ~2x a 1-token one against ~1.3x in float32 (Intel Xeon VM,
#: benchmarks/RESULTS.md, "The same heads on the Intel Xeon VM"): 3 nodes ran 0.97x that target's AR against 0.88x
#: for 4 (1.06x against 0.99x after n-gram lookup).
KERNEL_DECODE_BUDGET = 3

#: ``expand(level, paths [B, M, level] int64) -> (token ids [B, M, k] int64, log-probs [B, M, k] float)``
Expand = Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class TreeShape:
    """How a tree is grown (module docstring): ``depth`` levels (head calls, at most the number of heads),
    ``top_k`` children per expanded node, ``beam`` nodes expanded per level from level 2 on, at most ``budget``
    nodes below the root; ``min_prob`` / ``expand_prob`` in ``[0, 1)``: the thresholds on a node's path probability
    under the heads for being kept / expanded (module docstring; 0 and None: none; None: ``min_prob``).
    ``TreeShape.chain(k)`` is a chain of the heads' top-1 tokens."""

    depth: int = 4
    top_k: int = 4
    beam: int = 4
    budget: int = 12
    min_prob: float = 0.0
    expand_prob: float | None = None

    def __post_init__(self) -> None:
        for name in ("depth", "top_k", "beam", "budget"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DraftError(f"TreeShape.{name} must be an int >= 1; got {v!r}")
        for name in ("min_prob", "expand_prob"):
            p = getattr(self, name)
            if p is None and name == "expand_prob":
                continue
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
                raise DraftError(f"TreeShape.{name} must be a probability in [0, 1); got {p!r}")

    @classmethod
    def chain(cls, k: int) -> TreeShape:
        return cls(depth=k, top_k=1, beam=1, budget=k)

    @classmethod
    def for_decoding(cls, num_heads: int, budget: int = DECODE_BUDGET, top_k: int = 4) -> TreeShape:
        """The tree ``HydraProposer`` decodes with by default: depth ``min(4, num_heads)``, ``top_k`` children of
        each expanded node, ``top_k`` nodes expanded per level, ``budget`` nodes (``DECODE_BUDGET``). The plain
        ``TreeShape()`` (12 nodes) is the tree the heads' training score and held-out cards report."""
        return cls(depth=min(4, num_heads), top_k=top_k, beam=top_k, budget=budget)

    def with_thresholds(self, min_prob: float = 0.0, expand_prob: float | None = None) -> TreeShape:
        """This shape with the thresholds ``min_prob`` / ``expand_prob`` (``accel generate --tree-min-prob`` /
        ``--tree-expand-prob``)."""
        return replace(self, min_prob=min_prob, expand_prob=expand_prob)

    @property
    def floors(self) -> tuple[float, float]:
        """The thresholds as log-probability floors ``(keep, expand)`` (``-inf``: none)."""
        expand = self.min_prob if self.expand_prob is None else self.expand_prob
        return log_floor(self.min_prob), log_floor(expand)

    @property
    def max_nodes(self) -> int:
        """Most nodes below the root a tree of this shape can have."""
        return min(self.budget, self.top_k + (self.depth - 1) * self.beam * self.top_k)

    def as_dict(self) -> dict[str, int | float | None]:
        out: dict[str, int | float | None] = {"depth": self.depth, "top_k": self.top_k, "beam": self.beam}
        out["budget"] = self.budget
        if self.min_prob or self.expand_prob is not None:
            out.update(min_prob=self.min_prob, expand_prob=self.expand_prob)
        return out


@dataclass
class GrownTree:
    """One row's tree: ``tokens``/``parents`` int64 ``[N]`` (node 0 = the root, parents before children, siblings
    best first), ``scores`` float64 ``[N]`` (log-probability of each node's path under the heads; 0 at the root)."""

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray


def grow_trees(
    expand: Expand,
    roots: np.ndarray,
    shape: TreeShape,
    max_nodes: np.ndarray | None = None,
    max_depth: np.ndarray | None = None,
) -> list[GrownTree]:
    """One tree per row below ``roots [B]`` (module docstring). ``max_nodes`` / ``max_depth`` ``[B]``: per-row limits
    within the shape (the room a row has left); a row with a limit of 0 gets the root alone."""
    batch = int(roots.shape[0])
    cap_nodes = np.full(batch, shape.budget) if max_nodes is None else np.minimum(max_nodes, shape.budget)
    cap_depth = np.full(batch, shape.depth) if max_depth is None else np.minimum(max_depth, shape.depth)
    depth = int(min(shape.depth, max(0, int(cap_depth.max(initial=0)))))
    # per row: lists of node token, parent, score, depth, path (root first)
    tok = [[int(r)] for r in roots]
    par = [[-1] for _ in range(batch)]
    score = [[0.0] for _ in range(batch)]
    dep = [[0] for _ in range(batch)]
    paths: list[list[tuple[int, ...]]] = [[(int(r),)] for r in roots]
    frontier = [[0] if cap_nodes[b] > 0 and cap_depth[b] > 0 else [] for b in range(batch)]
    keep_floor, expand_floor = shape.floors
    for level in range(1, depth + 1):
        if not any(frontier):
            break
        width = max(len(f) for f in frontier)
        query = np.zeros((batch, width, level), dtype=np.int64)
        for b, nodes in enumerate(frontier):
            for m in range(width):
                query[b, m] = paths[b][nodes[min(m, len(nodes) - 1)]] if nodes else paths[b][0][:1] * level
        ids, logp = expand(level, query)
        ids = np.asarray(ids)[..., : shape.top_k]
        logp = np.minimum(np.asarray(logp, np.float64)[..., : shape.top_k], 0.0)  # log-probs: a path's score falls
        nxt: list[list[int]] = []
        for b, nodes in enumerate(frontier):
            new = []
            for m, parent in enumerate(nodes):
                for j in range(ids.shape[2]):
                    if not score[b][parent] + float(logp[b, m, j]) >= keep_floor:
                        continue  # below min_prob: left out (its children would score no higher)
                    new.append(len(tok[b]))
                    tok[b].append(int(ids[b, m, j]))
                    par[b].append(parent)
                    score[b].append(score[b][parent] + float(logp[b, m, j]))
                    dep[b].append(level)
                    paths[b].append((*paths[b][parent], int(ids[b, m, j])))
            row_scores = score[b]
            new.sort(key=lambda i: -row_scores[i])
            settled = new and sum(s >= row_scores[new[0]] for s in row_scores[1:]) >= cap_nodes[b]
            beam = min(shape.beam, max(1, int(cap_nodes[b]) // 2))
            grow = [i for i in new[:beam] if row_scores[i] >= expand_floor]
            nxt.append(grow if level < cap_depth[b] and not settled else [])
        frontier = nxt
    return [_select(tok[b], par[b], score[b], dep[b], int(cap_nodes[b]), int(cap_depth[b])) for b in range(batch)]


def _select(tok: list[int], par: list[int], score: list[float], dep: list[int], budget: int, depth: int) -> GrownTree:
    """The root and the ``budget`` best nodes (at most ``depth`` deep), in breadth-first order, siblings best first."""
    cand = [i for i in range(1, len(tok)) if dep[i] <= depth]
    cand.sort(key=lambda i: (-score[i], dep[i], i))
    keep = set(cand[:budget])
    order = [0, *sorted(keep, key=lambda i: (dep[i], -score[i], i))]
    index = {node: new for new, node in enumerate(order)}
    parents = [-1] + [index[par[i]] for i in order[1:]]  # every kept node's parent is kept (scores, depth ties)
    return GrownTree(
        np.asarray([tok[i] for i in order], dtype=np.int64),
        np.asarray(parents, dtype=np.int64),
        np.asarray([score[i] for i in order], dtype=np.float64),
    )
