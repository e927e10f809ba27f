"""Streaming compression of a Hugging Face checkpoint directory, tensor by tensor, without loading the model.

Each ``*.safetensors`` shard is memory-mapped (``file.SafetensorsFile``); each tensor is read, compressed or copied,
and written to its place in the output shard, so peak memory is about one tensor (plus its float32 copy and the
quantizer's temporaries). Output shards keep their names; ``model.safetensors.index.json`` is rewritten to point the
``.mx_codes`` / ``.mx_scales`` names at their shards; config, tokenizer and other small files are copied.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from accel.errors import FormatError
from accel.formats.constants import DEFAULT_BLOCK_SIZE
from accel.formats.elements import get_format
from accel.formats.file import SafetensorsFile, TensorSpec, bf16_to_f32
from accel.formats.mx_tensor import MXTensor, quantize
from accel.formats.packing import packed_nbytes
from accel.formats.report import CompressionReport, LayerReport, error_stats
from accel.formats.writer import SafetensorsWriter, make_temp_file

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
        shards = sorted(set(weight_map.values()))
        for shard in shards:
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


def compress_checkpoint(
    src_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    fmt: str = "mxfp6",
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> CompressionReport:
    """Compress the 2-D linear weights of a safetensors checkpoint directory to MX, writing ``out_dir``.

    ``include`` / ``exclude`` are globs over tensor names (default: every 2-D float ``*.weight`` except
    ``DEFAULT_EXCLUDE``). Weights are blocked along their last axis (in_features). Returns the CompressionReport;
    every output file is written to a temp file and renamed, so a failure leaves no partial file.
    """
    element = get_format(fmt)
    src, out = Path(src_dir), Path(out_dir)
    if not src.is_dir():
        raise FormatError(f"{src}: not a directory")
    if not (src / "config.json").is_file():
        raise FormatError(f"{src}: no config.json; expected a Hugging Face checkpoint directory")
    if src.resolve() == out.resolve():
        raise FormatError(f"output directory {out} must differ from the source")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FormatError(f"{out} exists and is not empty (pass overwrite=True / --overwrite)")
    include = list(include) if include else ["*"]
    exclude = list(DEFAULT_EXCLUDE if exclude is None else exclude)
    shards = _shards(src)
    report = CompressionReport(fmt=element.name, block_size=block_size)
    files = [SafetensorsFile(src / s) for s in shards]  # validates every header before writing anything
    total = sum(len(f.entries) for f in files)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    with tqdm(total=total, desc=f"compress to {element.name}", unit="tensor", disable=not progress) as bar:
        for shard, f in zip(shards, files, strict=True):
            plan = {n: should_compress(n, s, include, exclude) for n, s in f.entries.items()}
            specs, mx_heads = [], {}
            for name, spec in f.entries.items():
                if plan[name]:
                    specs += _mx_shape_spec(name, spec.shape, element.bits, block_size)
                    mx_heads[name] = {
                        "fmt": element.name,
                        "shape": list(spec.shape),
                        "axis": 1,
                        "block_size": block_size,
                    }
                else:
                    specs.append(spec)
            for s in specs:
                weight_map[s.name] = shard
            with SafetensorsWriter(out / shard, specs, {"format": "pt"}, mx_heads) as writer:
                for name in f.entries:
                    f.verify(name)
                    if plan[name]:
                        mx = _compress_one(f, name, element, block_size, report)
                        writer.write(name + ".mx_codes", mx.codes)
                        writer.write(name + ".mx_scales", mx.scales)
                    else:
                        report.skipped.append(name)
                        writer.write(name, f.raw(name))
                    bar.update(1)
    if (src / INDEX_NAME).is_file() or len(shards) > 1:
        index = {
            "metadata": {"format": "accel-mx", "fmt": element.name},
            "weight_map": dict(sorted(weight_map.items())),
        }
        _write_text_atomic(out / INDEX_NAME, json.dumps(index, indent=2))
    for p in sorted(src.iterdir()):
        if (
            p.is_file()
            and not p.name.endswith(".safetensors")
            and p.name != INDEX_NAME
            and not p.name.endswith(SKIPPED_SUFFIXES)
        ):
            _copy_atomic(p, out / p.name)
    return report


def _compress_one(f: SafetensorsFile, name: str, element, block_size: int, report: CompressionReport) -> MXTensor:
    raw = f.raw(name)
    weight = bf16_to_f32(raw) if f.entries[name].dtype == "BF16" else np.asarray(raw)
    mx = quantize(weight, element, axis=1, block_size=block_size, name=name)
    sqnr, max_err = error_stats(weight, mx.dequantize(np.float64 if weight.dtype == np.float64 else np.float32))
    report.layers.append(
        LayerReport(
            name=name,
            shape=weight.shape,
            fmt=element.name,
            bytes_before=raw.nbytes,
            bytes_after=mx.nbytes,
            sqnr_db=sqnr,
            max_abs_error=max_err,
        )
    )
    return mx


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = make_temp_file(path)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy_atomic(src: Path, dst: Path) -> None:
    fd, tmp = make_temp_file(dst)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
