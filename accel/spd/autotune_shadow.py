"""The lookup arm's statistics, kept current in the rounds ``AutoTune`` does not run it (``ShadowLookup``).

An n-gram lookup proposes without a draft call, so what it would have proposed in any round costs 20-30 us of host
time to know (``accel.spd.lookup.ngram_proposal`` over the row's tokens), and how that proposal would have fared can
be read off the tokens the row commits next: a chain of point masses ``d_1 .. d_k`` proposed after position ``n``
is accepted

- by greedy verification exactly up to its first disagreement with the target's greedy continuation, which is what
  the row commits (every round's tokens are the target's greedy tokens);
- by modified rejection sampling (a point mass ``d_i`` is accepted with probability ``q(d_i | d_<i)``) at least ``j``
  deep with probability ``prod_{i <= j} q(d_i | d_<i)``, which is the probability that the target's own draws, the
  tokens the row commits, start with ``d_1 .. d_j``: the committed tokens' agreement with the proposal has the law of
  the accepted count a lookup round would have had, at every depth.

So the controller keeps the lookup arm's hit rate and per-depth acceptance counts from every round, not only from the
rounds it chose the lookup in. Without it, an arm priced below no speculation after a stretch without repeats was
not run again until an exploration (``QUIET_EXPLORE`` times rarer while nothing speculates), and the text's next
repeated passage went by at one token a call (on the ``gguf-kernel-q8`` SmolLM2 target, greedy: a quarter of the
controller's rounds without speculation where the lookup alone was the fastest fixed setting).

Exactness: the proposals are a function of the row's committed tokens, and they are judged only against tokens
committed after them; the controller's choices stay functions of the past rounds (``accel.spd.autotune``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accel.spd.proposers import NgramLookup, RowOutcome, RunState
from accel.spd.tree import TokenTree

__all__ = ["ShadowLookup"]


@dataclass
class _Proposal:
    """What the lookup would have proposed for ``row`` after its first ``n_old`` tokens (``tree``: the root, the
    row's last token, then the proposal as a chain)."""

    row: int
    n_old: int
    tree: TokenTree


class ShadowLookup:
    """The proposals of the lookup arm ``arm`` (an ``NgramLookup``) in rounds it did not run, each judged once the row
    has committed enough tokens (module docstring).

    ``propose`` records a round's proposals and returns whether any row had one (the arm's hit rate);
    ``resolve`` returns the ``RowOutcome`` of every recorded proposal whose fate the committed tokens now decide: the
    tree as it would have been verified and the path the committed tokens follow down it."""

    def __init__(self, arm: int, lookup: NgramLookup) -> None:
        self.arm, self.lookup = arm, lookup
        self._pending: list[_Proposal] = []

    def reset(self) -> None:
        """Forget the proposals not judged yet (a new run)."""
        self._pending = []

    def propose(self, run: RunState, rows: np.ndarray, depth: int) -> bool:
        """Record the lookup's proposal of at most ``depth`` tokens (within the loop's limits) for every row of
        ``rows``; whether any row had one."""
        offered = False
        limits = run.loop_limits or (run.max_nodes, run.max_depth)
        for b in np.flatnonzero(rows).tolist():
            limit = int(min(depth, limits[0][b], limits[1][b]))
            if limit < 1:
                continue
            n = int(run.n[b])
            prop = self.lookup.proposal(run.tokens[b, :n], limit)
            if prop.size:
                offered = True
                self._pending.append(_Proposal(b, n, TokenTree.chain(int(run.tokens[b, n - 1]), prop, source="lookup")))
        return offered

    def resolve(self, run: RunState) -> list[RowOutcome]:
        """The outcomes the committed tokens now decide (each once); the proposals of rows that stopped are dropped."""
        done: list[RowOutcome] = []
        keep: list[_Proposal] = []
        for p in self._pending:
            drafts = p.tree.tokens[1:]
            committed = run.tokens[p.row, p.n_old : int(run.n[p.row])]
            seen = min(committed.size, drafts.size)
            differ = np.flatnonzero(committed[:seen] != drafts[:seen])
            if differ.size or seen == drafts.size:
                accepted = int(differ[0]) if differ.size else seen
                done.append(RowOutcome(p.n_old, p.tree, list(range(accepted + 1))))
            elif run.active[p.row]:
                keep.append(p)
        self._pending = keep
        return done
