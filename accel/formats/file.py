"""Checkpoint files: safetensors-compatible, memory-mappable, validated, written atomically.

A safetensors file is ``u64 header length | JSON header | data``; the header maps each tensor name to its dtype, shape
and byte range and may hold a ``__metadata__`` dict of strings. accel stores an MXTensor ``name`` as two uint8 tensors
``name.mx_codes`` (packed codes, 1-D) and ``name.mx_scales`` (E8M0, shape ``prefix + (nblocks,)``), and in
``__metadata__``: ``accel.format`` = ``accel-mx/1``, ``accel.mx`` = JSON {name: {fmt, shape, axis, block_size}},
``accel.crc32`` = JSON {stored tensor: CRC-32 hex}. Any safetensors reader can open the file; ``load_tensors`` also
reads plain Hugging Face files (BF16 is widened to float32, exactly). Nothing is ever unpickled.

Writing lives in ``accel.formats.writer`` (a temp file in the target directory, renamed over the target only once
complete). Checksums: a file whose ``__metadata__`` has any ``accel.*`` key is an accel file and must carry a CRC-32
for every stored tensor (``FormatError`` otherwise: a removed checksum is never read as "nothing to check"); a file
without accel keys declares itself plain safetensors (Hugging Face) and is read without checksums.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import FormatError
from accel.formats.constants import (
    CODES_SUFFIX,
    FILE_FORMAT_KEY,
    FILE_FORMAT_TAG,
    FILE_TENSORS_KEY,
    FILE_TIED_KEY,
    SCALES_SUFFIX,
)
from accel.formats.mx_tensor import MXTensor

MX_KEY = "accel.mx"
CRC_KEY = "accel.crc32"
MAX_HEADER_BYTES = 100 * 1024 * 1024

#: safetensors dtype code -> numpy storage dtype (BF16 is stored as uint16 and widened on read)
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def dtype_code(array: np.ndarray, name: str) -> str:
    """safetensors dtype code of a numpy array (ml_dtypes bfloat16 -> BF16)."""
    if array.dtype.name == "bfloat16":
        return "BF16"
    for code, dt in DTYPES.items():
        if code != "BF16" and array.dtype == dt:
            return code
    raise FormatError(f"tensor {name!r}: dtype {array.dtype} cannot be stored; allowed: {sorted(DTYPES)}")


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bits (uint16) to float32 exactly: they are the top 16 bits of a float32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor: name, safetensors dtype code, shape, byte size."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPES[self.dtype].itemsize


def mx_specs(name: str, mx: MXTensor) -> list[TensorSpec]:
    """The two stored tensors of an MXTensor."""
    return [
        TensorSpec(name + CODES_SUFFIX, "U8", (mx.codes_nbytes,)),
        TensorSpec(name + SCALES_SUFFIX, "U8", mx.scales_shape),
    ]


class SafetensorsFile:
    """A validated, memory-mapped safetensors file (header checked on open; data checked by ``verify``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FormatError(f"{self.path}: no such file")
        size = self.path.stat().st_size
        if size < 8:
            raise FormatError(f"{self.path}: truncated file ({size} bytes, a safetensors header needs at least 8)")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise FormatError(
                    f"{self.path}: header length {n} exceeds the file ({size} bytes): truncated or corrupt"
                )
            raw = f.read(n)
        try:
            head = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise FormatError(f"{self.path}: header is not valid JSON: {exc}") from exc
        if not isinstance(head, dict):
            raise FormatError(f"{self.path}: header must be a JSON object")
        self.metadata = _check_file_metadata(self.path, head.pop("__metadata__", None) or {})
        self.data_start = 8 + n
        data_len = size - self.data_start
        self.entries: dict[str, TensorSpec] = {}
        self.offsets: dict[str, tuple[int, int]] = {}
        for name, info in head.items():
            spec, (b, e) = _parse_entry(self.path, name, info)
            if not 0 <= b <= e <= data_len:
                raise FormatError(
                    f"{self.path}: tensor {name!r} byte range [{b}, {e}) outside the data "
                    f"({data_len} bytes): truncated file or corrupt header"
                )
            if e - b != spec.nbytes:
                raise FormatError(
                    f"{self.path}: tensor {name!r}: shape {list(spec.shape)} of {spec.dtype} needs "
                    f"{spec.nbytes} bytes, header gives {e - b}"
                )
            self.entries[name], self.offsets[name] = spec, (b, e)
        ranges = sorted(self.offsets.items(), key=lambda kv: kv[1])
        for (n1, (_, e1)), (n2, (b2, _)) in itertools.pairwise(ranges):
            if b2 < e1:
                raise FormatError(f"{self.path}: tensors {n1!r} and {n2!r} overlap")
        self.checksums = _checksums(self.path, self.metadata, self.entries)
        self._map = np.memmap(self.path, np.uint8, "r") if size > self.data_start else np.zeros(0, np.uint8)

    @property
    def mx_headers(self) -> dict[str, dict[str, Any]]:
        return json_meta(self.path, self.metadata, MX_KEY)

    def raw(self, name: str) -> np.ndarray:
        """The stored array of ``name`` (a read-only memory-mapped view; BF16 as uint16)."""
        spec = self.entries[name]
        b, e = self.offsets[name]
        view = self._map[self.data_start + b : self.data_start + e].view(np.ndarray)
        return view.view(DTYPES[spec.dtype]).reshape(spec.shape)

    def array(self, name: str) -> np.ndarray:
        """``raw`` with BF16 widened to float32."""
        raw = self.raw(name)
        return bf16_to_f32(raw) if self.entries[name].dtype == "BF16" else raw

    @property
    def is_accel(self) -> bool:
        """Whether the file is accel's own (any ``accel.*`` metadata key), so that it carries checksums."""
        return self.checksums is not None

    def verify(self, name: str) -> None:
        """Compare the CRC-32 of a stored tensor with the header's (accel files; plain safetensors have none)."""
        if self.checksums is None:
            return
        b, e = self.offsets[name]
        got = zlib.crc32(self._map[self.data_start + b : self.data_start + e].data)
        if f"{got:08x}" != self.checksums[name]:
            raise FormatError(
                f"{self.path}: tensor {name!r}: checksum mismatch (stored {self.checksums[name]}, data "
                f"{got:08x}): the file is corrupted"
            )

    def mx_tensor(self, name: str) -> MXTensor:
        """The MXTensor stored as ``name.mx_codes`` / ``name.mx_scales``, validated against its header."""
        head = self.mx_headers.get(name)
        if not isinstance(head, dict):
            raise FormatError(f"{self.path}: no MX header for tensor {name!r}")
        parts: list[np.ndarray] = []
        for suffix in (CODES_SUFFIX, SCALES_SUFFIX):
            if name + suffix not in self.entries:
                raise FormatError(f"{self.path}: tensor {name!r}: missing {name + suffix}")
            if self.entries[name + suffix].dtype != "U8":
                raise FormatError(f"{self.path}: tensor {name + suffix!r} must be U8")
            self.verify(name + suffix)
            parts.append(self.raw(name + suffix))
        try:
            codes, scales = parts
            return MXTensor(
                head["fmt"], tuple(head["shape"]), head["axis"], head["block_size"], codes, scales, name=name
            )
        except (KeyError, TypeError) as exc:
            raise FormatError(f"{self.path}: tensor {name!r}: bad MX header {head}: {exc}") from exc
        except FormatError as exc:
            raise FormatError(f"{self.path}: {exc}") from exc

    def tensors(self) -> dict[str, np.ndarray | MXTensor]:
        """Every tensor: MXTensors by their logical name, plain tensors as arrays (all checked)."""
        out: dict[str, np.ndarray | MXTensor] = {}
        mx = self.mx_headers
        stored = {n + s for n in mx for s in (CODES_SUFFIX, SCALES_SUFFIX)}
        orphans = [n for n in self.entries if self.is_accel and n.endswith((CODES_SUFFIX, SCALES_SUFFIX))]
        orphans = [n for n in orphans if n not in stored]
        if orphans:  # accel never writes these names outside an MX tensor: its header entry was removed or renamed
            raise FormatError(
                f"{self.path}: tensor {orphans[0]!r} has no MX header in {MX_KEY!r}: the file was altered"
            )
        for name in sorted(self.entries, key=lambda k: self.offsets[k]):
            if name in stored:
                continue
            self.verify(name)
            out[name] = self.array(name)
        for name in mx:
            out[name] = self.mx_tensor(name)
        return out


def _parse_entry(path: Path, name: str, info: Any) -> tuple[TensorSpec, tuple[int, int]]:
    try:
        dtype, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        ok = all(isinstance(v, int) and v >= 0 for v in (*shape, b, e))
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: tensor {name!r}: malformed header entry {info!r}") from exc
    if dtype not in DTYPES:
        raise FormatError(f"{path}: tensor {name!r}: unsupported dtype {dtype!r}; supported: {sorted(DTYPES)}")
    if not ok:
        raise FormatError(f"{path}: tensor {name!r}: shape and offsets must be non-negative ints, got {info!r}")
    return TensorSpec(name, dtype, tuple(shape)), (b, e)


_ACCEL_KEYS = frozenset({FILE_FORMAT_KEY, FILE_TENSORS_KEY, FILE_TIED_KEY, MX_KEY, CRC_KEY})


def _check_file_metadata(path: Path, meta: Any) -> dict[str, str]:
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise FormatError(f"{path}: __metadata__ must map str to str")
    unknown = sorted(k for k in meta if k.startswith("accel.") and k not in _ACCEL_KEYS)
    if unknown:  # a renamed or altered key would otherwise change how the tensors are read
        raise FormatError(f"{path}: unknown accel metadata key(s) {unknown[:3]} (known: {sorted(_ACCEL_KEYS)})")
    tag = meta.get(FILE_FORMAT_KEY)
    if tag is not None and tag != FILE_FORMAT_TAG:
        raise FormatError(f"{path}: unsupported accel file format {tag!r} (supported: {FILE_FORMAT_TAG})")
    return meta


def _checksums(path: Path, meta: dict[str, str], entries: dict[str, TensorSpec]) -> dict[str, str] | None:
    """CRC-32 of every stored tensor of an accel file (None for plain safetensors); FormatError if one is missing."""
    if not any(k.startswith("accel.") for k in meta):
        return None
    if CRC_KEY not in meta:
        raise FormatError(
            f"{path}: accel file without checksums (metadata {CRC_KEY!r} is missing): it was altered or damaged; "
            "accel files always carry them (a plain safetensors file has no accel.* metadata)"
        )
    crcs = json_meta(path, meta, CRC_KEY)
    missing = sorted(set(entries) - set(crcs))
    if missing:
        raise FormatError(f"{path}: no checksum for tensor(s) {missing[:5]} in {CRC_KEY!r}: the file was altered")
    bad = [n for n in entries if not (isinstance(crcs[n], str) and len(crcs[n]) == 8)]
    if bad:
        raise FormatError(f"{path}: checksum of tensor {bad[0]!r} is not 8 hex digits: {crcs[bad[0]]!r}")
    return {n: crcs[n].lower() for n in entries}


def json_meta(path: Path, meta: dict[str, str], key: str) -> dict[str, Any]:
    if key not in meta:
        return {}
    try:
        value = json.loads(meta[key])
    except ValueError as exc:
        raise FormatError(f"{path}: metadata {key!r} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise FormatError(f"{path}: metadata {key!r} must be a JSON object")
    return value


def load_tensors(path: str | os.PathLike) -> dict[str, np.ndarray | MXTensor]:
    """Read a safetensors file (accel's or a plain Hugging Face one): arrays and MXTensors, validated.

    Arrays are read-only memory-mapped views (BF16 is widened to float32, a copy). Raises FormatError naming the
    tensor and the problem for a truncated file, a bad header, a size/shape mismatch or a checksum mismatch.
    """
    return SafetensorsFile(path).tensors()
