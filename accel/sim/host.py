"""``measure_host``: a ``Hardware`` profile of this machine, measured (medians of repeated runs).

- memory bandwidth: ``np.copyto`` of a large float32 array (bytes read + bytes written per second);
- weight streaming: ``W @ x.T`` with a float32 ``W`` of ``stream_bytes`` at r = 1, 2, 4, ... rows; bytes of W / time
  at one row gives ``bandwidth_efficiency`` (relative to the copy bandwidth, capped at 1), and
  t(r)/t(1) = 1 + beta (r-1)^gamma fitted by least squares on log(t(r)/t(1) - 1) gives the multi-token term
  (docs/reference.md §8: on these CPUs several rows stream weights far slower than one, so scoring K+1 tokens is not
  free);
- matmul FLOP/s: a square float32 matmul (``peak_flops_per_s["fp32"]``; the host computes every format in fp32);
- call overhead: an onnxruntime session running a one-node graph (built with ``onnx.helper``), median per call.
Timing uses ``time.perf_counter``; the machine may be shared, hence medians.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from accel.sim.hardware import Hardware


def _median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def measure_copy_bandwidth(nbytes: float = 128e6, repeats: int = 5) -> float:
    """Bytes/s of ``np.copyto`` (read + write) on float32 arrays of ``nbytes``."""
    src = np.ones(int(nbytes) // 4, dtype=np.float32)
    dst = np.empty_like(src)

    def copy() -> None:
        np.copyto(dst, src)

    return 2.0 * src.nbytes / _median_time(copy, repeats)


def measure_matmul_flops(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of an n x n float32 matmul."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    return 2.0 * n**3 / _median_time(lambda: a @ b, repeats)


def measure_weight_streaming(
    rows: Sequence[int] = (1, 2, 4, 8, 16), nbytes: float = 64e6, repeats: int = 7
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of ``W @ x.T`` (W float32 of ``nbytes``, square, stored (out, in) like a Linear layer; x has r rows)
    for each row count; returns (rows, seconds). (With this OpenBLAS, ``x @ W`` at 2+ rows was several times slower
    than ``W @ x.T``: the layout matters, so measure the one the runtime uses.)"""
    d = int(np.sqrt(nbytes / 4))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((d, d), dtype=np.float32)
    xs = {r: rng.standard_normal((r, d), dtype=np.float32) for r in rows}

    def matmul(x: np.ndarray) -> Callable[[], Any]:
        return lambda: w @ x.T

    return np.asarray(rows), np.array([_median_time(matmul(xs[r]), repeats) for r in rows])


def fit_multi_token(rows: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(beta, gamma) of t(r)/t(1) = 1 + beta (r - 1)^gamma, least squares in log space; (0, 1) if flat."""
    rows, seconds = np.asarray(rows, float), np.asarray(seconds, float)
    t1 = seconds[rows == 1][0]
    excess = seconds / t1 - 1.0
    ok = (rows > 1) & (excess > 1e-3)
    if ok.sum() == 0:
        return 0.0, 1.0
    if ok.sum() == 1:
        return float(excess[ok][0] / (rows[ok][0] - 1.0)), 1.0
    A = np.stack([np.ones(ok.sum()), np.log(rows[ok] - 1.0)], axis=1)
    (log_beta, gamma), *_ = np.linalg.lstsq(A, np.log(excess[ok]), rcond=None)
    gamma = float(np.clip(gamma, 0.05, 2.0))
    return float(np.exp(log_beta)), gamma


def measure_ort_overhead(calls: int = 300) -> float:
    """Median seconds of one onnxruntime ``run`` of a one-node (Add) graph: the fixed cost of a model call."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "tiny", [x], [y], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # docs/reference.md §1: ORT 1.31 accepts IR <= 13
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": np.zeros((1, 8), dtype=np.float32)}
    return _median_time(lambda: sess.run(None, feed), calls, warmup=20)


def measure_host(
    *,
    copy_bytes: float = 128e6,
    stream_bytes: float = 64e6,
    rows: Sequence[int] = (1, 2, 4, 8, 16),
    matmul_n: int = 1024,
    ort_calls: int = 300,
) -> Hardware:
    """Measure this machine (a few seconds) and return it as a ``Hardware`` (see the module docstring)."""
    bw_copy = measure_copy_bandwidth(copy_bytes)
    r, t = measure_weight_streaming(rows, stream_bytes)
    bw_one_row = (int(np.sqrt(stream_bytes / 4)) ** 2 * 4) / t[0]
    beta, gamma = fit_multi_token(r, t)
    flops = measure_matmul_flops(matmul_n)
    overhead = measure_ort_overhead(ort_calls)
    bw = max(bw_copy, bw_one_row)
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        mem = 8e9
    try:
        l3 = float(max(os.sysconf("SC_LEVEL3_CACHE_SIZE"), 0))
    except (ValueError, OSError):
        l3 = 0.0
    return Hardware(
        name=f"host-{platform.machine()}-{os.cpu_count()}cpu",
        memory_bandwidth_bytes_per_s=bw,
        memory_capacity_bytes=mem,
        peak_flops_per_s={"fp32": flops},
        sram_bytes=l3,
        num_devices=1,
        bandwidth_efficiency=min(1.0, bw_one_row / bw),
        compute_efficiency=1.0,
        call_overhead_s=overhead,
        layer_overhead_s=0.0,
        multi_token_penalty=beta,
        multi_token_exponent=gamma,
        usable_memory_fraction=0.8,
        source=f"measured by accel.sim.measure_host on {platform.node() or 'host'} "
        f"at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        notes=(
            f"copy {bw_copy / 1e9:.2f} GB/s; 1-row weight streaming {bw_one_row / 1e9:.2f} GB/s; "
            f"W@x.T ms by rows {dict(zip(r.tolist(), [round(float(x) * 1e3, 3) for x in t], strict=True))}; matmul "
            f"{flops / 1e9:.1f} GFLOP/s fp32; onnxruntime call {overhead * 1e6:.1f} us; MX formats are "
            "not native here (timing them would need a decoder, not modeled)."
        ),
    )
