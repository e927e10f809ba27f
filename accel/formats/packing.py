"""Bit packing of element codes (the layouts of onnx.proto, onnx >= 1.20; docs/reference.md §1).

- 8-bit codes: one per byte.
- FP6: a contiguous LSB-first bit stream, 4 codes in 3 bytes: ``b0 = x0 | (x1 & 3) << 6``,
  ``b1 = x1 >> 2 | (x2 & 0xF) << 4``, ``b2 = x2 >> 4 | x3 << 2``; ceil(6n / 8) bytes, zero padded.
- FP4: two codes per byte, the first in the low nibble; ceil(n / 2) bytes.
"""

from __future__ import annotations

import numpy as np

from accel.errors import FormatError

SUPPORTED_BITS = (4, 6, 8)


def packed_nbytes(n: int, bits: int) -> int:
    """Bytes that ``n`` codes of ``bits`` bits take once packed: ceil(bits * n / 8)."""
    _check_bits(bits)
    _check_count(n)
    return -(-bits * int(n) // 8)


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise FormatError(f"cannot pack {bits!r}-bit codes; supported widths: {SUPPORTED_BITS}")


def _check_count(n: int) -> None:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
        raise FormatError(f"the number of codes must be an int >= 0, got {n!r}")


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack a flat sequence of ``bits``-bit codes (uint8, C order) into a 1-D uint8 array."""
    _check_bits(bits)
    try:
        flat = np.ascontiguousarray(codes).reshape(-1)
    except (ValueError, TypeError) as exc:
        raise FormatError(f"codes to pack must be a uint8 array, got {type(codes).__name__} ({exc})") from exc
    if flat.dtype != np.uint8:
        raise FormatError(f"codes to pack must be uint8, got {flat.dtype}")
    if flat.size and bits < 8 and int(flat.max()) >> bits:
        raise FormatError(f"a code does not fit in {bits} bits (max code {int(flat.max())})")
    n = flat.size
    if bits == 8:
        return flat.copy()
    if bits == 4:
        if n % 2:
            flat = np.concatenate([flat, np.zeros(1, np.uint8)])
        return flat[0::2] | (flat[1::2] << 4)
    pad = -n % 4
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, np.uint8)])
    x = flat.reshape(-1, 4)
    out = np.empty((x.shape[0], 3), np.uint8)
    out[:, 0] = x[:, 0] | (x[:, 1] << 6)
    out[:, 1] = (x[:, 1] >> 2) | (x[:, 2] << 4)
    out[:, 2] = (x[:, 2] >> 4) | (x[:, 3] << 2)
    return out.reshape(-1)[: packed_nbytes(n, 6)]


def unpack_codes(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Unpack the first ``n`` codes of ``bits`` bits from a packed uint8 array (the inverse of ``pack_codes``)."""
    _check_bits(bits)
    _check_count(n)
    n = int(n)
    try:
        data = np.asarray(packed).reshape(-1)
    except (ValueError, TypeError) as exc:
        raise FormatError(f"packed codes must be a uint8 array, got {type(packed).__name__} ({exc})") from exc
    if data.dtype != np.uint8:
        raise FormatError(f"packed codes must be uint8, got {data.dtype}")
    if data.size < packed_nbytes(n, bits):
        raise FormatError(
            f"packed buffer of {data.size} bytes is too small for {n} codes of {bits} bits "
            f"({packed_nbytes(n, bits)} bytes needed)"
        )
    if bits == 8:
        return data[:n].copy()
    if bits == 4:
        b = data[: -(-n // 2)]
        out = np.empty((b.size, 2), np.uint8)
        out[:, 0] = b & 0x0F
        out[:, 1] = b >> 4
        return out.reshape(-1)[:n]
    groups = -(-n // 4)
    b = data[: packed_nbytes(n, 6)]
    if b.size < 3 * groups:
        b = np.concatenate([b, np.zeros(3 * groups - b.size, np.uint8)])
    b = b.reshape(-1, 3)
    out = np.empty((groups, 4), np.uint8)
    out[:, 0] = b[:, 0] & 0x3F
    out[:, 1] = (b[:, 0] >> 6) | ((b[:, 1] & 0x0F) << 2)
    out[:, 2] = (b[:, 1] >> 4) | ((b[:, 2] & 0x03) << 4)
    out[:, 3] = b[:, 2] >> 2
    return out.reshape(-1)[:n]
