"""What the controller (``accel.spd.autotune.AutoTune``) knows of a round before it chooses: whether n-gram lookup
matches.

A lookup match is known before any proposal is made (it is a function of the committed tokens), and it changes
what every shape of a round gives: an arm with lookup first (``FirstOf(Unbudgeted(NgramLookup), chain)``,
``draft_arms``) proposes the lookup's copy at no draft call where the context repeats, and the draft's chain where
it does not. Pooled into one acceptance table, the copies' deep, often accepted nodes priced the chain's deeper
budgets (a chain of 4 after lookup was predicted 1.6-4.2 tokens a call where its rounds gave 1.2-2.0) and the
free proposals priced the chain's draft calls low. So the controller keeps one *context* per case, each with its own
statistics of every arm (acceptance counts, shape evidence, plan, last choice): the rounds in which the lookup of
its arms matches every row asked ("hit") and the others ("miss"). The draft's proposal seconds do not depend on the
context and are shared by both, except those of an arm with lookup first, which proposes no draft call on a hit.

In the hit context the arms that lead with the same lookup propose the same tree (the lookup's copy, at its own
length: the budget binds only the chain behind it), so they share one arm's statistics there, at one budget, the
lookup's length ``k``; its proposal, a lookup, is priced at 0 seconds until measured.

Exactness: the context is a function of the committed tokens and the loop's limits (``RunState``), which every
proposer may read, so a choice made from it is one made from the past (``accel.spd.autotune``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from accel.spd.autotune_arm import NO_ARM, Arm, SelfSized, ShapeEvidence, Unbudgeted
from accel.spd.proposers import FirstOf, NgramLookup, Proposer, RunState

__all__ = ["HIT", "MISS", "TuneContext", "context_lookup", "hit_arms", "lookup_hit", "lookup_led"]

MISS, HIT = 0, 1  # the context indices: lookup matched not every row asked (or there is no lookup), every row


@dataclass
class TuneContext:
    """One context's statistics: ``arms`` (the controller's arms in order; arms that propose the same tree in this
    context share one ``Arm``), the shapes' own rounds, the cached plan ``(rounds, plan)``, the model's last choice
    ``(arm, nodes)``, the exploration rounds run and the rounds run in this context (its plan is recomputed every
    ``replan_every`` of them: a rare context is not re-priced at every one of its rounds)."""

    arms: list[Arm]
    evidence: ShapeEvidence
    last: tuple[int, int]
    plan: tuple[int, Any] | None = None  # (this context's rounds when it was computed, the Plan or None)
    explored: int = 0
    rounds: int = 0

    @property
    def quiet(self) -> bool:
        """Whether the model's last choice here was no speculation (exploration is then rarer and cheaper)."""
        return self.last[1] == 0

    def nodes_for(self, arm: int, nodes: int) -> int:
        """The budget a round of ``arm`` at ``nodes`` is recorded at here: ``nodes`` where the arm takes it, else its
        largest (a lookup-led arm on a hit, which proposes at the lookup's length whatever the budget)."""
        if arm == NO_ARM or nodes == 0 or nodes in self.arms[arm].budgets:
            return nodes
        return self.arms[arm].budgets[-1]


def lookup_led(proposer: Proposer) -> NgramLookup | None:
    """The lookup of an arm that proposes n-gram lookup's copy first at its own length (``FirstOf`` of an
    ``Unbudgeted(NgramLookup)`` and others, possibly ``SelfSized``), else None."""
    while isinstance(proposer, SelfSized):
        proposer = proposer.proposer
    if isinstance(proposer, FirstOf):
        first = proposer.proposers[0]
        if isinstance(first, Unbudgeted) and isinstance(first.proposer, NgramLookup):
            return first.proposer
    return None


def context_lookup(proposers: Sequence[Proposer]) -> NgramLookup | None:
    """The lookup whose match defines the hit context: the first lookup-led arm's, else the first ``NgramLookup``
    anywhere in the arms (a ``Merge`` part, a ``FirstOf`` part); None without one (one context only)."""
    for p in proposers:
        found = lookup_led(p)
        if found is not None:
            return found
    for p in proposers:
        found = _first_lookup(p)
        if found is not None:
            return found
    return None


def _first_lookup(proposer: object) -> NgramLookup | None:
    if isinstance(proposer, NgramLookup):
        return proposer
    for inner in [getattr(proposer, "proposer", None), *getattr(proposer, "proposers", ())]:
        found = _first_lookup(inner) if inner is not None else None
        if found is not None:
            return found
    return None


def hit_arms(arms: Sequence[Arm], lookup: NgramLookup) -> list[Arm]:
    """Fresh statistics of ``arms`` for the hit context: each arm's own, sharing its proposal-cost curve with
    ``arms`` (a draft's seconds do not depend on the context), except the arms led by a lookup of ``lookup``'s
    ``(n, k)``, which share one ``Arm`` at the single budget ``k`` whose proposal is priced at 0 seconds until
    measured (module docstring)."""
    out: list[Arm] = []
    led: Arm | None = None
    for a in arms:
        own = lookup_led(a.proposer)
        if own is not None and (own.n, own.k) == (lookup.n, lookup.k):
            if led is None:
                led = Arm(a.proposer, [lookup.k], decay=a.decay, window=a.window)
                led.unmeasured_propose_s = 0.0
            out.append(led)
            continue
        arm = Arm(a.proposer, a.budgets, decay=a.decay, window=a.window)
        arm.propose_costs = a.propose_costs
        out.append(arm)
    return out


def lookup_hit(lookup: NgramLookup, run: RunState, rows: np.ndarray) -> bool:
    """Whether ``lookup`` proposes for every row in ``rows`` of ``run`` within the loop's limits (those the arms'
    ``Unbudgeted`` lookup proposes within)."""
    asked = np.flatnonzero(rows).tolist()
    if run.loop_limits is not None:
        run = copy.copy(run)  # the same run with the loop's limits (the run's arrays are not written)
        run.max_nodes, run.max_depth = run.loop_limits
    return bool(asked) and all(lookup.tokens(run, b).size for b in asked)
