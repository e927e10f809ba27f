"""``measure_host``: a ``Hardware`` profile of this machine, measured (medians of repeated runs).

- memory bandwidth: ``np.copyto`` of a large float32 array (bytes read + bytes written per second);
- weight streaming: ``W @ x.T`` with a float32 ``W`` of ``stream_bytes`` at r = 1, 2, 4, ... rows (the memory
  bandwidth is the largest of this one-row rate, the copy's and onnxruntime's below); t(r)/t(1) = 1 + beta
  (r-1)^gamma fitted by least squares on log(t(r)/t(1) - 1) gives the multi-token term (docs/reference.md §8: on
  these CPUs several rows stream weights far slower than one, so scoring K+1 tokens is not free);
- matmul FLOP/s: a square float32 matmul (``peak_flops_per_s["fp32"]``; the host computes every format in fp32);
- call overhead: an onnxruntime session running a one-node graph (built with ``onnx.helper``), median per call;
- onnxruntime operators (the runtime this host decodes with; ``threads`` intra-op threads, no spinning, as
  ``OrtBackend``): the fixed cost of one small node (a chain of Adds on one ``[1, 576]`` row, the call's cost taken
  out), times ``ORT_NODES_PER_LAYER`` = ``layer_overhead_s``; one-row weight streaming through a chain of float32
  ``MatMul`` nodes (``bandwidth_efficiency`` = its bytes/s over the copy bandwidth) and through 8-bit ``MatMulNBits``
  (int8 activations per block, ``accuracy_level`` 4): its weight elements per second are the decompression rate of
  ``int8``, ``mxint8``, ``mxfp6`` and ``mxfp4``, the formats that run on that kernel here (docs/backends.md), so an
  MX weight costs what the 8-bit kernel costs, not its 6.25 or 4.25 bits.
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


ORT_NODES_PER_LAYER = 34
"""Nodes per decoder layer of an accel export of a Llama-style model once onnxruntime has fused it (profile of
SmolLM2-135M, ``benchmarks/mx.py --profile``): 5 weight products, 3 attention products, 2 norms, softmax, the cache
write (GatherND, Where, ScatterND per K and V) and 18 small reshapes, splits, adds and muls."""
NBITS_FORMATS = ("int8", "mxint8", "mxfp6", "mxfp4")  # weights that run on 8-bit MatMulNBits on this host


def _ort_session(nodes: list, inits: list, width: int, threads: int | None) -> Any:
    """An onnxruntime session of a graph ``x [rows, width] -> y`` (opset 18 + com.microsoft), spinning off."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "host",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads is not None:
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _chain(n: int, make: Callable[[str, str, int], tuple[list, list]]) -> tuple[list, list]:
    """Nodes and initializers of ``n`` chained nodes ``x -> t1 -> ... -> y``; ``make(src, dst, i)`` builds one."""
    nodes, inits = [], []
    for i in range(n):
        nn, ii = make("x" if i == 0 else f"t{i}", "y" if i == n - 1 else f"t{i + 1}", i)
        nodes += nn
        inits += ii
    return nodes, inits


def measure_ort_node_s(nodes: int = 64, width: int = 576, calls: int = 100, threads: int | None = None) -> float:
    """Seconds of one small onnxruntime node: (a chain of ``nodes`` Adds on ``[1, width]`` - one Add) / (nodes - 1)."""
    from onnx import helper, numpy_helper

    def add(src: str, dst: str, i: int) -> tuple[list, list]:
        c = numpy_helper.from_array(np.full(width, 1e-3, np.float32), f"c{i}")
        return [helper.make_node("Add", [src, f"c{i}"], [dst])], [c]

    feed = {"x": np.zeros((1, width), np.float32)}
    times = []
    for n in (1, nodes):
        sess = _ort_session(*_chain(n, add), width, threads)
        times.append(_median_time(lambda s=sess: s.run(None, feed), calls, warmup=10))
    return max(times[1] - times[0], 0.0) / (nodes - 1)


def measure_ort_streaming(
    nbits: bool, width: int = 1536, chain: int = 12, calls: int = 15, threads: int | None = None
) -> tuple[float, float]:
    """One-row weight streaming through ``chain`` square ``[width, width]`` products on onnxruntime: float32 ``MatMul``
    (``nbits=False``) or 8-bit ``MatMulNBits`` (blocks of 32, float32 scales, ``accuracy_level`` 4). Returns
    (weight bytes per second, weight elements per second) over the chain's time less one small node per product."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = width // 32

    def product(src: str, dst: str, i: int) -> tuple[list, list]:
        if not nbits:
            w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
            return [helper.make_node("MatMul", [src, f"w{i}"], [dst])], [numpy_helper.from_array(w, f"w{i}")]
        q = rng.integers(68, 189, (width, blocks, 32), dtype=np.uint8)  # levels -60..60 (MXFP6 E2M3 x 8)
        sc = np.full(width * blocks, 1.0 / (35.0 * np.sqrt(width)), np.float32)
        node = helper.make_node(
            "MatMulNBits", [src, f"q{i}", f"s{i}"], [dst], domain="com.microsoft",
            K=width, N=width, bits=8, block_size=32, accuracy_level=4,
        )  # fmt: skip
        return [node], [numpy_helper.from_array(q, f"q{i}"), numpy_helper.from_array(sc, f"s{i}")]

    sess = _ort_session(*_chain(chain, product), width, threads)
    feed = {"x": rng.standard_normal((1, width)).astype(np.float32)}
    node_s = measure_ort_node_s(nodes=16, calls=max(calls, 20), threads=threads)
    t = max(_median_time(lambda: sess.run(None, feed), calls, warmup=2) - chain * node_s, 1e-9)
    elements = float(chain * width * width)
    return elements * ((1.0 + 4.0 / 32) if nbits else 4.0) / t, elements / t


def measure_host(
    *,
    copy_bytes: float = 128e6,
    stream_bytes: float = 64e6,
    rows: Sequence[int] = (1, 2, 4, 8, 16),
    matmul_n: int = 1024,
    ort_calls: int = 300,
    ort_threads: int | None = None,
    ort_width: int = 1536,
    ort_chain: int = 12,
) -> Hardware:
    """Measure this machine (a few seconds) and return it as a ``Hardware`` (see the module docstring).
    ``ort_threads``: onnxruntime intra-op threads of the operator measurements (default: onnxruntime's choice);
    ``ort_width`` x ``ort_width`` weights, ``ort_chain`` of them, for the streaming measurements (default 12 x 9.4 MB
    of float32: more than a usual last-level cache)."""
    bw_copy = measure_copy_bandwidth(copy_bytes)
    r, t = measure_weight_streaming(rows, stream_bytes)
    bw_one_row = (int(np.sqrt(stream_bytes / 4)) ** 2 * 4) / t[0]
    beta, gamma = fit_multi_token(r, t)
    flops = measure_matmul_flops(matmul_n)
    overhead = measure_ort_overhead(ort_calls)
    node_s = measure_ort_node_s(threads=ort_threads)
    bw_ort, _ = measure_ort_streaming(False, ort_width, ort_chain, threads=ort_threads)
    _, nbits_rate = measure_ort_streaming(True, ort_width, ort_chain, threads=ort_threads)
    bw = max(bw_copy, bw_one_row, bw_ort)
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
        bandwidth_efficiency=min(1.0, bw_ort / bw),
        compute_efficiency=1.0,
        call_overhead_s=overhead,
        layer_overhead_s=ORT_NODES_PER_LAYER * node_s,
        decompress_elements_per_s=dict.fromkeys(NBITS_FORMATS, nbits_rate),
        decompress_overlap=True,
        multi_token_penalty=beta,
        multi_token_exponent=gamma,
        usable_memory_fraction=0.8,
        source=f"measured by accel.sim.measure_host on {platform.node() or 'host'} "
        f"at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        notes=(
            f"copy {bw_copy / 1e9:.2f} GB/s; 1-row weight streaming {bw_one_row / 1e9:.2f} GB/s; "
            f"W@x.T ms by rows {dict(zip(r.tolist(), [round(float(x) * 1e3, 3) for x in t], strict=True))}; matmul "
            f"{flops / 1e9:.1f} GFLOP/s fp32; onnxruntime call {overhead * 1e6:.1f} us, small node "
            f"{node_s * 1e6:.2f} us (x {ORT_NODES_PER_LAYER} per layer), one-row MatMul streaming "
            f"{bw_ort / 1e9:.2f} GB/s, 8-bit MatMulNBits {nbits_rate / 1e9:.2f} G weights/s (the rate of "
            f"{', '.join(NBITS_FORMATS)}: they run on that kernel here)."
        ),
    )
