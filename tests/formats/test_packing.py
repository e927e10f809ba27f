"""Bit packing: round trips for every small length, and equality with onnx's own FP6/FP4 packing helpers."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats import pack_codes, packed_nbytes, unpack_codes

LENGTHS = [*list(range(0, 71)), 1000, 4097, 100003]


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_round_trip_every_length(bits, rng):
    for n in LENGTHS:
        codes = rng.integers(0, 1 << bits, n, dtype=np.uint8)
        packed = pack_codes(codes, bits)
        assert packed.dtype == np.uint8 and packed.shape == (packed_nbytes(n, bits),)
        assert packed.size == -(-bits * n // 8)
        np.testing.assert_array_equal(unpack_codes(packed, bits, n), codes)


def test_fp6_layout_by_hand():
    # docs/reference.md §1: b0 = x0 | (x1&3)<<6; b1 = x1>>2 | (x2&0xF)<<4; b2 = x2>>4 | x3<<2
    x = [0b101010, 0b110011, 0b011100, 0b111111]
    expected = [x[0] | (x[1] & 3) << 6, x[1] >> 2 | (x[2] & 0xF) << 4, x[2] >> 4 | x[3] << 2]
    assert list(pack_codes(np.array(x, np.uint8), 6)) == [b & 0xFF for b in expected]
    assert list(pack_codes(np.array([0x3F], np.uint8), 6)) == [0x3F]  # ceil(6/8) = 1 byte, zero padded
    assert list(pack_codes(np.array([1, 2], np.uint8), 4)) == [0x21]  # first element in the low nibble


def _onnx_helpers():
    numpy_helper = pytest.importorskip("onnx.numpy_helper")
    names = ("_pack_6bit", "_unpack_6bit", "_pack_4bitx2", "_unpack_4bit")
    if not all(hasattr(numpy_helper, n) for n in names):
        pytest.skip(f"installed onnx has no private packing helpers {names}")
    return numpy_helper


@pytest.mark.parametrize("bits", [4, 6])
def test_equals_onnx_packing(bits, rng):
    nh = _onnx_helpers()
    pack = nh._pack_6bit if bits == 6 else nh._pack_4bitx2
    unpack = nh._unpack_6bit if bits == 6 else nh._unpack_4bit
    for n in LENGTHS[1:]:
        codes = rng.integers(0, 1 << bits, n, dtype=np.uint8)
        ours = pack_codes(codes, bits)
        np.testing.assert_array_equal(ours, pack(codes))
        np.testing.assert_array_equal(unpack(ours, [n]), codes)


def test_bad_packing_inputs():
    with pytest.raises(FormatError, match="supported widths"):
        pack_codes(np.zeros(4, np.uint8), 5)
    with pytest.raises(FormatError, match="fit in 4 bits"):
        pack_codes(np.array([16], np.uint8), 4)
    with pytest.raises(FormatError, match="uint8"):
        pack_codes(np.zeros(4, np.int32), 8)
    with pytest.raises(FormatError, match="too small"):
        unpack_codes(np.zeros(2, np.uint8), 6, 4)
