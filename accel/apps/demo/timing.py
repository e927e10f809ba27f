"""Per-call latency of the demo's backends (median seconds of a few calls after a 16-token prefill)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["call_times", "feature_call_time", "mx_step_times", "paired_step_times"]


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


def paired_step_times(backends: list, reps: int) -> list[float]:
    """Median seconds of one S = 1 call (past length 16) of each backend, timed round robin (load drift hits all
    alike); the backends must take the same call (one vocabulary, no extra inputs)."""
    for b in backends:
        b.reset()
        b.forward(np.ones((1, 16), np.int64), np.arange(16)[None], num_logits=1)
    times: list[list[float]] = [[] for _ in backends]
    for i in range(reps + 1):
        for b, ts in zip(backends, times, strict=True):
            t0 = time.perf_counter()
            b.forward(np.ones((1, 1), np.int64), np.array([[16]]), num_logits=1)
            if i:  # the first round warms up
                ts.append(time.perf_counter() - t0)
    for b in backends:
        b.reset()
    return [float(np.median(ts)) for ts in times]


def mx_step_times(
    target, mx_onnx, threads: int | None, reps: int, kernel_onnx=None, kernel_q8_onnx=None
) -> dict[str, Any]:
    """One S = 1 step of the ``mxfp6-nbits`` graph ``mx_onnx`` (as ``OrtBackend`` runs it: one row for a GQA graph,
    padded to 2 rows otherwise, docs/backends.md "One row or two"; and one row), of the ``mxfp6-kernel`` graph
    ``kernel_onnx`` and of the ``mxfp6-kernel-q8`` graph ``kernel_q8_onnx`` (if given: the same weights on accel's
    fused kernel, float32 and int8 activations) timed round robin with the float32 ``target`` backend: ``DemoResult``
    fields, seconds."""
    from accel.backends import OrtBackend

    padded, one_row = OrtBackend(mx_onnx, threads=threads), OrtBackend(mx_onnx, threads=threads, min_rows=1)
    named = {name: path for name, path in (("kernel", kernel_onnx), ("q8", kernel_q8_onnx)) if path is not None}
    timed = [target, padded, one_row, *(OrtBackend(path, threads=threads) for path in named.values())]
    t_fp32, t_mx, t_one, *t_kernel = paired_step_times(timed, reps)
    at = dict(zip(named, t_kernel, strict=True))
    return {
        "mx_nbits_call_s": t_mx,
        "mx_nbits_one_row_call_s": t_one,
        "mx_kernel_call_s": at.get("kernel"),
        "mx_kernel_q8_call_s": at.get("q8"),
        "fp32_paired_call_s": t_fp32,
    }
