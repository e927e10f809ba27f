"""Predictive Pipelined Decoding (Yang et al. 2023, docs/reference.md §4): an exact decoder on two pipeline stages.

The target is split at its exit layer ``e`` (``accel.backends.stages``): the *front* stage runs layers ``[0, e)`` and
returns early-exit logits (``accel.drafts.early_exit``); the *back* stage runs layers ``[e, L)`` and returns the
model's logits. The front stage has ``k`` batch rows, one per candidate; the back stage one row. One step, with the
front's residual state ``h`` of the last token (position ``t``) and the top-``k`` exit candidates for ``t + 1``:

1. concurrently (two threads; onnxruntime and torch release the GIL inside a call):
   *main*: the back stage finishes token ``t`` from ``h`` and the next token ``x`` is chosen from its logits
   (greedy, or sampled from the warped distribution); *speculation*: the front stage runs candidate ``c_r`` at
   position ``t + 1`` in row ``r``;
2. hit (``x == c_r``): row ``r``'s output is ``x``'s front pass: its state and exit candidates carry on, and the
   next step starts at once; miss: the front stage runs ``x`` itself (on every row) before the next step.

So a hit saves the front stage's latency; the output is the target's own decoding whatever the candidates are (the
token always comes from the back stage's logits), greedy and sampled alike. Only row ``r``'s cache holds ``x``'s
keys/values at ``t + 1`` after a hit; the other rows get ``x`` again at the head of their next speculation call
(``[x, c'_r]`` at ``[t + 1, t + 2]``), the catch-up of the position-indexed cache contract (docs/reference.md §2).

``generate_ppd(front, back, prompt, max_new_tokens=...)`` runs it at batch 1 on any ``StageBackend`` pair (stage graphs
on ``OrtBackend``, or ``TorchBackend(..., stage=...)``); ``PPDStats`` reports the match rate ``p_correct`` for every
``k' <= k`` (the rank at which the true token was found) and where the time went. ``concurrent=False`` runs the
speculation after the main call on one thread: the same tokens, the cost of speculating without parallel hardware.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from accel.backends.stages import StageBackend, StageOutput
from accel.errors import SpdError
from accel.spd.checks import eos_set, make_rng
from accel.spd.mrs import sample
from accel.spd.warps import Sampling, check_logits

__all__ = ["PPDResult", "PPDStats", "generate_ppd"]

GREEDY = Sampling(greedy=True)


class PPDStats(BaseModel):
    """Statistics of one ``generate_ppd`` run. Times in seconds (``wall_s`` includes the prefill)."""

    model_config = ConfigDict(frozen=True)

    k: int = Field(description="candidates per step (the front stage's batch rows)")
    exit_layer: int
    num_layers: int
    concurrent: bool
    new_tokens: int
    steps: int = Field(description="steps that speculated (every decode step but the last)")
    hits: int = Field(description="steps whose token was among the candidates")
    hits_at_rank: list[int] = Field(description="hits whose token was the exit's i-th best candidate, i = 0..k-1")
    p_correct: list[float] = Field(description="match rate with the top k' candidates, k' = 1..k (NaN if no steps)")
    prefill_s: float
    wall_s: float
    main_s: float = Field(description="inside back-stage calls, prefill excluded")
    spec_s: float = Field(description="inside speculative front-stage calls")
    miss_s: float = Field(description="inside the front-stage calls after misses (on the critical path)")
    tokens_per_s: float
    decode_tokens_per_s: float = Field(description="new tokens after the first / decode time (prefill excluded)")


class PPDResult(BaseModel):
    """Generated tokens (prompt excluded), why the run stopped, and its statistics."""

    model_config = ConfigDict(frozen=True)

    tokens: list[int]
    finish_reason: Literal["eos", "length", "context"]
    stats: PPDStats


def _check(front: StageBackend, back: StageBackend, prompt: Sequence[int], max_new_tokens: int) -> np.ndarray:
    fs, bs = front.stage, back.stage
    if not (fs.is_first and fs.exit_logits and bs.is_last and fs.stop == bs.start and fs.total == bs.total):
        raise SpdError(
            f"PPD needs a front stage [0, e) with exit logits and the back stage [e, L) of the same model; got "
            f"[{fs.start}, {fs.stop}) exit_logits={fs.exit_logits} and [{bs.start}, {bs.stop}) of {bs.total}"
        )
    fi, bi = front.info, back.info
    if bi.batch_size != 1:
        raise SpdError(f"the back stage must have batch_size 1 (PPD decodes one sequence); it has {bi.batch_size}")
    if (fi.vocab_size, fi.hidden_size, fi.ctx_len) != (bi.vocab_size, bi.hidden_size, bi.ctx_len):
        raise SpdError("the front and back stages differ in vocabulary, hidden size or ctx_len")
    if fi.max_seq_len < 2:
        raise SpdError("the front stage must accept 2 tokens per call (a candidate and its row's catch-up)")
    ids = np.asarray(prompt)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise SpdError(f"the prompt must be a non-empty sequence of token ids; got shape {ids.shape} {ids.dtype}")
    if ids.min() < 0 or ids.max() >= fi.vocab_size:
        raise SpdError(f"prompt token ids must be in [0, {fi.vocab_size})")
    if ids.size > min(fi.max_seq_len, bi.max_seq_len) or ids.size >= fi.ctx_len:
        raise SpdError(
            f"a prompt of {ids.size} tokens does not fit one prefill call (max_seq_len {fi.max_seq_len}, "
            f"{bi.max_seq_len}) with room to generate in ctx_len {fi.ctx_len}"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise SpdError(f"max_new_tokens must be an integer >= 0; got {max_new_tokens!r}")
    return ids.astype(np.int64)


class _Run:
    """One PPD generation: the stages, the token buffer and the clocks."""

    def __init__(self, front, back, sampling: Sampling, rng, eos: frozenset[int], concurrent: bool) -> None:
        self.front, self.back, self.sampling, self.rng, self.eos = front, back, sampling, rng, eos
        self.k = front.info.batch_size
        self.pool = ThreadPoolExecutor(max_workers=1) if concurrent else None
        self.main_s = self.spec_s = self.miss_s = 0.0

    def candidates(self, exit_logits: np.ndarray) -> np.ndarray:
        """The exit's top k token ids ``[k]``, best first."""
        row = check_logits(exit_logits, "exit logits")
        top = np.argpartition(-row, self.k - 1)[: self.k]
        return top[np.argsort(-row[top], kind="stable")]

    def choose(self, logits: np.ndarray) -> int:
        """The next token from the back stage's logits ``[V]`` (greedy argmax or one sample)."""
        row = check_logits(logits, "target logits")
        if self.sampling.greedy:
            return int(np.argmax(row))
        return int(sample(self.sampling.probs(row[None]), self.rng)[0])

    def _timed_front(self, pos: np.ndarray, ids: np.ndarray) -> tuple[StageOutput, float]:
        t0 = time.perf_counter()
        out = self.front.forward_stage(pos, input_ids=ids, num_logits=1)
        return out, time.perf_counter() - t0

    def step(self, hidden: np.ndarray, pos: np.ndarray, spec: tuple[np.ndarray, np.ndarray] | None):
        """Main call on ``hidden`` at ``pos`` with the speculation call ``spec = (ids, pos)`` (or None) beside it;
        returns the chosen token and the speculation's output."""
        job = None
        if spec is not None and self.pool is not None:
            job = self.pool.submit(self._timed_front, spec[1], spec[0])
        t0 = time.perf_counter()
        out = self.back.forward_stage(pos, hidden_in=hidden, num_logits=1)
        self.main_s += time.perf_counter() - t0
        x = self.choose(out.logits[0, -1])
        spec_out = None
        if job is not None:
            spec_out, secs = job.result()
            self.spec_s += secs
        elif spec is not None:
            spec_out, secs = self._timed_front(spec[1], spec[0])
            self.spec_s += secs
        return x, spec_out

    def miss(self, x: int, position: int) -> StageOutput:
        """The front pass of the true token ``x`` at ``position`` on every row (after a miss)."""
        ids = np.full((self.k, 1), x, dtype=np.int64)
        out, secs = self._timed_front(np.full((self.k, 1), position, dtype=np.int64), ids)
        self.miss_s += secs
        return out


def _prefill(
    run: _Run, front: StageBackend, back: StageBackend, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reset both stages and run the prompt through the front stage on every row: (hidden, positions, candidates)."""
    k, n0 = run.k, int(ids.size)
    front.reset()
    back.reset()
    pre = front.forward_stage(np.tile(np.arange(n0), (k, 1)), input_ids=np.tile(ids, (k, 1)), num_logits=1)
    assert pre.hidden is not None and pre.logits is not None  # a front stage with exit logits returns both
    hidden, pos = pre.hidden[:1], np.arange(n0)[None]
    return hidden, pos, run.candidates(pre.logits[0, -1])


def _speculation(cands: np.ndarray, catch_up: int | None, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The speculation call ``(ids, pos)``: row r's candidate at ``n``, after the catch-up token at ``n - 1`` if any."""
    spec_ids, spec_pos = cands[:, None], np.full((k, 1), n, dtype=np.int64)
    if catch_up is not None:  # rows other than the last hit's lack the last token at n - 1
        spec_ids = np.concatenate([np.full((k, 1), catch_up), spec_ids], axis=1)
        spec_pos = np.concatenate([np.full((k, 1), n - 1), spec_pos], axis=1)
    return spec_ids, spec_pos


def _advance(
    run: _Run, cands: np.ndarray, x: int, spec_out: Any, n: int, ranks: np.ndarray
) -> tuple[Any, np.ndarray, np.ndarray, int | None]:
    """After token ``x`` at ``n``: count a hit in ``ranks``; the next (hidden, positions, candidates, catch-up)."""
    catch_up: int | None
    hit = np.flatnonzero(cands == x)
    if hit.size:
        r = int(hit[0])
        ranks[r] += 1
        out, catch_up = spec_out, x
    else:
        r, out, catch_up = 0, run.miss(x, n), None
    hidden, pos = out.hidden[r : r + 1, -1:], np.array([[n]])
    return hidden, pos, run.candidates(out.logits[r, -1]), catch_up


def _stats(
    run: _Run,
    front: StageBackend,
    concurrent: bool,
    tokens: list[int],
    steps: int,
    ranks: np.ndarray,
    prefill_s: float,
    wall: float,
) -> PPDStats:
    """The ``PPDStats`` of a finished run (``wall``: seconds since the prefill started)."""
    decode_s = max(wall - prefill_s, 1e-12)
    cum = np.cumsum(ranks)
    return PPDStats(
        k=run.k,
        exit_layer=front.stage.stop,
        num_layers=front.stage.total,
        concurrent=concurrent,
        new_tokens=len(tokens),
        steps=steps,
        hits=int(cum[-1]),
        hits_at_rank=ranks.tolist(),
        p_correct=[float(c / steps) if steps else float("nan") for c in cum],
        prefill_s=prefill_s,
        wall_s=wall,
        main_s=run.main_s,
        spec_s=run.spec_s,
        miss_s=run.miss_s,
        tokens_per_s=len(tokens) / wall if wall > 0 else float("nan"),
        decode_tokens_per_s=max(len(tokens) - 1, 0) / decode_s,
    )


def generate_ppd(
    front: StageBackend,
    back: StageBackend,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    seed: int | np.random.Generator = 0,
    eos_token_id: int | Sequence[int] | None = None,
    concurrent: bool = True,
) -> PPDResult:
    """Decode ``max_new_tokens`` tokens after ``prompt`` with PPD (module docstring); the tokens are the target's
    own decoding (greedy: token for token; sampled: the same law). ``k`` = ``front.info.batch_size``."""
    ids = _check(front, back, prompt, max_new_tokens)
    sampling = sampling.validate()
    rng = make_rng(seed)
    eos = frozenset(int(e) for e in eos_set(eos_token_id, front.info.vocab_size))
    run = _Run(front, back, sampling, rng, eos, concurrent)
    k, n0, ctx = run.k, int(ids.size), front.info.ctx_len
    ranks = np.zeros(k, dtype=np.int64)
    steps, reason = 0, "length"
    tokens: list[int] = []
    t0 = time.perf_counter()
    hidden, pos, cands = _prefill(run, front, back, ids)
    catch_up: int | None = None
    prefill_s = time.perf_counter() - t0
    try:
        while len(tokens) < max_new_tokens:
            n = n0 + len(tokens)  # the token chosen in this step goes to position n
            spec = None
            if len(tokens) + 1 < max_new_tokens and n + 1 < ctx:  # its front pass will be needed
                spec = _speculation(cands, catch_up, k, n)
            t_main = time.perf_counter()
            x, spec_out = run.step(hidden, pos, spec)
            if not tokens:  # the prompt's main call (and the first speculation beside it) count as prefill
                prefill_s += time.perf_counter() - t_main
                run.main_s = run.spec_s = 0.0
            tokens.append(x)
            if x in run.eos or n + 1 >= ctx or spec_out is None:
                reason = "eos" if x in run.eos else ("context" if n + 1 >= ctx else "length")
                break
            steps += 1
            hidden, pos, cands, catch_up = _advance(run, cands, x, spec_out, n, ranks)
    finally:
        if run.pool is not None:
            run.pool.shutdown()
    wall = time.perf_counter() - t0
    stats = _stats(run, front, concurrent, tokens, steps, ranks, prefill_s, wall)
    return PPDResult(tokens=tokens, finish_reason=reason, stats=stats)
