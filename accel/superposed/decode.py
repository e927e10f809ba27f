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

from accel.backends.base import Backend, prefill
from accel.errors import SuperposedError
from accel.superposed.scoring import SuperposedConfig, log_softmax, ngram_logprobs, select
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


@dataclass
class _Row:
    """The beam of one prompt: alive drafts' tokens ``[k, steps]``, scores, and the finished drafts."""

    prompt: list[int]
    tokens: np.ndarray
    score: np.ndarray
    finished: list[Draft]
    done: bool = False


class Beams:
    """The k drafts of every row of a batch, advanced one position per backend call (the state of one superposed
    run; also what a proposer keeps for one round).

    ``advance(logits)`` extends every unfinished row by one token from its next-token logits ``[B, V]``;
    ``mix_inputs()`` gives the next call's ``(ids [B, 1], positions [B, 1], mix_ids [B, 1, k], mix_weights [B, 1,
    k])`` (finished rows: position -1); ``drafts()`` each row's k best drafts.
    """

    def __init__(
        self,
        contexts: Sequence[Sequence[int]],
        config: SuperposedConfig,
        store: NgramStore | None = None,
        eos: frozenset[int] = frozenset(),
    ) -> None:
        k = config.k
        self.cfg, self.store, self.eos = config, store, eos
        self.rows = [
            _Row(list(c), np.zeros((k, 0), np.int64), np.array([0.0] + [-np.inf] * (k - 1)), []) for c in contexts
        ]
        self.steps = 0

    @property
    def done(self) -> bool:
        """Whether every row has stopped."""
        return all(row.done for row in self.rows)

    def advance(self, logits: np.ndarray, last: bool = False) -> None:
        """One step for every unfinished row (``last``: the final one; rows stop after it)."""
        for r, row in enumerate(self.rows):
            if not row.done:
                _advance(row, logits[r], self.cfg, self.store, self.eos, last)
        self.steps += 1

    def mix_inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The next call's inputs (class docstring): each row's alive drafts' latest tokens at the next position."""
        k = self.cfg.k
        mix_ids = np.stack([row.tokens[:, -1] if not row.done else np.zeros(k, np.int64) for row in self.rows])
        mix_w = np.stack([_mix_weights(row.score) for row in self.rows]).astype(np.float32)
        pos = np.array([[len(row.prompt) + self.steps - 1 if not row.done else -1] for row in self.rows], np.int64)
        return mix_ids[:, :1].copy(), pos, mix_ids[:, None], mix_w[:, None]

    def drafts(self) -> list[list[Draft]]:
        """Each row's k best drafts (finished and unfinished), best first."""
        return [_final(row, self.cfg.k) for row in self.rows]


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
        if beams.done:
            break
        ids1, pos1, mix_ids, mix_w = beams.mix_inputs()
        out = backend.forward(ids1, pos1, num_logits=1, mix_ids=mix_ids, mix_weights=mix_w)
        logits = np.asarray(out[0] if isinstance(out, tuple) else out)[:, -1, :]
        result.calls += 1
    result.decode_s = time.perf_counter() - t0
    result.drafts = beams.drafts()
    return result


def _mix_weights(score: np.ndarray) -> np.ndarray:
    """The drafts' normalised probabilities ``exp(score) / sum exp(score)`` (0 for empty slots)."""
    alive = np.isfinite(score)
    if not alive.any():
        return np.zeros_like(score)
    p = np.where(alive, np.exp(score - score[alive].max()), 0.0)
    return p / p.sum()


def _advance(
    row: _Row, logits: np.ndarray, cfg: SuperposedConfig, store: NgramStore | None, eos: frozenset[int], last: bool
) -> None:
    """One step of one row: extend the alive drafts by the best tokens of the shared distribution."""
    lp = log_softmax(logits / cfg.temperature)
    n = min(cfg.n_token_sample, lp.shape[0])
    top = np.argpartition(-lp, n - 1)[:n]
    top = top[np.argsort(-lp[top], kind="stable")]
    k = cfg.k
    tokens = np.broadcast_to(top, (k, n))
    lm = np.broadcast_to(lp[top], (k, n))
    if store is not None and cfg.alpha > 0:
        m = cfg.max_order - 1
        seqs = [row.prompt + row.tokens[d].tolist() for d in range(k)]
        ctx = np.zeros((k, m), np.int64)
        for d, s in enumerate(seqs):
            tail = s[-m:]
            ctx[d, m - len(tail) :] = tail
        ctx_len = np.array([min(len(s), m) for s in seqs])
        step = (1 - cfg.alpha) * lm + cfg.alpha * ngram_logprobs(store, ctx, ctx_len, np.ascontiguousarray(tokens), cfg)
    else:
        step = lm
    cand = row.score[:, None] + step  # dead drafts stay -inf
    sel = select(cand, tokens, k, eos)
    for d, t, s in sel.finished:
        row.finished.append(Draft([*row.tokens[d].tolist(), t], s, True))
    keep = sel.parent >= 0
    new = np.zeros((k, row.tokens.shape[1] + 1), np.int64)
    new[keep, :-1] = row.tokens[sel.parent[keep]]
    new[keep, -1] = sel.token[keep]
    row.tokens, row.score = new, sel.score
    row.finished.sort(key=lambda d: -d.score)
    del row.finished[k:]
    best_alive = sel.score.max()
    enough = len(row.finished) == k and row.finished[-1].score >= best_alive  # scores only fall: nothing can pass
    row.done = last or not np.isfinite(best_alive) or enough


def _final(row: _Row, k: int) -> list[Draft]:
    alive = [Draft(row.tokens[d].tolist(), float(row.score[d]), False) for d in range(k) if np.isfinite(row.score[d])]
    return sorted(row.finished + alive, key=lambda d: -d.score)[:k]
