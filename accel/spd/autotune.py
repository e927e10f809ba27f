"""``AutoTune``: a proposer that sizes another proposer's candidates every round for the most tokens per second.

Each round it picks one node budget N for the whole call (a chain's length K = N, a tree's node budget N, or N = 0:
no speculation, every row takes a plain target step), the N of the largest

    rate(N) = E[accepted + 1 | N] / (T_propose(N) + T_call(N))                      (tokens per second, per row)

and hands the wrapped proposer tighter limits for that round (``run.max_nodes`` and ``run.max_depth`` at most N, on a
copy of the run state); every proposer already honours those limits, since the loop itself lowers them near a row's
end. With N = 0 the wrapped proposer is not called at all (its draft catches up on the skipped tokens later, as
after a lookup round). Rows share a call, so the budget is chosen for the batch.

The model (docs/spd.md, "Cost-aware speculation"):

- **E[accepted + 1 | N]** is ``accel.sim.tree``'s tree model: ``1 + h * sum`` of the path probabilities of the N
  most likely nodes (``best_tree``, ``path_probabilities``) under a per-rank acceptance ``P[depth, rank]`` estimated
  from this run's verified trees (``rank_acceptance_from_counts``: tried and accepted counts per depth and sibling
  rank, the ``GenerationStats.rank_available``/``rank_accepted`` convention), each depth's rates shrunk towards the
  rate pooled over depths (``PRIOR_WEIGHT`` pseudo-counts; the pooled rate towards ``prior_acceptance``), counts
  decayed by ``decay`` per round so the estimate follows the text. A chain proposer is priced with rank 1 only.
  ``h`` is the (decayed) fraction of rounds in which the proposer offered a tree at all (lookup misses).
- **T_call(N)** = ``h * C(N + 1) + (1 - h) * C(1)``, ``C(S)`` the measured seconds from the end of ``propose`` to
  ``update`` in rounds whose widest tree scored S tokens: the target call, verification, compaction and host time
  (``accel.spd.costs.CostCurve``: medians of recent samples, fitted nondecreasing in S). ``AutoTune.probe(target)``
  times the target's call alone before a run (``probe_target``, a separate curve) at 1 token and a ladder of sizes
  up to N_max + 1 (all up to 5, then doubling: the curve interpolates between them). A size with real rounds is
  priced from them; a size only the probe timed is priced as the probe's time scaled by the median ratio of real to
  probe time over the sizes both timed (verification and host time make a real round dearer than the bare call,
  by 9-21% measured on SmolLM2 targets; unscaled, the sizes the controller never picks would look cheap).
- **T_propose(N)**: the measured seconds of the wrapped proposer's ``propose`` at budget N (its draft calls and
  catch-up), a second ``CostCurve``; 0 at N = 0.

These are the terms of ``accel.sim.rounds``' round (draft calls + catch-up + the scoring call + host), measured here
as two totals instead of priced from a roofline: the simulator's expected tokens and this controller's are one
formula, its seconds come from the hardware model and these from the clock.

Phases: the controller's first rounds (``probe``) try N_max, 0, 1 and N_max / 2 so both curves have points; every
``explore_every``-th round later (``explore``) tries a neighbour of the last choice (N + 1, then N - 1), which keeps
the curves near the optimum current as the machine's load changes and reaches deeper acceptance statistics; the other
rounds take the best N (``model``) of a plan recomputed every ``replan_every`` rounds (pricing every budget costs ~1.5
ms of host time, 6-8% of a SmolLM2 round; the plan is a function of the past either way). When a curve has no valid
sample (a clock returning zero, NaN or negative differences; every sample is refused, ``CostCurve``) the controller
runs ``fallback`` nodes (default: the wrapped proposer's own ``max_nodes``, its fixed shape) and says so in
``GenerationStats.tuned_rounds`` (``phase = "fallback"``): never a division by zero, never a hang. Its learned state
persists across ``generate`` calls (``reset()`` forgets it).

Exactness: the budget is a function of the previous rounds only (their verified trees, their timings, which
proposals were offered) and of the clock, never of the target's output for the current round: it is fixed before
the wrapped proposer is called and before the target scores anything. Limits that are functions of the past are
what the loop already gives every proposer, so the wrapped proposer's trees are exactly what it would propose under
those limits, and its exactness carries over (greedy = the target's greedy decoding, sampling = the target's law:
``tests/spd/test_autotune.py``, with a peeking controller that fails the same chi-square test).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from accel.backends.base import Backend, BackendInfo
from accel.errors import SpdError
from accel.sim.tree import best_tree, path_probabilities, rank_acceptance_from_counts
from accel.spd.costs import DEFAULT_WINDOW, CostCurve, probe_target
from accel.spd.proposers import Proposer, ProposerInfo, RowOutcome, RunState, proposals
from accel.spd.stats import TunedRound
from accel.spd.tree import TokenTree

__all__ = ["AutoTune", "Plan"]

PRIOR_WEIGHT = 2.0  # pseudo-counts pulling a depth's acceptance towards the pooled rate (and that towards the prior)
Phase = Literal["probe", "explore", "model", "fallback"]
MAX_WIDTH = 64  # sibling ranks counted and priced per node (accel.sim.tree.MAX_BEST_TREE_WIDTH)


@dataclass(frozen=True)
class Plan:
    """The model's prediction for each candidate budget ``nodes`` (0 first): tokens per row and call, seconds of the
    call (target + verification + host) and of the proposal."""

    nodes: np.ndarray
    tokens: np.ndarray
    call_s: np.ndarray
    propose_s: np.ndarray

    @property
    def tokens_per_s(self) -> np.ndarray:
        """Predicted tokens per second per row at each budget."""
        return self.tokens / (self.call_s + self.propose_s)

    def best(self) -> int:
        """The budget of the highest rate (the smallest on ties)."""
        return int(self.nodes[int(np.argmax(self.tokens_per_s))])

    def at(self, nodes: int) -> tuple[float, float, float]:
        """``(tokens, call_s, propose_s)`` predicted at budget ``nodes``."""
        i = int(np.flatnonzero(self.nodes == nodes)[0])
        return float(self.tokens[i]), float(self.call_s[i]), float(self.propose_s[i])


@dataclass
class _Pending:
    """What ``propose`` decided, for ``update`` to compare with what happened."""

    nodes: int
    phase: Phase
    rows: np.ndarray
    propose_s: float
    t_end: float
    offered: bool
    predicted: tuple[float, float, float]


class AutoTune:
    """Sizes ``proposer``'s trees per round for tokens per second (module docstring).

    Args:
        proposer: any ``Proposer`` that honours ``run.max_nodes`` / ``run.max_depth`` (``DraftChain``, ``DraftTree``,
            ``NgramLookup``, ``FirstOf``, ``Merge``, ...); its ``max_nodes`` is the largest budget tried.
        budgets: the node budgets to choose from besides 0 (default: 1 .. ``max_nodes``).
        fallback: the budget run when the costs cannot be measured (default: the largest budget; 0 = AR).
        prior_acceptance: the rank-1 acceptance assumed before any round was verified (later ranks: half of it).
        decay: per-round weight of the old acceptance counts, in (0, 1] (1 = never forget).
        explore_every: every this many rounds a neighbour of the chosen budget is re-measured (0 = never).
        replan_every: the model's plan is recomputed every this many rounds (>= 1) and kept in between: pricing
            every budget costs about 1.5 ms of host time, 6-8% of a 20-25 ms round on SmolLM2 targets.
        window: timing samples kept per size (``CostCurve``).
        clock: seconds for timing (``time.perf_counter``).
    """

    def __init__(
        self,
        proposer: Proposer,
        *,
        budgets: Sequence[int] | None = None,
        fallback: int | None = None,
        prior_acceptance: float = 0.5,
        decay: float = 0.97,
        explore_every: int = 16,
        replan_every: int = 8,
        window: int = DEFAULT_WINDOW,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(proposer, Proposer):
            raise SpdError(f"AutoTune wraps an accel.spd.Proposer; got {type(proposer).__name__}")
        self.proposer = proposer
        top = proposer.info.max_nodes
        allowed = list(range(1, top + 1)) if budgets is None else sorted({int(b) for b in budgets})
        if not allowed or allowed[0] < 1 or allowed[-1] > top:
            raise SpdError(
                f"AutoTune budgets must be node counts in 1 .. {top} (the proposer's max_nodes); got {budgets}"
            )
        self.budgets = allowed
        self.fallback = allowed[-1] if fallback is None else int(fallback)
        if not (self.fallback == 0 or self.fallback in allowed):
            raise SpdError(f"AutoTune fallback must be 0 or one of the budgets {allowed}; got {fallback!r}")
        if not (isinstance(prior_acceptance, (int, float)) and 0.0 < prior_acceptance < 1.0):
            raise SpdError(f"AutoTune prior_acceptance must be in (0, 1); got {prior_acceptance!r}")
        if not (isinstance(decay, (int, float)) and 0.0 < decay <= 1.0):
            raise SpdError(f"AutoTune decay must be in (0, 1]; got {decay!r}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, int) or explore_every < 0:
            raise SpdError(f"AutoTune explore_every must be an int >= 0; got {explore_every!r}")
        if isinstance(replan_every, bool) or not isinstance(replan_every, int) or replan_every < 1:
            raise SpdError(f"AutoTune replan_every must be an int >= 1; got {replan_every!r}")
        self.prior_acceptance, self.decay, self.explore_every = float(prior_acceptance), float(decay), explore_every
        self.replan_every = replan_every
        self.window, self.clock = window, clock
        self.reset()

    def reset(self) -> None:
        """Forget everything learned: timings, acceptance counts, the probe."""
        self.call_costs = CostCurve("target call", self.window)  # by tokens scored per row: call + verify + host
        self.probe_costs = CostCurve("target probe", self.window)  # the bare target call before the run
        self.propose_costs = CostCurve("proposal", self.window)  # by node budget
        depth = max(1, self.proposer.info.max_depth)
        self._available = np.zeros((depth, 1))
        self._accepted = np.zeros((depth, 1))
        self._offered = np.array([1.0, 1.0])  # decayed (rounds with a tree offered, rounds asked); prior 1 of 1
        self.rounds = 0
        self._last = self.budgets[-1]
        self._explored = 0
        self._pending: _Pending | None = None
        self._plan: tuple[int, Plan | None] | None = None  # (round it was computed at, plan)
        mid = self.budgets[(len(self.budgets) - 1) // 2]
        self._schedule = list(dict.fromkeys([self.budgets[-1], 0, self.budgets[0], mid]))

    # ------------------------------------------------------------------ the Proposer protocol

    @property
    def info(self) -> ProposerInfo:
        i = self.proposer.info
        return ProposerInfo(f"autotune({i.name})", i.max_nodes, i.max_depth, i.branching, i.needs_hidden, i.ctx_len)

    def check(self, target: BackendInfo) -> None:
        self.proposer.check(target)

    def start(self, run: RunState) -> None:
        self._pending = None
        self.proposer.start(run)

    def _cached_plan(self) -> Plan | None:
        """``plan()``, recomputed every ``replan_every`` rounds (a function of the past rounds either way)."""
        if self._plan is None or self.rounds - self._plan[0] >= self.replan_every or self._plan[1] is None:
            self._plan = (self.rounds, self.plan())
        return self._plan[1]

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        plan = self._cached_plan()
        nodes, phase = self._choose(plan)
        predicted = plan.at(nodes) if plan is not None else (math.nan, math.nan, math.nan)
        out: list[TokenTree | None] = [None] * run.batch
        t0 = self.clock()
        if nodes > 0:
            view = copy.copy(run)  # the same run, tighter limits for this round (the run's arrays are not written)
            view.max_nodes = np.minimum(run.max_nodes, nodes)
            view.max_depth = np.minimum(run.max_depth, nodes)
            out = proposals(self.proposer, view, rows)
        t_end = self.clock()
        offered = any(t is not None for t in out)
        self._pending = _Pending(nodes, phase, rows.copy(), t_end - t0, t_end, offered, predicted)
        return out

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        t = self.clock()
        self.proposer.update(run, outcomes)
        pending, self._pending = self._pending, None
        if pending is None:  # the loop asked no row this round (every row at its end)
            return
        self.rounds += 1
        width = max([o.tree.size for o in outcomes if o is not None], default=1)
        call_s = t - pending.t_end
        self.call_costs.observe(width, call_s)
        if pending.nodes > 0:
            self.propose_costs.observe(pending.nodes, pending.propose_s)
            self._offered = self._offered * self.decay + [float(pending.offered), 1.0]
            self._count(outcomes)
        asked = np.flatnonzero(pending.rows)
        tokens = [o.accepted + 1 if o is not None else 1 for o in (outcomes[b] for b in asked.tolist())]
        record = TunedRound(
            nodes=pending.nodes,
            phase=pending.phase,
            call_tokens=width,
            predicted_tokens_per_call=pending.predicted[0],
            tokens_per_call=float(np.mean(tokens)) if tokens else math.nan,
            predicted_call_s=pending.predicted[1],
            call_s=call_s,
            predicted_propose_s=pending.predicted[2],
            propose_s=pending.propose_s,
        )
        stats = getattr(run, "_stats", None)  # the run's StatsAccumulator: the record ends up in GenerationStats
        if stats is not None and hasattr(stats, "tuned"):
            stats.tuned.append(record)

    # ------------------------------------------------------------------ the model

    def probe(self, target: Backend, repeats: int = 2) -> CostCurve:
        """Time the target's bare call before ``generate`` (which resets the target) at 1 token and ``probe_sizes()``
        (``probe_target``, ``repeats`` samples per size) into ``probe_costs``, which is returned; ``SpdError`` if
        the probe fails. Real rounds are priced from their own timings where they exist (module docstring)."""
        return probe_target(target, self.probe_sizes(), repeats=repeats, curve=self.probe_costs, clock=self.clock)

    def probe_sizes(self) -> list[int]:
        """Tokens per call the probe times: 1, every budget + 1 up to 5, then doubling, and the largest + 1."""
        top = self.budgets[-1] + 1
        ladder = {1, top, *(b + 1 for b in self.budgets if b + 1 <= 5)}
        size = 8
        while size < top:
            ladder.add(size)
            size *= 2
        return sorted(ladder)

    def call_curve(self) -> CostCurve:
        """The call-cost curve the model prices with: real rounds' medians where measured, the probe's elsewhere
        scaled by the median real / probe ratio over the sizes both timed (1 without such a size)."""
        real, bare = self.call_costs, self.probe_costs
        if not bare.sizes:
            return real
        both = [s for s in real.sizes if s in bare.sizes]
        ratio = float(np.median([_median(real, s) / _median(bare, s) for s in both])) if both else 1.0
        merged = CostCurve("target call", 1)
        for size in sorted(set(real.sizes) | set(bare.sizes)):
            merged.observe(size, _median(real, size) if size in real.sizes else ratio * _median(bare, size))
        return merged

    def acceptance(self) -> np.ndarray:
        """The per-rank acceptance matrix ``P[depth, rank]`` the model uses (``accel.sim.tree`` convention): this
        run's decayed counts, each depth shrunk towards the pooled rate, that towards the prior."""
        width = self._available.shape[1] if self.proposer.info.branching else 1
        avail, acc = self._available[:, :width], self._accepted[:, :width]
        prior = np.full(width, self.prior_acceptance / 2.0)
        prior[0] = self.prior_acceptance
        pooled = (acc.sum(axis=0) + PRIOR_WEIGHT * prior) / (avail.sum(axis=0) + PRIOR_WEIGHT)
        return rank_acceptance_from_counts(avail + PRIOR_WEIGHT, acc + PRIOR_WEIGHT * pooled)

    def plan(self) -> Plan | None:
        """The predictions for budget 0 and every budget; None while a cost curve has no valid sample."""
        calls = self.call_curve()
        c1 = calls.seconds(1)
        if c1 is None or not self.propose_costs.sizes:
            return None
        p = self.acceptance()
        top = self.budgets[-1]
        tree = best_tree(p, top, width=p.shape[1], max_depth=max(1, self.proposer.info.max_depth))
        gain = np.concatenate([[0.0], np.cumsum(path_probabilities(tree, p))])  # the N most likely nodes
        hit = float(self._offered[0] / self._offered[1])
        nodes = np.asarray([0, *self.budgets])
        tokens = 1.0 + hit * gain[np.minimum(nodes, tree.n_nodes)]
        wide = np.asarray([_known(calls, n + 1) for n in nodes])
        call = np.where(nodes > 0, hit * wide + (1.0 - hit) * c1, c1)
        prop = np.asarray([_known(self.propose_costs, n) if n > 0 else 0.0 for n in nodes])
        if not (np.all(np.isfinite(call + prop)) and np.all(call > 0)):
            return None
        return Plan(nodes, tokens, call, prop)

    def describe(self) -> str:
        """One line on the current choice, e.g. ``"4 nodes: 2.31 tokens/call, 1.21x call cost"`` (or why none)."""
        plan = self.plan()
        if plan is None:
            return f"{self.fallback} nodes (fallback: no valid timings yet)"
        n = plan.best()
        tokens, call_s, propose_s = plan.at(n)
        cost = (call_s + propose_s) / plan.at(0)[1]
        return (
            "no speculation (it loses here)"
            if n == 0
            else f"{n} nodes: {tokens:.2f} tokens/call, {cost:.2f}x call cost"
        )

    def _choose(self, plan: Plan | None) -> tuple[int, Phase]:
        """This round's budget and phase, from the past only (module docstring)."""
        if self.rounds < len(self._schedule):
            return self._schedule[self.rounds], "probe"
        if plan is None:
            return self.fallback, "fallback"
        if self.explore_every and self.rounds % self.explore_every == 0:
            self._explored += 1
            up = self._explored % 2 == 1
            options = [0, *self.budgets]
            i = options.index(self._last) if self._last in options else 0
            j = min(i + 1, len(options) - 1) if up or i == 0 else i - 1
            return options[j], "explore"
        self._last = plan.best()
        return self._last, "model"

    def _count(self, outcomes: Sequence[RowOutcome | None]) -> None:
        """Add the verified trees' tried / accepted counts per (parent depth, sibling rank), after decaying the old."""
        self._available *= self.decay
        self._accepted *= self.decay
        for o in outcomes:
            if o is None:
                continue
            kids = o.tree.children()
            steps = []
            for d, node in enumerate(o.path):
                if not kids[node]:
                    break
                nxt = o.path[d + 1] if d + 1 < len(o.path) else -1
                rank = kids[node].index(nxt) if nxt >= 0 else -1
                steps.append((d, rank + 1 if rank >= 0 else len(kids[node]), rank))
            for d, tried, rank in steps:
                self._grow(d + 1, tried)
                self._available[d, :tried] += 1.0
                if 0 <= rank < MAX_WIDTH:
                    self._accepted[d, rank] += 1.0

    def _grow(self, depth: int, width: int) -> None:
        shape = (max(depth, self._available.shape[0]), min(MAX_WIDTH, max(width, self._available.shape[1])))
        if shape != self._available.shape:
            for name in ("_available", "_accepted"):
                old = getattr(self, name)
                new = np.zeros(shape)
                new[: old.shape[0], : old.shape[1]] = old[:, : shape[1]]
                setattr(self, name, new)


def _median(curve: CostCurve, size: int) -> float:
    """The median of ``curve``'s kept samples at ``size`` (a size it has samples of)."""
    return float(np.median(curve.samples(size)))


def _known(curve: CostCurve, size: int) -> float:
    """``curve.seconds(size)`` of a curve known to have samples (NaN otherwise, which ``plan`` refuses)."""
    value = curve.seconds(size)
    return math.nan if value is None else value
