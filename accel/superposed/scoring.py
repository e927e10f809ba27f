"""Scoring the k x n candidates of one Superposed Decoding step, and keeping the best k (docs/superposed.md).

Pure numpy on small arrays: the model's log-probabilities, interpolated with n-gram log-probabilities looked up for
all drafts at once in an ``NgramStore``, and the k^2 -> k selection with finished drafts set aside.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accel.errors import SuperposedError
from accel.superposed.store import NgramStore

__all__ = [
    "DEFAULT_NGRAM_WEIGHTS",
    "TUNED",
    "RowsSelection",
    "Selection",
    "SuperposedConfig",
    "log_softmax",
    "ngram_logprobs",
    "select",
    "select_rows",
]

DEFAULT_NGRAM_WEIGHTS = (0.01, 0.04, 0.15, 0.18, 0.12)  # orders 2..6 (Shen et al. 2024, docs/reference.md §9)


@dataclass(frozen=True)
class SuperposedConfig:
    """Settings of Superposed Decoding; the defaults are the paper's (docs/reference.md §9).

    Attributes:
        k: drafts kept alive (and returned).
        alpha: weight of the n-gram log-probability: ``score = (1 - alpha) log p_LM + alpha log p_ngram`` (0 without
            a store).
        temperature: applied to the model's logits before the log-softmax (the superposed distribution is flat; a low
            temperature sharpens it).
        n_token_sample: tokens of the shared LM distribution each draft may extend by (k x n candidates per step).
        ngram_weights: interpolation weights of n-gram orders 2, 3, ...: ``p_ngram = sum_n w_n p_n(t | context)``;
            the store must hold order ``len(ngram_weights) + 1``.
        no_match_logprob: ``log p_ngram`` of a candidate no order has seen (the paper's large penalty), nats.
        renormalize: divide ``p_ngram`` by the summed weights of the orders whose context the store has seen (a
            mixture of the usable orders' conditional distributions). The paper does not (False): there a draft
            whose recent tokens the corpus holds verbatim scores far above one whose context is new, whatever the
            candidate.
    """

    k: int = 3
    alpha: float = 0.54
    temperature: float = 0.06
    n_token_sample: int = 9
    ngram_weights: tuple[float, ...] = DEFAULT_NGRAM_WEIGHTS
    no_match_logprob: float = -100.0
    renormalize: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 64:
            raise SuperposedError(f"k must be in 1..64 drafts; got {self.k}")
        if not 0.0 <= self.alpha <= 1.0:
            raise SuperposedError(f"alpha must be in [0, 1]; got {self.alpha}")
        if not (self.temperature > 0 and np.isfinite(self.temperature)):
            raise SuperposedError(f"temperature must be > 0; got {self.temperature}")
        if not 1 <= self.n_token_sample <= 1024:
            raise SuperposedError(f"n_token_sample must be in 1..1024; got {self.n_token_sample}")
        w = self.ngram_weights
        if not 1 <= len(w) <= 15 or any(not (x >= 0 and np.isfinite(x)) for x in w) or not sum(w) > 0:
            raise SuperposedError(f"ngram_weights must be 1..15 non-negative weights (orders 2, 3, ...); got {w}")
        if not (self.no_match_logprob <= 0 and np.isfinite(self.no_match_logprob)):
            raise SuperposedError(
                f"no_match_logprob must be a finite log-probability <= 0; got {self.no_match_logprob}"
            )

    @property
    def max_order(self) -> int:
        """The longest n-gram the scoring reads (tokens)."""
        return len(self.ngram_weights) + 1


# The paper's settings with a milder no-match penalty, tuned for a store of the target's own writing on training
# prompts (benchmarks/superposed_tune.py; docs/superposed.md, "Tuning"): -100 nats times alpha outweighs ~7 logits of
# the LM at T = 0.06, so any candidate the (small) store has not seen lost to every one it has.
TUNED = SuperposedConfig(no_match_logprob=-10.0)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log-softmax (float64)."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def ngram_logprobs(
    store: NgramStore, context: np.ndarray, context_len: np.ndarray, tokens: np.ndarray, cfg: SuperposedConfig
) -> np.ndarray:
    """Interpolated n-gram log-probabilities of candidate next tokens, for R drafts at once (one store query).

    Args:
        store: counts; must hold order ``cfg.max_order`` and the model's vocabulary.
        context: int ``[R, C]``, each draft's last tokens right-aligned (``C >= cfg.max_order - 1``).
        context_len: int ``[R]``, how many of the last columns are real (a short prompt has fewer).
        tokens: int ``[R, N]`` candidate next tokens.

    Returns:
        float64 ``[R, N]``: ``log sum_n w_n count(c_n + t) / count(c_n + any)`` over orders ``n = 2..max_order`` with
        ``c_n`` the last ``n - 1`` context tokens (orders whose context is missing or unseen contribute 0; with
        ``cfg.renormalize`` the sum is divided by the weights of the other orders), or ``cfg.no_match_logprob``
        where the sum is 0.
    """
    if store.max_order < cfg.max_order:
        raise SuperposedError(
            f"the n-gram store counts up to order {store.max_order}; the weights need order {cfg.max_order}"
        )
    r, c = context.shape
    n_tok = tokens.shape[1]
    orders = np.arange(2, cfg.max_order + 1)
    width = cfg.max_order
    num = np.zeros((len(orders), r, n_tok, width), np.int64)
    den = np.zeros((len(orders), r, width), np.int64)
    for o, n in enumerate(orders):
        ctx = context[:, c - (n - 1) :]
        num[o, :, :, : n - 1] = ctx[:, None, :]
        num[o, :, :, n - 1] = tokens
        den[o, :, : n - 1] = ctx
    num_len = np.broadcast_to(orders[:, None, None], (len(orders), r, n_tok)).reshape(-1)
    den_len = np.broadcast_to(orders[:, None] - 1, (len(orders), r)).reshape(-1)
    hits = store.count(num.reshape(-1, width), num_len).reshape(len(orders), r, n_tok)
    totals = store.continuation_count(den[..., : width - 1].reshape(-1, width - 1), den_len).reshape(len(orders), r)
    usable = (orders[:, None] - 1 <= np.asarray(context_len)[None, :]) & (totals > 0)
    p_n = np.where(usable[..., None], hits / np.maximum(totals, 1)[..., None], 0.0)
    w = np.asarray(cfg.ngram_weights, np.float64)
    p = np.tensordot(w, p_n, axes=1)
    if cfg.renormalize:
        seen = np.tensordot(w, usable.astype(np.float64), axes=1)  # [R]
        p = np.divide(p, seen[:, None], out=np.zeros_like(p), where=seen[:, None] > 0)
    with np.errstate(divide="ignore"):
        return np.where(p > 0, np.log(p), cfg.no_match_logprob)


@dataclass(frozen=True)
class Selection:
    """One row's outcome of a step: the drafts that stay alive and the ones that finished.

    Attributes:
        parent: int ``[k]`` index of the draft each alive slot extends (-1: an empty slot).
        token: int ``[k]`` the token appended (-1: empty slot).
        score: float64 ``[k]`` cumulative score (``-inf``: empty slot).
        finished: ``(parent, token, score)`` of candidates that ended with an end-of-sequence token, best first.
    """

    parent: np.ndarray
    token: np.ndarray
    score: np.ndarray
    finished: list[tuple[int, int, float]]


@dataclass(frozen=True)
class RowsSelection:
    """``select_rows``' outcome for R rows at once.

    Attributes:
        parent, token, score: ``[R, k]`` as in ``Selection`` (-1 / -1 / ``-inf`` in empty slots).
        fin_row, fin_parent, fin_token, fin_score: the finished candidates, one entry each, rows in order and each
            row's best first.
    """

    parent: np.ndarray
    token: np.ndarray
    score: np.ndarray
    fin_row: np.ndarray
    fin_parent: np.ndarray
    fin_token: np.ndarray
    fin_score: np.ndarray


def select_rows(cand: np.ndarray, tokens: np.ndarray, k: int, eos: frozenset[int] = frozenset()) -> RowsSelection:
    """The k^2 -> k step for R rows at once: ``cand[r, d, j]`` is row r's draft d extended by ``tokens[r, d, j]``
    (cumulative score, ``-inf`` for a dead draft).

    Per row, the best ``2k`` candidates are walked in order (ties: lower draft, then lower column, first): one ending
    in an ``eos`` token is finished, the others fill the ``k`` alive slots in order; the walk stops at the first
    non-finite candidate and once ``k`` slots are filled (finished candidates after that are dropped). Vectorised:
    one stable sort per step, no Python loop over rows or candidates.
    """
    r, d, n = cand.shape
    flat = cand.reshape(r, d * n)
    order = np.argsort(-flat, axis=1, kind="stable")[:, : 2 * k]
    s = np.take_along_axis(flat, order, axis=1)
    t = np.take_along_axis(tokens.reshape(r, d * n), order, axis=1)
    finite = np.isfinite(s)
    finite &= np.cumprod(finite, axis=1).astype(bool)  # nothing after the first non-finite one
    is_eos = np.isin(t, np.fromiter(eos, np.int64, len(eos))) if eos else np.zeros_like(finite)
    fills = finite & ~is_eos
    filled = np.cumsum(fills, axis=1)  # alive slots filled up to and including each candidate
    keep = fills & (filled <= k)
    done = finite & is_eos & (filled - fills < k)
    parent = np.full((r, k), -1, np.int64)
    token = np.full((r, k), -1, np.int64)
    score = np.full((r, k), -np.inf)
    rows, cols = np.nonzero(keep)
    slot = filled[rows, cols] - 1
    parent[rows, slot] = order[rows, cols] // n
    token[rows, slot] = t[rows, cols]
    score[rows, slot] = s[rows, cols]
    fr, fc = np.nonzero(done)
    return RowsSelection(parent, token, score, fr, order[fr, fc] // n, t[fr, fc], s[fr, fc])


def select(cand: np.ndarray, tokens: np.ndarray, k: int, eos: frozenset[int] = frozenset()) -> Selection:
    """Keep the best ``k`` of one row's ``[D, N]`` candidates (the k^2 -> k step; ``select_rows`` for one row).

    ``cand[d, j]`` is draft d's cumulative score extended by ``tokens[d, j]`` (``-inf`` for a dead draft). The best
    ``2k`` candidates are walked in order (ties: lower draft, then lower column, first): one ending in an ``eos``
    token is set aside as finished, the others fill the ``k`` alive slots. Slots that no finite candidate fills stay
    empty.
    """
    sel = select_rows(np.asarray(cand, np.float64)[None], np.asarray(tokens)[None], k, eos)
    finished = [
        (int(p), int(t), float(s)) for p, t, s in zip(sel.fin_parent, sel.fin_token, sel.fin_score, strict=True)
    ]
    return Selection(sel.parent[0], sel.token[0], sel.score[0], finished)
