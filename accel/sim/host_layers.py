"""Per-layer cost of accel's onnxruntime decoder graph on this machine (``measure_host``'s operator terms).

A 135M-parameter model is not one large GEMV: each decoder layer is ~34 onnxruntime nodes (5 weight products, the
attention, the cache write, norms, reshapes), and on a CPU their fixed costs are a large share of a step. So
``measure_host`` times the real graph: ``accel.backends.onnx_graph.build_decoder_graph`` (numpy only) of a random
Llama-style model with ``LayerShape`` layers and a tiny vocabulary, on ``OrtBackend`` (no spinning, like the
runtime's default), one decode call after ``past`` tokens, at ``layers[0]`` and ``layers[1]`` layers: the difference
divided by the layers added is the time of one layer, free of the call's fixed cost and of the embedding and head.
Measured for float32 weights and for MXFP6 (E2M3) weights on 8-bit ``MatMulNBits`` (int8 activations), at 1, 2 and 4
rows per call; and the fixed cost of one call of that graph (the smaller graph less its layers: the embedding
gather, the mask and position nodes, the final norm and a 64-row head, onnxruntime's ``run``). Timing is the median
of ``calls`` calls, all graphs interleaved.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from accel.backends.graph_spec import GraphSpec
from accel.backends.onnx_graph import build_decoder_graph
from accel.backends.ort_backend import OrtBackend
from accel.formats import get_format, quantize
from accel.models.config import ModelConfig

__all__ = ["LayerShape", "layer_graph_spec", "layer_weight_elements", "measure_layer_times"]


class LayerShape(BaseModel):
    """The decoder layer ``measure_host`` times (default: SmolLM2-135M's), its cache and the past length (tokens)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden: int = Field(default=576, ge=32)
    intermediate: int = Field(default=1536, ge=32)
    heads: int = Field(default=9, ge=1)
    kv_heads: int = Field(default=3, ge=1)
    ctx_len: int = Field(default=256, ge=8)
    past: int = Field(default=128, ge=1)


def layer_weight_elements(shape: LayerShape) -> int:
    """Weight elements of the Linear layers of one decoder layer (q, k, v, o, gate, up, down)."""
    d, hd = shape.hidden, shape.hidden // shape.heads
    return d * (d + 2 * shape.kv_heads * hd) + d * d + 3 * d * shape.intermediate


def _tensors(shape: LayerShape, layers: int, nbits: bool, rng: np.random.Generator) -> dict[str, Any]:
    d, f, hd = shape.hidden, shape.intermediate, shape.hidden // shape.heads
    kv = shape.kv_heads * hd
    out: dict[str, Any] = {"embed_tokens.weight": rng.standard_normal((64, d), dtype=np.float32)}
    out["norm.weight"] = np.ones(d, np.float32)
    linear = {"self_attn.q_proj": (d, d), "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d)}
    linear |= {"self_attn.o_proj": (d, d), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f)}
    fmt = get_format("mxfp6_e2m3")
    for i in range(layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"layers.{i}.{norm}.weight"] = np.ones(d, np.float32)
        for name, (o, k) in linear.items():
            w = (rng.standard_normal((o, k), dtype=np.float32) / np.sqrt(k)).astype(np.float32)
            out[f"layers.{i}.{name}.weight"] = quantize(w, fmt, axis=-1, block_size=32) if nbits else w
    if nbits:
        out["lm_head.weight"] = quantize(out["embed_tokens.weight"], fmt, axis=-1, block_size=32)
    return out


def layer_graph_spec(shape: LayerShape, nbits: bool) -> GraphSpec:
    """The graph ``measure_host`` times: float32 weights, or 8-bit ``MatMulNBits`` weights with int8 activations
    (``accuracy_level`` 4; the MXFP6 codes are passed as ``MXTensor`` s, the ``mxint8`` element is the runtime's
    placeholder), with onnxruntime's fused RMSNorm/RoPE operators as in the exports ``benchmarks/mx.py`` times."""
    weights: dict[str, Any] = (
        dict(element="mxint8", runtime="nbits", activations="int8") if nbits else dict(element="fp32")
    )
    return GraphSpec(ctx_len=shape.ctx_len, batch_size=1, ort_ops=True, **weights)


def _backend(shape: LayerShape, layers: int, nbits: bool, rows: int, threads: int | None, tmp: Path) -> Any:
    import onnx

    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=shape.hidden,
        num_layers=layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        tie_word_embeddings=True,
    )
    tensors = _tensors(shape, layers, nbits, np.random.default_rng(layers))
    proto = build_decoder_graph(cfg, tensors, layer_graph_spec(shape, nbits))
    path = tmp / f"{layers}-{int(nbits)}.onnx"
    onnx.save(proto, str(path))
    b = OrtBackend(path, threads=threads, min_rows=rows)
    b.forward(np.zeros((1, shape.past), np.int64), np.arange(shape.past)[None])
    return b


def measure_layer_times(
    shape: LayerShape | None = None,
    *,
    layers: tuple[int, int] = (2, 8),
    rows: tuple[int, ...] = (1, 2, 4),
    calls: int = 15,
    threads: int | None = None,
    extra: Mapping[str, Callable[[], Any]] | None = None,
) -> dict[str, dict[int, float]]:
    """Seconds of one decoder layer per call of accel's onnxruntime graph, ``{"fp32" | "nbits8": {rows: s}}``: the
    time of a ``layers[1]``-layer graph less a ``layers[0]``-layer one, over the layers added (``rows`` new tokens
    after ``shape.past``; an nbits call of one row is not padded here: ``min_rows=1``); and ``"call": {rows: s}``,
    the fixed seconds of a call (the ``layers[0]``-layer graph less its layers, the mean of the two kinds, at least
    0). Every call of the four graphs at every row count, and each ``extra`` call (``{name: {1: median s}}``), is
    timed in one round robin, so load drift hits all of them alike (the simulator combines their differences)."""
    shape = shape or LayerShape()
    kinds = ("fp32", "nbits8")
    extra = dict(extra or {})
    extra_s: dict[str, list[float]] = {name: [] for name in extra}
    times: dict[tuple[str, int, int], list[float]] = {(k, n, r): [] for k in kinds for n in layers for r in rows}
    with tempfile.TemporaryDirectory() as tmp:
        graphs = {(k, n): _backend(shape, n, k == "nbits8", 1, threads, Path(tmp)) for k in kinds for n in layers}
        for i in range(calls + 2):
            for r in rows:  # no graph follows itself: each call finds its weights out of the cache, as in a model
                for (k, n), b in graphs.items():
                    ids, pos = np.zeros((1, r), np.int64), np.arange(shape.past, shape.past + r)[None]
                    t0 = time.perf_counter()
                    b.forward(ids, pos)
                    if i >= 2:
                        times[(k, n, r)].append(time.perf_counter() - t0)
            for name, fn in extra.items():
                t0 = time.perf_counter()
                fn()
                if i >= 2:
                    extra_s[name].append(time.perf_counter() - t0)
        del graphs
    med = {key: float(np.median(ts)) for key, ts in times.items()}
    (n0, n1), out = layers, {}
    for k in kinds:
        out[k] = {r: max(med[(k, n1, r)] - med[(k, n0, r)], 1e-9) / (n1 - n0) for r in rows}
    out["call"] = {r: max(float(np.mean([med[(k, n0, r)] - n0 * out[k][r] for k in kinds])), 0.0) for r in rows}
    out |= {name: {1: float(np.median(ts))} for name, ts in extra_s.items()}
    return out
