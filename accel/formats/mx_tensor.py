"""MXTensor: a tensor quantized to an MX format, with bit-packed element codes and E8M0 block scales.

Layout (the ONNX exporter relies on it): move ``axis`` last (``np.moveaxis(x, axis, -1)``), zero-pad it to a multiple
of ``block_size``, view as ``prefix + (nblocks, block_size)``. ``scales`` has shape ``prefix + (nblocks,)``; the
element codes of the padded array, flattened in C order, are bit-packed (see ``packing``) into the 1-D ``codes``.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from accel.errors import FormatError
from accel.formats.codec import encode_elements
from accel.formats.constants import (
    DEFAULT_BLOCK_SIZE,
    E8M0_BIAS,
    E8M0_NAN,
    MAX_BLOCK_SIZE,
    MAX_PADDING_SLACK,
    MX_BYTES_MAGIC,
    MX_BYTES_VERSION,
)
from accel.formats.elements import ElementFormat, get_format
from accel.formats.kernels import dequantize_flat
from accel.formats.packing import pack_codes, packed_nbytes, unpack_codes
from accel.formats.scaling import block_scale_codes

#: elements quantized per step (bounds temporaries; a multiple of 4 codes keeps FP6 packing byte-aligned)
_QUANT_CHUNK_ELEMENTS = 1 << 18


def _label(name: str | None) -> str:
    return f"tensor {name!r}" if name else "tensor"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_block_size(block_size: Any, name: str | None = None) -> int:
    """``block_size`` as an int, or FormatError unless it is an int in 1..MAX_BLOCK_SIZE."""
    if not _is_int(block_size) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise FormatError(f"{_label(name)}: block_size must be an int in 1..{MAX_BLOCK_SIZE}, got {block_size!r}")
    return int(block_size)


def check_shape(shape: Any, name: str | None = None) -> tuple[int, ...]:
    """``shape`` as a tuple of ints >= 0, or FormatError."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise FormatError(f"{_label(name)}: shape must be a sequence of ints, got {shape!r}") from None
    if not all(_is_int(d) and d >= 0 for d in dims):
        raise FormatError(f"{_label(name)}: shape must hold ints >= 0, got {shape!r}")
    return tuple(int(d) for d in dims)


def check_layout(shape: tuple[int, ...], axis: int, block_size: int, name: str | None = None) -> tuple[int, int]:
    """Validate ``axis`` and ``block_size`` for ``shape``; return (normalised axis, number of blocks).

    Padding the blocked axis to whole blocks may at most double the element count (plus MAX_PADDING_SLACK), so that
    a huge block size on a long, narrow tensor is refused before anything is allocated.
    """
    block_size = check_block_size(block_size, name)
    shape = check_shape(shape, name)
    ndim = len(shape)
    if ndim == 0:
        raise FormatError(f"{_label(name)}: cannot quantize a 0-d array (need at least one axis)")
    if not _is_int(axis) or not -ndim <= axis < ndim:
        raise FormatError(f"{_label(name)}: axis {axis!r} out of range for shape {shape} (allowed -{ndim}..{ndim - 1})")
    axis = int(axis) % ndim
    nblocks = -(-shape[axis] // block_size)
    numel = int(np.prod(shape, dtype=object))
    padded = numel // shape[axis] * nblocks * block_size if shape[axis] else 0
    if padded > 2 * numel + MAX_PADDING_SLACK:
        raise FormatError(
            f"{_label(name)}: block_size {block_size} pads axis {axis} of shape {shape} to {padded} elements "
            f"(more than twice its {numel}); use a block size up to the axis length {shape[axis]}"
        )
    return axis, nblocks


def _work_dtype(x: np.ndarray, name: str | None) -> type:
    if x.dtype.kind == "f" and x.dtype.itemsize == 8:
        return np.float64
    if (x.dtype.kind == "f" and x.dtype.itemsize in (2, 4)) or x.dtype.name == "bfloat16":
        return np.float32  # float16 / bfloat16 widen exactly; any byte order
    raise FormatError(
        f"{_label(name)}: dtype {x.dtype} cannot be quantized; allowed: float16, bfloat16, float32, float64"
    )


class MXTensor:
    """A quantized tensor: element format, original shape, blocked axis, block size, packed codes, E8M0 scales."""

    __slots__ = ("axis", "block_size", "codes", "fmt", "scales", "shape")

    def __init__(
        self,
        fmt: ElementFormat | str,
        shape: tuple[int, ...],
        axis: int,
        block_size: int,
        codes: np.ndarray,
        scales: np.ndarray,
        name: str | None = None,
    ) -> None:
        self.fmt = get_format(fmt)
        self.shape = check_shape(shape, name)
        self.axis, _nblocks = check_layout(self.shape, axis, block_size, name)
        self.block_size = int(block_size)
        codes, scales = np.ascontiguousarray(codes), np.ascontiguousarray(scales)
        if codes.dtype != np.uint8 or scales.dtype != np.uint8:
            raise FormatError(f"{_label(name)}: codes and scales must be uint8, got {codes.dtype} and {scales.dtype}")
        if scales.shape != self.scales_shape:
            raise FormatError(f"{_label(name)}: scales shape {scales.shape} != expected {self.scales_shape}")
        if codes.ndim != 1 or codes.size != self.codes_nbytes:
            raise FormatError(
                f"{_label(name)}: codes must be 1-D with {self.codes_nbytes} bytes for shape {self.shape} in "
                f"{self.fmt.name} (block {self.block_size}), got shape {codes.shape}"
            )
        self.codes, self.scales = codes, scales

    # layout --------------------------------------------------------------------------------------------------
    @property
    def prefix(self) -> tuple[int, ...]:
        """Shape of the axes other than ``axis``, in order (``np.moveaxis(x, axis, -1).shape[:-1]``)."""
        return self.shape[: self.axis] + self.shape[self.axis + 1 :]

    @property
    def nblocks(self) -> int:
        """Blocks along ``axis`` (the axis length rounded up to a multiple of ``block_size``)."""
        return -(-self.shape[self.axis] // self.block_size)

    @property
    def scales_shape(self) -> tuple[int, ...]:
        return (*self.prefix, self.nblocks)

    @property
    def num_codes(self) -> int:
        """Element codes stored, including the zero padding of the last block of each row."""
        return int(np.prod(self.scales_shape, dtype=np.int64)) * self.block_size

    @property
    def codes_nbytes(self) -> int:
        return packed_nbytes(self.num_codes, self.fmt.bits)

    @property
    def nbytes(self) -> int:
        """True storage in bytes: packed codes + one E8M0 byte per block (MXFP6, block 32: 6.25 bits/element)."""
        return int(self.codes.nbytes + self.scales.nbytes)

    # values --------------------------------------------------------------------------------------------------
    def unpacked_codes(self) -> np.ndarray:
        """Element codes (uint8) of the padded block array, shape ``prefix + (nblocks, block_size)``."""
        codes = unpack_codes(self.codes, self.fmt.bits, self.num_codes)
        return codes.reshape((*self.scales_shape, self.block_size))

    def dequantize(self, dtype: Any = np.float32, out: np.ndarray | None = None) -> np.ndarray:
        """The values, in the original shape, as ``dtype`` (computed in float32, or float64 if asked; exact).

        ``out``: an array of the original shape and ``dtype`` to write into (saves allocating, and first-touching,
        a new result; written in place without a temporary when ``axis`` is last and its length a multiple of
        ``block_size``). FormatError if a value exceeds the range of ``dtype`` (it would become inf): a float64
        input near the top of the E8M0 range needs ``dtype=np.float64``.
        """
        dtype = _float_dtype(dtype)
        work = np.float64 if dtype == np.float64 else np.float32
        self._check_fits(dtype)
        if out is not None:
            if not isinstance(out, np.ndarray) or out.shape != self.shape or out.dtype != dtype:
                raise FormatError(f"out must be an array of shape {self.shape} and dtype {dtype}")
            direct = (
                out.flags.c_contiguous
                and dtype == work
                and self.axis == len(self.shape) - 1
                and self.shape[self.axis] % self.block_size == 0
            )
            if direct:
                dequantize_flat(self.codes, self.scales, self.fmt, self.block_size, work, out=out.reshape(-1))
            else:
                np.copyto(out, self.dequantize(dtype))
            return out
        flat = dequantize_flat(self.codes, self.scales, self.fmt, self.block_size, work)
        moved = flat.reshape((*self.prefix, self.nblocks * self.block_size))[..., : self.shape[self.axis]]
        out = np.ascontiguousarray(np.moveaxis(moved, -1, self.axis))
        return out if out.dtype == dtype else out.astype(dtype)

    def _check_fits(self, dtype: np.dtype) -> None:
        """FormatError if a value would overflow ``dtype`` (checked exactly only when a block's scale allows it)."""
        if dtype == np.float64 or not self.scales.size:
            return
        limit = float(np.finfo(np.float32 if dtype.name == "bfloat16" else dtype).max)
        top = int(self.scales.max())
        if top == E8M0_NAN:
            finite = self.scales[self.scales != E8M0_NAN]
            top = int(finite.max()) if finite.size else 0
        if self.fmt.max_normal * 2.0 ** (top - E8M0_BIAS) <= limit:
            return
        values = self.dequantize(np.float64)
        over = int(np.count_nonzero(np.isfinite(values) & (np.abs(values) > limit)))
        if over:
            raise FormatError(
                f"{over} value(s) of this {self.fmt.name} tensor exceed the range of {dtype} (max {limit:.4g}): "
                "dequantize to float64"
            )

    def __repr__(self) -> str:
        return (
            f"MXTensor(fmt={self.fmt.name}, shape={self.shape}, axis={self.axis}, block_size={self.block_size}, "
            f"nbytes={self.nbytes})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MXTensor):
            return NotImplemented
        return (
            self.fmt == other.fmt
            and self.shape == other.shape
            and self.axis == other.axis
            and self.block_size == other.block_size
            and np.array_equal(self.codes, other.codes)
            and np.array_equal(self.scales, other.scales)
        )

    __hash__ = None  # type: ignore[assignment]

    # bytes ---------------------------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """The description stored next to the data: fmt, shape, axis, block_size."""
        return {"fmt": self.fmt.name, "shape": list(self.shape), "axis": self.axis, "block_size": self.block_size}

    def to_bytes(self) -> bytes:
        """Self-describing bytes: magic, version, JSON header, codes, scales, CRC-32 of everything before it."""
        head = json.dumps(self.header(), separators=(",", ":")).encode()
        body = (
            MX_BYTES_MAGIC
            + struct.pack("<HI", MX_BYTES_VERSION, len(head))
            + head
            + np.ascontiguousarray(self.codes).tobytes()
            + np.ascontiguousarray(self.scales).tobytes()
        )
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes, name: str | None = None) -> MXTensor:
        """Parse ``to_bytes`` output, validating magic, version, header, sizes and checksum (FormatError if bad)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise FormatError(f"{_label(name)}: MX bytes must be bytes, got {type(data).__name__}")
        data = bytes(data)
        fixed = len(MX_BYTES_MAGIC) + 6
        if len(data) < fixed + 4:
            raise FormatError(f"{_label(name)}: MX bytes truncated ({len(data)} bytes, need at least {fixed + 4})")
        if data[:4] != MX_BYTES_MAGIC:
            raise FormatError(f"{_label(name)}: bad magic {data[:4]!r}, expected {MX_BYTES_MAGIC!r}")
        version, head_len = struct.unpack_from("<HI", data, 4)
        if version != MX_BYTES_VERSION:
            raise FormatError(f"{_label(name)}: unsupported MX bytes version {version} (supported: {MX_BYTES_VERSION})")
        if fixed + head_len + 4 > len(data):
            raise FormatError(f"{_label(name)}: MX bytes truncated inside the header ({len(data)} bytes)")
        (crc,) = struct.unpack_from("<I", data, len(data) - 4)
        if zlib.crc32(data[:-4]) != crc:
            raise FormatError(f"{_label(name)}: checksum mismatch (corrupted or truncated MX bytes)")
        try:
            head = json.loads(data[fixed : fixed + head_len])
            fmt, shape = get_format(head["fmt"]), check_shape(head["shape"], name)
            axis, block_size = head["axis"], head["block_size"]
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(f"{_label(name)}: bad MX header: {exc}") from exc
        axis, nblocks = check_layout(shape, axis, block_size, name)
        prefix = shape[:axis] + shape[axis + 1 :]
        n_scales = int(np.prod(prefix, dtype=np.int64)) * nblocks
        n_codes = packed_nbytes(n_scales * block_size, fmt.bits)
        start = fixed + head_len
        if start + n_codes + n_scales + 4 != len(data):
            raise FormatError(
                f"{_label(name)}: size mismatch: header says {n_codes} code bytes + {n_scales} scale bytes, "
                f"payload has {len(data) - start - 4}"
            )
        codes = np.frombuffer(data, np.uint8, n_codes, start).copy()
        scales = np.frombuffer(data, np.uint8, n_scales, start + n_codes).copy().reshape((*prefix, nblocks))
        return cls(fmt, shape, axis, block_size, codes, scales, name=name)


def quantize(
    x: Any,
    fmt: ElementFormat | str = "mxfp6",
    axis: int = -1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    name: str | None = None,
) -> MXTensor:
    """Quantize a float array to MX (OCP MX v1.0 §6.3): floor-rule E8M0 scale per block, RNE saturating elements.

    Blocks run along ``axis``; its length is zero-padded to a multiple of ``block_size`` (dropped on dequantize).
    A block with NaN or ±Inf gets the NaN scale 0xFF and zero codes (it decodes to NaN). ``name`` labels errors.
    """
    fmt = get_format(fmt)
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:
            raise FormatError(f"{_label(name)}: cannot convert {type(x).__name__} to an array: {exc}") from exc
    work = _work_dtype(x, name)
    axis, nblocks = check_layout(x.shape, axis, block_size, name)
    moved = np.moveaxis(x, axis, -1)
    prefix, length = moved.shape[:-1], moved.shape[-1]
    rows = int(np.prod(prefix, dtype=np.int64))
    if length == nblocks * block_size and moved.dtype == work:
        blocks = np.ascontiguousarray(moved).reshape(rows * nblocks, block_size)  # a view when already C-ordered
    else:
        padded: np.ndarray = np.zeros((rows, nblocks * block_size), work)
        padded[:, :length] = moved.reshape(rows, length)
        blocks = padded.reshape(rows * nblocks, block_size)
    scales = np.empty(rows * nblocks, np.uint8)
    parts = []
    inverse_scales = np.ldexp(np.ones(256, work), E8M0_BIAS - np.arange(256))  # 2^-(code - 127); [255] unused
    step = max(4, (_QUANT_CHUNK_ELEMENTS // block_size) // 4 * 4)  # whole FP6 byte groups per step
    for b0 in range(0, blocks.shape[0], step):
        chunk = blocks[b0 : b0 + step]
        s = block_scale_codes(chunk, fmt, name)
        scales[b0 : b0 + step] = s
        scaled = chunk * inverse_scales[s][:, None]  # exact: multiplying by a power of two (as np.ldexp)
        elements = encode_elements(scaled, fmt)
        elements[s == E8M0_NAN] = 0  # canonical: a NaN-scale block stores zero codes
        parts.append(pack_codes(elements, fmt.bits))
    codes = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return MXTensor(fmt, x.shape, axis, block_size, codes, scales.reshape((*prefix, nblocks)), name=name)


def _float_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a numpy float dtype, or FormatError (dequantized values are never cast to integers)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise FormatError(f"unknown dtype {dtype!r}: {exc}") from None
    if dt.kind != "f" and dt.name != "bfloat16":
        raise FormatError(f"dequantize to a float dtype (float16, float32, float64), not {dt}")
    return dt


def dequantize(mx: MXTensor, dtype: Any = np.float32) -> np.ndarray:
    """``mx.dequantize(dtype)`` (FormatError if ``mx`` is not an ``MXTensor``)."""
    if not isinstance(mx, MXTensor):
        raise FormatError(f"dequantize needs an MXTensor (from quantize); got {type(mx).__name__}")
    return mx.dequantize(dtype)
