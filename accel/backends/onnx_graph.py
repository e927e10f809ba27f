"""Build the ONNX graph of a decoder with the position-indexed KV-cache contract (docs/reference.md §2), from numpy
weights.

The graph computes what ``accel.models.decoder.Decoder.forward`` computes (same masking, same RoPE, same op order in
the layers), so ORT and torch agree to fp32 rounding; the cache write is an exact ScatterND of each new row at its
slot (in place under ``OrtBackend``). No torch is needed here: weights arrive as float32 numpy arrays or ``MXTensor``
objects, keyed by ``Decoder`` state-dict names (how each is stored: ``accel.backends.onnx_weights``).

``build_decoder_graph`` assembles the graph of a ``GraphSpec`` in stages (``accel.backends.onnx_layers.DecoderGraph``):
inputs/outputs, embeddings, the attention mask, the cache-write slots, the RoPE tables, one block per layer, the final
norm and the LM head.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import onnx
from onnx import helper

from accel.backends.graph_spec import GraphSpec
from accel.backends.onnx_builder import IR_VERSION, OPSET, ExternalData
from accel.backends.onnx_layers import DecoderGraph
from accel.backends.stages import StageSpec
from accel.errors import BackendError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["IR_VERSION", "OPSET", "BuilderOptions", "build_decoder_graph", "legacy_spec"]


def build_decoder_graph(
    config: Any,
    tensors: Mapping[str, Any],
    spec: GraphSpec | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    external: ExternalData | None = None,
    **legacy: Unpack[BuilderOptions],
) -> onnx.ModelProto:
    """The ONNX model of a ``Decoder`` with ``config`` (an ``accel.models.ModelConfig``) and weights ``tensors``, as
    ``spec`` (an ``accel.backends.graph_spec.GraphSpec``) describes it.

    Inputs ``input_ids``/``position_ids`` int64 ``[batch_size, seq_len]`` (``seq_len`` dynamic), ``past_key.{i}`` /
    ``past_value.{i}`` float32 ``[batch_size, H_kv, ctx_len, head_dim]``. Outputs ``logits`` float32
    ``[batch_size, seq_len or num_logits, vocab]`` and ``past_key.{i}_RetainedState`` /
    ``past_value.{i}_RetainedState``.
    ``hidden_output`` (always on for a feature draft, ``config.feature_size > 0``) adds the output ``hidden_states``
    float32 ``[batch_size, seq_len, hidden]``: the final-norm hidden state of every column. A feature draft also has
    the input ``features`` float32 ``[batch_size, seq_len, feature_size]`` (see ``Decoder.embed``).
    The weights' ``runtime``: ``nbits`` runs the MX weights (MXINT8, MXFP6 E2M3, MXFP4 E2M1) as onnxruntime
    ``MatMulNBits`` nodes (``accuracy_level`` 4 for int8 activations, 1 for float32; ``accel.backends.onnx_weights``);
    ``kernel`` runs them packed on accel's fused kernel (``ai.accel::MXLinear``) with float32 or int8 activations per
    block of 32; ``dynamic`` stores every Linear (and the head) as int8 weights in the ``int8_scheme`` with dynamic
    activation quantization (``accel.backends.onnx_int8``). The element itself is not read here: the tensors carry
    their formats (float32 arrays or ``MXTensor``).
    ``tree`` adds the tree inputs ``slot_ids`` int64 ``[batch_size, seq_len]`` (each token's cache slot) and
    ``tree_mask`` bool ``[batch_size, seq_len, ctx_len]`` (the slots each token attends to), which replace the
    position-derived write slots and mask (docs/backends.md, "Tree calls").
    ``mix_inputs`` adds the inputs ``mix_ids`` int64 and ``mix_weights`` float32 ``[batch_size, seq_len, mix]``: the
    embedding of a column is then ``sum_m mix_weights * E[mix_ids]`` (superposed inputs; ``input_ids`` is not read;
    the ``"mix"`` extension of ``accel.backends.base``).
    ``stage``: only layers ``[stage.start, stage.stop)`` (``accel.backends.stages``): a later stage reads the input
    ``hidden_in`` float32 ``[batch_size, seq_len, hidden]`` instead of ``input_ids``, a stage before the last writes
    the output ``hidden_out`` (the residual stream after its last layer) instead of ``logits`` (and, with
    ``stage.exit_logits``, ``logits`` of an early-exit head: the ``exit.*`` adapter weights when ``tensors`` has them,
    then ``exit.norm.weight`` or the final norm, then the LM head); cache inputs ``past_key.{j}`` are numbered from 0
    within the stage. Default: the whole model (the graph is then exactly as without ``stage``).
    ``ort_ops``: write RMSNorm + residual add as ``com.microsoft.SkipSimplifiedLayerNormalization`` and RoPE as
    ``com.microsoft.RotaryEmbedding`` (onnxruntime's CPU kernels; fewer nodes per layer, docs/backends.md "The graph
    of a layer"); False: standard ONNX only (the graph Cloud AI 100 and other runtimes read).
    ``progress(1)`` is called once per layer. ``external``: write the initializers to this external-data sink as they
    are created (``accel.backends.onnx_builder.ExternalData``). ``legacy``: the builder's older keywords
    (``BuilderOptions``) instead of ``spec``.
    """
    if spec is None:
        spec = legacy_spec(**legacy)
    elif legacy:
        raise BackendError(f"build_decoder_graph: give a GraphSpec or the keywords {sorted(legacy)}, not both")
    _model_stage(config, spec.stage)
    return _assemble(DecoderGraph(config, tensors, spec, external), spec.num_logits, progress)


class BuilderOptions(TypedDict, total=False):
    """``build_decoder_graph``'s older keywords (kept for callers outside the engine; accel passes a GraphSpec):
    ``ctx_len``, ``batch_size``, ``num_logits`` in tokens/rows; ``float_dtype`` (``fp32``/``fp16``);
    ``matmul_nbits`` (0, or the ``MatMulNBits`` accuracy level 1 or 4); ``mx_kernel`` (0, or the fused kernel's
    activation bits 32 or 8); ``int8`` (None or the int8 scheme); ``fused`` (``ort_ops``); and ``GraphSpec``'s flags."""

    ctx_len: int
    batch_size: int
    num_logits: int | None
    float_dtype: str
    hidden_output: bool
    matmul_nbits: int
    mx_kernel: int
    tree: bool
    int8: str | None
    mix_inputs: bool
    stage: StageSpec | None
    fused: bool


def legacy_spec(**options: Unpack[BuilderOptions]) -> GraphSpec:
    """The ``GraphSpec`` of ``build_decoder_graph``'s older keywords (``BuilderOptions``). The builder reads no
    element (the tensors carry their formats), so a code runtime gets a placeholder one: ``mxint8`` for ``nbits``
    and the float32 kernel, ``mxfp6`` for the int8-activation kernel."""
    kw: dict[str, Any] = dict(options)
    unknown = sorted(set(kw) - set(BuilderOptions.__annotations__))
    if unknown:
        raise BackendError(f"build_decoder_graph got unknown keyword(s) {', '.join(unknown)}")
    nbits, kernel, int8 = kw.pop("matmul_nbits", 0), kw.pop("mx_kernel", 0), kw.pop("int8", None)
    kw["ort_ops"] = bool(kw.pop("fused", False))
    float_dtype = kw.pop("float_dtype", "fp32")
    if nbits:
        kw.update(element="mxint8", runtime="nbits", activations="int8" if nbits == 4 else "float32")
    elif kernel:
        q8 = kernel == 8
        kw.update(element="mxfp6" if q8 else "mxint8", runtime="kernel", activations="int8" if q8 else "float32")
    elif int8 is not None:
        kw.update(element="int8", int8_scheme=int8)
    else:
        kw["element"] = float_dtype
    if float_dtype != "fp32" and kw["element"] != float_dtype:
        raise BackendError(f"float_dtype={float_dtype!r} applies to float weights only")
    return GraphSpec(**kw)


def _model_stage(config: Any, stage: StageSpec | None) -> StageSpec:
    """``stage`` (default: the whole model), checked against the model's number of layers."""
    stage = stage or StageSpec.whole(config.num_layers)
    if stage.total != config.num_layers:
        raise ValueError(f"stage {stage} is for a model of {stage.total} layers; this one has {config.num_layers}")
    return stage


def _assemble(d: DecoderGraph, num_logits: int | None, progress: Callable[[int], None] | None) -> onnx.ModelProto:
    """The model of ``d``: inputs/outputs, shared tensors, the stage's layers, then its head or hidden output."""
    inputs, outputs = d.io_spec(num_logits)
    x = d.embed() if d.stage.is_first else "hidden_in"
    if d.spec.accel_attention:  # ai.accel::CacheAttention masks and writes the cache itself
        mask = ""
    else:
        mask = d.attention_mask()
        d.cache_slots()
    d.rope()
    delta = None  # the last sublayer's output, not yet added to the residual stream x (fused into the next norm)
    for i in range(d.stage.start, d.stage.stop):
        x, delta = d.layer(i, x, delta, mask)
        if progress:
            progress(1)
    _stage_outputs(d, x, delta, num_logits)
    graph = helper.make_graph(d.g.nodes, "accel_decoder", inputs, outputs, d.g.inits)
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(dom, 1) for dom in sorted(d.g.opsets)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="accel")
    model.ir_version = IR_VERSION
    return model


def _stage_outputs(d: DecoderGraph, x: str, delta: str | None, num_logits: int | None) -> None:
    """The graph's end: the head's logits (last stage), else ``hidden_out`` and any early-exit logits."""
    if d.stage.is_last:
        d.head(x, delta, num_logits)
    else:
        x = d.g.op("Add", x, delta) if delta else x
        d.g.op("Identity", x, name="hidden_out")
        if d.stage.exit_logits:
            d.exit_head(x, num_logits)
