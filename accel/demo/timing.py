"""Per-call latency of the demo's backends (median seconds of a few calls after a 16-token prefill)."""

from __future__ import annotations

import time

import numpy as np

__all__ = ["call_times", "feature_call_time"]


def call_times(tb, db, k: int, reps: int) -> tuple[float, float, float]:
    """Median seconds of one target call with S = 1 and S = K+1, and one draft call with S = 1 (past length 16)."""

    def median_time(backend, s: int) -> float:
        backend.reset()
        backend.forward(np.ones((1, 16), np.int64), np.arange(16)[None])
        times = []
        for _ in range(reps):
            ids, pos = np.ones((1, s), np.int64), np.arange(16, 16 + s)[None]
            t0 = time.perf_counter()
            backend.forward(ids, pos, num_logits=s)
            times.append(time.perf_counter() - t0)
        backend.reset()
        return float(np.median(times))

    return median_time(tb, 1), median_time(tb, k + 1), median_time(db, 1)


def feature_call_time(backend, reps: int) -> float:
    """Median seconds of one feature-draft call with S = 1 (past length 16, zero features)."""
    width = backend.info.feature_size
    backend.reset()
    backend.forward(np.ones((1, 16), np.int64), np.arange(16)[None], features=np.zeros((1, 16, width), np.float32))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        backend.forward(np.ones((1, 1), np.int64), np.array([[16]]), features=np.zeros((1, 1, width), np.float32))
        times.append(time.perf_counter() - t0)
    backend.reset()
    return float(np.median(times))
