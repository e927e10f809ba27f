"""ONNX graphs of Hydra heads (numpy weights in, ``onnx.ModelProto`` out; no torch).

- ``head_graph(i)``: head i's blocks for one tree level. Inputs ``base`` float32 ``[B, 1, H]`` (the row's base
  state) and ``path_embeds`` float32 ``[B, M, i x H]`` (the input embeddings of each of M paths of i tokens, root
  first); output ``state`` float32 ``[B, M, H]``. The embeddings are gathered on the host from a memory-mapped table
  (a few rows per call; the host needs the top-k tokens anyway to grow the tree), which keeps the 28 M-entry table out
  of the graphs.
- ``lm_head_graph``: the LM head shared by every level. Inputs ``state`` ``[B, M, H]`` and ``k`` int64 ``[1]``;
  outputs ``topk_logp`` float32 ``[B, M, k]`` (the log-probabilities of the k most likely tokens, over the LM head's
  tokens) and ``topk_ids`` int64 ``[B, M, k]`` (their token ids). The log-softmax, the top-k and the column-to-token-id
  lookup run in the graph, so a call returns 2 x k numbers per path instead of a vocabulary row. One graph for all
  levels (not one copy of the head per level graph): the head is most of a level's weights, and the calls of one
  round then read one copy, which stays in the CPU's caches from level to level.
- ``prefix_graph``: the Hydra++ prefix layer with its own position-indexed KV cache (docs/reference.md §2): inputs
  ``hidden`` float32 ``[B, S, H]`` (the target's states), ``position_ids`` int64 ``[B, S]`` (-1 = padding),
  ``past_key.0`` / ``past_value.0``; outputs ``base`` ``[B, S, H]`` and the ``*_RetainedState`` caches (updated in
  place by ``HydraRuntime``). Built from the decoder graph's own attention block (``accel.backends.onnx_graph``), so
  it computes what ``HydraHeads.prefix_step`` computes.

Weights are keyed by ``HydraHeads`` state-dict names (``heads.{i-1}.blocks.{j}.linear.weight`` ...); ``lm_weight``
``[n, H]`` and ``token_ids`` ``[n]`` are the LM head's rows and token ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from accel.backends.graph_spec import GraphSpec
from accel.backends.onnx_builder import IR_VERSION, OPSET, GraphBuilder
from accel.backends.onnx_layers import DecoderGraph
from accel.backends.onnx_weights import GraphWeights

__all__ = ["head_graph", "lm_head_graph", "prefix_graph"]


def _model(g: GraphBuilder, name: str, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="accel")
    model.ir_version = IR_VERSION
    return model


def head_graph(
    index: int, mlp_layers: int, hidden: int, tensors: Mapping[str, Any], batch_size: int
) -> onnx.ModelProto:
    """The level graph of head ``index``: its blocks, up to the state the LM head reads (module docstring)."""
    g = GraphBuilder()
    w = GraphWeights(g, tensors, "fp32", tied=False)
    value = helper.make_tensor_value_info
    B = batch_size
    inputs = [
        value("base", TensorProto.FLOAT, [B, 1, hidden]),
        value("path_embeds", TensorProto.FLOAT, [B, "paths", index * hidden]),
    ]
    outputs = [value("state", TensorProto.FLOAT, [B, "paths", hidden])]
    lead = g.op("Slice", g.op("Shape", "path_embeds"), g.const([0]), g.const([2]))  # [B, M]
    base = g.op("Expand", "base", g.op("Concat", lead, g.const([hidden]), axis=0))
    x = g.op("Concat", base, "path_embeds", axis=-1)
    prefix = f"heads.{index - 1}.blocks"
    for j in range(mlp_layers):
        p = f"{prefix}.{j}"
        lin = g.op("Add", w.linear(x, f"{p}.linear.weight"), w.plain(f"{p}.linear.bias"))
        act = g.op("Mul", lin, g.op("Sigmoid", lin))
        res = x if j else g.op("Add", w.linear(x, f"{p}.res.weight"), w.plain(f"{p}.res.bias"))
        x = g.op("Add", res, act, name="state" if j == mlp_layers - 1 else None)
    return _model(g, f"accel_hydra_head{index}", inputs, outputs)


def lm_head_graph(hidden: int, tensors: Mapping[str, Any], batch_size: int) -> onnx.ModelProto:
    """The shared LM head with log-softmax, top-k and token-id lookup (module docstring); ``tensors`` hold
    ``lm_weight`` ``[n, H]`` and ``token_ids`` ``[n]``."""
    g = GraphBuilder()
    w = GraphWeights(g, tensors, "fp32", tied=False)
    value = helper.make_tensor_value_info
    B = batch_size
    inputs = [value("state", TensorProto.FLOAT, [B, "paths", hidden]), value("k", TensorProto.INT64, [1])]
    outputs = [
        value("topk_logp", TensorProto.FLOAT, [B, "paths", "k"]),
        value("topk_ids", TensorProto.INT64, [B, "paths", "k"]),
    ]
    logp = g.op("LogSoftmax", w.linear("state", "lm_weight"), axis=-1)
    values, cols = g.ops("TopK", [logp, "k"], 2, axis=-1, largest=1, sorted=1)
    g.op("Identity", values, name="topk_logp")
    g.op("Gather", g.init("token_ids", np.asarray(tensors["token_ids"], np.int64)), cols, axis=0, name="topk_ids")
    return _model(g, "accel_hydra_lm_head", inputs, outputs)


def prefix_graph(target_config: Any, tensors: Mapping[str, Any], ctx_len: int, batch_size: int) -> onnx.ModelProto:
    """The Hydra++ prefix layer's graph (module docstring); ``target_config`` is the target's ``ModelConfig`` and
    ``tensors`` hold the layer's weights under ``layers.0.*``."""
    config = target_config.with_(num_layers=1, tie_word_embeddings=False)
    d = DecoderGraph(config, tensors, GraphSpec(ctx_len=ctx_len, batch_size=batch_size), None)
    value = helper.make_tensor_value_info
    B, H = batch_size, config.hidden_size
    kv_shape = [B, config.num_kv_heads, ctx_len, config.head_dim]
    inputs = [
        value("hidden", TensorProto.FLOAT, [B, "seq_len", H]),
        value("position_ids", TensorProto.INT64, [B, "seq_len"]),
    ]
    inputs += [value(f"past_{kv}.0", TensorProto.FLOAT, kv_shape) for kv in ("key", "value")]
    outputs = [value("base", TensorProto.FLOAT, [B, "seq_len", H])]
    outputs += [value(f"past_{kv}.0_RetainedState", TensorProto.FLOAT, kv_shape) for kv in ("key", "value")]
    mask = d.attention_mask()
    d.cache_slots()
    d.rope()
    d.g.op("Identity", d.block(0, "hidden", mask), name="base")
    return _model(d.g, "accel_hydra_prefix", inputs, outputs)
