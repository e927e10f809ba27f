"""The Superposed Decoding loop (Shen et al. 2024, docs/reference.md §9): k drafts from one forward pass per token.

One KV stream per prompt. Each step feeds the backend one column whose input is the weighted sum of the alive drafts'
latest token embeddings (the ``"mix"`` extension of ``accel.backends.base``; weights = the drafts' normalised
probabilities), reads one next-token distribution, scores every (draft, top token) pair with the model's
log-probability interpolated with n-gram statistics of the draft's own context, and keeps the best k
(``accel.superposed.scoring``). Approximate by design: the drafts are plausible continuations, not samples of the
model's distribution (``accel.superposed.proposer`` verifies them with the target where exactness matters).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from accel.backends.base import Backend, MixInputs, prefill, require
from accel.errors import SuperposedError
from accel.superposed.scoring import RowsSelection, SuperposedConfig, log_softmax, ngram_logprobs, select_rows
from accel.superposed.store import NgramStore

__all__ = ["Beams", "Draft", "SuperposedResult", "superposed_generate"]


@dataclass(frozen=True)
class Draft:
    """One returned draft: its new tokens (ending with the end-of-sequence token if it finished) and its score
    (cumulative interpolated log-probability, nats)."""

    tokens: list[int]
    score: float
    finished: bool


@dataclass
class SuperposedResult:
    """The drafts of every prompt (``drafts[row]``: k drafts, best first) and what they cost.

    Attributes:
        calls: backend ``forward`` calls after the prefill (one per generated position after the first).
        prefill_calls: the prefill's calls (chunks of ``info.max_seq_len``).
        prefill_s, decode_s: wall time of the prefill and of the decoding steps (seconds).
    """

    drafts: list[list[Draft]]
    calls: int = 0
    prefill_calls: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    config: SuperposedConfig = field(default_factory=SuperposedConfig)


class Beams:
    """The k drafts of every row of a batch, advanced one position per backend call (the state of one superposed
    run; also what a proposer keeps for one round). All rows advance together in array operations: one
    log-softmax and top-n over ``[B, V]``, one n-gram query for every row's k drafts, one ``select_rows``.

    ``advance(logits)`` extends every unfinished row by one token from its next-token logits ``[B, V]``;
    ``mix_inputs()`` gives the next call's ``(ids [B, 1], positions [B, 1], mix_ids [B, 1, k], mix_weights [B, 1,
    k])`` (stopped rows: position -1); ``stop(rows)`` stops rows early; ``drafts()`` each row's k best drafts.

    State: ``tokens [B, k, steps]`` (row b's drafts are ``tokens[b, :, : length[b]]``), ``score [B, k]`` (``-inf``:
    empty slot), ``context [B, k, m]`` the last ``m = max_order - 1`` tokens of prompt + draft right-aligned (what
    the n-gram lookups read; ``context_len [B]`` of them are real), ``done [B]``, and each row's finished drafts.
    """

    def __init__(
        self,
        contexts: Sequence[Sequence[int]],
        config: SuperposedConfig,
        store: NgramStore | None = None,
        eos: frozenset[int] = frozenset(),
    ) -> None:
        k, b = config.k, len(contexts)
        self.cfg, self.store, self.eos = config, store, eos
        self.prompt_len = np.array([len(c) for c in contexts], np.int64)
        self.tokens = np.zeros((b, k, 0), np.int64)
        self.length = np.zeros(b, np.int64)
        self.score = np.full((b, k), -np.inf)
        self.score[:, 0] = 0.0
        m = config.max_order - 1
        self.context = np.zeros((b, k, m), np.int64)
        for r, c in enumerate(contexts):
            tail = list(c)[-m:] if m else []
            self.context[r, :, m - len(tail) :] = tail
        self.context_len = np.minimum(self.prompt_len, m)
        self.done = np.zeros(b, bool)
        self.finished: list[list[Draft]] = [[] for _ in range(b)]
        self.steps = 0

    @property
    def all_done(self) -> bool:
        """Whether every row has stopped."""
        return bool(self.done.all())

    def stop(self, rows: np.ndarray) -> None:
        """Stop the rows where ``rows`` (bool ``[B]``) is true: they are not extended any more."""
        self.done |= np.asarray(rows, bool)

    def advance(self, logits: np.ndarray, last: bool = False) -> None:
        """One step for every unfinished row (``last``: the final one; rows stop after it)."""
        act = np.flatnonzero(~self.done)
        self.steps += 1
        if act.size == 0:
            return
        cfg, k = self.cfg, self.cfg.k
        lp = log_softmax(np.asarray(logits)[act] / cfg.temperature)
        n = min(cfg.n_token_sample, lp.shape[1])
        top = np.argpartition(-lp, n - 1, axis=1)[:, :n]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(lp, top, 1), axis=1, kind="stable"), 1)
        tokens = np.broadcast_to(top[:, None, :], (act.size, k, n))
        step = np.broadcast_to(np.take_along_axis(lp, top, 1)[:, None, :], (act.size, k, n))
        if self.store is not None and cfg.alpha > 0:
            ctx = self.context[act].reshape(act.size * k, -1)
            ctx_len = np.repeat(self.context_len[act], k)
            ng = ngram_logprobs(self.store, ctx, ctx_len, np.ascontiguousarray(tokens).reshape(act.size * k, n), cfg)
            step = (1 - cfg.alpha) * step + cfg.alpha * ng.reshape(act.size, k, n)
        sel = select_rows(self.score[act][:, :, None] + step, tokens, k, self.eos)  # dead drafts stay -inf
        self._finish(act, sel)
        self._extend(act, sel)
        best_alive = sel.score.max(axis=1)
        kth = np.array([f[k - 1].score if len(f) == k else -np.inf for f in (self.finished[b] for b in act)])
        enough = kth >= best_alive  # k finished drafts all beat every alive one: scores only fall
        self.done[act] = last | ~np.isfinite(best_alive) | enough

    def _finish(self, act: np.ndarray, sel: RowsSelection) -> None:
        """Set aside the candidates that ended in end of sequence (each row keeps its k best)."""
        for i, p, t, s in zip(sel.fin_row, sel.fin_parent, sel.fin_token, sel.fin_score, strict=True):
            b = int(act[i])
            self.finished[b].append(Draft([*self.tokens[b, p, : self.length[b]].tolist(), int(t)], float(s), True))
        for b in set(act[sel.fin_row].tolist()):
            self.finished[b].sort(key=lambda d: -d.score)
            del self.finished[b][self.cfg.k :]

    def _extend(self, act: np.ndarray, sel: RowsSelection) -> None:
        """Move the alive slots to their parents' tokens and contexts plus the chosen token."""
        if self.tokens.shape[2] < int(self.length[act].max()) + 1:
            self.tokens = np.concatenate([self.tokens, np.zeros((*self.tokens.shape[:2], 1), np.int64)], axis=2)
        keep = sel.parent >= 0
        parent = np.where(keep, sel.parent, 0)
        col = self.length[act]
        rows = np.arange(act.size)[:, None]
        toks = np.where(keep[:, :, None], self.tokens[act][rows, parent], 0)
        toks[np.arange(act.size), :, col] = np.where(keep, sel.token, 0)
        self.tokens[act] = toks
        ctx = self.context[act][rows, parent]
        if ctx.shape[2]:
            ctx = np.concatenate([ctx[:, :, 1:], np.where(keep, sel.token, 0)[:, :, None]], axis=2)
        self.context[act] = ctx
        self.context_len[act] = np.minimum(self.context_len[act] + 1, self.context.shape[2])
        self.length[act] += 1
        self.score[act] = sel.score

    def mix_inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The next call's inputs (class docstring): each row's alive drafts' latest tokens at the next position."""
        b, k = self.done.size, self.cfg.k
        if self.tokens.shape[2]:
            latest = self.tokens[np.arange(b), :, np.maximum(self.length - 1, 0)]
        else:
            latest = np.zeros((b, k), np.int64)
        mix_ids = np.where(self.done[:, None] | (self.length[:, None] == 0), 0, latest).astype(np.int64)
        mix_w = _mix_weights(self.score).astype(np.float32)
        pos = np.where(self.done, -1, self.prompt_len + self.length - 1)[:, None].astype(np.int64)
        return mix_ids[:, :1].copy(), pos, mix_ids[:, None], mix_w[:, None]

    def drafts(self) -> list[list[Draft]]:
        """Each row's k best drafts (finished and unfinished), best first."""
        out = []
        for b in range(self.done.size):
            alive = [
                Draft(self.tokens[b, d, : self.length[b]].tolist(), float(self.score[b, d]), False)
                for d in range(self.cfg.k)
                if np.isfinite(self.score[b, d])
            ]
            out.append(sorted(self.finished[b] + alive, key=lambda d: -d.score)[: self.cfg.k])
        return out


def _check(backend: Backend, prompts: Sequence[Sequence[int]], max_new_tokens: int, store: NgramStore | None) -> None:
    info = backend.info
    if "mix" not in info.capabilities:
        raise SuperposedError(
            f"this {info.name} backend takes no mixed inputs: export the model with mix_inputs=True "
            "(or use a TorchBackend)"
        )
    if len(prompts) != info.batch_size:
        raise SuperposedError(f"{len(prompts)} prompts for a backend of batch size {info.batch_size}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise SuperposedError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise SuperposedError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
    longest = max(len(p) for p in prompts) + max_new_tokens
    if longest > info.ctx_len:
        raise SuperposedError(f"prompt + max_new_tokens = {longest} tokens exceeds the KV cache ({info.ctx_len})")
    if store is not None and store.vocab_size != info.vocab_size:
        raise SuperposedError(
            f"the n-gram store is for a {store.vocab_size}-token vocabulary; the model has {info.vocab_size}"
        )


def superposed_generate(
    backend: Backend,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    config: SuperposedConfig | None = None,
    store: NgramStore | None = None,
    eos_token_ids: Sequence[int] = (),
) -> SuperposedResult:
    """``config.k`` drafts of up to ``max_new_tokens`` tokens for each prompt, one backend call per position.

    Args:
        backend: a backend with the ``"mix"`` capability (``export_onnx(mix_inputs=True)`` or a ``TorchBackend``),
            one prompt per batch row.
        prompts: token ids per row.
        store: n-gram counts for the interpolation (None: the model's log-probabilities alone, ``alpha`` unused).
        eos_token_ids: a draft that emits one of these is finished (kept, not extended).

    Returns:
        ``SuperposedResult``; each row's k drafts sorted by score (finished and unfinished together).
    """
    cfg = config or SuperposedConfig()
    _check(backend, prompts, max_new_tokens, store)
    mixer = require(backend, "mix")
    eos = frozenset(int(t) for t in eos_token_ids)
    b = len(prompts)
    width = max(len(p) for p in prompts)
    ids = np.zeros((b, width), np.int64)
    pos = np.full((b, width), -1, np.int64)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :], pos[r, width - len(p) :] = p, np.arange(len(p))
    t0 = time.perf_counter()
    backend.reset()
    logits = prefill(backend, ids, pos)
    result = SuperposedResult([], config=cfg, prefill_s=time.perf_counter() - t0)
    result.prefill_calls = -(-width // backend.info.max_seq_len)
    t0 = time.perf_counter()
    beams = Beams(prompts, cfg, store, eos)
    for step in range(max_new_tokens):
        beams.advance(logits, last=step == max_new_tokens - 1)
        if beams.all_done:
            break
        ids1, pos1, mix_ids, mix_w = beams.mix_inputs()
        logits = mixer.forward(ids1, pos1, num_logits=1, mix=MixInputs(mix_ids, mix_w))[:, -1, :]
        result.calls += 1
    result.decode_s = time.perf_counter() - t0
    result.drafts = beams.drafts()
    return result


def _mix_weights(score: np.ndarray) -> np.ndarray:
    """Each row's drafts' normalised probabilities ``exp(score) / sum exp(score)`` (0 for empty slots), ``[B, k]``."""
    alive = np.isfinite(score)
    top = np.where(alive, score, -np.inf).max(axis=1, keepdims=True)
    p = np.where(alive, np.exp(score - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = p.sum(axis=1, keepdims=True)
    return np.divide(p, total, out=np.zeros_like(p), where=total > 0)
