"""Speculative decoding math (docs/reference.md §3): tokens per loop, its distribution, loop time, speedup.

One loop = K draft calls (one token each) + one target call scoring K+1 positions + host time. It yields the accepted
draft prefix plus one target token (the correction or the bonus): between 1 and K+1 tokens.
The draft's next first call also feeds what it has not seen: after an all-accepted loop a standalone draft reads
[d_K, bonus] (one extra token, with probability P(all K accepted)); a feature draft (``ModelSpec.feature_dim``)
re-reads every token of the loop with the target's hidden states (E - 1 extra tokens on average):
:func:`draft_catch_up_s` prices either at the draft's marginal cost of one more token in a call.
With i.i.d. acceptance a: E[tokens] = (1 - a^(K+1)) / (1 - a) (Leviathan et al. / Chen et al.), exact.
With a measured per-position vector (a_1..a_K, a_i = P(accept position i | positions < i accepted)):
E[tokens] = 1 + a_1 + a_1 a_2 + ... + a_1...a_K, exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from accel.errors import SimError
from accel.sim._base import MAX_K, SimModel

Acceptance = float | Sequence[float] | np.ndarray


def check_k(k: Any) -> np.ndarray:
    """K as an integer array in [1, ``MAX_K``] (``SimError`` otherwise; a bool is not an integer here)."""
    a = np.asarray(k)
    if (
        a.size == 0
        or a.dtype == bool
        or not np.issubdtype(a.dtype, np.number)
        or np.any(~np.isfinite(a))
        or np.any(a != np.round(a))
        or np.any(a < 1)
        or np.any(a > MAX_K)
    ):
        raise SimError(f"K (draft tokens per loop) must be an integer in [1, {MAX_K}], got {k!r}")
    return a.astype(np.int64)


def check_alpha(alpha: Any) -> np.ndarray:
    """Acceptance probabilities as a float array in [0, 1] (``SimError`` otherwise)."""
    try:
        bad = isinstance(alpha, (str, bool)) or np.asarray(alpha).dtype == bool
        a = np.asarray(np.nan) if bad else np.asarray(alpha, dtype=np.float64)
    except (TypeError, ValueError):
        a = np.asarray(np.nan)
    if a.size == 0 or a.size > 1 << 20 or np.any(~np.isfinite(a)) or np.any((a < 0) | (a > 1)):
        raise SimError(f"acceptance rate alpha must be in [0, 1], got {alpha!r}"[:300])
    return a


def acceptance_vector(acceptance: Acceptance, k: int) -> np.ndarray:
    """Per-position acceptance (length K) from a scalar i.i.d. alpha or a measured vector (length >= K; a shorter
    vector is an error: the positions beyond it were never measured)."""
    k = int(check_k(k))
    a = check_alpha(acceptance)
    if a.ndim == 0:
        return np.full(k, float(a))
    if a.ndim != 1 or a.size < k:
        raise SimError(f"per-position acceptance needs at least K={k} values, got {a.size}")
    return a[:k].copy()


def expected_tokens(alpha: Any, k: Any) -> Any:
    """E[tokens per loop] with i.i.d. acceptance ``alpha`` (vectorized over alpha and K): (1 - a^(K+1)) / (1 - a),
    K+1 at a = 1."""
    a = check_alpha(alpha)
    kk = check_k(k)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(a < 1.0, (1.0 - a ** (kk + 1)) / np.where(a < 1.0, 1.0 - a, 1.0), kk + 1.0)
    return e if e.ndim else float(e)


def tokens_pmf(acceptance: Acceptance, k: int) -> np.ndarray:
    """P(tokens per loop = n) for n = 1..K+1 (index n-1): the first n-1 drafts accepted, then a rejection (or all K)."""
    a = acceptance_vector(acceptance, k)
    survive = np.concatenate([[1.0], np.cumprod(a)])  # P(first i accepted), i = 0..K
    pmf = survive.copy()
    pmf[:-1] *= 1.0 - a
    return pmf


def expected_tokens_from(acceptance: Acceptance, k: int) -> float:
    """E[tokens per loop] from a scalar alpha or a per-position vector."""
    return float(np.sum(np.arange(1, int(k) + 2) * tokens_pmf(acceptance, k)))


def alpha_for_expected_tokens(e: float, k: int) -> float:
    """The i.i.d. alpha whose E[tokens per loop] at K drafts is ``e`` (clipped to [1, K+1]); bisection to 1e-12."""
    k = int(check_k(k))
    if not np.isfinite(e):
        raise SimError(f"expected tokens per loop must be a finite number, got {e!r}")
    if e <= 1.0 or e >= k + 1.0:  # the ends exactly (the closed form cancels badly next to alpha = 1)
        return 0.0 if e <= 1.0 else 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if expected_tokens(mid, k) < e else (lo, mid)
    return hi


def catch_up_tokens(
    expected_tokens_per_loop: Any, p_all_accepted: Any, feature_draft: bool, lookup_fraction: float = 0.0
) -> Any:
    """Extra tokens the draft is fed per loop beyond its one-token calls (vectorized): ``p_all`` for a standalone
    draft (after an all-accepted loop it reads [d_K, bonus]), ``E - 1`` for a feature draft (it re-reads the loop),
    plus the tokens of lookup loops (see :func:`draft_catch_up_s`)."""
    e, f = np.asarray(expected_tokens_per_loop), float(lookup_fraction)
    return e - (1.0 - f) if feature_draft else np.asarray(p_all_accepted) + f * e


def draft_catch_up_s(
    catch_up_token_s: Any,
    expected_tokens_per_loop: Any,
    p_all_accepted: Any,
    feature_draft: bool,
    lookup_fraction: float = 0.0,
) -> Any:
    """Extra draft seconds per loop beyond its one-token calls (vectorized). ``catch_up_token_s`` = the draft's cost
    of one more token in a call (its 2-token call minus its 1-token call). A standalone draft pays it after
    all-accepted loops (``p_all_accepted``); a feature draft re-feeds the whole loop, ``E - 1`` extra tokens.
    With n-gram lookup drafts (``lookup_fraction`` of the loops call no draft), the draft later catches up on every
    token those loops emitted: a feature draft feeds ``E - (1 - f)`` extra tokens per loop, a standalone one
    ``p_all + f E``."""
    extra = catch_up_tokens(expected_tokens_per_loop, p_all_accepted, feature_draft, lookup_fraction)
    return extra * np.asarray(catch_up_token_s)


class LoopStats(SimModel):
    """Measured shape of speculative loops, for runs the i.i.d. / per-position acceptance model does not describe:
    a dynamic draft length (``accel.spd.generate(min_draft_prob=...)`` stops drafting when the draft is unsure, so K
    varies per loop), n-gram lookup drafts, or token trees. ``accel.spd``'s ``GenerationStats`` has the fields
    (``LoopStats.from_stats``).

    A measured tree run: ``tokens_per_loop`` = tokens per target call, ``drafts_per_loop`` = mean tree size T (the
    target scores T + 1 tokens), ``draft_calls_per_loop`` = draft calls per round (one per tree level that is
    expanded, the root's included), ``draft_tokens_per_call`` = mean tokens fed per draft call (a level's width)."""

    tokens_per_loop: float = Field(ge=1.0, description="E: mean tokens emitted per target call (accepted + 1)")
    drafts_per_loop: float = Field(
        gt=0.0,
        description="mean draft tokens proposed per loop; the target scores drafts_per_loop + 1 positions per call",
    )
    all_accepted_fraction: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="loops whose drafts were all accepted (a standalone draft's "
        "catch-up); default ((E - 1) / drafts) ** drafts, the i.i.d. estimate",
    )
    draft_calls_per_loop: float | None = Field(
        default=None,
        ge=0.0,
        description="draft-model calls per loop; default drafts_per_loop (one call per draft). "
        "Fewer with n-gram lookup drafts (accel.spd.generate(ngram=...)), which call no draft",
    )
    lookup_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="loops drafted by n-gram lookup: no draft call, and the draft catches up on their tokens later",
    )
    draft_tokens_per_call: float = Field(
        default=1.0,
        ge=1.0,
        le=1024.0,
        description="mean tokens fed per draft call: 1 for a chain, a tree level's width for a tree proposer",
    )

    @model_validator(mode="after")
    def _check(self) -> LoopStats:
        for name in ("tokens_per_loop", "drafts_per_loop"):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) > 1024:
                raise SimError(f"LoopStats: {name} must be a finite number <= 1024, got {getattr(self, name)!r}")
        if self.tokens_per_loop > self.drafts_per_loop + 1.0 + 1e-9:
            raise SimError(
                f"LoopStats: tokens_per_loop {self.tokens_per_loop:g} exceeds drafts_per_loop + 1 = "
                f"{self.drafts_per_loop + 1:g} (a loop emits at most its drafts plus one)"
            )
        if (
            self.draft_calls_per_loop is not None
            and self.lookup_fraction == 0.0
            and (self.draft_calls_per_loop > self.drafts_per_loop + 1e-9)
        ):
            raise SimError(
                f"LoopStats: draft_calls_per_loop {self.draft_calls_per_loop:g} exceeds drafts_per_loop "
                f"{self.drafts_per_loop:g} without lookup drafts (a call proposes one draft per row)"
            )
        return self

    def draft_calls(self) -> float:
        """Draft-model calls per loop (``draft_calls_per_loop``, else one per draft)."""
        return self.drafts_per_loop if self.draft_calls_per_loop is None else self.draft_calls_per_loop

    @classmethod
    def from_stats(cls, stats: Any) -> LoopStats:
        """From an ``accel.spd.GenerationStats`` (or anything with ``mean_tokens_per_loop``,
        ``mean_drafts_per_loop``, ``all_accepted_rounds`` and ``row_calls``; optionally ``draft_calls_per_loop``,
        ``lookup_rounds`` and, for tree runs, ``mean_draft_tokens_per_call``)."""
        rows = getattr(stats, "row_calls", 0)
        calls = getattr(stats, "draft_calls_per_loop", None)
        width = getattr(stats, "mean_draft_tokens_per_call", None)
        return cls(
            tokens_per_loop=float(stats.mean_tokens_per_loop),
            drafts_per_loop=float(stats.mean_drafts_per_loop),
            all_accepted_fraction=stats.all_accepted_rounds / rows if rows else None,
            draft_calls_per_loop=float(calls) if calls is not None and math.isfinite(calls) else None,
            lookup_fraction=getattr(stats, "lookup_rounds", 0) / rows if rows else 0.0,
            draft_tokens_per_call=float(width) if width is not None and math.isfinite(width) and width >= 1 else 1.0,
        )

    def all_accepted(self) -> float:
        """``all_accepted_fraction``, or its i.i.d. estimate."""
        if self.all_accepted_fraction is not None:
            return self.all_accepted_fraction
        d = self.drafts_per_loop
        return min(1.0, (self.tokens_per_loop - 1.0) / d) ** d


def loop_time(k: Any, draft_step_s: Any, score_step_s: Any, host_s: float = 0.0) -> Any:
    """Seconds of one loop: K draft calls + one (K+1)-token scoring call + host time (vectorized)."""
    return np.asarray(k) * draft_step_s + score_step_s + host_s


def speedup(expected_tokens_per_loop: Any, loop_s: Any, target_step_s: Any) -> Any:
    """Speedup over autoregressive decoding: tokens per second with SpD / tokens per second of the target alone."""
    return np.asarray(expected_tokens_per_loop) * target_step_s / loop_s


def break_even_alpha(
    k: int,
    target_step_s: float,
    draft_step_s: float,
    score_step_s: float,
    host_s: float = 0.0,
    tol: float = 1e-10,
    catch_up_s: float = 0.0,
    feature_draft: bool = False,
) -> float | None:
    """Smallest i.i.d. alpha at which SpD with this K is at least as fast as AR (bisection on the speedup, which
    increases with alpha as long as the draft catch-up ``catch_up_s`` (seconds per extra token,
    :func:`draft_catch_up_s`) is smaller than a target step). 0.0 if SpD already wins at alpha = 0; ``None`` if it
    loses even at alpha = 1."""
    lt = float(loop_time(k, draft_step_s, score_step_s, host_s))

    def gain(a: float) -> float:
        e = expected_tokens(a, k)
        return float(speedup(e, lt + draft_catch_up_s(catch_up_s, e, a**k, feature_draft), target_step_s)) - 1.0

    if gain(0.0) >= 0:
        return 0.0
    if gain(1.0) < 0:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gain(mid) < 0 else (lo, mid)
    return hi
