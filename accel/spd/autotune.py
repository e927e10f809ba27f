"""``AutoTune``: a proposer that picks, every round, the shape and size of the candidates for the most tokens per
second.

It wraps one proposer or several (*arms*, ``accel.spd.autotune_arm``: e.g. a draft chain with n-gram lookup first and
a draft tree merged with lookup, over one draft backend: ``AutoTune.for_draft``). Each round it picks one arm A and
one node budget N for the whole call (a chain's length K = N, a tree's node budget N, or N = 0: no speculation,
every row takes a plain target step), the (A, N) of the largest

    rate(A, N) = E[accepted + 1 | A, N] / (T_propose(A, N) + T_call(N))             (tokens per second, per row)

and hands arm A's proposer tighter limits for that round (``run.max_nodes`` and ``run.max_depth`` at most N, on a
copy of the run state); every proposer already honours those limits, since the loop itself lowers them near a row's
end. The other arms are not called (told of the round as rows not theirs, as ``FirstOf`` does; a draft catches up on
the skipped tokens in its next round, as after a lookup round). Rows share a call, so the shape is chosen for the
batch. Arms sharing one draft backend are safe: the draft cache is position-indexed, and each arm's bookkeeping
only trusts positions below the committed length, which every arm writes with the same tokens.

The model (docs/spd.md, "Cost-aware speculation"):

- **E[accepted + 1 | A, N]** is ``accel.sim.tree``'s tree model: ``1 + h * sum`` of the path probabilities of the
  N most likely nodes (``best_tree``, ``path_probabilities``) under a per-rank acceptance ``P[depth, rank]`` estimated
  from arm A's verified trees (``rank_acceptance_from_counts``: tried and accepted counts per depth and sibling
  rank, the ``GenerationStats.rank_available``/``rank_accepted`` convention), each depth's rates shrunk towards the
  rate pooled over depths (``PRIOR_WEIGHT`` pseudo-counts; the pooled rate towards ``prior_acceptance``), counts
  decayed by ``decay`` per round so the estimate follows the text (also over the rounds an arm sits out, applied at
  each plan: an arm left idle after a run of rejections drifts back to the prior and is tried again). A chain
  proposer is priced with rank 1 only.
  ``h`` is the (decayed) fraction of rounds in which the proposer offered a tree at all (lookup misses).
- **T_call(N)** = ``h * C(N + 1) + (1 - h) * C(1)``, ``C(S)`` the measured seconds from the end of ``propose`` to
  ``update`` in rounds whose widest tree scored S tokens: the target call, verification, compaction and host time
  (``accel.spd.costs.CostCurve``: medians of recent samples, fitted nondecreasing in S). ``AutoTune.probe(target)``
  times the target's call alone before a run (``probe_target``, a separate curve) at 1 token and a ladder of sizes
  up to N_max + 1 (all up to 5, then doubling: the curve interpolates between them). A size with real rounds is
  priced from them; a size only the probe timed is priced as the probe's time scaled by the median ratio of real to
  probe time over the sizes both timed (verification and host time make a real round dearer than the bare call,
  by 9-21% measured on SmolLM2 targets; unscaled, the sizes the controller never picks would look cheap).
- **T_propose(A, N)**: the measured seconds of arm A's ``propose`` at budget N (its draft calls and
  catch-up), a second ``CostCurve``; 0 at N = 0.

These are the terms of ``accel.sim.rounds``' round (draft calls + catch-up + the scoring call + host), measured here
as two totals instead of priced from a roofline: the simulator's expected tokens and this controller's are one
formula, its seconds come from the hardware model and these from the clock.

Phases: the controller's first rounds (``probe``) try N_max, 0, 1 and N_max / 2 of the first arm, then N_max, 1 and
N_max / 2 of each other arm, so every curve has points; a budget above an arm's smallest only where the prior model
on the probed call curve says it could beat no speculation (``worth_probing``: on ``gguf-kernel`` SmolLM2, where a
5-token call costs 2.4 steps, the 13 probe rounds of up to 17 tokens were ~4% of a 4-prompt cell); every
``explore_every``-th round later (``explore``) tries a neighbour of the last choice (N + 1, then N - 1; with several
arms every third exploration is instead the best budget of the next other arm, so the arms not chosen keep their
statistics current), which keeps the curves near the optimum current as the machine's load changes and reaches
deeper acceptance statistics. While the model's choice calls no draft (no speculation, or the lookup alone where
other arms have a draft: ``_draftless``; a target whose wide calls cost too much, e.g. accel's fused-kernel targets
on a 2-core CPU) exploration is ``QUIET_EXPLORE`` times rarer and tries only each arm's smallest budget: every such
exploration pays the draft's catch-up over every token since its last call, and on ``gguf-kernel`` SmolLM2 they
cost the controller 6% against AR; the interval doubles after each exploration that leaves the choice draftless, up
to ``TuneSettings.quiet_backoff`` times. The other rounds take the best N (``model``) of a plan recomputed every
``replan_every`` rounds, ``QUIET_EXPLORE`` times more rarely while the choice is draftless (pricing every budget costs
0.4-2.5 ms of host time with four or five arms; the plan is a function of the past either way), where a draft that
is far behind has its catch-up priced (``accel.spd.autotune_catchup``). When a curve has no valid sample (a clock
returning zero, NaN or negative differences; every sample is refused, ``CostCurve``) the controller runs
``fallback`` nodes (default: the first arm's own ``max_nodes``, its fixed shape; on the first arm whose budgets hold
it) and says so in ``GenerationStats.tuned_rounds`` (``phase = "fallback"``): never a division by zero, never a
hang. Its learned state persists across ``generate`` calls (``reset()`` forgets it). Each arm's proposer is started
(``Proposer.start``: a draft's prompt prefill) at its first round in a run, so a run that never calls the draft
never starts it.

Exactness: the arm and budget are a function of the previous rounds only (their verified trees, their timings, which
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
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from accel._legacy import Replaced, legacy_keywords
from accel.backends.base import Backend, BackendInfo
from accel.errors import SpdError
from accel.spd.autotune_arm import (
    EVIDENCE_DECAY,
    NO_ARM,
    Arm,
    ShapeEvidence,
    arm_budgets,
    as_arms,
    draft_arms,
    probe_schedule,
    share_draft_models,
)
from accel.spd.autotune_catchup import STEADY_TOKENS, CatchUp
from accel.spd.autotune_plan import Plan, TuneSettings
from accel.spd.autotune_shadow import ShadowLookup
from accel.spd.costs import CostCurve, probe_target
from accel.spd.proposers import NgramLookup, Proposer, ProposerInfo, RowOutcome, RunState, proposals
from accel.spd.stats import TunedRound
from accel.spd.tree import TokenTree

__all__ = ["AutoTune", "Plan", "TuneSettings", "draft_arms"]

Phase = Literal["probe", "explore", "model", "fallback"]

#: while the model chooses no speculation, exploration rounds are this many times rarer (module docstring)
QUIET_EXPLORE = 4


@dataclass
class _Pending:
    """What ``propose`` decided, for ``update`` to compare with what happened."""

    arm: int
    nodes: int
    phase: Phase
    rows: np.ndarray
    propose_s: float
    t_end: float
    offered: bool
    predicted: tuple[float, float, float]
    model: tuple[float, float] | None
    behind: int  # tokens the arm's draft was behind before the round (its catch-up)


#: ``AutoTune``'s keywords before ``TuneSettings`` (deprecated; removed in accel 0.2.0)
_SETTINGS = Replaced("settings", TuneSettings, {f.name: f.name for f in fields(TuneSettings) if f.name != "margin"})


class AutoTune:
    """Picks a shape (arm and node budget) of ``proposer``'s candidates per round for tokens per second (module
    docstring).

    Args:
        proposer: a ``Proposer`` that honours ``run.max_nodes`` / ``run.max_depth`` (``DraftChain``, ``DraftTree``,
            ``NgramLookup``, ``FirstOf``, ``Merge``, ...; its ``max_nodes`` is the largest budget tried), or a list
            of them (the arms, e.g. ``draft_arms(draft)``).
        budgets: the node budgets to choose from besides 0 (default: 1 .. each arm's ``max_nodes``); with several
            arms each takes those up to its ``max_nodes``.
        fallback: the budget run when the costs cannot be measured (default: the first arm's largest; 0 = AR).
        settings: how the controller learns (``TuneSettings``; default ``TuneSettings()``). Its fields as keywords
            (``prior_acceptance=``, ``decay=``, ``explore_every=``, ``replan_every=``, ``window=``) are deprecated.
        clock: seconds for timing (``time.perf_counter``).
    """

    def __init__(
        self,
        proposer: Proposer | Sequence[Proposer],
        *,
        budgets: Sequence[int] | None = None,
        fallback: int | None = None,
        settings: TuneSettings | None = None,
        clock: Callable[[], float] = time.perf_counter,
        **legacy: Any,
    ) -> None:
        objects, _ = legacy_keywords("AutoTune", legacy, [_SETTINGS], {"settings": settings}, keep=())
        self.settings = st = objects["settings"] or TuneSettings()
        st.check()
        prior_acceptance, decay, explore_every = st.prior_acceptance, st.decay, st.explore_every
        replan_every, window = st.replan_every, st.window
        proposers = as_arms(proposer)
        share_draft_models(proposers)  # one arm proposes a round: the arms may share a draft's bookkeeping
        long_run = float(st.long_run_decay)
        self.arms = [
            Arm(p, b, decay=float(decay), window=window, long_run_decay=long_run)
            for p, b in arm_budgets(proposers, budgets)
        ]
        self.fallback = self.arms[0].budgets[-1] if fallback is None else int(fallback)
        self._fallback_arm = next((i for i, a in enumerate(self.arms) if self.fallback in a.budgets), NO_ARM)
        if self.fallback != 0 and self._fallback_arm == NO_ARM:
            known = sorted({b for a in self.arms for b in a.budgets})
            raise SpdError(f"AutoTune fallback must be 0 or one of the budgets {known}; got {fallback!r}")
        self.prior_acceptance, self.decay, self.explore_every = float(prior_acceptance), float(decay), explore_every
        self.replan_every = replan_every
        self.window, self.clock = window, clock
        self.reset()

    @classmethod
    def for_draft(cls, draft: Backend, *, k: int = 4, nodes: int = 8, **options) -> AutoTune:
        """A controller over ``draft_arms(draft, k=k, nodes=nodes)`` (``options``: as ``AutoTune``)."""
        return cls(draft_arms(draft, k=k, nodes=nodes), **options)

    @property
    def proposer(self) -> Proposer:
        """The first arm's proposer (the only one when a single proposer is wrapped)."""
        return self.arms[0].proposer

    @property
    def propose_costs(self) -> CostCurve:
        """The first arm's proposal-cost curve (the only one when a single proposer is wrapped)."""
        return self.arms[0].propose_costs

    @property
    def budgets(self) -> list[int]:
        """Every budget some arm may take, sorted."""
        return sorted({b for a in self.arms for b in a.budgets})

    def reset(self) -> None:
        """Forget everything learned: timings, acceptance counts, the probe."""
        self.call_costs = CostCurve("target call", self.window)  # by tokens scored per row: call + verify + host
        self.probe_costs = CostCurve("target probe", self.window)  # the bare target call before the run
        for arm in self.arms:
            arm.reset()
        self.evidence = ShapeEvidence(max(self.decay, EVIDENCE_DECAY))  # per shape: its own rounds' tokens, seconds
        self.catch_up = CatchUp()  # seconds per token of the drafts' long catch-ups
        self.rounds = 0
        self._last = (0, self.arms[0].budgets[-1])
        self._started = [False] * len(self.arms)  # per arm: started in this run (``start``)
        self._explored = 0
        self._explored_at = 0  # the round of the last exploration
        self._quiet_explores = 0  # explorations in a row while the model's choice called no draft
        self._pending: _Pending | None = None
        self._plan: tuple[int, Plan | None, tuple[int, int] | None] | None = None  # (round computed, plan, its best)
        self._schedule = probe_schedule(self.arms)
        self._pruned = False  # the schedule is pruned once, at the first round (worth_probing)
        self._shadows = [  # the lookup-alone arms, judged in the rounds they do not run (accel.spd.autotune_shadow)
            ShadowLookup(i, a.proposer)
            for i, a in enumerate(self.arms)
            if self.settings.shadow_lookup and isinstance(a.proposer, NgramLookup)
        ]
        self._shadowed: list[bool | None] = [None] * len(self._shadows)  # this round: would it have offered a tree

    # ------------------------------------------------------------------ the Proposer protocol

    @property
    def info(self) -> ProposerInfo:
        infos = [a.proposer.info for a in self.arms]
        limits = [i.ctx_len for i in infos if i.ctx_len is not None]
        return ProposerInfo(
            f"autotune({' / '.join(i.name for i in infos)})",
            max(i.max_nodes for i in infos),
            max(i.max_depth for i in infos),
            any(i.branching for i in infos),
            any(i.needs_hidden for i in infos),
            min(limits) if limits else None,
        )

    def check(self, target: BackendInfo) -> None:
        for arm in self.arms:
            arm.proposer.check(target)

    def start(self, run: RunState) -> None:
        """A new run. Each arm's proposer is started at its first round in the run (``_started``), not here: a draft
        arm's start prefills the draft with the prompt, which a run that never speculates does not need."""
        self._pending = None
        self._started = [False] * len(self.arms)
        for shadow in self._shadows:
            shadow.reset()

    def _cached_plan(self) -> Plan | None:
        """``plan()``, recomputed every ``replan_every`` rounds, ``QUIET_EXPLORE`` times more rarely while the model
        chooses no draft (``_draftless``: no speculation, or lookup alone; nothing it learns changes then but the
        timings of plain steps and the lookup's counts; a plan costs 0.4-2.5 ms of host time with four or five arms,
        5-35% of a ``gguf-kernel-q8`` SmolLM2 step); a function of the past rounds either way.
        Not every round: re-pricing from every round's evidence churned between shapes (docs/spd.md, "Phases")."""
        every = self.replan_every * (QUIET_EXPLORE if self._draftless else 1)
        if self._plan is None or self.rounds - self._plan[0] >= every or self._plan[1] is None:
            plan = self.plan()
            self._plan = (self.rounds, plan, plan.best_shape() if plan is not None else None)
        return self._plan[1]

    def _best(self, plan: Plan, run: RunState | None = None, rows: np.ndarray | None = None) -> tuple[int, int]:
        """``plan.best_shape()`` (kept with the cached plan: host time per round), with the catch-up its arm's draft
        would need now spread over ``TuneSettings.catch_up_rounds`` rounds (``accel.spd.autotune_catchup``) and likewise
        every other draft arm's: only where the plain best's draft is behind can that change the choice."""
        cached = self._plan[2] if self._plan is not None and self._plan[1] is plan else None
        best = cached if cached is not None else plan.best_shape()
        if run is None or rows is None or best[1] == 0:
            return best
        drafts = self.arms[best[0]].drafts
        if CatchUp.behind(drafts, run, rows) <= STEADY_TOKENS:
            return best
        extra = {
            i: self.catch_up.seconds(a.drafts, CatchUp.behind(a.drafts, run, rows)) for i, a in enumerate(self.arms)
        }
        if not any(extra.values()):
            return best
        spread = self.settings.catch_up_rounds or self.replan_every
        added = np.array([extra.get(int(a), 0.0) / spread for a in plan.arms.tolist()])
        return plan.best_shape(extra_s=added)

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        plan = self._cached_plan()
        arm, nodes, phase = self._choose(plan, run, rows)
        predicted = plan.at(nodes, arm) if plan is not None else (math.nan, math.nan, math.nan)
        model = plan.model_at(nodes, arm) if plan is not None else None
        out: list[TokenTree | None] = [None] * run.batch
        behind = CatchUp.behind(self.arms[arm].drafts, run, rows) if nodes > 0 else 0
        t0 = self.clock()
        if nodes > 0 and not self._started[arm]:  # the run's first round of this arm: its draft's prompt prefill
            self.arms[arm].proposer.start(run)
            self._started[arm] = True
        if nodes > 0:
            view = copy.copy(run)  # the same run, tighter limits for this round (the run's arrays are not written)
            view.max_nodes = np.minimum(run.max_nodes, nodes)
            view.max_depth = np.minimum(run.max_depth, nodes)
            view.loop_limits = run.loop_limits or (run.max_nodes, run.max_depth)
            out = proposals(self.arms[arm].proposer, view, rows)
        t_end = self.clock()
        for i, shadow in enumerate(self._shadows):  # the lookup arms this round does not run: what they would offer
            own = nodes > 0 and shadow.arm == arm
            self._shadowed[i] = None if own else shadow.propose(run, rows, self.arms[shadow.arm].budgets[-1])
        offered = any(t is not None for t in out)
        self._pending = _Pending(arm, nodes, phase, rows.copy(), t_end - t0, t_end, offered, predicted, model, behind)
        return out

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        t = self.clock()
        pending, self._pending = self._pending, None
        chosen = pending.arm if pending is not None else NO_ARM
        for i, arm in enumerate(self.arms):  # the arm that proposed is told how it fared; the others of no rows
            if self._started[i]:
                arm.proposer.update(run, outcomes if i == chosen else [None] * len(outcomes))
        if pending is None:  # the loop asked no row this round (every row at its end)
            return
        self.rounds += 1
        width = max([o.tree.size for o in outcomes if o is not None], default=1)
        call_s = t - pending.t_end
        self.call_costs.observe(width, call_s)
        propose_s = pending.propose_s
        if pending.nodes > 0:
            proposed = self.arms[pending.arm]
            proposed.idle_until(self.rounds - 1)  # the rounds it sat out before this one
            steady = pending.behind <= STEADY_TOKENS  # a long catch-up is priced apart (accel.spd.autotune_catchup)
            if not steady:
                usual = proposed.propose_costs.seconds(pending.nodes)
                if usual is not None:
                    self.catch_up.observe(proposed.drafts, pending.behind, propose_s - usual)
                    propose_s = usual  # the shape's evidence: its steady cost
            proposed.observe(pending.nodes, pending.propose_s if steady else None, pending.offered, outcomes)
        tokens = self._record(run, pending, outcomes, width, call_s)
        shape = (pending.arm if pending.nodes > 0 else NO_ARM, pending.nodes)
        self.evidence.observe(shape, tokens, call_s, propose_s, model=pending.model)
        self._judge_shadows(run, pending.nodes == 0)

    def _judge_shadows(self, run: RunState, quiet: bool) -> None:
        """Count the lookup arms' shadowed proposals the committed tokens now decide (``accel.spd.autotune_shadow``);
        where this round ran no speculation (``quiet``) and one of them would have been accepted, the plan is priced
        again at the next round instead of up to ``QUIET_EXPLORE * replan_every`` rounds later."""
        for i, shadow in enumerate(self._shadows):
            arm, offered = self.arms[shadow.arm], self._shadowed[i]
            if offered is not None:
                arm.idle_until(self.rounds - 1)
            done = shadow.resolve(run)
            arm.observe_shadow(offered, done)
            if quiet and any(o.accepted > 0 for o in done):
                self._plan = None

    def _record(
        self, run: RunState, pending: _Pending, outcomes: Sequence[RowOutcome | None], width: int, call_s: float
    ) -> float:
        """The round's ``TunedRound``, into the run's statistics (``GenerationStats.tuned_rounds``); returns its
        tokens per call (the mean over the rows asked)."""
        asked = pending.rows.tolist()
        tokens = [o.accepted + 1 if o is not None else 1 for o, a in zip(outcomes, asked, strict=True) if a]
        mean = sum(tokens) / len(tokens) if tokens else math.nan
        record = TunedRound.model_construct(  # every field computed here (validation: ~60 us a round)
            nodes=pending.nodes,
            shape=self.arms[pending.arm].name if pending.nodes > 0 else "none",
            phase=pending.phase,
            call_tokens=width,
            predicted_tokens_per_call=pending.predicted[0],
            tokens_per_call=mean,
            predicted_call_s=pending.predicted[1],
            call_s=call_s,
            predicted_propose_s=pending.predicted[2],
            propose_s=pending.propose_s,
        )
        stats = getattr(run, "_stats", None)  # the run's StatsAccumulator: the record ends up in GenerationStats
        if stats is not None and hasattr(stats, "tuned"):
            stats.tuned.append(record)
        return mean

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
        ratio = float(np.median([real.median(s) / bare.median(s) for s in both])) if both else 1.0
        merged = CostCurve("target call", 1)
        for size in sorted(set(real.sizes) | set(bare.sizes)):
            merged.observe(size, real.median(size) if size in real.sizes else ratio * bare.median(size))
        return merged

    def acceptance(self, arm: int = 0) -> np.ndarray:
        """The per-rank acceptance matrix ``P[depth, rank]`` the model uses for ``arm`` (``accel.sim.tree``
        convention): its decayed counts, each depth shrunk towards the pooled rate, that towards the prior."""
        return self.arms[arm].acceptance(self.prior_acceptance)

    def plan(self) -> Plan | None:
        """The predictions for budget 0 and every arm's budgets: each arm's model (module docstring), scaled by what
        its rounds gave over what it predicted (``ShapeEvidence.arm_factors``), then each shape's moved towards its
        own rounds (``ShapeEvidence.blend``); None while a cost curve has no valid sample."""
        calls = self.call_curve()
        c1 = calls.seconds(1)
        if c1 is None or not any(a.propose_costs.sizes for a in self.arms):
            return None
        rows = [(NO_ARM, 0, 1.0, c1, 0.0, 1.0, 1.0, 1.0)]
        for i, arm in enumerate(self.arms):
            arm.idle_until(self.rounds)  # the rounds it sat out since its counts were last decayed
            if not arm.propose_costs.sizes:
                continue  # an arm not measured yet is not priced (the probe schedule measures every arm)
            hit = arm.hit_rate
            factors = self.evidence.arm_factors(i)  # (gain, call) factors: what the arm's rounds gave over its model
            expected = arm.expected_tokens(self.prior_acceptance).tolist()
            for n, e, most in zip(arm.budgets, expected, arm.most_tokens.tolist(), strict=True):
                call = hit * _known(calls, n + 1) + (1.0 - hit) * c1
                rows.append((i, n, e, call, _known(arm.propose_costs, n), *factors, most))
        arms, nodes, model_tokens, model_call, propose_s, gain, dearer, most = (
            np.asarray(col) for col in zip(*rows, strict=True)
        )
        if not (np.all(np.isfinite(model_call + propose_s)) and np.all(model_call > 0)):
            return None
        fixed = np.stack([1.0 + gain * (model_tokens - 1.0), dearer * model_call, propose_s], axis=1)
        tokens, call_s, propose_s = self.evidence.blend(arms, nodes, fixed).T
        tokens = np.minimum(tokens, most)  # a corrected prediction stays within what the shape can give
        return Plan(nodes, tokens, call_s, propose_s, arms, model_tokens, model_call, self.settings.margin)

    def describe(self) -> str:
        """One line on the current choice, e.g. ``"4 nodes: 2.31 tokens/call, 1.21x call cost"`` (with several arms
        the arm's name first), or why none."""
        plan = self.plan()
        if plan is None:
            return f"{self.fallback} nodes (fallback: no valid timings yet)"
        arm, n = plan.best_shape()
        if n == 0:
            return "no speculation (it loses here)"
        tokens, call_s, propose_s = plan.at(n, arm)
        cost = (call_s + propose_s) / plan.at(0)[1]
        shape = f"{self.arms[arm].name}, " if len(self.arms) > 1 else ""
        return f"{shape}{n} nodes: {tokens:.2f} tokens/call, {cost:.2f}x call cost"

    def worth_probing(self, schedule: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The shapes of ``schedule`` worth a probe round: no speculation and each arm's smallest budget always (every
        arm needs a proposal cost and acceptance counts); a larger budget only where the prior model (acceptance at
        ``prior_acceptance``, no proposal cost: optimistic) on the call curve known now (the probe's) prices it at
        least at no speculation's rate. All of them while no call is timed."""
        calls = self.call_curve()
        c1 = calls.seconds(1)
        if c1 is None:
            return list(schedule)
        keep = []
        for arm, n in schedule:
            a = self.arms[arm] if n > 0 else None
            if a is None or n == a.budgets[0]:
                keep.append((arm, n))
                continue
            tokens = float(a.expected_tokens(self.prior_acceptance)[a.budgets.index(n)])
            seconds = calls.seconds(n + 1)
            if seconds is not None and tokens / seconds >= 1.0 / c1:
                keep.append((arm, n))
        return keep

    def _choose(
        self, plan: Plan | None, run: RunState | None = None, rows: np.ndarray | None = None
    ) -> tuple[int, int, Phase]:
        """This round's arm, budget and phase, from the past only (module docstring); ``run``/``rows``: where the
        drafts stand (their catch-up is priced)."""
        if not self._pruned and self.rounds == 0:
            self._schedule, self._pruned = self.worth_probing(self._schedule), True
        if self.rounds < len(self._schedule):
            return (*self._schedule[self.rounds], "probe")
        if plan is None:
            return self._fallback_arm, self.fallback, "fallback"
        if self.explore_every and self.rounds - self._explored_at >= self._explore_interval():
            self._explored += 1
            self._explored_at = self.rounds
            self._quiet_explores += self._draftless
            return (*self._neighbour(plan), "explore")
        self._last = self._best(plan, run, rows)
        if not self._draftless:
            self._quiet_explores = 0
        return (*self._last, "model")

    def _explore_interval(self) -> int:
        """Rounds between explorations: ``explore_every``; while the model chooses no draft (no speculation, or lookup
        alone, where some arm has a draft) ``QUIET_EXPLORE`` times that, doubled after each exploration in a row that
        left the choice there (up to ``TuneSettings.quiet_backoff`` times): each one costs the draft's catch-up over
        the tokens since its last call."""
        if not self._draftless:
            return self.explore_every
        return self.explore_every * QUIET_EXPLORE * 2 ** min(self._quiet_explores, self.settings.quiet_backoff)

    @property
    def _draftless(self) -> bool:
        """Whether the model's last choice called no draft (no speculation, or an arm without a draft model such as
        lookup alone) while some arm has one: what an exploration then tries costs a catch-up (``_explore_interval``);
        without draft arms, whether it was no speculation."""
        arm, nodes = self._last
        if nodes == 0:
            return True
        return not self.arms[arm].drafts and any(a.drafts for a in self.arms)

    def _neighbour(self, plan: Plan) -> tuple[int, int]:
        """The shape an exploration round re-measures: the last choice's budget + 1, then - 1, within its arm (from no
        speculation or a draftless choice (``_draftless``): the first budget of the first arm); with several arms every
        third time the best budget of the next other arm instead (its smallest from such a choice)."""
        arm, nodes = self._last
        quiet = self._draftless
        if quiet:
            arm, nodes = 0, 0
        if len(self.arms) > 1 and self._explored % 3 == 0:
            other = (arm + self._explored // 3) % len(self.arms)
            other = other if other != arm else (other + 1) % len(self.arms)
            best = plan.best_shape(other)
            return best if best[1] > 0 and not quiet else (other, self.arms[other].budgets[0])
        options = [0, *self.arms[arm].budgets]
        i = options.index(nodes) if nodes in options else 0
        j = min(i + 1, len(options) - 1) if self._explored % 2 == 1 or i == 0 else i - 1
        return (arm if options[j] > 0 else NO_ARM), options[j]


def _known(curve: CostCurve, size: int) -> float:
    """``curve.seconds(size)`` of a curve known to have samples (NaN otherwise, which ``plan`` refuses)."""
    value = curve.seconds(size)
    return math.nan if value is None else value
