"""The draft's catch-up, priced by how far behind it is (``accel.spd.autotune.AutoTune``).

A draft arm's first draft call in a round feeds every token the draft has not seen (``DraftModel.catch_up``): one or
two after a round of its own, but every token since its last call after rounds without it (no speculation, n-gram
lookup alone, another drafter's arm). That call costs about the same per token whatever the gap (the int8 SmolLM2
feature draft on the Intel VM: 1.1 ms for 1 token, 2.6 ms for 8, 15.9 ms for 64, ~0.24 ms a token beyond the first
few), so after a stretch without the draft the first speculative round costs several target steps more than the
same shape in a run of them, and a median of proposal times (mostly from such runs) prices it far too cheaply.

``CatchUp`` keeps, per draft model, the recent seconds per token of the catch-ups beyond ``STEADY_TOKENS`` (what a
round's proposal took beyond its arm's steady cost, over the tokens fed), and prices the catch-up the next round of
an arm would need: those seconds per token times the tokens the draft is behind, spread over
``TuneSettings.catch_up_rounds`` rounds (32: a chosen shape is held ``replan_every`` rounds at least, and a draft arm
that pays runs far longer). Rounds after a longer gap give no sample to the arm's steady proposal curve. All of it is
a function of the past rounds and their timings.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from accel.spd.draft_model import DraftModel
from accel.spd.proposers import RunState

__all__ = ["STEADY_TOKENS", "CatchUp"]

#: a catch-up of at most this many tokens is part of an arm's steady proposal cost (after a chain round of its own the
#: draft is 1 .. K + 1 tokens behind; a dynamic chain's K reaches 6)
STEADY_TOKENS = 8
SAMPLES = 8  # seconds-per-token samples kept per draft model (their median prices the next catch-up)


class CatchUp:
    """Per draft model (by identity): the recent seconds per catch-up token beyond ``STEADY_TOKENS``."""

    def __init__(self) -> None:
        self._per_token: dict[int, deque[float]] = {}

    @staticmethod
    def behind(models: Sequence[DraftModel], run: RunState, rows: np.ndarray) -> int:
        """Tokens the arm's drafts would catch up on now (the most over its models and ``rows``; 0 for an arm without
        a draft model: lookup, Hydra heads)."""
        return max((m.behind(run, rows) for m in models), default=0)

    def observe(self, models: Sequence[DraftModel], tokens: int, extra_s: float) -> None:
        """A round whose drafts were ``tokens`` behind took ``extra_s`` seconds beyond its arm's steady cost."""
        if tokens <= STEADY_TOKENS or not models or not np.isfinite(extra_s):
            return
        for m in models:
            self._per_token.setdefault(id(m), deque(maxlen=SAMPLES)).append(max(extra_s, 0.0) / tokens)

    def seconds(self, models: Sequence[DraftModel], tokens: int) -> float:
        """The catch-up seconds priced for ``tokens`` behind: 0 within ``STEADY_TOKENS`` or before any sample."""
        if tokens <= STEADY_TOKENS:
            return 0.0
        rates = [float(np.median(self._per_token[id(m)])) for m in models if self._per_token.get(id(m))]
        return max(rates, default=0.0) * tokens
