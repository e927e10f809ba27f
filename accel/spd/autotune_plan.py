"""What ``accel.spd.autotune.AutoTune`` decides from: its ``Plan`` (the predicted tokens and seconds of every shape
it may choose, and the choice among them) and its learning settings (``TuneSettings``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from accel.errors import SpdError
from accel.spd.costs import DEFAULT_WINDOW

__all__ = ["Plan", "TuneSettings"]


@dataclass(frozen=True)
class Plan:
    """The model's prediction for each candidate shape: ``arms[i]`` (the arm index; ``NO_ARM`` for budget 0, the first
    entry) at budget ``nodes[i]``: tokens per row and call, seconds of the call (target + verification + host) and of
    the proposal; ``model_tokens`` / ``model_call_s``: the arm model's own tokens and call seconds before its rounds
    corrected them (``ShapeEvidence``; None: the same as ``tokens`` / ``call_s``)."""

    nodes: np.ndarray
    tokens: np.ndarray
    call_s: np.ndarray
    propose_s: np.ndarray
    arms: np.ndarray
    model_tokens: np.ndarray | None = None
    model_call_s: np.ndarray | None = None
    margin: float = 0.0

    @property
    def tokens_per_s(self) -> np.ndarray:
        """Predicted tokens per second per row of each shape."""
        return self.tokens / (self.call_s + self.propose_s)

    def best_shape(self, arm: int | None = None, extra_s: np.ndarray | None = None) -> tuple[int, int]:
        """``(arm, nodes)`` of the highest rate (the first on ties: no speculation, then smaller budgets and earlier
        arms), no speculation's rate counted ``1 + margin`` times (``TuneSettings.margin``); ``arm``: the best of
        that arm only; ``extra_s``: seconds added to each shape's round (a draft's catch-up)."""
        if arm is not None:
            i = int(np.argmax(np.where(self.arms == arm, self.tokens_per_s, -np.inf)))
        else:
            rate = (
                self.tokens_per_s.copy() if extra_s is None else self.tokens / (self.call_s + self.propose_s + extra_s)
            )
            rate[self.nodes == 0] *= 1.0 + self.margin
            i = int(np.argmax(rate))
        return int(self.arms[i]), int(self.nodes[i])

    def best(self) -> int:
        """The budget of the highest rate (the smallest on ties)."""
        return self.best_shape()[1]

    def at(self, nodes: int, arm: int = 0) -> tuple[float, float, float]:
        """``(tokens, call_s, propose_s)`` predicted at budget ``nodes`` of ``arm`` (any arm for budget 0); NaN for a
        shape the plan does not price (an arm not measured yet)."""
        i = self._index(nodes, arm)
        if i is None:
            return math.nan, math.nan, math.nan
        return float(self.tokens[i]), float(self.call_s[i]), float(self.propose_s[i])

    def model_at(self, nodes: int, arm: int = 0) -> tuple[float, float]:
        """``(tokens, call_s)`` of the arm model alone at that shape, before its rounds corrected it (NaN as ``at``)."""
        i = self._index(nodes, arm)
        if i is None:
            return math.nan, math.nan
        tokens = self.tokens if self.model_tokens is None else self.model_tokens
        call = self.call_s if self.model_call_s is None else self.model_call_s
        return float(tokens[i]), float(call[i])

    def _index(self, nodes: int, arm: int) -> int | None:
        return self._slots.get((int(arm), int(nodes)) if nodes != 0 else (None, 0))

    @cached_property
    def _slots(self) -> dict[tuple[int | None, int], int]:
        """``(arm, nodes)`` -> the first entry of that shape (``(None, 0)``: the first of budget 0, any arm): the
        controller reads a plan's predictions twice a round."""
        slots: dict[tuple[int | None, int], int] = {}
        for i, (arm, nodes) in enumerate(zip(self.arms.tolist(), self.nodes.tolist(), strict=True)):
            slots.setdefault((None, 0) if nodes == 0 else (int(arm), int(nodes)), i)
        return slots


@dataclass(frozen=True)
class TuneSettings:
    """How ``AutoTune`` learns.

    Attributes:
        prior_acceptance: the rank-1 acceptance assumed before any round was verified (later ranks: half of it).
        decay: per-round weight of the old acceptance counts, in (0, 1] (1 = never forget); 0.93 (half-life ~10
            rounds) followed the text better than 0.97 and 0.99 on SmolLM2 targets (docs/spd.md, "Phases").
        explore_every: every this many rounds a neighbour of the chosen shape is re-measured (0 = never).
        replan_every: the model's plan is recomputed every this many rounds (>= 1) and kept in between: pricing
            every budget costs 0.4-1.4 ms of host time with four or five arms (a tree search per arm).
        window: timing samples kept per size (``CostCurve``).
        margin: speculation is chosen only where its predicted rate is at least ``1 + margin`` times no
            speculation's, in [0, 1) (default 0). The shape chosen is the one whose noisy estimate is highest, so its
            prediction runs high (3-21% more tokens per call than its rounds gave, SmolLM2 targets on a 2-core VM);
            a margin keeps marginal speculation off, at the price of also refusing some that wins (docs/spd.md).
        quiet_backoff: while the model chooses no speculation, the exploration interval doubles after each exploration
            that left it there, at most this many times (0 = a fixed interval).
        long_run_decay: per-round decay, in [0, 1), of an arm's long-run acceptance counts (its own rounds only), the
            rate its recent counts fall back to while it sits out rounds; 0 = fall back to ``prior_acceptance``.
        shadow_lookup: in the rounds the controller does not run a lookup-alone arm (``NgramLookup``), what it would
            have proposed is judged against the tokens the rows commit and counted in that arm's hit rate and
            acceptance (``accel.spd.autotune_shadow``; 20-30 us of host time a round per row), and a shadowed hit
            while nothing speculates prices the plan again.
        catch_up_rounds: the rounds a draft's catch-up is spread over when the plan weighs a draft arm whose draft is
            far behind (``accel.spd.autotune_catchup``): a shape chosen is held ``replan_every`` rounds at least and
            usually longer; 32 was 1.00-1.06x the controller with 8 in four A/B cells (benchmarks/RESULTS.md);
            0 = ``replan_every``.
    """

    prior_acceptance: float = 0.5
    decay: float = 0.93
    explore_every: int = 16
    replan_every: int = 8
    window: int = DEFAULT_WINDOW
    margin: float = 0.0
    quiet_backoff: int = 4
    long_run_decay: float = 0.998
    catch_up_rounds: int = 32
    shadow_lookup: bool = True

    def check(self) -> None:
        """``SpdError`` naming the first setting out of its range."""
        p, decay, explore, replan = self.prior_acceptance, self.decay, self.explore_every, self.replan_every
        if not (isinstance(p, (int, float)) and 0.0 < p < 1.0):
            raise SpdError(f"AutoTune prior_acceptance must be in (0, 1); got {p!r}")
        if not (isinstance(decay, (int, float)) and 0.0 < decay <= 1.0):
            raise SpdError(f"AutoTune decay must be in (0, 1]; got {decay!r}")
        if isinstance(explore, bool) or not isinstance(explore, int) or explore < 0:
            raise SpdError(f"AutoTune explore_every must be an int >= 0; got {explore!r}")
        if isinstance(replan, bool) or not isinstance(replan, int) or replan < 1:
            raise SpdError(f"AutoTune replan_every must be an int >= 1; got {replan!r}")
        margin = self.margin
        if isinstance(margin, bool) or not (isinstance(margin, (int, float)) and 0.0 <= margin < 1.0):
            raise SpdError(f"AutoTune margin must be in [0, 1); got {margin!r}")
        backoff, long_run = self.quiet_backoff, self.long_run_decay
        if isinstance(backoff, bool) or not isinstance(backoff, int) or not 0 <= backoff <= 16:
            raise SpdError(f"AutoTune quiet_backoff must be an int in 0 .. 16; got {backoff!r}")
        if isinstance(long_run, bool) or not (isinstance(long_run, (int, float)) and 0.0 <= long_run < 1.0):
            raise SpdError(f"AutoTune long_run_decay must be in [0, 1); got {long_run!r}")
        if not isinstance(self.shadow_lookup, bool):
            raise SpdError(f"AutoTune shadow_lookup must be a bool; got {self.shadow_lookup!r}")
        spread = self.catch_up_rounds
        if isinstance(spread, bool) or not isinstance(spread, int) or spread < 0:
            raise SpdError(f"AutoTune catch_up_rounds must be an int >= 0; got {spread!r}")
