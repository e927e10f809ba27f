"""Reading an ONNX decoder graph's contract: ``GraphContract``/``inspect_graph`` (batch, ctx_len, vocab, layers,
cache shape, logits columns, tree and mixed inputs, pipeline stage, the recorded ``GraphSpec``) and
``check_inplace_cache`` (may the cache be updated in place?). Used by ``OrtBackend``
(``accel.backends.ort_backend``)."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from accel.backends.graph_spec import GRAPH_SPEC_KEY, GraphSpec
from accel.backends.stages import StageSpec
from accel.errors import BackendError

__all__ = ["GraphContract", "check_inplace_cache", "inspect_graph"]

_PAST = re.compile(r"^past_(key|value)\.(\d+)$")


@dataclass(frozen=True)
class GraphContract:
    """What an ONNX decoder graph declares, read by ``inspect_graph``.

    Attributes:
        kv_shape: the shape of every cache tensor ``[batch_size, H_kv, ctx_len, head_dim]``.
        num_layers: cache layers (a stage graph's own layers).
        vocab_size: tokens in the vocabulary (the logits' last dimension).
        num_logits: None (logits for every token of a call) or the fixed number of last tokens with logits.
        metadata: the graph's ``metadata_props``.
        hidden_size: width of the output ``hidden_states`` (0: none).
        feature_size: width of the input ``features`` (0: none; a feature draft).
        tree: the graph has the tree inputs ``slot_ids`` / ``tree_mask``.
        mix_inputs: the graph has ``mix_ids`` / ``mix_weights`` (superposed inputs).
        logits_input: the graph has the input ``num_logits`` (int64 ``[1]``): each call says how many last tokens
            get logits (``GraphSpec.logits_input``).
        stage: the layers the graph runs (``StageSpec.whole`` for an ordinary model).
        stage_width: width of ``hidden_in`` / ``hidden_out`` (a stage graph's residual stream; 0: none).
        graph_spec: the ``GraphSpec`` its metadata records (``accel.graph_spec``, checked against the graph), or
            None for a graph without one (another tool's, or an older accel's).
    """

    kv_shape: tuple[int, ...]
    num_layers: int
    vocab_size: int
    num_logits: int | None
    metadata: dict[str, str]
    stage: StageSpec
    hidden_size: int = 0
    feature_size: int = 0
    tree: bool = False
    mix_inputs: bool = False
    logits_input: bool = False
    stage_width: int = 0
    graph_spec: GraphSpec | None = None

    @property
    def batch_size(self) -> int:
        """Rows per call."""
        return self.kv_shape[0]

    @property
    def ctx_len(self) -> int:
        """KV-cache length in tokens."""
        return self.kv_shape[2]


def inspect_graph(session: ort.InferenceSession, source: str = "graph") -> GraphContract:
    """Check ``session``'s inputs/outputs against the KV-cache contract; BackendError names whatever is missing."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    for names in (("input_ids", "hidden_in"), ("position_ids",)):  # hidden_in: a later pipeline stage
        if not any(n in inputs for n in names):
            raise BackendError(f"{source}: input {names[0]!r} is missing (inputs: {sorted(inputs)})")
    if "logits" not in outputs and "hidden_out" not in outputs:  # hidden_out only: a middle pipeline stage
        raise BackendError(f"{source}: output 'logits' is missing (outputs: {sorted(outputs)})")
    num_layers, kv_shape = _cache_inputs(inputs, outputs, source)
    batch = inputs["input_ids" if "input_ids" in inputs else "hidden_in"].shape[0]
    if isinstance(batch, int) and batch != kv_shape[0]:
        raise BackendError(f"{source}: input_ids batch {batch} differs from the cache batch {kv_shape[0]}")
    logits_shape = outputs["logits"].shape if "logits" in outputs else []
    vocab = logits_shape[-1] if logits_shape else None
    meta = dict(session.get_modelmeta().custom_metadata_map)
    if not isinstance(vocab, int):
        cfg = json.loads(meta.get("accel.model_config", "{}"))
        vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int):
        raise BackendError(f"{source}: the vocabulary size is unknown (logits shape {logits_shape}, no metadata)")
    num_logits = logits_shape[1] if len(logits_shape) == 3 and isinstance(logits_shape[1], int) else None
    widths = _widths(inputs, outputs, source)
    mix = "mix_ids" in inputs or "mix_weights" in inputs
    if mix and not ("mix_ids" in inputs and "mix_weights" in inputs):
        raise BackendError(f"{source}: a mixed-input graph needs both inputs mix_ids and mix_weights")
    contract = GraphContract(
        kv_shape=kv_shape,
        num_layers=num_layers,
        vocab_size=vocab,
        num_logits=num_logits,
        metadata=meta,
        stage=_graph_stage(meta, num_layers, "input_ids" in inputs, "logits" in outputs, widths[2:], source),
        hidden_size=widths[0],
        feature_size=widths[1],
        tree=_tree_inputs(inputs, kv_shape[2], source),
        mix_inputs=mix,
        logits_input=_logits_input(inputs, num_logits, source),
        stage_width=max(widths[2:]),
    )
    return dataclasses.replace(contract, graph_spec=_recorded_spec(contract, source))


def _cache_inputs(inputs: dict[str, Any], outputs: dict[str, Any], source: str) -> tuple[int, tuple[int, ...]]:
    """The graph's cache layers and the shape of each cache tensor, checked (every layer's key and value, input and
    ``_RetainedState`` output, one fixed float32 shape)."""
    layers = sorted({int(m.group(2)) for n in inputs if (m := _PAST.match(n))})
    if not layers:
        raise BackendError(f"{source}: no past_key.{{i}} / past_value.{{i}} cache inputs (inputs: {sorted(inputs)})")
    num_layers = layers[-1] + 1
    for i in range(num_layers):
        for kv in ("key", "value"):
            if f"past_{kv}.{i}" not in inputs:
                raise BackendError(f"{source}: cache input 'past_{kv}.{i}' is missing")
            if f"past_{kv}.{i}_RetainedState" not in outputs:
                raise BackendError(f"{source}: output 'past_{kv}.{i}_RetainedState' is missing")
    kv_shape = inputs["past_key.0"].shape
    if len(kv_shape) != 4 or not all(isinstance(d, int) for d in kv_shape):
        raise BackendError(f"{source}: past_key.0 must have a fixed shape [B, H_kv, ctx_len, D]; got {kv_shape}")
    for name in inputs:
        if _PAST.match(name) and tuple(inputs[name].shape) != tuple(kv_shape):
            raise BackendError(f"{source}: {name} has shape {inputs[name].shape}, past_key.0 has {kv_shape}")
        if _PAST.match(name) and inputs[name].type != "tensor(float)":
            raise BackendError(f"{source}: {name} must be float32; got {inputs[name].type}")
    return num_layers, tuple(kv_shape)


def _widths(inputs: dict[str, Any], outputs: dict[str, Any], source: str) -> list[int]:
    """Widths of ``hidden_states``, ``features``, ``hidden_in`` and ``hidden_out`` (0 where absent)."""
    widths = []
    for name, group in (("hidden_states", outputs), ("features", inputs), ("hidden_in", inputs),
                        ("hidden_out", outputs)):  # fmt: skip
        shape = group[name].shape if name in group else None
        if shape is not None and (len(shape) != 3 or not isinstance(shape[2], int)):
            raise BackendError(f"{source}: {name} must be [B, seq_len, width] with a fixed width; got {shape}")
        widths.append(shape[2] if shape is not None else 0)
    return widths


def _recorded_spec(c: GraphContract, source: str) -> GraphSpec | None:
    """The graph's recorded ``GraphSpec`` (None without one), checked against what the graph itself declares."""
    spec = GraphSpec.from_metadata(c.metadata, source)
    if spec is None:
        return None
    facts = {
        "ctx_len": (spec.ctx_len, c.ctx_len),
        "batch_size": (spec.batch_size, c.batch_size),
        "tree": (spec.tree, c.tree),
        "mix_inputs": (spec.mix_inputs, c.mix_inputs),
        "logits_input": (spec.logits_input, c.logits_input),
        "stage": (spec.stage or StageSpec.whole(c.num_layers), c.stage),
    }
    if c.stage.has_logits:
        facts["num_logits"] = (spec.num_logits, c.num_logits)
    if c.stage.is_last:
        facts["hidden_output"] = (spec.hidden_output, bool(c.hidden_size))
    wrong = [f"{name} {said!r} (the graph: {has!r})" for name, (said, has) in facts.items() if said != has]
    if wrong:
        raise BackendError(f"{source}: {GRAPH_SPEC_KEY} disagrees with the graph: {'; '.join(wrong)}")
    return spec


def _tree_inputs(inputs: dict[str, Any], ctx_len: int, source: str) -> bool:
    """Whether the graph has the tree inputs (both, with the right types and a ``ctx_len`` mask width)."""
    have = [name for name in ("slot_ids", "tree_mask") if name in inputs]
    if not have:
        return False
    if len(have) == 1:
        raise BackendError(f"{source}: a tree graph needs both inputs slot_ids and tree_mask; it has only {have[0]}")
    if inputs["slot_ids"].type != "tensor(int64)" or inputs["tree_mask"].type != "tensor(bool)":
        raise BackendError(f"{source}: slot_ids must be int64 and tree_mask bool")
    shape = inputs["tree_mask"].shape
    if len(shape) != 3 or shape[2] != ctx_len:
        raise BackendError(f"{source}: tree_mask must be [B, seq_len, ctx_len={ctx_len}]; got {shape}")
    return True


def _logits_input(inputs: dict[str, Any], num_logits: int | None, source: str) -> bool:
    """Whether the graph has the input ``num_logits`` (int64 ``[1]``, in a graph without a fixed count)."""
    if "num_logits" not in inputs:
        return False
    i = inputs["num_logits"]
    if i.type != "tensor(int64)" or list(i.shape) != [1]:
        raise BackendError(f"{source}: the input num_logits must be int64 [1]; got {i.type} {i.shape}")
    if num_logits is not None:
        raise BackendError(f"{source}: a graph with a fixed num_logits ({num_logits}) cannot take it as an input")
    return True


def _graph_stage(
    meta: dict[str, str], num_layers: int, has_ids: bool, has_logits: bool, widths: list[int], source: str
) -> StageSpec:
    """The pipeline stage a graph is (``StageSpec.whole`` for an ordinary model), checked against its inputs and
    outputs: ``hidden_in`` iff it starts after layer 0, ``hidden_out`` iff it ends before the last layer."""
    stage = StageSpec.from_metadata(meta, num_layers, source)
    if has_ids != stage.is_first or bool(widths[0]) == stage.is_first:
        raise BackendError(
            f"{source}: a stage from layer {stage.start} reads {'input_ids' if stage.is_first else 'hidden_in'}"
        )
    if bool(widths[1]) == stage.is_last or has_logits != stage.has_logits:
        raise BackendError(f"{source}: the graph's outputs do not match its stage {stage} (hidden_out / logits)")
    return stage


def _writes_in_place(writer: Any, name: str, out: str) -> bool:
    """Whether node ``writer`` makes cache output ``out`` from cache input ``name`` in place: a ScatterND of it, or an
    ``ai.accel::CacheAttention`` whose past key (value) input 1 (2) is ``name`` and output 1 (2) ``out``."""
    if writer.op_type == "ScatterND":
        return writer.input[0] == name
    if writer.op_type == "CacheAttention" and writer.domain == "ai.accel" and len(writer.input) == 8:
        return any(writer.input[k] == name and writer.output[k] == out for k in (1, 2))
    return False


def check_inplace_cache(path: str | Path, num_layers: int) -> set[str]:
    """BackendError unless every cache output of the graph at ``path`` can share its input's buffer; returns the
    graph's operator types.

    That holds when ``past_X_RetainedState`` is produced by a ScatterND whose data input is ``past_X`` (or by an
    ``ai.accel::CacheAttention`` from it) and every other node reading ``past_X`` is an ancestor of that node (so it
    runs before the write): the graphs ``export_onnx`` writes. onnxruntime's ScatterND, and accel's operator, skip
    the input -> output copy when both are the same memory."""
    import onnx

    try:
        graph = onnx.load_model(str(path), load_external_data=False).graph
    except Exception as exc:  # protobuf DecodeError, OSError: a corrupt or unreadable file
        raise BackendError(f"{path} is not a readable ONNX file: {type(exc).__name__}: {exc}") from exc
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for i in range(num_layers):
        for kv in ("key", "value"):
            name = f"past_{kv}.{i}"
            writer = producer.get(f"{name}_RetainedState")
            if writer is None or not _writes_in_place(writer, name, f"{name}_RetainedState"):
                raise BackendError(
                    f"{path}: {name}_RetainedState is not a ScatterND (or ai.accel::CacheAttention) of {name}; "
                    "OrtBackend updates the cache in place and supports only such graphs (as export_onnx writes them)"
                )
            ancestors, todo = set(), [x for x in writer.input if x != name]
            while todo:
                node = producer.get(todo.pop())
                if node is not None and id(node) not in ancestors:
                    ancestors.add(id(node))
                    todo.extend(node.input)
            late = [n.name or n.op_type for n in readers[name] if n is not writer and id(n) not in ancestors]
            if late:
                raise BackendError(
                    f"{path}: {name} is read by {late} independently of its cache write; OrtBackend "
                    "updates the cache in place and needs every reader to run before the write"
                )
    return {node.op_type for node in graph.node}
