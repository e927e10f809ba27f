"""Measured costs of speculative rounds on this machine: call times per size, robust to noise, monotone in the size.

A ``CostCurve`` maps an integer size (the tokens a target call scores, or a proposer's node budget) to seconds. It
learns from samples: a short probe at start-up (``probe_target``: the target called at each size before the run)
and then the timings of real rounds. Per size it keeps the last ``window`` samples and takes their median (one slow
call, a page fault or a scheduler hiccup, moves nothing; a lasting change of the machine's load moves the median
within ``window / 2`` samples). Across sizes the medians are fitted nondecreasing (pool-adjacent-violators,
weighted by the samples per size: a call scoring more tokens never costs less), and sizes between measured ones are
interpolated linearly; beyond the largest measured size the last segment's slope continues (flat with one size),
below the smallest the curve is flat.

Bad timings are refused, never averaged in: a sample that is not a finite number of seconds > 0 (a frozen clock
gives 0, a broken one NaN or a negative difference) is counted in ``rejected`` and dropped, so every fitted value
is > 0 and a price divided by it is finite. A curve without any valid sample has no estimate (``seconds`` returns
None): its user decides what to do then (``accel.spd.autotune.AutoTune`` runs its fixed fallback shape).
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from accel.backends.base import Backend
from accel.errors import SpdError

__all__ = ["CostCurve", "monotone_fit", "probe_target", "valid_seconds"]

DEFAULT_WINDOW = 8  # samples kept per size: the median moves after window / 2 samples at a new load


def valid_seconds(seconds: float) -> bool:
    """Whether ``seconds`` is a usable duration: a finite number > 0."""
    number = isinstance(seconds, (int, float, np.floating, np.integer)) and not isinstance(seconds, bool)
    return number and math.isfinite(seconds) and seconds > 0


def monotone_fit(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The nondecreasing sequence closest to ``values`` in weighted least squares (pool adjacent violators; exact).
    ``values`` and ``weights`` (> 0) are 1-D and of one length, ordered by size."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return np.asarray([b[0] for b in blocks for _ in range(int(b[2]))], dtype=np.float64)


class CostCurve:
    """Seconds as a nondecreasing function of an integer size, learned from samples (module docstring).

    Args:
        name: what the curve times, for messages (e.g. ``"target call"``).
        window: samples kept per size (the median of the last ``window``).
    """

    def __init__(self, name: str = "call", window: int = DEFAULT_WINDOW) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise SpdError(f"CostCurve window must be an int >= 1 (samples kept per size); got {window!r}")
        self.name, self.window = name, window
        self._samples: dict[int, deque[float]] = {}
        self.rejected = 0  # samples refused: not a finite number of seconds > 0
        self._fit: tuple[list[int], list[float]] | None = None

    def observe(self, size: int, seconds: float) -> bool:
        """Add one sample (``seconds`` at ``size`` >= 0); False (and counted in ``rejected``) if it is not a finite
        number of seconds > 0."""
        if not valid_seconds(seconds):
            self.rejected += 1
            return False
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise SpdError(f"{self.name} cost: size must be an int >= 0; got {size!r}")
        self._samples.setdefault(int(size), deque(maxlen=self.window)).append(float(seconds))
        self._fit = None
        return True

    @property
    def sizes(self) -> list[int]:
        """The sizes with at least one valid sample, ascending."""
        return sorted(self._samples)

    def samples(self, size: int) -> list[float]:
        """The kept samples at ``size`` (oldest first)."""
        return list(self._samples.get(int(size), ()))

    def median(self, size: int) -> float:
        """The median of the kept samples at ``size`` (a size with samples; numpy's median, without its overhead:
        the controller reads these for every size several times a plan)."""
        return _median(self._samples[int(size)])

    def fitted(self) -> tuple[np.ndarray, np.ndarray]:
        """``(sizes, seconds)`` of the monotone fit of the per-size medians (empty arrays without samples)."""
        sizes, secs = self._fitted()
        return np.asarray(sizes, dtype=np.int64), np.asarray(secs, dtype=np.float64)

    def _fitted(self) -> tuple[list[int], list[float]]:
        if self._fit is None:
            sizes = self.sizes
            med = np.asarray([self.median(s) for s in sizes], dtype=np.float64)
            weights = np.asarray([len(self._samples[s]) for s in sizes], dtype=np.float64)
            self._fit = (sizes, (monotone_fit(med, weights) if sizes else med).tolist())
        return self._fit

    def seconds(self, size: float) -> float | None:
        """The fitted seconds at ``size`` (interpolated between measured sizes, the last slope beyond them, flat
        below); None when the curve has no valid sample."""
        sizes, secs = self._fitted()
        if not sizes:
            return None
        if size >= sizes[-1] and len(sizes) >= 2:
            slope = (secs[-1] - secs[-2]) / float(sizes[-1] - sizes[-2])
            return float(secs[-1] + slope * (size - sizes[-1]))
        i = bisect.bisect_right(sizes, size) - 1  # np.interp's segment and arithmetic, in Python floats
        if i < 0:
            return float(secs[0])
        if i >= len(sizes) - 1:
            return float(secs[-1])
        slope = (secs[i + 1] - secs[i]) / (sizes[i + 1] - sizes[i])
        return float(slope * (size - sizes[i]) + secs[i])


def _median(values: Iterable[float]) -> float:
    """The median of a few floats as numpy computes it (the mean of the middle two for an even count)."""
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2.0


def probe_target(
    target: Backend,
    sizes: Iterable[int],
    *,
    repeats: int = 3,
    curve: CostCurve | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> CostCurve:
    """Time ``target``'s forward call at each size S in ``sizes`` (S tokens scored, S logits), ``repeats`` times,
    sizes interleaved, after one unrecorded warm-up call; the samples go into ``curve`` (a new ``CostCurve`` by
    default), which is returned. The calls write the target's cache at positions 0 .. S-1 of every row: run the
    probe before ``generate`` (which resets the target first), never during a run; the target is reset afterwards.

    ``SpdError`` if a size does not fit the target (``1 <= S <= min(max_seq_len, ctx_len)``), if a call fails (the
    backend's error is chained), or if no valid timing (a finite number of seconds > 0) came back for some size."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise SpdError(f"probe_target repeats must be an int >= 1; got {repeats!r}")
    info = target.info
    limit = min(info.max_seq_len, info.ctx_len)
    todo = sorted({int(s) for s in sizes})
    if not todo or todo[0] < 1 or todo[-1] > limit:
        raise SpdError(f"probe_target sizes must be tokens per call in 1 .. {limit} (the target's limit); got {todo}")
    curve = curve if curve is not None else CostCurve("target call")
    batch = info.batch_size
    got: set[int] = set()
    target.reset()
    try:
        for rep in range(repeats + 1):  # the first pass warms up (allocations, thread pools) and is not recorded
            for s in todo:
                ids = np.zeros((batch, s), dtype=np.int64)
                pos = np.broadcast_to(np.arange(s, dtype=np.int64), (batch, s)).copy()
                t0 = clock()
                try:
                    target.forward(ids, pos, num_logits=s)
                except Exception as e:  # any backend failure: name the probe and the size, keep the cause
                    raise SpdError(f"the cost probe's target call at {s} tokens failed: {e}") from e
                if rep and curve.observe(s, clock() - t0):
                    got.add(s)
    finally:
        target.reset()
    missing = [s for s in todo if s not in got]
    if missing:
        raise SpdError(
            f"the cost probe got no valid timing (a finite number of seconds > 0) of the target at {missing} tokens "
            f"per call ({curve.rejected} rejected): the clock or the backend is broken; use a fixed shape instead"
        )
    return curve
