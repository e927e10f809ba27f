"""Plain safetensors files (no accel metadata) for the serving engines: a streaming, atomic writer and a validated
reader, both with the 8-bit float dtype ``F8_E4M3`` that compressed-tensors' MXFP8 weights use.

``accel.formats.file`` writes accel's own files (with checksums and ``accel.*`` metadata, which accel's loaders take as
"accel-compressed"); a file for vLLM or transformers must be plain, with ``{"format": "pt"}`` as its only metadata
(transformers refuses a safetensors file without it). The layout is the safetensors one: ``u64 header length | JSON
header | data``, each tensor's ``dtype``, ``shape`` and ``data_offsets``.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from pathlib import Path

import numpy as np

from accel.errors import FormatError
from accel.formats.file import DTYPES, bf16_to_f32
from accel.formats.writer import make_temp_file

#: dtype code -> numpy storage dtype: accel's codes plus F8_E4M3 (OCP E4M3 bytes, read and written as uint8)
PLAIN_DTYPES: dict[str, np.dtype] = {**DTYPES, "F8_E4M3": np.dtype("u1")}
#: the metadata transformers requires in a checkpoint's safetensors files
PT_METADATA = {"format": "pt"}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def _nbytes(code: str, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * PLAIN_DTYPES[code].itemsize


class PlainWriter:
    """Write a plain safetensors file tensor by tensor (declared up front as ``{name: (dtype code, shape)}``).

    Written to a temp file beside ``path`` and renamed into place by ``close``; use as a context manager (an
    exception removes the temp file and leaves ``path`` untouched).
    """

    def __init__(self, path: Path, specs: dict[str, tuple[str, tuple[int, ...]]]) -> None:
        bad = {n: c for n, (c, _) in specs.items() if c not in PLAIN_DTYPES}
        if bad:
            raise FormatError(f"{path}: unsupported dtype(s) {bad}; supported: {sorted(PLAIN_DTYPES)}")
        self.path, self.specs = Path(path), specs
        head: dict[str, object] = {"__metadata__": PT_METADATA}
        self.offsets: dict[str, int] = {}
        pos = 0
        for name in sorted(specs, key=lambda n: (-PLAIN_DTYPES[specs[n][0]].itemsize, n)):  # keeps wide dtypes aligned
            code, shape = specs[name]
            size = _nbytes(code, shape)
            head[name] = {"dtype": code, "shape": list(shape), "data_offsets": [pos, pos + size]}
            self.offsets[name], pos = pos, pos + size
        raw = json.dumps(head, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % 8)
        self.data_start = 8 + len(raw)
        fd, self.tmp = make_temp_file(self.path)
        self.file = os.fdopen(fd, "w+b")
        self.file.write(struct.pack("<Q", len(raw)) + raw)
        self.file.truncate(self.data_start + pos)
        self.written: set[str] = set()

    def write(self, name: str, array: np.ndarray) -> None:
        """Write one declared tensor; its bytes must have the declared dtype's width and the declared shape."""
        code, shape = self.specs[name]
        array = np.ascontiguousarray(array)
        if tuple(array.shape) != tuple(shape) or array.dtype.itemsize != PLAIN_DTYPES[code].itemsize:
            raise FormatError(f"tensor {name!r}: got {array.dtype} {array.shape}, declared {code} {shape}")
        self.file.seek(self.data_start + self.offsets[name])
        self.file.write(array.reshape(-1).view(np.uint8).tobytes())
        self.written.add(name)

    def close(self) -> None:
        missing = sorted(set(self.specs) - self.written)
        if missing:
            raise FormatError(f"{self.path}: tensors declared but never written: {missing[:5]}")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)

    def __enter__(self) -> PlainWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.close()
                return
            except BaseException:
                self._abort()
                raise
        self._abort()

    def _abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)


class PlainFile:
    """A validated, memory-mapped safetensors file: ``entries`` maps each tensor to ``(dtype code, shape)``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size if self.path.is_file() else -1
        if size < 8:
            raise FormatError(f"{self.path}: missing or truncated safetensors file")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(size - 8, _MAX_HEADER_BYTES):
                raise FormatError(f"{self.path}: header length {n} exceeds the file ({size} bytes)")
            try:
                head = json.loads(f.read(n))
            except (UnicodeDecodeError, ValueError) as exc:
                raise FormatError(f"{self.path}: header is not valid JSON: {exc}") from exc
        if not isinstance(head, dict):
            raise FormatError(f"{self.path}: header must be a JSON object")
        head.pop("__metadata__", None)
        self.data_start = 8 + n
        self.entries: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._ranges: dict[str, tuple[int, int]] = {}
        for name, info in head.items():
            try:
                code, shape = info["dtype"], tuple(int(d) for d in info["shape"])
                b, e = (int(x) for x in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as exc:
                raise FormatError(f"{self.path}: tensor {name!r}: bad header entry {info!r}") from exc
            if code not in PLAIN_DTYPES:
                raise FormatError(f"{self.path}: tensor {name!r}: dtype {code!r}; supported: {sorted(PLAIN_DTYPES)}")
            if min(shape, default=0) < 0 or not 0 <= b <= e <= size - self.data_start or e - b != _nbytes(code, shape):
                raise FormatError(f"{self.path}: tensor {name!r}: byte range [{b}, {e}) does not fit {code} {shape}")
            self.entries[name], self._ranges[name] = (code, shape), (b, e)
        spans = sorted(self._ranges.items(), key=lambda kv: kv[1])
        for (n1, (_, e1)), (n2, (b2, _)) in itertools.pairwise(spans):
            if b2 < e1:
                raise FormatError(f"{self.path}: tensors {n1!r} and {n2!r} overlap")
        self._map = np.memmap(self.path, np.uint8, "r") if size > self.data_start else np.zeros(0, np.uint8)

    def raw(self, name: str) -> np.ndarray:
        """The stored array (read-only view; BF16 as uint16, F8_E4M3 as uint8 codes)."""
        code, shape = self.entries[name]
        b, e = self._ranges[name]
        view = self._map[self.data_start + b : self.data_start + e].view(np.ndarray)
        return view.view(PLAIN_DTYPES[code]).reshape(shape)

    def float32(self, name: str) -> np.ndarray:
        """A float32 copy of a float tensor (BF16 widened exactly); FormatError for other dtypes."""
        code = self.entries[name][0]
        if code == "BF16":
            return bf16_to_f32(self.raw(name))
        if code not in ("F16", "F32", "F64"):
            raise FormatError(f"{self.path}: tensor {name!r} is {code}, not a float tensor")
        return self.raw(name).astype(np.float32)
