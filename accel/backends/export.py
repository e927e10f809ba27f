"""``export_onnx``: write a ``Decoder`` or a checkpoint file as an ONNX file with the KV-cache contract of
docs/reference.md §2.

The graph is built directly with ``onnx.helper`` (``accel.backends.onnx_graph``) rather than traced: one file takes a
dynamic number of new tokens S (prefill chunks, K+1 scoring, single draft steps), and MX weights can be stored packed
with an in-graph decode. The weight storage is an ``ExportWeights`` (``accel.backends.weights``: ``fp32``, ``fp16``,
``mx-rounded``, ``mx-packed``, ``int8`` for drafts, ``mxint8-nbits`` / ``mxfp6-nbits`` / ``mxfp4-nbits``, and the
``*-kernel`` forms of those three); which weights are MX: ``accel.backends.export_tensors``.

The export streams: tensors are read one at a time (from the model's parameters, or straight from a checkpoint
directory / GGUF file without building a torch model: ``accel.models.sources``), converted, and written to the
external-data file as the graph is built (``accel.backends.onnx_builder.ExternalData``), so peak memory is about one
tensor beyond what the source already holds, whatever the model's size.

A restricted head (``config.head_vocab > 0``) is exported as its ``[B, N, head_vocab]`` MatMul scattered into a
``MASKED_LOGIT``-filled ``[B, N, vocab]`` tensor, so the ``logits`` output keeps its name and shape.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from tqdm.auto import tqdm

from accel.backends.export_tensors import ExportLayout, ExportTensors, model_tensors
from accel.backends.limits import check_sizes
from accel.backends.onnx_builder import ExternalData
from accel.backends.onnx_graph import IR_VERSION, OPSET, build_decoder_graph
from accel.backends.stages import StageSpec
from accel.backends.weights import WEIGHT_MODES, ExportWeights, WeightFormat
from accel.errors import BackendError

if TYPE_CHECKING:  # a checkpoint path is exported without torch; only a loaded Decoder brings it
    import torch

    from accel.models.decoder import Decoder

__all__ = [
    "WEIGHT_MODES",
    "ExportWeights",
    "WeightFormat",
    "export_cached",
    "export_onnx",
    "model_tensors",
    "onnx_file_bytes",
]
#: weights above this many bytes (estimated as float32) go to external data by default; below it the file is one
#: self-contained protobuf, which is serialized in memory (about twice its size at the peak) and limited to 2 GiB
_EXTERNAL_DATA_BYTES = 64 * 1024 * 1024


def _resolve(model: Decoder | str | os.PathLike) -> tuple[ExportLayout, Mapping[str, np.ndarray] | None]:
    """The model's structure and, for a checkpoint path, its lazily read tensors (the structure then comes from the
    config alone: no torch, no weights allocated)."""
    if not isinstance(model, (str, os.PathLike)):
        if getattr(model, "config", None) is None or not hasattr(model, "named_modules"):
            raise BackendError(f"export_onnx needs an accel.models.Decoder; got {type(model).__name__}")
        return ExportLayout.of_model(model), None
    from accel.models.sources import checkpoint_mx, open_checkpoint

    config, tensors = open_checkpoint(model)
    layout = ExportLayout.of_config(config)
    mx = checkpoint_mx(model)  # an accel-compressed directory: its MX weights are kept exactly, as a loaded model's
    return (dataclasses.replace(layout, mx=mx) if mx else layout), tensors


def export_onnx(
    model: Decoder | str | os.PathLike,
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
    external_data: bool | None = None,
    stage: StageSpec | None = None,
    exit_head: torch.nn.Module | None = None,
    ort_ops: bool | None = None,
) -> Path:
    """Export ``model`` to ONNX at ``path``; returns the path.

    Args:
        model: an ``accel.models.Decoder`` (possibly MX-compressed), or a checkpoint directory / ``.gguf`` file, read
            tensor by tensor without building a torch model (the way to export models near the machine's memory).
        ctx_len: KV-cache length in tokens (fixed in the graph).
        batch_size: rows per call (fixed in the graph).
        num_logits: if given, the graph returns logits for the last ``num_logits`` positions only (the Cloud AI 100
            decode specialization); default: all ``seq_len`` positions (OrtBackend slices).
        weights: the weight storage: an ``ExportWeights`` (format, MX element format, float storage) or a
            ``WeightFormat`` / its name (``fp32``, ``fp16``, ``mx-rounded``, ``mx-packed``, ``int8``,
            ``mxint8-nbits``, ``mxfp6-nbits``, ``mxfp4-nbits``, ``mxint8-kernel``, ``mxfp6-kernel``,
            ``mxfp4-kernel``; MX modes then use ``mxfp6`` and float32 for the rest).
        opset: ONNX opset; only 18 is supported (IR version 8, loadable by stock onnxruntime).
        progress: show a tqdm bar (one step per layer).
        hidden_output: add the output ``hidden_states`` (final-norm hidden state of every column, ``[B, S, hidden]``):
            what a feature draft reads from its target. A feature draft (``config.feature_size > 0``) always has it,
            and its input ``features``.
        tree: add the tree inputs ``slot_ids`` ``[B, S]`` and ``tree_mask`` ``[B, S, ctx_len]`` (token-tree calls
            for speculative decoding; docs/backends.md, "Tree calls"). ``OrtBackend`` feeds chain calls to such a
            graph with the equivalent inputs.
        mix_inputs: add the inputs ``mix_ids`` / ``mix_weights`` (superposed inputs: the ``"mix"`` extension of
            ``accel.backends.base``, used by ``accel.superposed``).
        external_data: store the weights in ``<path>.data`` next to the file (written while the graph is built;
            tensors under 1 KiB stay inline). Default: when the model's float32 weights exceed 64 MiB.
        stage: export only layers ``[stage.start, stage.stop)`` as a pipeline stage (``accel.backends.stages``):
            hidden-state input/output instead of tokens/logits where the stage begins/ends inside the model, its own
            layers' cache, the layer range in the metadata (``accel.layers``).
        exit_head: the early-exit head of a ``stage`` with ``exit_logits`` (``accel.drafts.early_exit.ExitHead``: its
            weights go into the graph as ``exit.*``); None: the target's final norm and LM head on the stage's output.
        ort_ops: write RMSNorm + residual add and RoPE as onnxruntime's fused CPU operators
            (``com.microsoft.SkipSimplifiedLayerNormalization``, ``RotaryEmbedding``: 5 nodes less per layer,
            docs/backends.md "The graph of a layer"); False: standard ONNX only, what Cloud AI 100 and other runtimes
            read. Default: True for the onnxruntime-only formats (``int8``, ``*-nbits``, ``*-kernel``), False for
            the others.

    Files are written under temporary names and renamed (the data file first, the ``.onnx`` last, after
    ``onnx.checker``), with mode 0644. Settings are recorded in ``metadata_props`` (``accel.*`` keys).
    """
    opts = _ExportOptions(ctx_len, batch_size, num_logits, opset, progress, hidden_output, tree, mix_inputs, ort_ops)
    return _export(model, path, weights, opts, external_data, stage, exit_head)


@dataclasses.dataclass(frozen=True)
class _ExportOptions:
    """The graph settings of one ``export_onnx`` call, as given (see its docstring)."""

    ctx_len: int
    batch_size: int
    num_logits: int | None
    opset: int
    progress: bool
    hidden_output: bool
    tree: bool
    mix_inputs: bool
    ort_ops: bool | None


def _export(
    model: Decoder | str | os.PathLike,
    path: str | Path,
    weights: ExportWeights | WeightFormat | str,
    opts: _ExportOptions,
    external_data: bool | None,
    stage: StageSpec | None,
    exit_head: torch.nn.Module | None,
) -> Path:
    """``export_onnx``: check the settings, build the graph and write its files; returns the path."""
    spec = ExportWeights.of(weights)
    structure, source = _resolve(model)
    cfg = _check_export(structure, opts.ctx_len, opts.batch_size, opts.num_logits, opts.opset)
    path = Path(path)
    if path.is_dir():
        raise BackendError(f"{path} is a directory: give the path of the .onnx file to write")
    tensors, used_format = model_tensors(structure, spec, source)
    if external_data is None:
        external_data = _num_elements(structure, source) * 4 > _EXTERNAL_DATA_BYTES
    bar = tqdm(total=cfg.num_layers + 2, desc=f"export {path.name}", unit="step", disable=not opts.progress)
    stage = _check_stage(cfg, stage, exit_head, opts.tree)
    if exit_head is not None:  # early-exit adapter weights, float32
        tensors = tensors.with_extra(
            {f"exit.{k}": v.detach().float().cpu().numpy() for k, v in exit_head.state_dict().items()}
        )
    fused = _ort_only(spec) if opts.ort_ops is None else bool(opts.ort_ops)
    with _Output(path, external_data) as out:
        bar.set_postfix_str("graph")
        proto = _build_graph(cfg, tensors, spec, opts, stage, fused, out.external, bar.update)
        bar.update(1)
        flags = {
            "hidden_output": opts.hidden_output or bool(cfg.feature_size),
            "tree": opts.tree,
            "mix_inputs": opts.mix_inputs,
        }
        flags["ort_ops"] = fused
        meta = _metadata(cfg, spec, used_format, opts.ctx_len, opts.batch_size, opts.num_logits, flags)
        onnx.helper.set_model_props(proto, {**meta, **({} if stage.is_whole else stage.metadata())})
        bar.set_postfix_str("write")
        out.save(proto)
        bar.update(1)
    bar.close()
    return path


def _build_graph(
    cfg: Any,
    tensors: ExportTensors,
    spec: ExportWeights,
    opts: _ExportOptions,
    stage: StageSpec,
    fused: bool,
    external: ExternalData | None,
    progress: Callable[[int], None],
) -> onnx.ModelProto:
    """The decoder graph of an export (``build_decoder_graph`` with the weight storage's settings)."""
    return build_decoder_graph(
        cfg,
        tensors,
        ctx_len=opts.ctx_len,
        batch_size=opts.batch_size,
        num_logits=opts.num_logits,
        float_dtype=spec.float_dtype,
        progress=progress,
        hidden_output=opts.hidden_output,
        matmul_nbits=spec.accuracy_level if spec.format.is_nbits else 0,
        mx_kernel=spec.format.kernel_act_bits,
        tree=opts.tree,
        mix_inputs=opts.mix_inputs,
        stage=stage,
        int8=spec.int8_scheme if spec.format == WeightFormat.INT8 else None,
        external=external,
        fused=fused,
    )


def _ort_only(spec: ExportWeights) -> bool:
    """Whether the weight format needs onnxruntime anyway (contrib, custom or dynamic-quantization operators)."""
    return spec.format.runs_codes or spec.format == WeightFormat.INT8


def _num_elements(layout: ExportLayout, source: Any) -> int:
    """Elements of the model's weights (a tied head once)."""
    if source is not None:
        return int(source.num_elements())
    return sum(int(np.prod(p.shape)) for p in layout.model.parameters())


def _metadata(
    cfg: Any,
    spec: ExportWeights,
    used_format: str | None,
    ctx_len: int,
    batch_size: int,
    num_logits: int | None,
    flags: dict[str, bool],
) -> dict[str, str]:
    """The ``accel.*`` metadata of an export; ``flags``: ``hidden_output``, ``tree``, ``mix_inputs``."""
    from accel import __version__

    return {
        "accel.version": __version__,
        "accel.weights": spec.format.value,
        "accel.mx_format": used_format or "",
        "accel.float_weights": spec.float_dtype,
        "accel.ctx_len": str(ctx_len),
        "accel.batch_size": str(batch_size),
        "accel.num_logits": str(num_logits or 0),
        **{f"accel.{key}": str(int(value)) for key, value in flags.items()},
        "accel.model_config": json.dumps(cfg.to_hf()),
        **({"accel.int8": spec.int8_scheme} if spec.format == WeightFormat.INT8 else {}),
        # Linear activations quantized to int8 per block: OrtBackend then refuses token trees (docs/spd.md)
        "accel.int8_activations": str(int(spec.format.int8_activations and spec.accuracy_level == 4)),
        "accel.attention_rows": "grouped",  # the G query heads of a KV head as G * S rows (OrtBackend.min_rows)
    }


def _quantize_int8(proto: onnx.ModelProto, scheme: str = "u8u8") -> onnx.ModelProto:
    """``proto`` (an in-memory graph under 2 GB, e.g. a Hydra head) with onnxruntime's dynamic int8 quantization of
    its weight MatMuls (``fc`` and the exact rope rotation excluded), stored as ``scheme``
    (``accel.backends.onnx_int8``: ``u8u8`` the codes as uint8 + 128, ``u8s7`` onnxruntime's ``reduce_range``,
    ``u8s8`` as the tool writes them).
    ``export_onnx`` writes int8 decoders itself (``accel.backends.onnx_int8``) without this whole-graph pass."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from accel.backends.onnx_int8 import INT8_SCHEMES, to_u8u8

    if scheme not in INT8_SCHEMES:
        raise BackendError(f"int8 scheme {scheme!r} is not supported; supported: {', '.join(INT8_SCHEMES)}")
    weights = {t.name for t in proto.graph.initializer}
    keep = [
        n.name
        for n in proto.graph.node
        if n.op_type == "MatMul" and (n.input[1] not in weights or n.input[1] in ("fc.weight", "rope_half_turn"))
    ]
    if sum(t.ByteSize() for t in proto.graph.initializer) > 1_800_000_000:  # protobuf's 2 GiB limit, with margin
        raise BackendError("_quantize_int8 quantizes an inline float graph: this graph's weights exceed 1.8 GB")
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
                reduce_range=scheme == "u8s7",
            )
        finally:
            logging.disable(previous)
        out = onnx.load_model(dst)
    out.ir_version = min(out.ir_version, IR_VERSION)
    return to_u8u8(out) if scheme == "u8u8" else out


def _check_export(model: ExportLayout, ctx_len: int, batch_size: int, num_logits: int | None, opset: int) -> Any:
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


class _Output:
    """The files of one export: ``<path>.data`` (external data, written while the graph is built) and ``<path>``.

    Both are written under temporary names in the target directory: the data file is renamed first, then the
    ``.onnx`` is saved, checked with ``onnx.checker`` and renamed, so ``<path>`` appears only when complete. On an
    error every temporary file is removed.
    """

    def __init__(self, path: Path, external: bool) -> None:
        self.path, self.data_path = path, path.with_name(path.name + ".data")
        self.use_external = external
        self.external: ExternalData | None = None
        self._tmps: list[str] = []

    def __enter__(self) -> _Output:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.use_external:
            tmp = self._tmp(self.data_path)
            self._file = open(tmp, "wb")  # closed in save() or __exit__
            self.external = ExternalData(self._file, self.data_path.name)
        return self

    def _tmp(self, target: Path) -> str:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        self._tmps.append(tmp)
        return tmp

    def save(self, proto: onnx.ModelProto) -> None:
        if proto.ir_version > IR_VERSION:
            raise BackendError(f"IR version {proto.ir_version} > {IR_VERSION}: stock onnxruntime would reject it")
        if self.external is not None:
            self._file.close()
            os.replace(self._tmps[0], self.data_path)  # the .onnx that refers to it appears only after the check
        elif self.data_path.exists():
            self.data_path.unlink()  # a stale data file of an earlier export to this path
        tmp = self._tmp(self.path)
        onnx.save_model(proto, tmp)
        onnx.checker.check_model(tmp)
        os.replace(tmp, self.path)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.external is not None and not self._file.closed:
            self._file.close()
        for tmp in self._tmps:
            if os.path.exists(tmp):
                os.unlink(tmp)


def onnx_file_bytes(path: str | Path) -> int:
    """Size of an exported model in bytes: the ``.onnx`` file plus its external data (``<path>.data``) if any."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


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
    progress: bool = False,
) -> Path:
    """The ONNX file of checkpoint ``src`` (a directory or a ``.gguf`` file) in ``onnx_dir``, exported once per
    (checkpoint files' names, sizes and mtimes, ``ctx_len`` in tokens, ``weights`` mode, accel version, the
    exporter's source) and reused afterwards (batch 1).

    ``model``: the already-loaded (possibly compressed) model of ``src`` to export; without it the checkpoint is
    streamed from its files (``export_onnx`` of the path) when the file is not cached. ``say``: optional callable
    receiving one status line. ``hidden_output``, ``tree`` and ``mix_inputs``: as ``export_onnx`` (part of the cache
    key). ``progress``: show the export's progress bar.
    """
    src = Path(src)
    digest, spec = _cache_key(_checkpoint_files(src), ctx_len, weights, hidden_output, tree, mix_inputs)
    label = name or (src.stem if src.is_file() else src.name)
    path = Path(onnx_dir) / f"{label}-{digest[:12]}.onnx"
    if path.is_file():
        if say:
            say(f"ONNX {label}: cached {path}")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    import time

    if say:
        say(f"ONNX {label}: exporting {src.name} (weights {spec.format.value}, ctx {ctx_len}), once")
    t0 = time.perf_counter()
    export_onnx(
        src if model is None else model,
        path,
        ctx_len=ctx_len,
        batch_size=1,
        weights=spec,
        progress=progress,
        hidden_output=hidden_output,
        tree=tree,
        mix_inputs=mix_inputs,
    )
    if say:
        say(
            f"ONNX {label}: exported {path.name} ({onnx_file_bytes(path) / 1e6:.0f} MB, "
            f"weights {spec.format.value}, ctx {ctx_len}) in {time.perf_counter() - t0:.1f} s"
        )
    return path


def _checkpoint_files(src: Path) -> list[Path]:
    """The files of checkpoint ``src`` that key its cached export (a directory's configs and weights, or the GGUF)."""
    if src.is_dir():
        return [f for f in sorted(src.iterdir()) if f.suffix in (".json", ".safetensors", ".bin")]
    if src.is_file() and src.suffix == ".gguf":
        return [src]
    raise BackendError(f"{src} is neither a checkpoint directory nor a .gguf file")


def _cache_key(
    files: list[Path],
    ctx_len: int,
    weights: ExportWeights | WeightFormat | str,
    hidden_output: bool,
    tree: bool,
    mix_inputs: bool,
) -> tuple[str, ExportWeights]:
    """The hex SHA-256 key of an ``export_cached`` call (see its docstring) and its resolved weight storage."""
    import hashlib

    from accel import __version__

    key = hashlib.sha256()
    for f in files:
        st = f.stat()
        key.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    spec = ExportWeights.of(weights)
    key.update(f"{ctx_len}:{spec}:{__version__}:{int(hidden_output)}{':tree' if tree else ''}".encode())
    if mix_inputs:
        key.update(b":mix")
    graph_code = ("onnx_graph.py", "onnx_weights.py", "onnx_builder.py", "onnx_int8.py", "weights.py")
    for module in (Path(__file__), *(Path(__file__).with_name(n) for n in graph_code)):  # the graph code itself
        key.update(module.read_bytes())
    return key.hexdigest(), spec
