"""Streaming compression of a Hugging Face checkpoint directory, tensor by tensor, without loading the model.

Each ``*.safetensors`` shard is memory-mapped (``file.SafetensorsFile``); each tensor is read, compressed or copied,
and written to its place in the output shard, so peak memory is about one tensor (plus its float32 copy and the
quantizer's temporaries). Output shards keep their names; ``model.safetensors.index.json`` is rewritten to point the
``.mx_codes`` / ``.mx_scales`` names at their shards; config, tokenizer and other small files are copied.

The output folder is built beside its target and renamed into place when complete (``accel.formats.staging``): a
failure leaves nothing, an interruption leaves a marked partial folder that ``resume=True`` finishes. Weights
holding NaN/Inf follow the non-finite policy of ``accel.formats.report`` (an error by default).
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from accel._io import writing
from accel._legacy import Replaced, legacy_keywords
from accel.errors import FormatError
from accel.formats.constants import DEFAULT_BLOCK_SIZE
from accel.formats.elements import get_format
from accel.formats.file import SafetensorsFile, TensorSpec, bf16_to_f32
from accel.formats.mx_tensor import MXTensor, check_block_size, quantize
from accel.formats.packing import packed_nbytes
from accel.formats.report import (
    CompressionReport,
    LayerReport,
    check_nonfinite,
    check_policy,
    count_nonfinite,
    layer_report,
)
from accel.formats.staging import (
    PartialState,
    check_output,
    copy_atomic,
    drop_temp_files,
    finish,
    open_partial,
    partial_dir,
    remove_partial,
    source_stamp,
    write_marker,
    write_text_atomic,
)
from accel.formats.writer import SafetensorsWriter, make_parents, remove_empty_dirs

INDEX_NAME = "model.safetensors.index.json"
#: weights kept as they are unless ``exclude`` is given: embeddings, the LM head, norms
DEFAULT_EXCLUDE = ("*embed*", "*lm_head*", "*norm*", "*wte*", "*wpe*")
#: weight files of other formats that are never copied (and never unpickled)
SKIPPED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def should_compress(name: str, spec: TensorSpec, include: list[str], exclude: list[str]) -> bool:
    """A 2-D float ``*.weight`` that matches ``include`` and no ``exclude`` glob."""
    return (
        name.endswith(".weight")
        and len(spec.shape) == 2
        and spec.dtype in FLOAT_DTYPES
        and any(fnmatch.fnmatchcase(name, p) for p in include)
        and not any(fnmatch.fnmatchcase(name, p) for p in exclude)
    )


def _shards(src: Path) -> list[str]:
    index = src / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(f"{index}: not a valid safetensors index ({exc})") from exc
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise FormatError(f"{index}: weight_map must map tensor names to shard file names")
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if Path(shard).name != shard or shard in ("", ".", ".."):
                raise FormatError(f"{index}: shard {shard!r} is not a plain file name in the checkpoint directory")
            if not (src / shard).is_file():
                raise FormatError(f"{index}: shard {shard!r} listed in the index is missing")
        return shards
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    if not shards:
        raise FormatError(f"{src}: no *.safetensors files (and no {INDEX_NAME})")
    return shards


def _mx_shape_spec(name: str, shape: tuple[int, ...], bits: int, block_size: int) -> list[TensorSpec]:
    rows, cols = shape
    nblocks = -(-cols // block_size)
    return [
        TensorSpec(name + ".mx_codes", "U8", (packed_nbytes(rows * nblocks * block_size, bits),)),
        TensorSpec(name + ".mx_scales", "U8", (rows, nblocks)),
    ]


@dataclass(frozen=True)
class CompressSettings:
    """What ``compress_checkpoint`` writes: the MX element format ``fmt``, the tensors it compresses (``include`` /
    ``exclude``: globs over tensor names; default every 2-D float ``*.weight`` except ``DEFAULT_EXCLUDE``), the
    ``block_size`` and the non-finite policy ``nonfinite`` (``"error"`` or ``"keep"``, ``accel.formats.report``).
    Checked when used; a resumed run must have the same settings."""

    fmt: str = "mxfp6"
    include: Sequence[str] | None = None
    exclude: Sequence[str] | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    nonfinite: str = "error"


def compress_checkpoint(
    src_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    settings: CompressSettings | str | None = None,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    **legacy: Any,
) -> CompressionReport:
    """Compress the 2-D linear weights of a safetensors checkpoint directory to MX, writing ``out_dir``.

    ``settings``: a ``CompressSettings``, or just its format name (default ``CompressSettings()``: MXFP6). Weights
    are blocked along their last axis (in_features). ``out_dir`` appears only once complete; ``overwrite`` replaces
    an existing checkpoint there (and clears an unfinished run), ``resume`` finishes an interrupted run from its
    partial folder ``OUT.accel-partial``. Returns the CompressionReport. Deprecated: ``fmt=``, ``include=``,
    ``exclude=``, ``block_size=``, ``nonfinite=`` (use ``CompressSettings(...)``).
    """
    settings = _legacy_settings("compress_checkpoint", settings, legacy)
    checked = _settings(get_format(settings.fmt).name, settings)
    src, out = Path(src_dir), Path(out_dir)
    _check_source(src, out)
    check_output(out, overwrite)
    shards = _shards(src)
    files = [SafetensorsFile(src / s) for s in shards]  # validates every header before writing anything
    state = PartialState(settings=checked, sources={s: source_stamp(src / s) for s in shards})
    with writing(out, "the compressed checkpoint", FormatError):  # a refusal of the OS: one named line
        created = make_parents(partial_dir(out))
        try:
            staging, state = open_partial(out, state, resume, overwrite)
        except BaseException:
            remove_empty_dirs(created)
            raise
        try:
            report = _write_all(src, staging, shards, files, state, progress)
            finish(staging, out)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (accel.cli): keep the finished shards for --resume
            drop_temp_files(staging)  # a signal between a writer's mkstemp and its own cleanup would leave one
            raise
        except BaseException:
            remove_partial(staging)
            remove_empty_dirs(created)
            raise
    return report


def _legacy_settings(func: str, settings: CompressSettings | str | None, legacy: dict[str, Any]) -> CompressSettings:
    """``settings`` as a ``CompressSettings`` (a format name: ``CompressSettings(fmt=name)``), or built from the
    deprecated keywords ``legacy`` (``accel._legacy``: one ``DeprecationWarning`` naming them) and a format name
    given positionally. Unknown keywords, a ``CompressSettings`` with them, or ``fmt`` twice are a TypeError."""
    if legacy and isinstance(settings, str) and "fmt" in legacy:
        raise TypeError(f"{func}() got multiple values for the format: {settings!r} and fmt={legacy['fmt']!r}")
    name = {"fmt": settings} if isinstance(settings, str) and legacy else {}
    given = {"settings": settings if isinstance(settings, CompressSettings) else None}
    objects, _ = legacy_keywords(func, {**name, **legacy}, [_SETTINGS], given, keep=())
    if objects["settings"] is not None:
        return objects["settings"]
    return CompressSettings(fmt=settings) if isinstance(settings, str) else CompressSettings()


_SETTINGS = Replaced("settings", CompressSettings, {f.name: f.name for f in fields(CompressSettings)})


def _settings(fmt: str, settings: CompressSettings) -> dict[str, Any]:
    """The settings of a run, checked, as the partial folder's marker keeps them (a resumed run must match them)."""
    patterns = {}
    for what, value, default in (
        ("include", settings.include, ["*"]),
        ("exclude", settings.exclude, list(DEFAULT_EXCLUDE)),
    ):
        value = default if value is None or (what == "include" and not value) else value
        if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
            raise FormatError(f"{what} must be a list of glob patterns (str), got {value!r}")
        patterns[what] = list(value)
    return {
        "fmt": fmt,
        "block_size": check_block_size(settings.block_size),
        "nonfinite": check_policy(settings.nonfinite),
        **patterns,
    }


def _check_source(src: Path, out: Path) -> None:
    if not src.is_dir():
        raise FormatError(f"{src}: not a directory")
    if not (src / "config.json").is_file():
        raise FormatError(f"{src}: no config.json; expected a Hugging Face checkpoint directory")
    src_r, out_r = src.resolve(), out.resolve()
    if src_r == out_r or out_r in src_r.parents:
        raise FormatError(f"output directory {out} must differ from the source and not contain it")


def _write_all(
    src: Path, staging: Path, shards: list[str], files: list[SafetensorsFile], state: PartialState, progress: bool
) -> CompressionReport:
    """Write every shard not yet done, the index and the small files into ``staging``; returns the report."""
    settings = state.settings
    element = get_format(settings["fmt"])
    report = CompressionReport(fmt=element.name, block_size=settings["block_size"], nonfinite=settings["nonfinite"])
    weight_map: dict[str, str] = {}
    total = sum(len(f.entries) for f in files)
    with tqdm(total=total, desc=f"compress to {element.name}", unit="tensor", disable=not progress) as bar:
        for shard, f in zip(shards, files, strict=True):
            specs, mx_heads, plan = _shard_plan(f, settings)
            weight_map.update({s.name: shard for s in specs})
            if shard in state.done:
                SafetensorsFile(staging / shard)  # written by the interrupted run: its header must still be sound
                part = state.done[shard]
                bar.update(len(f.entries))
            else:
                part = _write_shard(f, staging / shard, specs, mx_heads, plan, settings, bar)
                state.done[shard] = part
                write_marker(staging, state)
            report.layers += [LayerReport.model_validate(x) for x in part["layers"]]
            report.skipped += part["skipped"]
    if (src / INDEX_NAME).is_file() or len(shards) > 1:
        index = {
            "metadata": {"format": "accel-mx", "fmt": element.name},
            "weight_map": dict(sorted(weight_map.items())),
        }
        write_text_atomic(staging / INDEX_NAME, json.dumps(index, indent=2))
    for p in sorted(src.iterdir()):
        if (
            p.is_file()
            and not p.name.endswith(".safetensors")
            and p.name != INDEX_NAME
            and not p.name.endswith(SKIPPED_SUFFIXES)
        ):
            copy_atomic(p, staging / p.name)
    return report


def _shard_plan(
    f: SafetensorsFile, settings: dict[str, Any]
) -> tuple[list[TensorSpec], dict[str, dict[str, Any]], dict[str, bool]]:
    """(stored tensors of the output shard, MX headers, tensor -> compressed?) of one source shard."""
    bits, block_size = get_format(settings["fmt"]).bits, settings["block_size"]
    plan = {n: should_compress(n, s, settings["include"], settings["exclude"]) for n, s in f.entries.items()}
    specs: list[TensorSpec] = []
    mx_heads: dict[str, dict[str, Any]] = {}
    for name, spec in f.entries.items():
        if plan[name]:
            specs += _mx_shape_spec(name, spec.shape, bits, block_size)
            mx_heads[name] = {"fmt": settings["fmt"], "shape": list(spec.shape), "axis": 1, "block_size": block_size}
        else:
            specs.append(spec)
    return specs, mx_heads, plan


def _write_shard(f, path: Path, specs, mx_heads, plan, settings: dict[str, Any], bar) -> dict[str, Any]:
    """Compress or copy every tensor of one source shard into ``path``; returns its part of the report."""
    layers: list[dict[str, Any]] = []
    skipped: list[str] = []
    with SafetensorsWriter(path, specs, {"format": "pt"}, mx_heads) as writer:
        for name in f.entries:
            f.verify(name)
            if plan[name]:
                mx, layer = _compress_one(f, name, settings)
                writer.write(name + ".mx_codes", mx.codes)
                writer.write(name + ".mx_scales", mx.scales)
                layers.append(layer.model_dump())
            else:
                skipped.append(name)
                writer.write(name, f.raw(name))
            bar.update(1)
    return {"layers": layers, "skipped": skipped}


def _compress_one(f: SafetensorsFile, name: str, settings: dict[str, Any]) -> tuple[MXTensor, LayerReport]:
    raw = f.raw(name)
    weight = bf16_to_f32(raw) if f.entries[name].dtype == "BF16" else np.asarray(raw)
    count = count_nonfinite(weight)
    check_nonfinite(name, count, weight.size, settings["nonfinite"])
    element = get_format(settings["fmt"])
    mx = quantize(weight, element, axis=1, block_size=settings["block_size"], name=name)
    restored = mx.dequantize(np.float64 if weight.dtype == np.float64 else np.float32)
    return mx, layer_report(name, weight, restored, element.name, raw.nbytes, mx.nbytes, count)
