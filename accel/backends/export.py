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
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from tqdm.auto import tqdm

from accel import __version__
from accel._io import check_output_path
from accel.backends.export_tensors import ExportLayout, model_tensors
from accel.backends.graph_spec import GraphOptions, GraphSpec, element_name
from accel.backends.onnx_builder import ExternalData
from accel.backends.onnx_graph import IR_VERSION, build_decoder_graph
from accel.backends.onnx_int8 import INT8_SCHEMES, to_u8u8
from accel.backends.stages import StageSpec
from accel.backends.weights import WEIGHT_MODES, ExportWeights, WeightFormat
from accel.errors import BackendError
from accel.models.gguf_loader import open_gguf
from accel.models.sources import checkpoint_mx, open_checkpoint

if TYPE_CHECKING:  # a checkpoint path is exported without torch; only a loaded Decoder brings it
    import torch
    from typing_extensions import Unpack

    from accel.models.decoder import Decoder

__all__ = [
    "WEIGHT_MODES",
    "ExportWeights",
    "GraphOptions",
    "GraphSpec",
    "WeightFormat",
    "checkpoint_files",
    "export_cached",
    "export_onnx",
    "model_tensors",
    "onnx_file_bytes",
]
#: weights above this many bytes (estimated as float32) go to external data by default; below it the file is one
#: self-contained protobuf, which is serialized in memory (about twice its size at the peak) and limited to 2 GiB
_EXTERNAL_DATA_BYTES = 64 * 1024 * 1024


def _resolve(
    model: Decoder | str | os.PathLike, blocks: bool = False
) -> tuple[ExportLayout, Mapping[str, np.ndarray] | None]:
    """The model's structure and, for a checkpoint path, its lazily read tensors (the structure then comes from the
    config alone: no torch, no weights allocated). ``blocks``: a ``.gguf`` file's Q8_0/Q4_0/Q4_1 (and,
    repacked, K-quant and Q5) Linear weights as ``GGMLTensor`` blocks (``weights="gguf-kernel"``), not dequantized."""
    if not isinstance(model, (str, os.PathLike)):
        if getattr(model, "config", None) is None or not hasattr(model, "named_modules"):
            raise BackendError(f"export_onnx needs an accel.models.Decoder; got {type(model).__name__}")
        return ExportLayout.of_model(model), None
    if blocks:
        if not (Path(model).is_file() and Path(model).suffix == ".gguf"):
            raise BackendError(f"weights gguf-kernel(-q8) runs a .gguf file's own blocks; {model} is not a .gguf file")
        config, tensors = open_gguf(Path(model), blocks=True)
    else:
        config, tensors = open_checkpoint(model)
    layout = ExportLayout.of_config(config)
    mx = checkpoint_mx(model)  # an accel-compressed directory: its MX weights are kept exactly, as a loaded model's
    return (dataclasses.replace(layout, mx=mx) if mx else layout), tensors


def export_onnx(
    model: Decoder | str | os.PathLike,
    path: str | Path,
    spec: GraphSpec | None = None,
    *,
    progress: bool = True,
    external_data: bool | None = None,
    exit_head: torch.nn.Module | None = None,
    **options: Unpack[GraphOptions],
) -> Path:
    """Export ``model`` to ONNX at ``path`` as the graph ``spec`` describes; returns the path.

    Args:
        model: an ``accel.models.Decoder`` (possibly MX-compressed), or a checkpoint directory / ``.gguf`` file, read
            tensor by tensor without building a torch model (the way to export models near the machine's memory).
        spec: the graph (``accel.backends.graph_spec.GraphSpec``: sizes, weights, optional inputs and outputs);
            or give its fields as keywords (``options``, below), which make one.
        progress: show a tqdm bar (one step per layer).
        external_data: store the weights in ``<path>.data`` next to the file (written while the graph is built;
            tensors under 1 KiB stay inline). Default: when the model's float32 weights exceed 64 MiB.
        exit_head: the early-exit head of a ``stage`` with ``exit_logits`` (``accel.drafts.early_exit.ExitHead``: its
            weights go into the graph as ``exit.*``); None: the target's final norm and LM head on the stage's output.
        options: ``GraphSpec``'s fields as keywords (``GraphOptions``; an unknown one is a BackendError naming it):
            ``ctx_len`` (KV-cache length in tokens), ``batch_size`` (rows per call), ``num_logits`` (the graph returns
            logits for the last ``num_logits`` positions only: the Cloud AI 100 decode specialization; default all
            ``seq_len`` positions, which OrtBackend slices), ``weights`` (the weight storage: an ``ExportWeights``, a
            ``WeightFormat`` or its name: ``fp32``, ``fp16``, ``mx-rounded``, ``mx-packed``, ``int8``,
            ``mxint8-nbits``, ``mxfp6-nbits``, ``mxfp4-nbits``, ``mxint8-kernel``, ``mxfp6-kernel``,
            ``mxfp4-kernel``, ``mxfp6-kernel-q8``, ``mxfp4-kernel-q8``; or ``element`` / ``runtime`` /
            ``activations`` / ``float_storage`` / ``int8_scheme``), ``hidden_output`` (the output ``hidden_states``
            ``[B, S, hidden]``, what a feature draft reads from its target; a feature draft,
            ``config.feature_size > 0``, always has it, and its input ``features``), ``tree`` (the inputs
            ``slot_ids`` ``[B, S]`` and ``tree_mask`` ``[B, S, ctx_len]``: docs/backends.md, "Tree calls"),
            ``mix_inputs`` (the inputs ``mix_ids`` / ``mix_weights``: the ``"mix"`` extension of
            ``accel.backends.base``), ``stage`` (only layers ``[stage.start, stage.stop)`` as a pipeline stage,
            ``accel.backends.stages``), ``ort_ops`` (onnxruntime's fused RMSNorm + residual add and RoPE operators,
            docs/backends.md "The graph of a layer"; False: standard ONNX only, what Cloud AI 100 reads; default:
            on for ``int8``, ``*-nbits``, ``*-kernel``), ``opset`` (only 18).

    Files are written under temporary names and renamed (the data file first, the ``.onnx`` last, after
    ``onnx.checker``), with mode 0644. The graph's spec is recorded in ``metadata_props`` (``accel.graph_spec``,
    beside the older ``accel.*`` keys).
    """
    return _export(model, path, GraphSpec.of(spec, options), progress, external_data, exit_head)


def _export(
    model: Decoder | str | os.PathLike,
    path: str | Path,
    spec: GraphSpec,
    progress: bool,
    external_data: bool | None,
    exit_head: torch.nn.Module | None,
) -> Path:
    """``export_onnx``: check the settings, build the graph and write its files; returns the path."""
    structure, source = _resolve(model, blocks=spec.element == "gguf")
    cfg = _check_export(structure, spec)
    path = Path(path)
    if path.is_dir():
        raise BackendError(f"{path} is a directory: give the path of the .onnx file to write")
    path = check_output_path(path, "the ONNX graph", BackendError)
    tensors, used_format = model_tensors(structure, spec.export_weights, source)
    if external_data is None:
        external_data = _num_elements(structure, source) * 4 > _EXTERNAL_DATA_BYTES
    bar = tqdm(total=cfg.num_layers + 2, desc=f"export {path.name}", unit="step", disable=not progress)
    _check_stage(cfg, spec, exit_head)
    if exit_head is not None:  # early-exit adapter weights, float32
        tensors = tensors.with_extra(
            {f"exit.{k}": v.detach().float().cpu().numpy() for k, v in exit_head.state_dict().items()}
        )
    with _Output(path, external_data) as out:
        bar.set_postfix_str("graph")
        proto = build_decoder_graph(cfg, tensors, spec, progress=bar.update, external=out.external)
        bar.update(1)
        onnx.helper.set_model_props(proto, _metadata(cfg, _as_built(spec, cfg, used_format), used_format))
        bar.set_postfix_str("write")
        out.save(proto)
        bar.update(1)
    bar.close()
    return path


def _as_built(spec: GraphSpec, cfg: Any, used_format: str | None) -> GraphSpec:
    """``spec`` as the exported graph is: a feature draft's hidden output on, and the element of a compressed
    model's MX weights where ``rounded`` / ``packed`` keep its one format (not the requested one)."""
    changes: dict[str, Any] = {"hidden_output": spec.hidden_output or bool(cfg.feature_size)}
    if spec.runtime in ("rounded", "packed") and used_format and "," not in used_format:
        changes["element"] = element_name(used_format)
    return dataclasses.replace(spec, **changes)


def _num_elements(layout: ExportLayout, source: Any) -> int:
    """Elements of the model's weights (a tied head once)."""
    if source is not None:
        return int(source.num_elements())
    return sum(int(np.prod(p.shape)) for p in layout.model.parameters())


def _metadata(cfg: Any, spec: GraphSpec, used_format: str | None) -> dict[str, str]:
    """The ``accel.*`` metadata of an export: the graph's spec (``GraphSpec.metadata``: ``accel.graph_spec`` and the
    keys derived from it) and what the model adds (its config, the MX formats used, the accel version)."""
    return {
        "accel.version": __version__,
        "accel.mx_format": used_format or "",
        "accel.model_config": json.dumps(cfg.to_hf()),
        # the G query heads of a KV head as G * S rows (OrtBackend.min_rows)
        "accel.attention_rows": "grouped",
        **spec.metadata(),
    }


def _quantize_int8(proto: onnx.ModelProto, scheme: str = "u8u8") -> onnx.ModelProto:
    """``proto`` (an in-memory graph under 2 GB, e.g. a Hydra head) with onnxruntime's dynamic int8 quantization of
    its weight MatMuls (``fc`` and the exact rope rotation excluded), stored as ``scheme``
    (``accel.backends.onnx_int8``: ``u8u8`` the codes as uint8 + 128, ``u8s7`` onnxruntime's ``reduce_range``,
    ``u8s8`` as the tool writes them).
    ``export_onnx`` writes int8 decoders itself (``accel.backends.onnx_int8``) without this whole-graph pass."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

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


def _check_export(model: ExportLayout, spec: GraphSpec) -> Any:
    """The model's config, after checking the spec against it (BackendError naming the problem; the spec checked
    itself when it was made)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "num_kv_heads"):
        raise BackendError(f"export_onnx needs an accel.models.Decoder; got {type(model).__name__}")
    ctx_len = spec.ctx_len
    window = (cfg.extra or {}).get("sliding_window")
    if window and ctx_len > window:  # the decoders attend to the whole cache; exact only within the window
        raise BackendError(f"ctx_len {ctx_len} exceeds the model's sliding_window {window} (full attention only)")
    if cfg.positions == "learned" and ctx_len > cfg.max_position_embeddings:
        raise BackendError(f"ctx_len {ctx_len} exceeds the model's {cfg.max_position_embeddings} learned positions")
    return cfg


def _check_stage(cfg: Any, spec: GraphSpec, exit_head: Any) -> None:
    """Check the spec's stage (the whole model by default) against the model and the exit head."""
    stage = spec.stage or StageSpec.whole(cfg.num_layers)
    if stage.total != cfg.num_layers:
        raise BackendError(f"stage must be a StageSpec of this model's {cfg.num_layers} layers; got {stage!r}")
    if exit_head is not None and not stage.exit_logits:
        raise BackendError("exit_head given for a stage without exit_logits")
    if stage.exit_logits and cfg.feature_size:
        raise BackendError("a feature draft cannot be exported as an exit stage")


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
    spec: GraphSpec | None = None,
    *,
    name: str | None = None,
    model: Decoder | None = None,
    say: Callable[[str], object] | None = None,
    progress: bool = False,
    **options: Unpack[GraphOptions],
) -> Path:
    """The ONNX file of checkpoint ``src`` (a directory or a ``.gguf`` file) in ``onnx_dir``, exported once per
    ``GraphSpec.cache_key``: the graph ``spec`` (or its fields as keywords, as ``export_onnx`` takes them; batch 1 by
    default), the checkpoint files' names, sizes and mtimes, the accel version and the exporter's source; reused
    afterwards.

    ``model``: the already-loaded (possibly compressed) model of ``src`` to export; without it the checkpoint is
    streamed from its files (``export_onnx`` of the path) when the file is not cached. ``name``: the file's label
    (default: the checkpoint's name). ``say``: optional callable receiving one status line. ``progress``: show the
    export's progress bar.
    """
    src = Path(src)
    spec = GraphSpec.of(spec, options, "export_cached")
    digest = spec.cache_key(checkpoint_files(src))
    label = name or (src.stem if src.is_file() else src.name)
    path = Path(onnx_dir) / f"{label}-{digest[:12]}.onnx"
    if path.is_file():
        if say:
            say(f"ONNX {label}: cached {path}")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    what = f"weights {spec.weight_format.value}, ctx {spec.ctx_len}"
    if say:
        say(f"ONNX {label}: exporting {src.name} ({what}), once")
    t0 = time.perf_counter()
    export_onnx(src if model is None else model, path, spec, progress=progress)
    if say:
        mb = onnx_file_bytes(path) / 1e6
        say(f"ONNX {label}: exported {path.name} ({mb:.0f} MB, {what}) in {time.perf_counter() - t0:.1f} s")
    return path


def checkpoint_files(src: Path) -> list[Path]:
    """The files of checkpoint ``src`` that key its cached export (``export_cached``): a directory's configs and
    weights (``.json``, ``.safetensors``, ``.bin``, sorted by name), or the ``.gguf`` file itself. ``BackendError``
    for anything else."""
    if src.is_dir():
        return [f for f in sorted(src.iterdir()) if f.suffix in (".json", ".safetensors", ".bin")]
    if src.is_file() and src.suffix == ".gguf":
        return [src]
    raise BackendError(f"{src} is neither a checkpoint directory nor a .gguf file")
