"""A target graph for an EAGLE-3 head: accel's ONNX export whose ``hidden_states`` output carries the target's
residual stream at the head's aux layers instead of the final-norm state.

``export_eagle3_target`` exports the target as ``accel.backends.export_onnx`` does (every weight format, fused
operators or not, external data), then rewires the output ``hidden_states`` to
``concat(r_{l_1}, ..., r_{l_n}, 0_H)`` ``[B, S, (n + 1) H]``: ``r_l`` is the residual stream entering layer ``l``
(``l = num_layers``: after the last layer, before the final norm), the tensor that feeds that layer's input norm
(vLLM's ``aux_hidden_states``), and the trailing zeros are the slot the head's own state fills while drafting
(``accel.serving.eagle3_graph``). The logits and the cache are untouched: the rewrite adds one Concat (and the zeros)
and moves the output; it finds ``r_l`` as the input of the norm whose weight is ``layers.{l}.input_layernorm.weight``
(``norm.weight``), in both the standard graph (Pow ... Div, Mul by the weight) and the fused one
(``SkipSimplifiedLayerNormalization``: its fourth output is the sum).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from accel.backends.export import export_onnx
from accel.errors import DraftError
from accel.formats.writer import make_temp_file
from accel.serving.speculators_format import Eagle3Head

__all__ = ["add_aux_hidden_output", "export_eagle3_target"]


def export_eagle3_target(target: Any, path: str | Path, head: Eagle3Head, **export_options: Any) -> Path:
    """Export ``target`` (a ``Decoder`` or checkpoint, as ``export_onnx`` takes) to ``path`` with the aux states
    ``head`` reads as its ``hidden_states`` output; ``export_options``: ``export_onnx``'s keywords (``ctx_len`` is
    required; ``hidden_output`` is implied). Returns the path. DraftError (and no file) when the head's layers or
    width do not fit the target."""

    if not isinstance(head, Eagle3Head):
        raise DraftError(f"export_eagle3_target needs an Eagle3Head (read_speculators); got {type(head).__name__}")
    export_options.pop("hidden_output", None)
    path = export_onnx(target, path, hidden_output=True, **export_options)
    try:
        return add_aux_hidden_output(path, head.layer_ids, head.hidden_size)
    except DraftError:  # a target the head does not fit: leave no plain export behind under the asked name
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".data").unlink(missing_ok=True)
        raise


def add_aux_hidden_output(path: str | Path, layer_ids: Sequence[int], hidden_size: int) -> Path:
    """Rewrite the accel target graph at ``path`` (exported with ``hidden_output=True``) in place so that
    ``hidden_states`` is ``concat(r_l for l in layer_ids, zeros[hidden_size])`` (module docstring). The new file is
    written beside it and renamed over it (its external data file, if any, is kept as it is). Returns the path."""
    path = Path(path)
    if not path.is_file():
        raise DraftError(f"no ONNX file at {path}")
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    num_layers = sum(1 for i in graph.input if i.name.startswith("past_key."))
    bad = [i for i in layer_ids if not 0 <= i <= num_layers]
    if bad or not layer_ids:
        raise DraftError(f"aux layer ids {list(layer_ids)} must be in 0..{num_layers} (the target's layer count)")
    streams = [_residual_stream(graph, i, num_layers, path) for i in layer_ids]
    width = _width(graph, hidden_size, path)
    _rewire(graph, streams, hidden_size, width * len(streams) + hidden_size)
    props = {p.key: p.value for p in model.metadata_props}
    props["accel.aux_layer_ids"] = ",".join(str(i) for i in layer_ids)
    helper.set_model_props(model, props)
    fd, tmp = make_temp_file(path)
    os.close(fd)
    try:
        onnx.save_model(model, str(tmp))
        onnx.checker.check_model(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _residual_stream(graph: onnx.GraphProto, layer: int, num_layers: int, path: Path) -> str:
    """The tensor that enters the input norm of ``layer`` (the final norm for ``layer == num_layers``)."""
    weight = "norm.weight" if layer == num_layers else f"layers.{layer}.input_layernorm.weight"
    names = {weight}
    for node in graph.node:  # float16 storage: the weight reaches the norm through a Cast
        if node.op_type == "Cast" and node.input[0] == weight:
            names.add(node.output[0])
    users = [n for n in graph.node if names & set(n.input) and n.op_type != "Cast"]
    if len(users) != 1:
        raise DraftError(f"{path}: {weight} feeds {len(users)} nodes; expected one norm (not an accel target graph?)")
    norm = users[0]
    if norm.op_type == "SkipSimplifiedLayerNormalization" and len(norm.output) > 3 and norm.output[3]:
        return norm.output[3]
    if norm.op_type in ("LayerNormalization", "SimplifiedLayerNormalization"):
        return norm.input[0]
    if norm.op_type == "Mul":
        other = norm.input[0] if norm.input[1] in names else norm.input[1]
        div = [n for n in graph.node if other in n.output and n.op_type == "Div"]
        if div:
            return div[0].input[0]
    raise DraftError(f"{path}: cannot find the residual stream entering layer {layer} (norm node {norm.op_type})")


def _width(graph: onnx.GraphProto, hidden_size: int, path: Path) -> int:
    """The target's hidden width, from its ``hidden_states`` output; DraftError unless it is ``hidden_size``."""
    outputs = {o.name: o for o in graph.output}
    if "hidden_states" not in outputs:
        raise DraftError(f"{path} has no hidden_states output: export the target with hidden_output=True")
    dims = outputs["hidden_states"].type.tensor_type.shape.dim
    width = dims[2].dim_value if len(dims) == 3 else 0
    if width != hidden_size:
        raise DraftError(f"{path}: the target's hidden width is {width}; the EAGLE-3 head reads {hidden_size}")
    return width


def _rewire(graph: onnx.GraphProto, streams: list[str], hidden_size: int, total: int) -> None:
    """Point ``hidden_states`` at ``concat(streams, zeros [B, S, hidden_size])`` and declare its new width."""
    nodes = [
        helper.make_node("Shape", [streams[0]], ["aux_shape"], name="aux_shape"),
        helper.make_node("Constant", [], ["aux_starts"], name="aux_starts", value_ints=[0]),
        helper.make_node("Constant", [], ["aux_ends"], name="aux_ends", value_ints=[2]),
        helper.make_node("Constant", [], ["aux_width"], name="aux_width", value_ints=[hidden_size]),
        helper.make_node("Slice", ["aux_shape", "aux_starts", "aux_ends"], ["aux_lead"], name="aux_lead"),
        helper.make_node("Concat", ["aux_lead", "aux_width"], ["aux_zero_shape"], name="aux_zero_shape", axis=0),
        helper.make_node(
            "ConstantOfShape",
            ["aux_zero_shape"],
            ["aux_zeros"],
            name="aux_zeros",
            value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]),
        ),
        helper.make_node("Concat", [*streams, "aux_zeros"], ["aux_hidden"], name="aux_hidden", axis=-1),
    ]
    producer = [n for n in graph.node if "hidden_states" in n.output]
    if len(producer) != 1:
        raise DraftError("the target graph's hidden_states has no single producing node")
    node = producer[0]
    if node.op_type == "Identity" and not any("hidden_states" in n.input for n in graph.node):
        graph.node.remove(node)  # the final-norm copy nothing else reads
    else:
        node.output[list(node.output).index("hidden_states")] = "final_hidden_states"
    nodes.append(helper.make_node("Identity", ["aux_hidden"], ["hidden_states"], name="aux_hidden_states"))
    graph.node.extend(nodes)
    for out in graph.output:
        if out.name == "hidden_states":
            out.type.tensor_type.shape.dim[2].dim_value = total
