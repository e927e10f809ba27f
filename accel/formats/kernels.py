"""Fast numpy dequantization of packed MX codes: table look-ups on packed bytes, one pass per cache-sized chunk.

Per format one table maps a *packed unit* straight to float pairs, so no separate unpack pass is needed:
- FP4: a byte -> 2 floats (256 x 2 table),
- FP6: 12 bits (two codes) -> 2 floats (4096 x 2 table, 32 KiB); 3 bytes = 24 bits give two such units,
- 8-bit: a byte -> 1 float.
Each float pair is fetched as one 64-bit word. Then the block scale 2^(code - 127) multiplies each block in place.
Exact: element values have <= 4 significant bits (7 for MXINT8) and the scale is a power of two, so the float32
product is exact unless it leaves float32's range (possible only for scales built by hand or from float64 inputs).
"""

from __future__ import annotations

import functools

import numpy as np

from accel.formats.elements import ElementFormat
from accel.formats.packing import packed_nbytes, unpack_codes
from accel.formats.scaling import scale_values

#: elements per chunk (times 4 bytes = 256 KiB of float32 output, about an L2 cache)
CHUNK_ELEMENTS = 1 << 16


@functools.cache
def _pair_table(fmt: ElementFormat, dtype: type) -> np.ndarray:
    """Table of (value of low code, value of high code) for every packed unit, as one 2*itemsize word each."""
    lut: np.ndarray = fmt.code_values().astype(dtype)
    if fmt.bits == 8:
        return lut
    unit_bits = 2 * fmt.bits
    idx = np.arange(1 << unit_bits)
    mask = (1 << fmt.bits) - 1
    pairs = np.stack([lut[idx & mask], lut[idx >> fmt.bits]], axis=1)
    word = np.uint64 if np.dtype(dtype).itemsize == 4 else np.dtype([("lo", dtype), ("hi", dtype)])
    return np.ascontiguousarray(pairs).view(word).reshape(-1)


def _decode_chunk(packed: np.ndarray, fmt: ElementFormat, out: np.ndarray, dtype: type) -> None:
    """Decode ``out.size`` codes (a multiple of 4) from ``packed`` into ``out`` (element values, unscaled)."""
    table = _pair_table(fmt, dtype)
    # mode="clip" skips numpy's per-index bounds check (indices are in range by construction): ~4x faster take
    if fmt.bits == 8:
        table.take(packed.astype(np.intp), out=out, mode="clip")
        return
    pair_out = out.view(table.dtype)
    if fmt.bits == 4:
        table.take(packed.astype(np.intp), out=pair_out, mode="clip")
        return
    groups = packed.size // 3
    # two unaligned little-endian uint16 views with a 3-byte stride: bytes (b0, b1) and (b1, b2) of each group
    lo16 = np.ndarray((groups,), "<u2", packed, 0, (3,))
    hi16 = np.ndarray((groups,), "<u2", packed, 1, (3,))
    units = np.empty((groups, 2), np.intp)
    np.bitwise_and(lo16, 0xFFF, out=units[:, 0])  # codes 0, 1: bits 0..11
    np.right_shift(hi16, 4, out=units[:, 1])  # codes 2, 3: bits 12..23
    table.take(units.reshape(-1), out=pair_out, mode="clip")


def dequantize_flat(
    codes: np.ndarray,
    scales: np.ndarray,
    fmt: ElementFormat,
    block_size: int,
    dtype: type = np.float32,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Values of every element of the padded block array, flat (C order), as ``dtype`` (float32 or float64).

    ``codes`` are the packed codes of ``scales.size * block_size`` elements; ``scales`` the E8M0 code per block.
    ``out``, if given, is a contiguous 1-D array of that many elements and ``dtype`` to write into.
    """
    flat_scales = scales.reshape(-1)
    nblocks = flat_scales.size
    n = nblocks * block_size
    if out is None:
        out = np.empty(n, dtype)
    svals = scale_values(dtype)
    chunk_blocks = max(4, (CHUNK_ELEMENTS // block_size) // 4 * 4)  # multiple of 4 codes: whole FP6 byte groups
    for b0 in range(0, nblocks, chunk_blocks):
        b1 = min(nblocks, b0 + chunk_blocks)
        e0, e1 = b0 * block_size, b1 * block_size
        part = out[e0:e1]
        if (e1 - e0) % 4 == 0:
            start = packed_nbytes(e0, fmt.bits)  # e0 is a multiple of 4, so this is a byte boundary
            _decode_chunk(codes[start : start + packed_nbytes(e1 - e0, fmt.bits)], fmt, part, dtype)
        else:  # a ragged last chunk: plain unpack of its codes
            start = packed_nbytes(e0, fmt.bits)
            tail = unpack_codes(codes[start:], fmt.bits, e1 - e0)
            part[:] = fmt.code_values().astype(dtype)[tail]
        blocks = part.reshape(b1 - b0, block_size)
        blocks *= svals[flat_scales[b0:b1]][:, None]
    return out
