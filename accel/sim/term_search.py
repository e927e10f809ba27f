"""Which efficiency terms a calibration fits: chosen by fit, not by a fixed priority (``calibrate(fit=None)``).

Candidates are the terms whose Jacobian column (at a nominal point where every fixed cost is > 0) is not zero: terms
the observations can see. The search fits candidate sets by least squares and compares their residuals:

1. every single term and, when there are two or more observations, every pair whose Jacobian has full column rank
   (terms the observations tell apart);
2. then forward: the best set so far plus each remaining term, while the set is smaller than the number of
   observations and the fit is not yet exact.

A larger set is taken only when it explains enough more: it fits exactly (RMS relative residual < ``EXACT_RMS``), or
its sum of squares drops by more than ``F_ENTER`` times the remaining variance per degree of freedom (a partial F test),
or, with as many terms as observations, it halves the RMS. Within one size, sets whose RMS is within ``TIE_RMS`` of the
best tie; ties go to the set with fewer terms at a bound, then to the earlier terms of ``PRIORITY`` (the bandwidth
efficiency first). So one observation fits one term - the first in priority that fits it inside its bounds - and two
points of one device (a large and a small model) fit bandwidth efficiency plus the per-call cost when those explain
both exactly, where a fixed priority took the link latency and pinned the efficiency at 1.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

EXACT_RMS = 1e-6  # an RMS relative residual below this is an exact fit
TIE_RMS = 1e-3  # sets within 0.1 % RMS of the best of their size tie
F_ENTER = 4.0  # partial F statistic a term needs to enter (about the 5 % point of F(1, dof) for dof >= 10)
MAX_PAIR_CANDIDATES = 12  # every pair is tried up to this many candidates (66 pairs); beyond, forward steps only


@dataclass(frozen=True)
class SetFit:
    """A fitted candidate set: its terms (in priority order), unconstrained values, RMS relative residual, terms at a
    bound."""

    terms: tuple[str, ...]
    x: np.ndarray
    rms: float
    at_bound: tuple[str, ...]


def identifiable(jac: np.ndarray, cols: Sequence[int]) -> bool:
    """True when the Jacobian columns ``cols`` are finite, non-zero and linearly independent (normalized columns'
    smallest singular value > 1e-3 of the largest)."""
    sub = jac[:, list(cols)]
    if not np.all(np.isfinite(sub)):
        return False
    norms = np.linalg.norm(sub, axis=0)
    if np.any(norms < 1e-4):
        return False
    s = np.linalg.svd(sub / norms, compute_uv=False)
    return bool(s[-1] > 1e-3 * s[0])


def _key(f: SetFit, best_rms: float, rank: dict[str, int]) -> tuple[bool, int, list[int]]:
    return (f.rms > best_rms + TIE_RMS * max(best_rms, 1e-3), len(f.at_bound), sorted(rank[t] for t in f.terms))


def _best(fits: list[SetFit], rank: dict[str, int]) -> SetFit:
    best_rms = min(f.rms for f in fits)
    return min(fits, key=lambda f: _key(f, best_rms, rank))


def _enters(new: SetFit, old: SetFit, n_obs: int) -> bool:
    """Whether ``new`` (one term more than ``old``) explains enough more to be taken (module docstring)."""
    if new.rms < EXACT_RMS:
        return old.rms >= EXACT_RMS
    dof = n_obs - len(new.terms)
    if dof <= 0:
        return new.rms < 0.5 * old.rms
    ss_old, ss_new = old.rms**2 * n_obs, new.rms**2 * n_obs
    return (ss_old - ss_new) / (ss_new / dof) > F_ENTER


def search_terms(
    candidates: Sequence[str],
    jac: np.ndarray,
    n_obs: int,
    fit: Callable[[list[str]], SetFit],
) -> tuple[SetFit, dict[str, float]]:
    """The chosen set (module docstring) and the RMS relative residual of every set tried (``"a+b": rms``).
    ``candidates`` in priority order; ``jac``: the residuals' Jacobian with one column per candidate; ``fit`` fits a
    set of terms (given in priority order)."""
    rank = {t: i for i, t in enumerate(candidates)}
    idx = [i for i in range(len(candidates)) if identifiable(jac, [i])]
    tried: dict[str, float] = {}
    cache: dict[tuple[int, ...], SetFit] = {}

    def run(cols: tuple[int, ...]) -> SetFit:
        cols = tuple(sorted(cols))
        if cols not in cache:
            cache[cols] = fit([candidates[i] for i in cols])
            tried["+".join(candidates[i] for i in cols)] = cache[cols].rms
        return cache[cols]

    if not idx:
        raise ValueError("no candidate term changes the predictions")
    current = _best([run((i,)) for i in idx], rank)
    max_terms = min(n_obs, len(idx))
    if max_terms >= 2 and len(idx) <= MAX_PAIR_CANDIDATES and current.rms >= EXACT_RMS:
        pairs = [run(p) for p in combinations(idx, 2) if identifiable(jac, p)]
        if pairs:
            best_pair = _best(pairs, rank)
            if _enters(best_pair, current, n_obs):
                current = best_pair
    while len(current.terms) < max_terms and current.rms >= EXACT_RMS:
        chosen = [rank[t] for t in current.terms]
        grown = [run((*chosen, i)) for i in idx if i not in chosen and identifiable(jac, [*chosen, i])]
        if not grown:
            break
        nxt = _best(grown, rank)
        if not _enters(nxt, current, n_obs):
            break
        current = nxt
    return current, tried
