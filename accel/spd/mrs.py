"""Modified rejection sampling (Chen et al. 2023, "Accelerating LLM decoding with speculative sampling", Alg. 2).

One speculative round per row: the draft proposed ``d_1..d_k`` with ``d_i ~ p_i``; the target scored them, giving
``q_1..q_{k+1}`` (``q_i`` is the target's distribution for the slot of ``d_i``; ``q_{k+1}`` the one after ``d_k``).

- accept ``d_i`` with probability ``min(1, q_i(d_i) / p_i(d_i))``, in order, until the first rejection;
- on a rejection at ``i``, emit one token from the residual ``(q_i - p_i)+ / sum((q_i - p_i)+)``;
- if all ``k`` drafts are accepted, emit a bonus token from ``q_{k+1}``.

Every emitted token is then distributed exactly as the target's ``q`` (docs/reference.md §3), provided ``p`` and
``q`` are the distributions actually sampled from (same warps). Edge cases, explicit:

- ``p_i(d_i) == 0`` (impossible if ``d_i`` was sampled from ``p_i``): treated as a rejection;
- residual mass 0 (only when ``p_i == q_i`` up to rounding, where a rejection has probability ~0): emit from ``q_i``.

Greedy mode (both warps top-1) reduces to: accept while ``d_i == argmax q_i``, then emit ``argmax`` of the next ``q``;
:func:`greedy_accept` does that without random numbers and :func:`speculative_accept` on one-hot inputs agrees with it.

Rows are independent; ``num_drafts[b]`` (``0..K``) lets rows propose fewer than ``K`` tokens in a batched round
(columns beyond it are ignored). Random numbers come from the ``np.random.Generator`` passed in: a fixed number of
draws per call (``B * (K + 1)``), so seeded runs are reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accel.errors import SpdError
from accel.spd.tree import DIST_SUM_TOLERANCE
from accel.spd.warps import Sampling, check_logits, exp_shifted

__all__ = [
    "RoundResult",
    "acceptance_probs",
    "greedy_accept",
    "residual",
    "sample",
    "sample_logits",
    "speculative_accept",
]


@dataclass(frozen=True)
class RoundResult:
    """Outcome of one batched speculative round.

    Attributes:
        num_accepted: int ``[B]``, drafts accepted per row (``0..num_drafts[b]``).
        next_token: int ``[B]``, the token emitted after the accepted drafts (residual sample or bonus).
        overlap: float ``[B, K]``, ``sum_x min(p_i(x), q_i(x))`` per proposed slot (NaN where ``i >= num_drafts[b]``):
            the per-token acceptance probability alpha at that slot.
    """

    num_accepted: np.ndarray
    next_token: np.ndarray
    overlap: np.ndarray


def acceptance_probs(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``min(1, q / p)`` elementwise (0 where ``p == 0``: such a token is never accepted)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), 0.0)
    return np.minimum(1.0, ratio)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Normalised ``(q - p)+`` over the last axis; rows whose residual mass is 0 fall back to ``q``."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    r = np.maximum(q - p, 0.0)
    mass = r.sum(axis=-1, keepdims=True)
    return np.where(mass > 0, r / np.where(mass > 0, mass, 1.0), q)


_CDF_BLOCK = 256  # entries per block of the two-level inverse CDF (_inverse_cdf)


def sample(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row from ``probs [..., V]`` by inverse CDF (one uniform draw per row).

    The CDF is scaled by its last value, so rows need not sum to exactly 1; a zero-probability token is never
    returned (the uniform is drawn in ``(0, 1]``).
    """
    probs = np.asarray(probs, dtype=np.float64)
    u = 1.0 - rng.random(probs.shape[:-1])  # (0, 1]
    return _inverse_cdf(probs, u)


def sample_logits(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """One token from ``sampling``'s warped law of one row of raw ``logits [V]``: the arg-max (greedy), else one
    draw as ``sample(sampling.probs(logits)[None], rng)`` makes it (one uniform; ``SpdError`` on NaN or infinite
    logits).

    With a temperature alone (no top-k, no top-p) the law is never normalised or copied more than once: the row is
    shifted by its maximum into float64, scaled by ``1 / temperature`` and exponentiated in place, and the inverse CDF
    scales its threshold by the weights' total (``sample`` takes unnormalised rows). That is the same law as
    ``warp``'s in another order of float64 operations (weights equal to ~1e-15 relative), so the token equals
    warp-then-sample's except where the uniform falls within that rounding of a token's CDF boundary; 0.15-0.2 ms
    instead of ~0.33 ms for a 49,152-token row on a 2-core VM. For a root's token, where nothing is accepted or
    rejected against the law (a plain step; the loop's root-only trees): modified rejection sampling keeps the
    arrays of ``warp``."""
    row = np.asarray(logits)
    if row.ndim != 1:
        raise SpdError(f"sample_logits takes one row of logits [V]; got shape {row.shape}")
    if sampling.greedy:
        if not np.isfinite(np.sum(row)):
            check_logits(row, "target logits")  # raises
        return int(np.argmax(row))
    t = sampling.temperature
    if sampling.top_k is not None or sampling.top_p is not None or not (t > 0 and np.isfinite(t)):
        return int(sample(sampling.probs(row)[None], rng)[0])  # warp checks the logits and the settings
    top, bottom = row.max(), row.min()  # NaN propagates into both; +-inf shows in one
    if not (np.isfinite(top) and np.isfinite(bottom)):
        check_logits(row, "target logits")  # raises
    x = np.subtract(row, top, dtype=np.float64)
    if t != 1.0:
        x *= 1.0 / t
    return int(sample(exp_shifted(x)[None], rng)[0])


def _inverse_cdf(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row of ``probs [..., V]``: the first index whose cumulative sum reaches ``u * total`` (``u`` in (0, 1]).

    In two levels: the cumulative sum of the sums of ``_CDF_BLOCK`` entries finds the block the threshold falls in,
    then that block's own cumulative sum the index (one running sum over a 49,152-token vocabulary is a sequential
    pass of ~0.22 ms on a 2-core VM; in two levels ~0.06 ms). A cumulative sum of non-negative floats never decreases,
    so a binary search (``searchsorted``, left) gives the first index reaching the threshold. The sums are added in
    another order than one running sum, so the index can differ from that of a single pass only where the threshold
    lies within rounding (~1e-16 of the total) of an entry's boundary; either way it is an index of positive
    probability (unless the whole row is zero: index 0, as the single pass).
    """
    vocab = probs.shape[-1]
    flat = probs.reshape(-1, vocab)
    thresholds = np.ravel(u)
    if vocab <= 4 * _CDF_BLOCK:  # small vocabularies: one running sum per row
        cdf = np.cumsum(flat, axis=-1)
        idx = [np.searchsorted(row, t * row[-1], side="left") for row, t in zip(cdf, thresholds, strict=True)]
        return np.minimum(np.array(idx, dtype=np.int64), vocab - 1).reshape(probs.shape[:-1])
    full = vocab // _CDF_BLOCK * _CDF_BLOCK
    sums = flat[:, :full].reshape(flat.shape[0], -1, _CDF_BLOCK).sum(axis=-1)
    if full < vocab:
        sums = np.concatenate([sums, flat[:, full:].sum(axis=-1, keepdims=True)], axis=1)
    cum = np.cumsum(sums, axis=-1)
    out = np.empty(flat.shape[0], dtype=np.int64)
    for r, (row, c) in enumerate(zip(flat, cum, strict=True)):
        t = thresholds[r] * c[-1]
        j = min(int(np.searchsorted(c, t, side="left")), c.size - 1)
        block = row[j * _CDF_BLOCK : (j + 1) * _CDF_BLOCK]
        local = np.cumsum(block)
        if j:
            local += c[j - 1]
        i = int(np.searchsorted(local, t, side="left"))
        if i >= block.size:  # its running sum ends a rounding error below the block's sum (> 0: c[j] > c[j - 1])
            i = int(np.flatnonzero(block > 0)[-1])
        out[r] = j * _CDF_BLOCK + i
    return out.reshape(probs.shape[:-1])


def _check(draft_tokens: np.ndarray, p: np.ndarray | None, q: np.ndarray, num_drafts: np.ndarray | None):
    d = np.asarray(draft_tokens)
    if d.ndim != 2:
        raise SpdError(f"draft_tokens must be [batch, K]; got shape {d.shape}")
    batch, k = d.shape
    if q.ndim != 3 or q.shape[:2] != (batch, k + 1):
        raise SpdError(f"target probs q must be [batch={batch}, K+1={k + 1}, V]; got shape {q.shape}")
    vocab = q.shape[2]
    if p is not None and p.shape != (batch, k, vocab):
        raise SpdError(f"draft probs p must be [batch={batch}, K={k}, V={vocab}]; got shape {p.shape}")
    for name, arr in (("p", p), ("q", q)):  # one reduction first (NaN/inf propagate); elementwise only if it overflowed
        if arr is not None and not np.isfinite(np.sum(arr)) and not np.all(np.isfinite(arr)):
            raise SpdError(f"{name} contains NaN or inf")
    n = np.full(batch, k, dtype=np.int64) if num_drafts is None else np.asarray(num_drafts, dtype=np.int64)
    if n.shape != (batch,) or np.any(n < 0) or np.any(n > k):
        raise SpdError(f"num_drafts must be [batch={batch}] integers in 0..{k}; got {n}")
    proposed = np.arange(k)[None, :] < n[:, None]
    if np.any(proposed & ((d < 0) | (d >= vocab))):
        raise SpdError(f"draft token ids must be in [0, {vocab})")
    if p is not None and proposed.any():  # the law each draft was drawn from (accel.spd.tree.check_dists's rule)
        rows = p[proposed]
        off = (np.abs(rows.sum(axis=-1) - 1.0) > DIST_SUM_TOLERANCE) | (rows.min(axis=-1) < 0)
        if off.any():
            b, i = (int(x) for x in np.argwhere(proposed)[np.flatnonzero(off)[0]])
            raise SpdError(
                f"draft probs p[{b}, {i}] is not a probability distribution (sums to {float(p[b, i].sum()):.6g}, min "
                f"{float(p[b, i].min()):.3g}): give the normalised law the draft was sampled from (tolerance "
                f"{DIST_SUM_TOLERANCE:g})"
            )
    return np.where(proposed, d, 0).astype(np.int64), n, proposed


def _first_false(ok: np.ndarray) -> np.ndarray:
    """Index of the first False per row of a bool ``[B, K]`` (K if none)."""
    return np.sum(np.cumprod(ok, axis=1), axis=1).astype(np.int64)


def speculative_accept(
    draft_tokens: np.ndarray,
    p: np.ndarray,
    q: np.ndarray,
    rng: np.random.Generator,
    num_drafts: np.ndarray | None = None,
) -> RoundResult:
    """Modified rejection sampling for a batch of rows.

    Args:
        draft_tokens: int ``[B, K]``, ``d_i`` sampled from ``p[:, i]``.
        p: float ``[B, K, V]``, the (warped) draft distributions the drafts were sampled from.
        q: float ``[B, K+1, V]``, the target's distributions after the same warps (slot ``K`` is the bonus slot).
        rng: seeded generator; ``B * (K + 1)`` uniforms are drawn per call.
        num_drafts: int ``[B]``, drafts proposed per row (default ``K``); row ``b`` uses ``p[b, :n]``, ``q[b, :n+1]``.

    Returns:
        :class:`RoundResult`; row ``b`` emits ``draft_tokens[b, :num_accepted[b]]`` then ``next_token[b]``.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    d, n, proposed = _check(draft_tokens, p, q, num_drafts)
    batch, k = d.shape
    rows = np.arange(batch)
    u = rng.random((batch, k))
    u_next = 1.0 - rng.random(batch)
    if k:
        p_d = np.take_along_axis(p, d[..., None], axis=2)[..., 0]
        q_d = np.take_along_axis(q[:, :k], d[..., None], axis=2)[..., 0]
        # accept iff u < q/p  <=>  u * p < q  (p > 0); p == 0 is a rejection
        ok = (p_d > 0) & (u * p_d < q_d) & proposed
        m = np.minimum(_first_false(ok), n)
        overlap = np.where(proposed, np.minimum(p, q[:, :k]).sum(axis=2), np.nan)
    else:
        m = np.zeros(batch, dtype=np.int64)
        overlap = np.zeros((batch, 0))
    dist = q[rows, m]  # a bonus row samples from q_{n+1}; a rejected row from its residual at the rejected slot
    rejected = np.flatnonzero(m < n)
    if rejected.size:
        dist[rejected] = residual(p[rejected, m[rejected]], dist[rejected])
    next_token = _inverse_cdf(dist, u_next)
    return RoundResult(num_accepted=m, next_token=next_token, overlap=overlap)


def greedy_accept(draft_tokens: np.ndarray, q_logits: np.ndarray, num_drafts: np.ndarray | None = None) -> RoundResult:
    """Greedy verification: accept while ``d_i == argmax q_i``; emit ``argmax`` of the first mismatching/bonus slot.

    Args:
        draft_tokens: int ``[B, K]`` (the draft's own argmaxes).
        q_logits: ``[B, K+1, V]`` target logits or probabilities (only the argmax matters).
        num_drafts: int ``[B]`` drafts proposed per row (default ``K``).

    ``overlap`` is 1.0 where the draft token equals the target argmax and 0.0 otherwise (``sum min(p, q)`` of one-hots).
    """
    q_logits = np.asarray(q_logits)
    d, n, proposed = _check(draft_tokens, None, q_logits, num_drafts)
    batch, k = d.shape
    best = np.argmax(q_logits, axis=-1)  # [B, K+1]
    ok = (d == best[:, :k]) & proposed
    m = np.minimum(_first_false(ok), n)
    overlap = np.where(proposed, ok.astype(np.float64), np.nan)
    return RoundResult(num_accepted=m, next_token=best[np.arange(batch), m].astype(np.int64), overlap=overlap)
