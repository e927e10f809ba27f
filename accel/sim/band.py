"""Speedup as a band over uncertain acceptance: ``predict_band``.

A planner rarely knows a draft's acceptance on the traffic it will serve; it knows a range (a guess, or the spread of
``accel eval-draft`` / ``GenerationStats`` over prompts). ``predict_band`` prices speculative decoding at each given
acceptance and reports every configuration's speedup at the requested quantiles of that distribution.

Two ways to give the distribution:

- ``acceptance_range=(lo, hi)``: the i.i.d. per-token acceptance alpha uniform on [lo, hi]. A chain's expected tokens
  per round, ``(1 - alpha^(K+1)) / (1 - alpha)``, increases with alpha and a round's cost does not depend on it, so
  the speedup is nondecreasing in alpha and its q-quantile is the speedup at ``lo + q (hi - lo)``: exact, one
  prediction per quantile.
- ``acceptance_samples=[...]``: measured values, each an alpha or a per-position vector (as
  ``GenerationStats.acceptance_per_position`` of one prompt): one prediction per sample, and per configuration the
  quantiles of the resulting speedups (numpy's linear interpolation between order statistics).

Autoregressive configurations do not depend on acceptance; their band is one value repeated. Every other setting
(K, a tree budget, the deployment's fields) is ``predict_speedup``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.deployment import Deployment, HardwareLike, ModelLike
from accel.sim.predict import predict_speedup
from accel.sim.spd import Acceptance

__all__ = ["DEFAULT_QUANTILES", "MAX_BAND_SAMPLES", "SpeedupBand", "predict_band"]

DEFAULT_QUANTILES = (0.1, 0.5, 0.9)
MAX_BAND_SAMPLES = 10_000  # predictions one band may ask for (each is a full predict_speedup)


class SpeedupBand(SimModel):
    """Speedups over the baseline AR at ``quantiles`` of the acceptance distribution, per configuration name
    (``speedup[name][i]`` at ``quantiles[i]``; ``tokens_per_s`` likewise, end to end). ``acceptance``: the alphas
    priced for a range (one per quantile), or a summary of the samples (their quantiles of the mean acceptance)."""

    quantiles: list[float]
    acceptance: list[float]
    source: str  # "range" or "samples"
    n_predictions: int
    speedup: dict[str, list[float]]
    tokens_per_s: dict[str, list[float]]

    def table(self) -> str:
        """A plain-text table: one row per configuration, one column per quantile."""
        head = "configuration".ljust(32) + "".join(f"  p{round(q * 100):<6d}" for q in self.quantiles)
        rows = [name.ljust(32) + "".join(f"  {v:6.2f}x" for v in vals) for name, vals in self.speedup.items()]
        return "\n".join([head, *rows])


def _check_quantiles(quantiles: Sequence[float]) -> list[float]:
    qs = [float(q) for q in quantiles]
    if not qs or any(not (0.0 <= q <= 1.0) for q in qs) or qs != sorted(qs):
        raise SimError(f"quantiles must be ascending numbers in [0, 1]; got {list(quantiles)!r}")
    return qs


def _alphas_of_range(rng: Sequence[float], qs: list[float]) -> list[float]:
    if len(rng) != 2:
        raise SimError(f"acceptance_range must be (lo, hi); got {rng!r}")
    lo, hi = (float(x) for x in rng)
    if not (0.0 <= lo <= hi <= 1.0):
        raise SimError(f"acceptance_range must satisfy 0 <= lo <= hi <= 1; got ({lo}, {hi})")
    return [lo + q * (hi - lo) for q in qs]


def _mean_acceptance(sample: Acceptance) -> float:
    return float(np.mean(np.asarray(sample, dtype=np.float64)))


def predict_band(
    deployment: Deployment | ModelLike | None = None,
    draft: ModelLike | None = None,
    hardware: HardwareLike | None = None,
    *,
    acceptance_range: Sequence[float] | None = None,
    acceptance_samples: Sequence[Acceptance] | None = None,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    **kwargs: Any,
) -> SpeedupBand:
    """Every configuration's speedup (and end-to-end tokens/s) at ``quantiles`` of an acceptance distribution given
    as ``acceptance_range`` or ``acceptance_samples`` (module docstring); the other arguments are
    ``predict_speedup``'s (a draft is required). ``SimError`` for both or neither distribution, an empty or
    oversized sample list, a range outside [0, 1] or quantiles outside [0, 1]."""
    qs = _check_quantiles(quantiles)
    if (acceptance_range is None) == (acceptance_samples is None):
        raise SimError("give acceptance_range=(lo, hi) or acceptance_samples=[...], exactly one")
    if "acceptance" in kwargs or "loop_stats" in kwargs:
        raise SimError("predict_band takes the acceptance as a distribution: drop acceptance / loop_stats")
    alphas: list[float] = []
    if acceptance_range is not None:
        alphas = _alphas_of_range(acceptance_range, qs)
        points: list[Acceptance] = list(alphas)
        source = "range"
    else:
        points = list(acceptance_samples or [])
        if not 1 <= len(points) <= MAX_BAND_SAMPLES:
            raise SimError(f"acceptance_samples must hold 1 .. {MAX_BAND_SAMPLES} values; got {len(points)}")
        source = "samples"
    preds = [predict_speedup(deployment, draft, hardware, acceptance=a, **kwargs) for a in points]
    if preds[0].draft is None:
        raise SimError("predict_band prices speculative decoding: give a draft model")
    names = [c.name for c in preds[0].configs]
    speed = np.asarray([[c.speedup for c in p.configs] for p in preds])  # [points, configs]
    rate = np.asarray([[c.tokens_per_s for c in p.configs] for p in preds])
    if source == "range":  # nondecreasing in alpha: the points are the quantiles already
        sq, rq, acc = speed, rate, alphas
    else:
        sq, rq = np.quantile(speed, qs, axis=0), np.quantile(rate, qs, axis=0)
        acc = [float(v) for v in np.quantile([_mean_acceptance(a) for a in points], qs)]
    return SpeedupBand(
        quantiles=qs,
        acceptance=acc,
        source=source,
        n_predictions=len(preds),
        speedup={n: [float(v) for v in sq[:, i]] for i, n in enumerate(names)},
        tokens_per_s={n: [float(v) for v in rq[:, i]] for i, n in enumerate(names)},
    )
