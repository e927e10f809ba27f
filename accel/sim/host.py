"""``measure_host``: a ``Hardware`` profile of this machine, measured (medians of repeated runs).

- memory bandwidth: ``np.copyto`` of a large float32 array (bytes read + bytes written per second);
- weight streaming: ``W @ x.T`` with a float32 ``W`` of ``stream_bytes`` at r = 1, 2, 4, ... rows (the memory
  bandwidth is the largest of this one-row rate, the copy's and onnxruntime's below; the rows are reported in the
  notes: numpy's GEMM path is not onnxruntime's, docs/reference.md §8);
- matmul FLOP/s: a square float32 ``MatMul`` on onnxruntime, timed in the layers' round robin below
  (``peak_flops_per_s["fp32"]``; the host computes every format in fp32; numpy's, reported in the notes, is the
  fallback without the layers: its BLAS threads spin after a call and slow onnxruntime's beside it);
- call overhead: an onnxruntime session running a one-node graph (built with ``onnx.helper``), median per call;
- onnxruntime (the runtime this host decodes with; ``ort_threads`` intra-op threads, no spinning, as ``OrtBackend``):
  one-row streaming through a chain of float32 ``MatMul`` and of 8-bit ``MatMulNBits`` nodes (int8 activations; the
  8-bit chain timed in the layers' round robin): the latter's weight elements per second are the decompression rate
  of ``int8``, ``mxint8``, ``mxfp6`` and ``mxfp4``, the formats that run on that kernel here (docs/backends.md: an
  MX weight costs what the 8-bit kernel costs, not its 6.25 or 4.25 bits); and the time of one decoder layer of accel's
  own graph (``accel.sim.host_layers``) with MXFP6 weights on ``MatMulNBits`` and with float32 weights, at 1, 2, 4 rows:
  ``layer_overhead_s`` = the 8-bit layer less its weights at the kernel's rate (the fixed cost of the layer's ~34
  nodes; its 8-bit weights are a small share of it), ``bandwidth_efficiency`` from the float32 layer less that
  overhead (float32 weights streamed inside a layer), the float32 layer's growth over rows (less the overhead) is the
  multi-token term of memory-bound products (``multi_token_penalty``, ``multi_token_exponent``) and the 8-bit
  layer's growth over rows (less the overhead) that of the decompression-bound kernel
  (``decompress_multi_token_penalty``, ``decompress_multi_token_exponent``: ``MatMulNBits`` quantizes every
  activation row to int8 and runs an integer GEMM, so it grows with the rows faster than a float32 stream), and
  ``call_overhead_s`` is the fixed cost of one call of that graph (its smaller graph less its layers; the one-node
  call above is its floor).
Timing uses ``time.perf_counter``; the machine may be shared, hence medians.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from accel._legacy import Replaced, legacy_keywords
from accel.sim.hardware import Hardware
from accel.sim.host_layers import LayerShape, layer_weight_elements, measure_layer_times


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


def ort_matmul_call(n: int = 1024, threads: int | None = None) -> tuple[Callable[[], Any], float]:
    """A call of an n x n float32 ``MatMul`` on onnxruntime (the runtime's GEMM), and its FLOPs."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((n, n), dtype=np.float32), "w")
    sess = _ort_session([helper.make_node("MatMul", ["x", "w"], ["y"])], [w], n, threads)
    feed = {"x": rng.standard_normal((n, n), dtype=np.float32)}
    return (lambda: sess.run(None, feed)), 2.0 * n**3


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


def measure_ort_streaming(
    nbits: bool, width: int = 2048, chain: int = 12, calls: int = 15, threads: int | None = None
) -> float:
    """Weight elements per second of one-row streaming through ``chain`` square ``[width, width]`` products on
    onnxruntime: float32 ``MatMul`` (``nbits=False``) or 8-bit ``MatMulNBits`` (blocks of 32, float32 scales,
    ``accuracy_level`` 4), each node's fixed cost included."""
    fn, elements = ort_streaming_call(nbits, width, chain, threads)
    return elements / _median_time(fn, calls, warmup=2)


def ort_streaming_call(
    nbits: bool, width: int = 2048, chain: int = 12, threads: int | None = None
) -> tuple[Callable[[], Any], float]:
    """A one-row call of the chain ``measure_ort_streaming`` times, and its weight elements."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)

    def product(src: str, dst: str, i: int) -> tuple[list, list]:
        if not nbits:
            w = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
            return [helper.make_node("MatMul", [src, f"w{i}"], [dst])], [numpy_helper.from_array(w, f"w{i}")]
        q = rng.integers(68, 189, (width, width // 32, 32), dtype=np.uint8)  # levels -60..60 (MXFP6 E2M3 x 8)
        sc = np.full(width * (width // 32), 1.0 / (35.0 * np.sqrt(width)), np.float32)
        node = helper.make_node(
            "MatMulNBits", [src, f"q{i}", f"s{i}"], [dst], domain="com.microsoft",
            K=width, N=width, bits=8, block_size=32, accuracy_level=4,
        )  # fmt: skip
        return [node], [numpy_helper.from_array(q, f"q{i}"), numpy_helper.from_array(sc, f"s{i}")]

    sess = _ort_session(*_chain(chain, product), width, threads)
    feed = {"x": rng.standard_normal((1, width)).astype(np.float32)}
    return (lambda: sess.run(None, feed)), float(chain * width * width)


@dataclass(frozen=True)
class HostProbe:
    """The sizes of what ``measure_host`` times (defaults: ~30 s on a desktop CPU). Numpy: ``copy_bytes`` copied,
    a float32 weight matrix of ``stream_bytes`` streamed at each of ``rows`` activation rows, a ``matmul_n`` square
    matmul (also onnxruntime's GEMM). onnxruntime: ``ort_calls`` calls of a one-node graph (the call overhead), a
    chain of ``ort_chain`` square ``[ort_width, ort_width]`` products (default 12 x 4.2 M weights: 50 MB in 8 bits,
    more than a usual last-level cache). Decoder layers (``accel.sim.host_layers``): ``layer`` (``None``:
    SmolLM2-135M's) at ``layer_counts`` layers (the larger should hold more 8-bit weights than the cache), timed
    ``layer_calls`` calls each."""

    copy_bytes: float = 128e6
    stream_bytes: float = 64e6
    rows: Sequence[int] = (1, 2, 4, 8, 16)
    matmul_n: int = 1024
    ort_calls: int = 300
    ort_width: int = 2048
    ort_chain: int = 12
    layer: LayerShape | None = None
    layer_counts: tuple[int, int] = (2, 12)
    layer_calls: int = 25


_HOST_LEGACY = (Replaced("probe", HostProbe, {f.name: f.name for f in fields(HostProbe)}),)


def measure_host(probe: HostProbe | None = None, *, ort_threads: int | None = None, **legacy: Any) -> Hardware:
    """Measure this machine (~30 s with the default ``HostProbe``) and return it as a ``Hardware`` (see the module
    docstring). ``ort_threads``: onnxruntime intra-op threads of the operator measurements (default: onnxruntime's
    choice). Deprecated: the ``HostProbe`` fields as keywords (use ``probe=HostProbe(...)``)."""
    probe = legacy_keywords("measure_host", legacy, _HOST_LEGACY, {"probe": probe})[0]["probe"] or HostProbe()
    bw_copy = measure_copy_bandwidth(probe.copy_bytes)
    r, t = measure_weight_streaming(probe.rows, probe.stream_bytes)
    bw_one_row = (int(np.sqrt(probe.stream_bytes / 4)) ** 2 * 4) / t[0]
    overhead = measure_ort_overhead(probe.ort_calls)
    bw_ort = 4.0 * measure_ort_streaming(False, probe.ort_width, probe.ort_chain, threads=ort_threads)
    layer = probe.layer or LayerShape()
    flops_numpy = measure_matmul_flops(probe.matmul_n)
    lt, nbits_rate, flops = _layer_times(probe, layer, ort_threads, flops_numpy)
    terms = layer_terms(lt, layer_weight_elements(layer), nbits_rate) if lt else {}
    bw = max(bw_copy, bw_one_row, bw_ort, terms.get("fp32_bytes_per_s", 0.0))
    mem, l3 = _memory_sizes()
    return Hardware(
        name=f"host-{platform.machine()}-{os.cpu_count()}cpu",
        memory_bandwidth_bytes_per_s=bw,
        memory_capacity_bytes=mem,
        peak_flops_per_s={"fp32": flops},
        sram_bytes=l3,
        num_devices=1,
        bandwidth_efficiency=min(1.0, terms.get("fp32_bytes_per_s", bw_ort) / bw),
        compute_efficiency=1.0,
        call_overhead_s=max(overhead, terms.get("call_s", 0.0)),
        layer_overhead_s=terms.get("layer_overhead_s", 0.0),
        decompress_elements_per_s=dict.fromkeys(NBITS_FORMATS, nbits_rate),
        decompress_overlap=True,
        multi_token_penalty=terms.get("beta", 0.0),
        multi_token_exponent=terms.get("gamma", 1.0),
        decompress_multi_token_penalty=terms.get("dec_beta"),
        decompress_multi_token_exponent=terms.get("dec_gamma"),
        usable_memory_fraction=0.8,
        source=f"measured by accel.sim.measure_host on {platform.node() or 'host'} "
        f"at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        notes=_numpy_notes(bw_copy, bw_one_row, r, t, flops_numpy)
        + _ort_notes(overhead, flops, bw_ort, nbits_rate, lt, terms),
    )


def _layer_times(
    probe: HostProbe, layer: LayerShape, ort_threads: int | None, flops_numpy: float
) -> tuple[dict[str, dict[int, float]], float, float]:
    """(decoder layer times, 8-bit weights/s, GEMM FLOP/s): timed in the layers' round robin, or without layers."""
    nb_fn, nb_elements = ort_streaming_call(True, probe.ort_width, probe.ort_chain, ort_threads)
    mm_fn, mm_flops = ort_matmul_call(probe.matmul_n, ort_threads)
    try:  # the 8-bit chain and the GEMM in the layers' round robin: the terms the simulator combines see one load
        extra = {"nbits_chain": nb_fn, "matmul": mm_fn}
        lt = measure_layer_times(
            layer, layers=probe.layer_counts, calls=probe.layer_calls, threads=ort_threads, extra=extra
        )
        nbits_rate, flops = nb_elements / lt["nbits_chain"][1], mm_flops / lt["matmul"][1]
    except ImportError:  # the graph builder's accel.models needs torch: no layer terms (pure roofline)
        lt = {}
        nbits_rate, flops = nb_elements / _median_time(nb_fn, 15, warmup=2), flops_numpy
    return lt, nbits_rate, flops


def _memory_sizes() -> tuple[float, float]:
    """(physical memory bytes, default 8 GB; last-level cache bytes, default 0) of this machine."""
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        mem = 8e9
    try:
        l3 = float(max(os.sysconf("SC_LEVEL3_CACHE_SIZE"), 0))
    except (ValueError, OSError):
        l3 = 0.0
    return mem, l3


def _numpy_notes(bw_copy: float, bw_one_row: float, r: np.ndarray, t: np.ndarray, flops_numpy: float) -> str:
    """The notes' numpy part: the copy, one-row streaming (ms by rows) and matmul rates."""
    return (
        f"copy {bw_copy / 1e9:.2f} GB/s; numpy 1-row weight streaming {bw_one_row / 1e9:.2f} GB/s, W@x.T ms by "
        f"rows {dict(zip(r.tolist(), [round(float(x) * 1e3, 3) for x in t], strict=True))}; numpy matmul "
        f"{flops_numpy / 1e9:.1f} GFLOP/s fp32; "
    )


def _ort_notes(
    overhead: float,
    flops: float,
    bw_ort: float,
    nbits_rate: float,
    lt: dict[str, dict[int, float]],
    terms: dict[str, float],
) -> str:
    """The notes' onnxruntime part: call overhead, GEMM and streaming rates, and the decoder layers' terms."""
    return (
        f"onnxruntime: call {overhead * 1e6:.1f} us, GEMM (the profile's "
        f"peak) {flops / 1e9:.1f} GFLOP/s fp32, one-row streaming: MatMul "
        f"{bw_ort / 1e9:.2f} GB/s, 8-bit MatMulNBits {nbits_rate / 1e9:.2f} G weights/s (the rate of "
        f"{', '.join(NBITS_FORMATS)}: they run on that kernel here); " + _layer_notes(lt, terms)
    )


def _layer_notes(lt: dict[str, dict[int, float]], terms: dict[str, float]) -> str:
    if not lt:
        return "decoder layers not timed (building accel's graph needs the torch extra): no layer terms."
    ms = lambda d: {k: round(v * 1e3, 3) for k, v in d.items()}  # noqa: E731
    return (
        f"decoder layer ms by rows fp32 {ms(lt['fp32'])} / MXFP6 on 8-bit MatMulNBits {ms(lt['nbits8'])} -> layer "
        f"overhead {terms['layer_overhead_s'] * 1e3:.3f} ms, float32 weights in a layer "
        f"{terms['fp32_bytes_per_s'] / 1e9:.2f} GB/s, multi-token (beta, gamma) fp32 ({terms['beta']:.3f}, "
        f"{terms['gamma']:.2f}) / 8-bit ({terms['dec_beta']:.3f}, {terms['dec_gamma']:.2f}); graph call "
        f"{terms.get('call_s', 0.0) * 1e3:.3f} ms."
    )


def layer_terms(times: dict[str, dict[int, float]], elements: int, nbits_rate: float) -> dict[str, float]:
    """``Hardware`` terms from per-layer times (``measure_layer_times``) of a layer of ``elements`` weights and the
    8-bit ``MatMulNBits`` streaming rate (weights/s): the layer overhead = the 8-bit layer less its weights at that
    rate (at least 0; the 8-bit weights are a small share of that layer, so the split is robust), the float32
    weights' bytes/s in a layer = bytes / (the float32 layer less the overhead), the multi-token (beta, gamma) of the
    float32 layer's weight time over its rows and (dec_beta, dec_gamma) of the 8-bit layer's, and ``call_s`` = the
    graph's fixed seconds per call at one row (when ``times`` has ``"call"``)."""
    t32, t8 = times["fp32"], times["nbits8"]
    overhead = max(t8[1] - elements / nbits_rate, 0.0)

    def growth(t: dict[int, float]) -> tuple[float, float]:  # (beta, gamma) of the layer less its overhead
        weights_s = {r: max(x - overhead, 1e-3 * x) for r, x in t.items()}
        beta, gamma = fit_multi_token(np.array(list(weights_s)), np.array(list(weights_s.values())))
        return min(beta, 4.0), gamma

    (beta, gamma), (dec_beta, dec_gamma) = growth(t32), growth(t8)
    out = {
        "layer_overhead_s": overhead,
        "fp32_bytes_per_s": 4.0 * elements / max(t32[1] - overhead, 1e-3 * t32[1]),
        "beta": beta,
        "gamma": gamma,
        "dec_beta": dec_beta,
        "dec_gamma": dec_gamma,
    }
    if 1 in times.get("call", {}):
        out["call_s"] = times["call"][1]
    return out
