"""Results and statistics of a generation run: pydantic models at the edge, a numpy accumulator inside.

Counting conventions (used by the tests and the benchmark):

- A *round* (loop) is one target scoring call; per row it emits ``accepted + 1`` tokens (the accepted drafts, then one
  residual/bonus token from the target), possibly truncated by EOS or ``max_new_tokens``.
- ``row_calls``: (row, target call) pairs in which the row was active; ``tokens_per_target_call`` =
  ``new_tokens / row_calls`` is 1.0 for autoregressive decoding and about ``E[accepted] + 1`` for SpD (EOS truncation
  lowers it); ``mean_tokens_per_loop`` is the untruncated ``mean(accepted + 1)``.
- ``draft_tokens``: draft tokens proposed over all (row, round) pairs (``K`` per round at a fixed K; fewer with a
  dynamic draft length); ``mean_drafts_per_loop = draft_tokens / row_calls``. With ``mean_tokens_per_loop`` these
  two numbers are what ``accel.sim.LoopStats`` takes to predict a dynamic-length run on other hardware.
- ``accepted_histogram[m]``: rounds (per row) in which exactly ``m`` drafts were accepted, ``m = 0..K``.
- ``acceptance_per_position[i]``: of the drafts *reached* at slot ``i`` (proposed, and the previous ``i`` were
  accepted, so this one was tested), the fraction accepted; ``proposed_per_position`` counts the reached ones.
  ``alpha_counts`` = accepted / proposed over all slots, the maximum-likelihood estimate of the
  per-token acceptance rate under the i.i.d. model of docs/reference.md §3. ``alpha_overlap`` = mean of
  ``sum_x min(p(x), q(x))`` over the reached slots: the expected acceptance, computed from both distributions.
- ``draft_calls_per_loop``: draft calls outside the prefill per round (= ``mean_drafts_per_loop`` at batch 1
  without lookup; lookup rounds call no draft, and a long catch-up may take several calls).
- ``lookup_rounds``: (row, round) pairs whose drafts came from n-gram lookup (``generate(..., ngram=n)``), not from
  the draft model; ``lookup_accepted``: accepted drafts among them. With lookup the per-slot arrays cover
  ``max(K, ngram_k)`` slots.
- Times in seconds: ``draft_s`` and ``target_s`` are spent inside backend calls (prefill included, reported apart in
  ``prefill_s``), ``host_s = wall_s - draft_s - target_s`` (sampling, bookkeeping). ``tokens_per_s = new_tokens /
  wall_s``; ``decode_tokens_per_s`` leaves the prefill out.
- ``tuned_rounds``: one ``TunedRound`` per round of a cost-aware controller (``accel.spd.autotune.AutoTune``): the
  node budget it chose, and what it predicted against what it saw (empty for other proposers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from accel.spd.verify import TreeOutcome

__all__ = ["GenerationResult", "GenerationStats", "StatsAccumulator", "TunedRound"]

FinishReason = Literal["eos", "length", "context"]


class TunedRound(BaseModel):
    """One round of ``accel.spd.autotune.AutoTune``: the shape it chose and its prediction against the observation.
    Times in seconds; ``call`` = the target call with its verification and host time, ``propose`` = the wrapped
    proposer's ``propose``. Predictions are NaN where the cost model had no estimate (probe and fallback rounds)."""

    model_config = ConfigDict(frozen=True)

    nodes: int = Field(description="the node budget chosen (chain length, tree nodes); 0 = no speculation")
    shape: str = Field("", description="the arm chosen (its proposer's name); 'none' for no speculation")
    phase: Literal["probe", "explore", "model", "fallback"] = Field(
        description="why: start-up probe, periodic re-measurement, the cost model's best, or the fixed fallback"
    )
    call_tokens: int = Field(description="tokens the target scored per row (the widest tree, root included)")
    predicted_tokens_per_call: float = Field(description="E[accepted + 1] per row the model expected")
    tokens_per_call: float = Field(description="observed mean accepted + 1 over the rows asked")
    predicted_call_s: float
    call_s: float
    predicted_propose_s: float
    propose_s: float


class GenerationStats(BaseModel):
    """Statistics of one ``generate`` / ``generate_ar`` run (see the module docstring for definitions)."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["ar", "spd"]
    proposer: str = Field(default="", description="the proposer that made the candidates (empty for AR)")
    k: int = Field(description="most draft tokens (tree nodes below the root) per round (0 for autoregressive)")
    batch_size: int
    new_tokens: int = Field(description="tokens emitted over all rows")
    rounds: int = Field(description="target decode calls (after prefill)")
    row_calls: int = Field(description="(row, target decode call) pairs with the row active")
    target_calls: int = Field(description="target forward calls, prefill chunks included")
    draft_calls: int = Field(description="draft forward calls, prefill chunks included")
    tokens_per_target_call: float = Field(description="new_tokens / row_calls (1.0 for AR)")
    accepted_histogram: list[int] = Field(description="rounds with m accepted drafts, m = 0..K")
    acceptance_per_position: list[float] = Field(description="accepted / proposed at draft slot i (NaN if none)")
    proposed_per_position: list[int]
    all_accepted_rounds: int = Field(description="(row, round) pairs with k >= 1 drafts all accepted (catch-up next)")
    draft_tokens: int = Field(
        description="draft tokens proposed over all (row, round) pairs: K per round at a fixed "
        "K, fewer when min_draft_prob stops drafting early"
    )
    mean_drafts_per_loop: float = Field(description="draft_tokens / row_calls: the mean draft length (NaN for AR)")
    accepted_drafts: int
    proposed_drafts: int
    draft_calls_per_loop: float = Field(
        default=math.nan,
        description="draft calls outside the prefill per round (one "
        "call serves all rows; fewer than the drafts with n-gram lookup)",
    )
    mean_draft_tokens_per_call: float = Field(
        default=math.nan, description="tokens fed per draft call outside the prefill (a tree level's width)"
    )
    mean_target_call_tokens: float = Field(
        default=math.nan, description="columns of a target decode call (the tree or chain size with its root)"
    )
    lookup_rounds: int = Field(default=0, description="(row, round) pairs drafted by n-gram lookup")
    lookup_accepted: int = Field(default=0, description="accepted drafts of those rounds")
    tree_rounds: int = Field(
        default=0, description="(row, round) pairs whose candidates branched (a tree, not a chain)"
    )
    tree_nodes_histogram: list[int] = Field(
        default_factory=list, description="(row, round) pairs with n nodes below the root, n = 0, 1, ..."
    )
    tree_depth_histogram: list[int] = Field(default_factory=list, description="(row, round) pairs with d levels")
    rank_available: list[list[int]] = Field(
        default_factory=list,
        description="[depth][rank]: reached nodes at depth d (0 = the root) whose child of sibling rank r was "
        "tried (ranks are tried in order until one matches)",
    )
    rank_accepted: list[list[int]] = Field(
        default_factory=list, description="[depth][rank]: times the rank-r child of a reached depth-d node was accepted"
    )
    target_tokens: int = Field(description="tokens emitted from the target (residual or bonus samples)")
    alpha_counts: float = Field(description="accepted / proposed drafts (NaN if none proposed)")
    alpha_overlap: float = Field(description="mean sum_x min(p, q) over reached slots (NaN if none)")
    mean_tokens_per_loop: float = Field(
        description="mean accepted + 1 per (row, round) before EOS truncation: E[tokens per loop] of "
        "docs/reference.md §3"
    )
    wall_s: float
    prefill_s: float
    draft_s: float
    target_s: float
    host_s: float
    tokens_per_s: float = Field(description="new_tokens / wall_s")
    decode_tokens_per_s: float = Field(description="new_tokens / (wall_s - prefill_s)")
    tuned_rounds: list[TunedRound] = Field(
        default_factory=list, description="per round of a cost-aware controller (AutoTune): shape, predicted, observed"
    )


class GenerationResult(BaseModel):
    """Generated tokens per row (prompt excluded) and the run's statistics."""

    model_config = ConfigDict(frozen=True)

    tokens: list[list[int]]
    from_draft: list[list[bool]] = Field(description="per generated token: True if it was an accepted draft token")
    finish_reasons: list[FinishReason]
    messages: list[str] = Field(default_factory=list, description="warnings, e.g. context exhaustion")
    stats: GenerationStats


def _nan_div(a: float | np.integer, b: float | np.integer) -> float:
    return float(a) / float(b) if b else math.nan


class StatsAccumulator:
    """Mutable counters filled by the loop; :meth:`finish` freezes them into :class:`GenerationStats`."""

    def __init__(
        self, mode: Literal["ar", "spd"], k: int, batch_size: int, slots: int | None = None, proposer: str = ""
    ) -> None:
        self.mode, self.k, self.batch_size, self.proposer = mode, k, batch_size, proposer
        slots = k if slots is None else slots  # deepest tree (draft slots of a chain) per round
        self.hist = np.zeros(slots + 1, dtype=np.int64)
        self.available = np.zeros((slots, 1), dtype=np.int64)  # [depth, rank]: reached nodes with a rank-r child
        self.rank_acc = np.zeros((slots, 1), dtype=np.int64)  # [depth, rank]: rank-r child accepted
        self.nodes_hist = np.zeros(1, dtype=np.int64)
        self.depth_hist = np.zeros(slots + 1, dtype=np.int64)
        self.lookup_rounds = self.lookup_accepted = self.tree_rounds = 0
        self.overlap_sum = 0.0
        self.overlap_n = 0
        self.rounds = self.row_calls = self.target_calls = self.draft_calls = self.draft_decode_calls = 0
        self.draft_call_tokens = self.target_call_tokens = 0
        self.new_tokens = self.target_tokens = self.from_draft_tokens = 0
        self.loop_tokens = 0
        self.all_accepted = 0
        self.drafted = 0
        self.times = {"draft": 0.0, "target": 0.0, "prefill": 0.0}
        self.tuned: list[TunedRound] = []  # filled by accel.spd.autotune.AutoTune
        self._t0 = time.perf_counter()

    @contextmanager
    def timed(self, what: str, prefill: bool = False) -> Iterator[None]:
        """Add the elapsed seconds of the block to ``what`` ("draft"/"target"), and to prefill if ``prefill``."""
        t = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t
            self.times[what] += dt
            if prefill:
                self.times["prefill"] += dt

    def add_round(self, call_tokens: int) -> None:
        """One target decode call of ``call_tokens`` columns."""
        self.rounds += 1
        self.target_call_tokens += call_tokens

    def add_row(
        self,
        nodes: int,
        depth: int,
        branching: bool,
        outcome: TreeOutcome,
        leaf: bool,
        emitted: int,
        emitted_from_draft: int,
        lookup: bool = False,
    ) -> None:
        """One active row of a round: its tree (``nodes`` below the root, ``depth`` levels, ``branching`` if some node
        has two children), the verification ``outcome``, whether the accepted path ended at a leaf, and the tokens
        emitted (after EOS / length truncation) and how many of them came from the tree."""
        m = outcome.accepted
        self.row_calls += 1
        self.hist = _grown(self.hist, m + 1)
        self.hist[m] += 1
        self.loop_tokens += m + 1
        self.all_accepted += int(m >= 1 and leaf)
        self.drafted += nodes
        self.nodes_hist = _grown(self.nodes_hist, nodes + 1)
        self.nodes_hist[nodes] += 1
        self.depth_hist = _grown(self.depth_hist, depth + 1)
        self.depth_hist[depth] += 1
        self.tree_rounds += int(branching)
        for d, tried, rank in outcome.steps:
            shape = (max(d + 1, self.available.shape[0]), max(tried, self.available.shape[1]))
            self.available, self.rank_acc = _grown2(self.available, shape), _grown2(self.rank_acc, shape)
            self.available[d, :tried] += 1
            if rank >= 0:
                self.rank_acc[d, rank] += 1
        ov = [o for o in outcome.overlaps if math.isfinite(o)]
        self.overlap_sum += float(sum(ov))
        self.overlap_n += len(ov)
        if lookup:
            self.lookup_rounds += 1
            self.lookup_accepted += m
        self.new_tokens += emitted
        self.from_draft_tokens += emitted_from_draft
        self.target_tokens += emitted - emitted_from_draft

    def add_plain(self, emitted: int) -> None:
        """``add_row`` of a row whose tree is the root alone (a plain step, nothing accepted, nothing from a draft)."""
        self.row_calls += 1
        self.hist[0] += 1
        self.loop_tokens += 1
        self.nodes_hist[0] += 1
        self.depth_hist[0] += 1
        self.new_tokens += emitted
        self.target_tokens += emitted

    def finish(self) -> GenerationStats:
        """Freeze the counters (wall time ends now)."""
        wall = time.perf_counter() - self._t0
        draft_s, target_s, prefill_s = self.times["draft"], self.times["target"], self.times["prefill"]
        decode_s = wall - prefill_s
        spd = self.mode == "spd"
        reached = self.available[:, 0]
        accepted = self.rank_acc.sum(axis=1)
        return GenerationStats(
            mode=self.mode,
            proposer=self.proposer,
            k=self.k,
            batch_size=self.batch_size,
            new_tokens=self.new_tokens,
            rounds=self.rounds,
            row_calls=self.row_calls,
            target_calls=self.target_calls,
            draft_calls=self.draft_calls,
            tokens_per_target_call=_nan_div(self.new_tokens, self.row_calls),
            accepted_histogram=[int(x) for x in self.hist],
            acceptance_per_position=[_nan_div(a, p) for a, p in zip(accepted, reached, strict=True)],
            proposed_per_position=[int(x) for x in reached],
            all_accepted_rounds=self.all_accepted,
            draft_tokens=self.drafted,
            mean_drafts_per_loop=_nan_div(self.drafted, self.row_calls) if spd else math.nan,
            accepted_drafts=int(accepted.sum()),
            proposed_drafts=int(reached.sum()),
            draft_calls_per_loop=_nan_div(self.draft_decode_calls, self.rounds) if spd else math.nan,
            mean_draft_tokens_per_call=_nan_div(self.draft_call_tokens, self.draft_decode_calls),
            mean_target_call_tokens=_nan_div(self.target_call_tokens, self.rounds),
            lookup_rounds=self.lookup_rounds,
            lookup_accepted=self.lookup_accepted,
            tree_rounds=self.tree_rounds,
            tree_nodes_histogram=[int(x) for x in self.nodes_hist],
            tree_depth_histogram=[int(x) for x in self.depth_hist],
            rank_available=self.available.tolist(),
            rank_accepted=self.rank_acc.tolist(),
            target_tokens=self.target_tokens,
            alpha_counts=_nan_div(accepted.sum(), reached.sum()),
            alpha_overlap=_nan_div(self.overlap_sum, self.overlap_n),
            mean_tokens_per_loop=_nan_div(self.loop_tokens, self.row_calls),
            wall_s=wall,
            prefill_s=prefill_s,
            draft_s=draft_s,
            target_s=target_s,
            host_s=max(0.0, wall - draft_s - target_s),
            tokens_per_s=_nan_div(self.new_tokens, wall),
            decode_tokens_per_s=_nan_div(self.new_tokens, decode_s),
            tuned_rounds=list(self.tuned),
        )


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    return a if a.size >= size else np.concatenate([a, np.zeros(size - a.size, dtype=a.dtype)])


def _grown2(a: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    if a.shape == shape:
        return a
    out = np.zeros(shape, dtype=a.dtype)
    out[: a.shape[0], : a.shape[1]] = a
    return out
