"""N-gram lookup drafts (prompt lookup decoding): propose what followed the last time the context's suffix occurred.

Text often repeats itself: code reuses identifiers and whole lines, answers quote their question. When the last ``n``
tokens of a row occurred earlier in that row (prompt or generated text), the tokens that followed that occurrence
are a free guess at what comes next: no draft-model call, only a wider verification. ``generate(..., ngram=n)`` uses
such a guess for a row whenever one exists and the draft model otherwise.

Exactness is untouched: the guess is a deterministic function of the row's tokens, i.e. a draft distribution that
puts probability 1 on the proposed token. Greedy verification accepts it while it equals the target's argmax;
modified rejection sampling accepts it with probability ``min(1, q(x) / 1) = q(x)`` and otherwise samples from
``(q - onehot(x))+``, normalised (``accel.spd.mrs``), which is the target's distribution either way.
"""

from __future__ import annotations

import numpy as np

from accel.errors import SpdError

__all__ = ["check_ngram", "ngram_proposal"]


def check_ngram(ngram: int | None, ngram_k: int | None, k: int) -> tuple[int, int]:
    """``(n, tokens per match)`` from ``generate``'s arguments; ``n = 0`` means lookup is off."""
    if ngram is None or ngram == 0:
        return 0, 0
    if isinstance(ngram, bool) or not isinstance(ngram, (int, np.integer)) or ngram < 1:
        raise SpdError(f"ngram must be an int >= 1 (the longest context suffix looked up) or None; got {ngram!r}")
    if ngram_k is None:
        ngram_k = k
    if isinstance(ngram_k, bool) or not isinstance(ngram_k, (int, np.integer)) or ngram_k < 1:
        raise SpdError(f"ngram_k must be an int >= 1 (tokens proposed from a match) or None; got {ngram_k!r}")
    return int(ngram), int(ngram_k)


def ngram_proposal(tokens: np.ndarray, n_max: int, k: int, n_min: int = 2) -> np.ndarray:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix of ``tokens`` (1-D
    int) of length ``n_max`` down to ``n_min``; an empty array when no such suffix occurred before with at least one
    token after it. The suffix itself (at the end) does not count as an occurrence.

    Every occurrence of a suffix ends where the last token occurs again, so the search starts from those positions
    (one comparison over the tokens) and extends each match backwards, at most ``n_max`` - 1 steps: 18-29 us for
    100-600 tokens, where comparing every window with the suffix took 40-100 us (a lookup runs every round)."""
    tokens = np.asarray(tokens)
    size = len(tokens)
    top, low = min(n_max, size - 1), max(n_min, 1)
    if top < low:
        return tokens[:0].copy()
    ends = np.flatnonzero(tokens[: size - 1] == tokens[size - 1])  # earlier occurrences' last positions
    length = np.ones(ends.size, dtype=np.int64)  # how many suffix tokens match, ending at each
    alive = np.ones(ends.size, dtype=bool)
    for j in range(1, top):
        at = ends - j
        alive &= at >= 0
        alive[alive] = tokens[at[alive]] == tokens[size - 1 - j]
        length += alive
    longest = int(length.max()) if ends.size else 0  # at most top
    if longest < low:
        return tokens[:0].copy()
    last = int(ends[length == longest][-1])  # the latest occurrence of the longest suffix that occurred
    return tokens[last + 1 : last + 1 + k].copy()
