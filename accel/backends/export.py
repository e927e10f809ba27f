"""``export_onnx``: write a ``Decoder`` as an ONNX file with the KV-cache contract of docs/reference.md §2.

The graph is built directly with ``onnx.helper`` (``accel.backends.onnx_graph``) rather than traced: one file takes a
dynamic number of new tokens S (prefill chunks, K+1 scoring, single draft steps), and MX weights can be stored packed
with an in-graph decode. The weight storage is an ``ExportWeights`` (``accel.backends.weights``: ``fp32``, ``fp16``,
``mx-rounded``, ``mx-packed``, ``int8`` for drafts, ``mxint8-nbits`` / ``mxfp6-nbits`` / ``mxfp4-nbits``).

Which Linear weights are MX: if the model was compressed (``accel.compress``: modules with an MX weight), exactly
those, in their format; otherwise the Linear layers ``accel.compress`` picks by default (attention and MLP projections;
not ``lm_head``) are quantized with ``mx_format`` along the input features (blocks of 32). Embeddings, norms, biases and
``lm_head`` stay float32.

A restricted head (``config.head_vocab > 0``) is exported as its ``[B, N, head_vocab]`` MatMul scattered into a
``MASKED_LOGIT``-filled ``[B, N, vocab]`` tensor, so the ``logits`` output keeps its name and shape.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from tqdm.auto import tqdm

from accel.backends.limits import check_sizes
from accel.backends.onnx_graph import IR_VERSION, OPSET, build_decoder_graph
from accel.backends.stages import StageSpec
from accel.backends.weights import WEIGHT_MODES, ExportWeights, WeightFormat
from accel.errors import BackendError
from accel.models.decoder import Decoder

__all__ = ["WEIGHT_MODES", "ExportWeights", "WeightFormat", "export_cached", "export_onnx", "model_tensors"]
_EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's hard limit is 2 GiB; keep margin for the graph itself


def _mx_of(module: torch.nn.Module) -> Any | None:
    """The MXTensor weight of a compressed Linear (``accel.formats.torch_ops.MXLinear``), else None."""
    if getattr(module, "mx", None) is not None:
        return module.mx
    mx_weight = getattr(module, "mx_weight", None)
    if callable(mx_weight):
        return mx_weight()
    return None


def _is_linear_weight(model: torch.nn.Module, name: str) -> bool:
    """``name`` is the weight of an ``nn.Linear`` (``lm_head.weight`` too, when it is a tied copy of the embedding)."""
    import torch

    if name == "lm_head.weight":
        return True
    module = model.get_submodule(name.rsplit(".", 1)[0]) if name.endswith(".weight") else None
    return isinstance(module, torch.nn.Linear) and name != "fc.weight"  # a feature draft's fc reads raw features


def model_tensors(model: Decoder, weights: ExportWeights | WeightFormat | str) -> tuple[dict[str, Any], str | None]:
    """Weights of ``model`` by ``Decoder`` name (float32 numpy or MXTensor) for ``weights``; and the MX format used.

    A tied ``lm_head.weight`` is left out (the graph reuses the embedding), except for ``int8`` and the ``*-nbits``
    formats: there the head is a quantized copy and the embedding stays float32 (it is only gathered).
    """
    spec = ExportWeights.of(weights)
    fmt = spec.format
    own_head = fmt == WeightFormat.INT8 or fmt.is_nbits
    tensors: dict[str, Any] = {}
    mx_modules: dict[str, Any] = {}
    for name, module in model.named_modules():
        mx = _mx_of(module)
        if mx is not None:
            mx_modules[f"{name}.weight"] = mx
    for name, p in model.named_parameters():  # remove_duplicate: a tied lm_head.weight appears once (as embed_tokens)
        tensors[name] = p.detach().float().cpu().numpy()
    if model.config.tie_word_embeddings and not own_head:
        tensors.pop("lm_head.weight", None)
    elif model.config.tie_word_embeddings and "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["embed_tokens.weight"]  # the head gets its own (quantized) copy
    if getattr(model.config, "head_vocab", 0):  # restricted head: its token ids (int64) go into the graph as is
        tensors["lm_head_token_ids"] = model.lm_head_token_ids.detach().cpu().numpy().astype(np.int64)
    tensors.update(mx_modules)
    if fmt in (WeightFormat.FP32, WeightFormat.FP16, WeightFormat.INT8):  # int8: quantized later (_quantize_int8)
        for name, mx in mx_modules.items():
            tensors[name] = mx.dequantize(np.float32)
        return tensors, None
    used_format = _mx_weights(model, spec, tensors, mx_modules)
    if fmt == WeightFormat.MX_ROUNDED:
        for name, mx in mx_modules.items():
            tensors[name] = mx.dequantize(np.float32)
    return tensors, used_format


def _mx_weights(model: Decoder, spec: ExportWeights, tensors: dict[str, Any], mx_modules: dict[str, Any]) -> str:
    """Put the MX weights of an MX mode into ``tensors`` (and ``mx_modules``); returns the element format(s) used."""
    from accel.formats import get_format, quantize

    if spec.format.element_format:  # *-nbits: every Linear and the head (a compressed model: its codes)
        element = get_format(spec.format.element_format)
        other = sorted({mx.fmt.name for mx in mx_modules.values()} - {element.name})
        if other:
            raise BackendError(
                f"weights={spec.format.value!r} runs {element.name} weights only; this model is compressed with "
                f"{', '.join(other)} (use mx-packed or mx-rounded, or compress with {element.name})"
            )
        names = sorted(n for n in tensors if _is_linear_weight(model, n) and n not in mx_modules)
    elif mx_modules:  # a compressed model: keep exactly its MX weights and formats
        return ",".join(sorted({mx.fmt.name for mx in mx_modules.values()}))
    else:
        from accel.formats.compress import select_linear_layers

        chosen, _ = select_linear_layers(model)  # as accel.compress: not lm_head, not embedding-tied Linears
        names = sorted(f"{n}.weight" for n in chosen)
        element = get_format(spec.mx_format)
    for name in names:
        mx_modules[name] = quantize(tensors[name], element, axis=-1, block_size=32, name=name)
        tensors[name] = mx_modules[name]
    return element.name


def export_onnx(
    model: Decoder,
    path: str | Path,
    *,
    ctx_len: int,
    batch_size: int = 1,
    num_logits: int | None = None,
    weights: ExportWeights | WeightFormat | str = "fp32",
    opset: int = OPSET,
    progress: bool = True,
    hidden_output: bool = False,
    tree: bool = False,
    mix_inputs: bool = False,
    stage: StageSpec | None = None,
    exit_head: torch.nn.Module | None = None,
) -> Path:
    """Export ``model`` (an ``accel.models.Decoder``, possibly MX-compressed) to ONNX at ``path``; returns the path.

    Args:
        ctx_len: KV-cache length in tokens (fixed in the graph).
        batch_size: rows per call (fixed in the graph).
        num_logits: if given, the graph returns logits for the last ``num_logits`` positions only (the Cloud AI 100
            decode specialization); default: all ``seq_len`` positions (OrtBackend slices).
        weights: the weight storage: an ``ExportWeights`` (format, MX element format, float storage) or a
            ``WeightFormat`` / its name (``fp32``, ``fp16``, ``mx-rounded``, ``mx-packed``, ``int8``,
            ``mxint8-nbits``, ``mxfp6-nbits``, ``mxfp4-nbits``; MX modes then use ``mxfp6`` and float32 for the rest).
        opset: ONNX opset; only 18 is supported (IR version 8, loadable by stock onnxruntime).
        progress: show a tqdm bar.
        hidden_output: add the output ``hidden_states`` (final-norm hidden state of every column, ``[B, S, hidden]``):
            what a feature draft reads from its target. A feature draft (``config.feature_size > 0``) always has it,
            and its input ``features``.
        tree: add the tree inputs ``slot_ids`` ``[B, S]`` and ``tree_mask`` ``[B, S, ctx_len]`` (token-tree calls
            for speculative decoding; docs/backends.md, "Tree calls"). ``OrtBackend`` feeds chain calls to such a
            graph with the equivalent inputs.
        mix_inputs: add the inputs ``mix_ids`` / ``mix_weights`` (superposed inputs: the ``"mix"`` extension of
            ``accel.backends.base``, used by ``accel.superposed``).
        stage: export only layers ``[stage.start, stage.stop)`` as a pipeline stage (``accel.backends.stages``):
            hidden-state input/output instead of tokens/logits where the stage begins/ends inside the model, its own
            layers' cache, the layer range in the metadata (``accel.layers``).
        exit_head: the early-exit head of a ``stage`` with ``exit_logits`` (``accel.drafts.early_exit.ExitHead``: its
            weights go into the graph as ``exit.*``); None: the target's final norm and LM head on the stage's output.

    The file is written to a temporary name, checked with ``onnx.checker`` and renamed. Models over ~1.8 GB of
    weights store them as external data in ``<path>.data`` next to the file. Settings are recorded in
    ``metadata_props`` (``accel.*`` keys).
    """
    from accel import __version__

    spec = ExportWeights.of(weights)
    cfg = _check_export(model, ctx_len, batch_size, num_logits, opset)
    path = Path(path)
    if path.is_dir():
        raise BackendError(f"{path} is a directory: give the path of the .onnx file to write")
    bar = tqdm(total=cfg.num_layers + 2, desc=f"export {path.name}", unit="step", disable=not progress)
    bar.set_postfix_str("weights")
    tensors, used_format = model_tensors(model, spec)
    stage = _check_stage(cfg, stage, exit_head, tree)
    if exit_head is not None:  # early-exit adapter weights, float32
        tensors.update({f"exit.{k}": v.detach().float().cpu().numpy() for k, v in exit_head.state_dict().items()})
    bar.update(1)
    bar.set_postfix_str("graph")
    proto = build_decoder_graph(
        cfg,
        tensors,
        ctx_len=ctx_len,
        batch_size=batch_size,
        num_logits=num_logits,
        float_dtype=spec.float_dtype,
        progress=bar.update,
        hidden_output=hidden_output,
        matmul_nbits=spec.accuracy_level if spec.format.is_nbits else 0,
        tree=tree,
        mix_inputs=mix_inputs,
        stage=stage,
    )
    meta = {
        "accel.version": __version__,
        "accel.weights": spec.format.value,
        "accel.mx_format": used_format or "",
        "accel.float_weights": spec.float_dtype,
        "accel.ctx_len": str(ctx_len),
        "accel.batch_size": str(batch_size),
        "accel.num_logits": str(num_logits or 0),
        "accel.hidden_output": str(int(hidden_output or bool(cfg.feature_size))),
        "accel.tree": str(int(tree)),
        "accel.mix_inputs": str(int(mix_inputs)),
        "accel.model_config": json.dumps(cfg.to_hf()),
        **({} if stage.is_whole else stage.metadata()),
    }
    if spec.format == WeightFormat.INT8:
        bar.set_postfix_str("int8")
        proto = _quantize_int8(proto)
    onnx.helper.set_model_props(proto, meta)
    bar.set_postfix_str("write")
    _save_atomic(proto, path)
    bar.update(1)
    bar.close()
    return path


def _check_export(model: Decoder, ctx_len: int, batch_size: int, num_logits: int | None, opset: int) -> Any:
    """The model's config, after checking the export settings against it (BackendError naming the problem)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "num_kv_heads"):
        raise BackendError(f"export_onnx needs an accel.models.Decoder; got {type(model).__name__}")
    if opset != OPSET:
        raise BackendError(f"opset {opset} is not supported; supported: {OPSET}")
    check_sizes(ctx_len, batch_size)  # before the graph's tables are sized by them
    if num_logits is not None and (isinstance(num_logits, bool) or not isinstance(num_logits, int)):
        raise BackendError(f"num_logits must be an int >= 1; got {num_logits!r}")
    if num_logits is not None and not 1 <= num_logits <= ctx_len:
        raise BackendError(f"num_logits={num_logits} must be in 1..ctx_len ({ctx_len})")
    window = (cfg.extra or {}).get("sliding_window")
    if window and ctx_len > window:  # the decoders attend to the whole cache; exact only within the window
        raise BackendError(f"ctx_len {ctx_len} exceeds the model's sliding_window {window} (full attention only)")
    if cfg.positions == "learned" and ctx_len > cfg.max_position_embeddings:
        raise BackendError(f"ctx_len {ctx_len} exceeds the model's {cfg.max_position_embeddings} learned positions")
    return cfg


def _check_stage(cfg: Any, stage: StageSpec | None, exit_head: Any, tree: bool) -> StageSpec:
    """The stage to export (the whole model by default), checked against the model and the exit head."""
    stage = stage or StageSpec.whole(cfg.num_layers)
    if not isinstance(stage, StageSpec) or stage.total != cfg.num_layers:
        raise BackendError(f"stage must be a StageSpec of this model's {cfg.num_layers} layers; got {stage!r}")
    if exit_head is not None and not stage.exit_logits:
        raise BackendError("exit_head given for a stage without exit_logits")
    if stage.exit_logits and cfg.feature_size:
        raise BackendError("a feature draft cannot be exported as an exit stage")
    if tree and not stage.is_whole:
        raise BackendError("tree inputs are for whole-model graphs; a pipeline stage has none (export without tree)")
    return stage


def _quantize_int8(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with onnxruntime's dynamic int8 quantization of its weight MatMuls (``fc`` and the exact rope rotation
    excluded)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weights = {t.name for t in proto.graph.initializer}
    keep = [
        n.name
        for n in proto.graph.node
        if n.op_type == "MatMul" and (n.input[1] not in weights or n.input[1] in ("fc.weight", "rope_half_turn"))
    ]
    if sum(t.ByteSize() for t in proto.graph.initializer) > _EXTERNAL_DATA_BYTES:
        raise BackendError("weights='int8' quantizes an inline float graph: this model's weights exceed 1.8 GB")
    with tempfile.TemporaryDirectory(prefix="accel-int8-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(proto, src)
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)  # the tool's root-logger advice to pre-process (shape inference) is noise here
        try:
            quantize_dynamic(
                src,
                dst,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                nodes_to_exclude=keep,
            )
        finally:
            logging.disable(previous)
        out = onnx.load_model(dst)
    out.ir_version = min(out.ir_version, IR_VERSION)
    return out


def _save_atomic(proto: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    big = sum(len(t.raw_data) for t in proto.graph.initializer) > _EXTERNAL_DATA_BYTES
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if big:  # the data file is written first under its final name; the .onnx appears only when complete
            onnx.save_model(
                proto,
                tmp,
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=f"{path.name}.data",
                size_threshold=1024,
            )
            onnx.checker.check_model(tmp)
        else:
            onnx.checker.check_model(proto)
            onnx.save_model(proto, tmp)
        if proto.ir_version > IR_VERSION:
            raise BackendError(f"IR version {proto.ir_version} > {IR_VERSION}: stock onnxruntime would reject it")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def export_cached(
    src: str | Path,
    onnx_dir: str | Path,
    *,
    name: str | None = None,
    ctx_len: int,
    weights: ExportWeights | WeightFormat | str = "fp32",
    model: Decoder | None = None,
    say=None,
    hidden_output: bool = False,
    tree: bool = False,
    mix_inputs: bool = False,
) -> Path:
    """The ONNX file of checkpoint directory ``src`` in ``onnx_dir``, exported once per (checkpoint files' names,
    sizes and mtimes, ``ctx_len`` in tokens, ``weights`` mode, accel version, the exporter's source) and reused
    afterwards (batch 1).

    ``model``: the already-loaded (possibly compressed) model of ``src`` to export; loaded with ``accel.models.load``
    only when the file is not cached. ``say``: optional callable receiving one status line. ``hidden_output``,
    ``tree`` and ``mix_inputs``: as ``export_onnx`` (part of the cache key).
    """
    import hashlib

    from accel import __version__

    src = Path(src)
    if not src.is_dir():
        raise BackendError(f"{src} is not a checkpoint directory")
    key = hashlib.sha256()
    for f in sorted(src.iterdir()):
        if f.suffix in (".json", ".safetensors"):
            st = f.stat()
            key.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    spec = ExportWeights.of(weights)
    key.update(f"{ctx_len}:{spec}:{__version__}:{int(hidden_output)}{':tree' if tree else ''}".encode())
    if mix_inputs:
        key.update(b":mix")
    graph_code = ("onnx_graph.py", "onnx_weights.py", "onnx_builder.py", "weights.py")
    for module in (Path(__file__), *(Path(__file__).with_name(n) for n in graph_code)):  # the graph code itself
        key.update(module.read_bytes())
    path = Path(onnx_dir) / f"{name or src.name}-{key.hexdigest()[:12]}.onnx"
    if path.is_file():
        if say:
            say(f"ONNX {name or src.name}: cached {path}")
        return path
    if model is None:
        from accel.models import load_checkpoint

        model = load_checkpoint(src)
    path.parent.mkdir(parents=True, exist_ok=True)
    import time

    t0 = time.perf_counter()
    export_onnx(
        model,
        path,
        ctx_len=ctx_len,
        batch_size=1,
        weights=spec,
        progress=False,
        hidden_output=hidden_output,
        tree=tree,
        mix_inputs=mix_inputs,
    )
    if say:
        say(
            f"ONNX {name or src.name}: exported {path.name} ({path.stat().st_size / 1e6:.0f} MB, "
            f"weights {spec.format.value}, ctx {ctx_len}) in {time.perf_counter() - t0:.1f} s"
        )
    return path
