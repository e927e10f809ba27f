"""Bad input to the formats API: named FormatErrors, no silent clamping, bounds checked before allocating."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats import (
    MXTensor,
    block_scale_codes,
    decode_elements,
    encode_elements,
    get_format,
    pack_codes,
    packed_nbytes,
    quantize,
    scale_codes_from_amax,
    unpack_codes,
)
from accel.formats.constants import MAX_BLOCK_SIZE


def test_codec_takes_format_names_and_checks_codes():
    x = np.array([0.5, -1.0, 7.5], np.float32)
    fmt = get_format("mxfp6")
    np.testing.assert_array_equal(encode_elements(x, "mxfp6"), encode_elements(x, fmt))
    np.testing.assert_array_equal(decode_elements(encode_elements(x, "mxfp6"), "mxfp6"), x)
    for codes, needle in (([64], r"\[0, 64\); got min 64"), ([-1, 3], "got min -1"), ([300], "max 300")):
        with pytest.raises(FormatError, match=needle):
            decode_elements(np.array(codes), "mxfp6")
    with pytest.raises(FormatError, match="must be integers"):
        decode_elements(np.array([1.5]), "mxfp6")
    with pytest.raises(FormatError, match="dtype <U"):
        encode_elements(np.array(["a"]), "mxfp6")
    with pytest.raises(FormatError, match="unknown MX format"):
        encode_elements(x, "mxfp5")
    assert decode_elements(np.array([255], np.uint8), "mxfp8").dtype == np.float32  # 8-bit: every byte is a code


@pytest.mark.parametrize("fmt", ["mxfp6", "mxfp8_e4m3", "mxint8", "mxfp4"])
def test_float64_beyond_e8m0_range_is_an_error_not_a_clamp(fmt):
    emax = get_format(fmt).emax
    top = 2.0 ** (128 + emax)  # the smallest amax whose scale would need 2^128
    with pytest.raises(FormatError, match=r"'w'.*beyond the range.*2\^127"):
        quantize(np.array([top, 1.0]), fmt, name="w")
    with pytest.raises(FormatError, match="beyond the range"):
        scale_codes_from_amax(np.array([top]), fmt)
    below = np.array([np.nextafter(top, 0), 1.0])  # largest amax that still fits: decodes finite in float64
    mx = quantize(below, fmt)
    wide = mx.dequantize(np.float64)
    assert np.isfinite(wide).all()
    if np.abs(wide).max() > np.finfo(np.float32).max:  # all but MXINT8 (max 127/64 * 2^127 fits in float32)
        with pytest.raises(FormatError, match="exceed the range of float32"):
            mx.dequantize(np.float32)  # no silent inf either
    else:
        np.testing.assert_array_equal(mx.dequantize(np.float32), wide)


def test_float64_beyond_range_torch_path():
    torch = pytest.importorskip("torch")
    from accel.formats.torch_ops import quantize_torch

    with pytest.raises(FormatError, match=r"'w'.*beyond the range"):
        quantize_torch(torch.tensor([1e300, 1.0], dtype=torch.float64), "mxfp6", name="w")


def test_block_size_and_padding_bounds_come_before_allocating():
    x = np.ones((4, 64), np.float32)
    for bad in (0, -1, 2.5, True, "32", MAX_BLOCK_SIZE + 1, 2**28):
        with pytest.raises(FormatError, match=rf"block_size must be an int in 1\.\.{MAX_BLOCK_SIZE}"):
            quantize(x, "mxfp6", block_size=bad)
    tall = np.ones((1 << 16, 1), np.float32)  # one element per row: block 4096 would pad it to 2^28 elements
    with pytest.raises(FormatError, match="pads axis 1"):
        quantize(tall, "mxfp6", block_size=4096)
    assert quantize(np.ones((2, 3), np.float32), "mxfp6", block_size=MAX_BLOCK_SIZE).num_codes == 2 * MAX_BLOCK_SIZE


def test_mxtensor_and_bytes_reject_wrong_types():
    mx = quantize(np.ones((2, 32), np.float32), "mxfp6")
    for shape in ("ab", None, (2, 32.0), (2, -32), (True, 32)):
        with pytest.raises(FormatError, match="shape must"):
            MXTensor("mxfp6", shape, 1, 32, mx.codes, mx.scales)
    for data in ("text", None, 12):
        with pytest.raises(FormatError, match="MX bytes must be bytes"):
            MXTensor.from_bytes(data)
    for dtype in (np.int32, "foo", bool):
        with pytest.raises(FormatError, match="dtype"):
            mx.dequantize(dtype)


def test_scales_and_packing_check_their_arguments():
    with pytest.raises(FormatError, match="float array"):
        block_scale_codes(np.ones((2, 32), np.int32), "mxfp6")
    for n in (-1, 2.5, True, "3"):
        with pytest.raises(FormatError, match="number of codes must be an int >= 0"):
            unpack_codes(np.zeros(4, np.uint8), 6, n)
        with pytest.raises(FormatError, match="number of codes"):
            packed_nbytes(n, 6)
    with pytest.raises(FormatError, match="supported widths"):
        pack_codes(np.zeros(4, np.uint8), True)
    with pytest.raises(FormatError, match="uint8 array"):
        pack_codes([[1, 2], [3]], 6)
