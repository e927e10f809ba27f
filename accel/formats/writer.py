"""Writing safetensors files atomically: ``SafetensorsWriter`` (tensor by tensor, CRC-32 of each in the header) and
``save_tensors``. See ``accel.formats.file`` for the layout.

A file is written to a temp file next to its target and renamed into place once complete; on any failure (an
exception, Ctrl-C, a failed rename) the temp file and the folders the writer created are removed.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from accel._io import check_output_path, writing
from accel.errors import FormatError
from accel.formats.constants import CODES_SUFFIX, FILE_FORMAT_KEY, FILE_FORMAT_TAG, SCALES_SUFFIX
from accel.formats.file import CRC_KEY, DTYPES, MX_KEY, TensorSpec, dtype_code, mx_specs
from accel.formats.mx_tensor import MXTensor

__all__ = ["SafetensorsWriter", "make_parents", "make_temp_file", "remove_empty_dirs", "save_tensors"]

_WHAT = "a safetensors file"  # what the writer's errors say it was writing


def make_temp_file(target: Path) -> tuple[int, Path]:
    """A temp file next to ``target`` (same filesystem, so the final rename is atomic) with the permissions a plain
    ``open`` would give (mkstemp's default 0600 would make shared checkpoints unreadable)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    return fd, Path(tmp)


def make_parents(path: Path) -> list[Path]:
    """Create the missing parent folders of ``path``; return those created, deepest first (for cleanup)."""
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    return missing


def remove_empty_dirs(dirs: list[Path]) -> None:
    """Remove the folders ``make_parents`` created, deepest first, while they are empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


class SafetensorsWriter:
    """Write a safetensors file tensor by tensor (any order), atomically; CRC-32 of each tensor in the header.

    The layout is fixed up front from ``specs`` (sorted by item size, so every tensor stays aligned); the header is
    written with placeholder checksums of the same width and rewritten on ``close``. Use as a context manager: on an
    exception the temp file is removed and the target is left untouched.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        specs: list[TensorSpec],
        metadata: dict[str, str] | None = None,
        mx: dict[str, dict[str, Any]] | None = None,
        internal: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            dups = sorted({n for n in names if names.count(n) > 1})
            raise FormatError(f"duplicate tensor names in {self.path}: {dups}")
        self.metadata = _check_metadata(metadata)
        self.metadata.update(internal or {})  # accel's own keys (e.g. accel.tied), set by accel code only
        self.mx = mx or {}
        order = sorted(specs, key=lambda s: -DTYPES[s.dtype].itemsize)
        self.specs = {s.name: s for s in specs}
        self.offsets: dict[str, tuple[int, int]] = {}
        pos = 0
        for s in order:
            self.offsets[s.name] = (pos, pos + s.nbytes)
            pos += s.nbytes
        self.data_bytes = pos
        self.crcs = {n: 0 for n in names}
        self.written: set[str] = set()
        header = self._header()
        self.header_len = len(header)
        check_output_path(self.path, _WHAT, FormatError)
        self.created_dirs: list[Path] = []
        try:
            with writing(self.path, _WHAT, FormatError):
                self.created_dirs = make_parents(self.path)
                fd, self.tmp = make_temp_file(self.path)
        except BaseException:
            remove_empty_dirs(self.created_dirs)
            raise
        self.file = os.fdopen(fd, "w+b")
        try:
            with writing(self.path, _WHAT, FormatError):
                self.file.write(struct.pack("<Q", self.header_len) + header)
                self.file.truncate(8 + self.header_len + self.data_bytes)
        except BaseException:
            self.abort()
            raise

    def _header(self) -> bytes:
        meta = dict(self.metadata)
        meta[FILE_FORMAT_KEY] = FILE_FORMAT_TAG
        meta[MX_KEY] = json.dumps(self.mx, sort_keys=True, separators=(",", ":"))
        meta[CRC_KEY] = json.dumps({n: f"{c:08x}" for n, c in sorted(self.crcs.items())}, separators=(",", ":"))
        head: dict[str, Any] = {"__metadata__": meta}
        for name, (b, e) in sorted(self.offsets.items(), key=lambda kv: kv[1]):
            s = self.specs[name]
            head[name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [b, e]}
        raw = json.dumps(head, separators=(",", ":")).encode()
        return raw + b" " * (-(8 + len(raw)) % 8)  # data starts 8-byte aligned (padding allowed by the format)

    def write(self, name: str, array: np.ndarray) -> None:
        """Write the data of one declared tensor (its dtype code and shape must match the spec)."""
        if name not in self.specs:
            raise FormatError(f"tensor {name!r} was not declared for {self.path}")
        spec = self.specs[name]
        array = np.asarray(array)
        array = array if array.flags.c_contiguous else np.ascontiguousarray(array)  # (keeps 0-d arrays 0-d)
        code = "BF16" if spec.dtype == "BF16" and array.dtype == np.uint16 else dtype_code(array, name)
        if code != spec.dtype or tuple(array.shape) != spec.shape:
            raise FormatError(f"tensor {name!r}: got {code} {array.shape}, declared {spec.dtype} {spec.shape}")
        data = array.reshape(-1).view(np.uint8) if array.size else np.zeros(0, np.uint8)
        self.crcs[name] = zlib.crc32(data.data)
        with writing(self.path, _WHAT, FormatError):
            self.file.seek(8 + self.header_len + self.offsets[name][0])
            self.file.write(data.tobytes() if data.size < (1 << 20) else data.data)
        self.written.add(name)

    def close(self) -> None:
        """Check every tensor was written, write the final header, fsync and rename into place."""
        missing = sorted(set(self.specs) - self.written)
        if missing:
            self.abort()
            raise FormatError(f"{self.path}: tensors declared but never written: {missing[:5]}")
        header = self._header()
        assert len(header) == self.header_len, "checksum placeholders must keep the header length"
        try:
            with writing(self.path, _WHAT, FormatError):
                self.file.seek(8)
                self.file.write(header)
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
                os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()  # e.g. the target became a directory, or the disk is full: no temp file left behind
            raise

    def abort(self) -> None:
        """Drop the temp file (and the folders this writer created); the target path is not touched."""
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)
        remove_empty_dirs(self.created_dirs)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    metadata = dict(metadata or {})
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise FormatError(f"metadata must map str to str; got {k!r}: {type(v).__name__}")
        if k.startswith("accel."):
            raise FormatError(f"metadata key {k!r} is reserved (keys starting with 'accel.' are accel's own)")
    return metadata


def save_tensors(
    path: str | os.PathLike, tensors: dict[str, np.ndarray | MXTensor], metadata: dict[str, str] | None = None
) -> None:
    """Write numpy arrays and MXTensors to a safetensors file at ``path`` (atomically: temp file, then rename)."""
    specs: list[TensorSpec] = []
    mx: dict[str, dict[str, Any]] = {}
    data: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise FormatError(f"tensor names must be non-empty str, got {name!r}")
        if name.endswith((CODES_SUFFIX, SCALES_SUFFIX)):
            raise FormatError(f"tensor {name!r}: names ending in {CODES_SUFFIX}/{SCALES_SUFFIX} are reserved")
        if isinstance(value, MXTensor):
            specs += mx_specs(name, value)
            mx[name] = value.header()
            data[name + CODES_SUFFIX], data[name + SCALES_SUFFIX] = value.codes, value.scales
        elif isinstance(value, np.ndarray):
            specs.append(TensorSpec(name, dtype_code(value, name), tuple(value.shape)))
            data[name] = value.view(np.uint16) if value.dtype.name == "bfloat16" else value
        else:
            raise FormatError(f"tensor {name!r}: expected np.ndarray or MXTensor, got {type(value).__name__}")
    with SafetensorsWriter(path, specs, metadata, mx) as writer:
        for name, array in data.items():
            writer.write(name, array)
