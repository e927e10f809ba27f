"""Exact verification of a token tree: greedy, and recursive rejection sampling over siblings.

Walk down from the root. At a node v the target's (warped) distribution is ``q_v``; its children ``c_1 .. c_k`` are
tried in sibling order against a residual ``r`` that starts as ``q_v`` (SpecInfer's multi-step speculative
sampling; EAGLE verifies its trees the same way):

- a *sampled* child x with proposal ``p_i`` (its distribution given the path and the earlier siblings) is accepted
  with probability ``min(1, r(x) / p_i(x))``; if not, ``r <- (r - p_i)+ / sum (r - p_i)+``;
- a *deterministic* child x (a point mass) is accepted with probability ``r(x)``; if not, ``r <- r`` without x,
  renormalised (the same rule with ``p_i = onehot(x)``).

An accepted child becomes v; when every child is rejected (or v is a leaf) one token is sampled from ``r`` and the
round ends. By the one-step identity of modified rejection sampling (docs/reference.md §3), given the history before
child i the emitted token is distributed as ``r_i``: ``P(x) = min(p_i, r_i)(x) + (1 - sum min(p_i, r_i)) r_{i+1}(x)``
and ``r_{i+1}`` depends only on ``p_i`` (not on the drawn x), so by induction over the siblings it is ``q_v``, and
by induction over the depth the emitted sequence has the target's law. That needs every ``p_i`` to be exactly the law
the child was drawn from (``accel.spd.tree``). With one child per node this is the chain's modified rejection
sampling (Chen et al. 2023).

Greedy (``Sampling.greedy``): follow the child whose token is the target's argmax (the first such sibling); emit the
argmax where none matches. Token-identical to greedy decoding of the target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from accel.spd.mrs import residual, sample
from accel.spd.tree import TokenTree, check_dists, check_structure

__all__ = ["TreeOutcome", "after_rejection", "verify_greedy", "verify_sampled"]


@dataclass
class TreeOutcome:
    """One row's verification: ``path`` = accepted node indices from the root (``path[0] = 0``), ``next_token`` = the
    target's token after them; per visited node with children: its depth, the sibling ranks tried and the accepted
    rank (-1: none), and the first child's acceptance probability (``sum min(p_1, q)``; 1/0 for greedy)."""

    path: list[int]
    next_token: int
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (depth, ranks tried, accepted rank or -1)
    overlaps: list[float] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def after_rejection(r: np.ndarray, tree: TokenTree, child: int) -> np.ndarray:
    """The residual after ``child`` was rejected against ``r``: ``(r - p)+`` normalised, ``p`` the child's proposal
    (a point mass on its token for a deterministic child). The recursion's sibling rule."""
    if tree.is_sampled(child):
        assert tree.dists is not None
        return residual(tree.dists[child], r)
    out = r.copy()
    out[int(tree.tokens[child])] = 0.0
    mass = out.sum()
    return out / mass if mass > 0 else r


def verify_sampled(tree: TokenTree, q_of: Callable[[int], np.ndarray], rng: np.random.Generator) -> TreeOutcome:
    """Recursive rejection sampling down ``tree`` (module docstring); ``q_of(i)`` is the target's warped
    distribution ``[V]`` (float64) after node i. Draws one uniform per child tried and one for the final token.

    The proposal is checked first (``SpdError``): a well-formed tree with tokens in the target's vocabulary, and
    every sampled node's distribution finite and normalised (``accel.spd.tree.check_dists``; docs/spd.md)."""
    q0 = q_of(0)
    check_structure(tree, "the tree to verify", int(np.shape(q0)[-1]))
    check_dists(tree, "the tree to verify")
    kids = tree.children()
    depths = tree.depths()
    out = TreeOutcome([0], -1)
    v = 0
    while True:
        q = q0 if v == 0 else q_of(v)
        r = q
        accepted = -1
        for rank, c in enumerate(kids[v]):
            x = int(tree.tokens[c])
            if rank == 0:
                out.overlaps.append(
                    float(np.minimum(tree.dists[c], q).sum())
                    if tree.is_sampled(c) and tree.dists is not None
                    else float(q[x])
                )
            u = rng.random()
            if tree.is_sampled(c):
                assert tree.dists is not None
                px = float(tree.dists[c, x])
                ok = px > 0 and u * px < r[x]
            else:
                ok = u < r[x]
            if ok:
                accepted = rank
                break
            r = after_rejection(r, tree, c)
        if kids[v]:
            out.steps.append((depths[v], accepted + 1 if accepted >= 0 else len(kids[v]), accepted))
        if accepted < 0:
            out.next_token = int(sample(r[None], rng)[0])
            return out
        v = kids[v][accepted]
        out.path.append(v)


def verify_greedy(tree: TokenTree, argmax_of: Callable[[int], int], vocab_size: int | None = None) -> TreeOutcome:
    """Follow the target's argmax (``argmax_of(i)``: its token after node i) down ``tree``; no random numbers.
    ``SpdError`` unless the tree is well formed (``accel.spd.tree.check_structure``: one root, parents before
    children, token ids >= 0, below ``vocab_size`` when given)."""
    check_structure(tree, "the tree to verify", vocab_size)
    kids = tree.children()
    depths = tree.depths()
    out = TreeOutcome([0], -1)
    v = 0
    while True:
        best = argmax_of(v)
        tokens = [int(tree.tokens[c]) for c in kids[v]]
        rank = tokens.index(best) if best in tokens else -1
        if kids[v]:
            out.steps.append((depths[v], rank + 1 if rank >= 0 else len(kids[v]), rank))
            out.overlaps.append(float(tokens[0] == best))
        if rank < 0:
            out.next_token = best
            return out
        v = kids[v][rank]
        out.path.append(v)
