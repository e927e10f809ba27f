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
