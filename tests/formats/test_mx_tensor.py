"""MXTensor: layout, corner cases, error bounds (hypothesis), idempotence, bytes round trip, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from accel.errors import FormatError
from accel.formats import MXTensor, encode_elements, get_format, pack_codes, quantize, scale_codes_from_amax
from tests.helpers.formats import ALL_FORMATS


def reference_quantize(x: np.ndarray, name: str, axis: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Unpacked codes and scales built step by step from the layout's definition (moveaxis, pad, block)."""
    fmt = get_format(name)
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    pad = -moved.shape[-1] % block_size
    padded = np.concatenate([moved, np.zeros((*moved.shape[:-1], pad))], axis=-1)
    blocks = padded.reshape((*moved.shape[:-1], -1, block_size))
    scales = scale_codes_from_amax(np.abs(blocks).max(axis=-1), fmt)
    codes = encode_elements(blocks / 2.0 ** (scales.astype(np.float64) - 127)[..., None], fmt)
    return codes, scales


@pytest.mark.parametrize("name", ALL_FORMATS)
@pytest.mark.parametrize(("shape", "axis"), [((70,), 0), ((5, 33), -1), ((64, 5), 0), ((3, 40, 4), 1), ((2, 3, 96), 2)])
def test_layout(name, shape, axis, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    mx = quantize(x, name, axis=axis)
    codes, scales = reference_quantize(x, name, axis, 32)
    assert mx.axis == axis % len(shape) and mx.shape == shape
    assert mx.scales.dtype == np.uint8 and mx.codes.dtype == np.uint8 and mx.codes.ndim == 1
    np.testing.assert_array_equal(mx.scales, scales)
    np.testing.assert_array_equal(mx.unpacked_codes(), codes)
    np.testing.assert_array_equal(mx.codes, pack_codes(codes.reshape(-1), mx.fmt.bits))
    out = mx.dequantize()
    assert out.shape == shape and out.dtype == np.float32
    np.testing.assert_array_equal(
        out,
        np.moveaxis(
            (get_format(name).code_values()[codes] * 2.0 ** (scales.astype(np.float64) - 127)[..., None]).reshape(
                (*np.moveaxis(x, axis, -1).shape[:-1], -1)
            )[..., : shape[axis]],
            -1,
            axis,
        ),
    )


@pytest.mark.parametrize("block_size", [1, 7, 16, 32, 64])
def test_block_sizes(block_size, rng):
    x = rng.standard_normal((3, 100)).astype(np.float32)
    mx = quantize(x, "mxfp6", block_size=block_size)
    codes, scales = reference_quantize(x, "mxfp6", -1, block_size)
    np.testing.assert_array_equal(mx.unpacked_codes(), codes)
    np.testing.assert_array_equal(mx.scales, scales)


def test_nbytes_is_true_storage():
    x = np.ones((128, 256), np.float32)
    assert quantize(x, "mxfp6").nbytes * 8 / x.size == 6.25
    assert quantize(x, "mxfp4").nbytes * 8 / x.size == 4.25
    assert quantize(x, "mxfp8").nbytes * 8 / x.size == 8.25
    assert quantize(x, "mxint8").nbytes * 8 / x.size == 8.25


def test_saturation_edge_e2m3():
    """Floor rule: a block amax of 7.9 * 2^k gets scale 2^k and clamps to 7.5 * 2^k (docs/reference.md §1)."""
    for k in (-3, 0, 5):
        x = np.zeros(32, np.float32)
        x[0], x[1] = 7.9 * 2.0**k, -7.9 * 2.0**k
        out = quantize(x, "mxfp6_e2m3").dequantize()
        assert out[0] == 7.5 * 2.0**k and out[1] == -7.5 * 2.0**k
        x[0] = 8.0 * 2.0**k  # the next binade: scale 2^(k+1), 8 = 4 * 2 exactly
        assert quantize(x, "mxfp6_e2m3").dequantize()[0] == 8.0 * 2.0**k


def test_nan_and_inf_blocks_only_poison_their_block():
    x = np.ones((2, 64), np.float32)
    x[0, 3] = np.nan
    x[1, 40] = -np.inf
    mx = quantize(x, "mxfp6")
    np.testing.assert_array_equal(mx.scales, [[0xFF, 127 - 2], [127 - 2, 0xFF]])
    assert np.all(mx.unpacked_codes()[0, 0] == 0) and np.all(mx.unpacked_codes()[1, 1] == 0)  # canonical codes
    out = mx.dequantize()
    assert np.all(np.isnan(out[0, :32])) and np.all(np.isnan(out[1, 32:]))
    assert np.all(out[0, 32:] == 1) and np.all(out[1, :32] == 1)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_all_zero_and_empty(name):
    mx = quantize(np.zeros((4, 50), np.float32), name)
    assert np.all(mx.scales == 0) and np.all(mx.dequantize() == 0)
    empty = quantize(np.zeros((0, 64), np.float32), name)
    assert empty.dequantize().shape == (0, 64) and empty.nbytes == 0
    zero_axis = quantize(np.zeros((3, 0), np.float32), name)
    assert zero_axis.dequantize().shape == (3, 0)


def test_input_dtypes(rng):
    x = rng.standard_normal((4, 64))
    ref = quantize(x.astype(np.float32), "mxfp6")
    assert quantize(x.astype(np.float16).astype(np.float32), "mxfp6") == quantize(x.astype(np.float16), "mxfp6")
    assert quantize(x.astype(np.float32).tolist(), "mxfp6") == ref
    assert quantize(x.astype(np.float32).astype(np.float64), "mxfp6") == ref  # float64 path, same bits
    np.testing.assert_array_equal(ref.dequantize(np.float64), ref.dequantize().astype(np.float64))
    assert ref.dequantize(np.float16).dtype == np.float16
    assert quantize(x.astype(">f4"), "mxfp6") == ref  # big-endian input
    ml_dtypes = pytest.importorskip("ml_dtypes")
    xb = x.astype(ml_dtypes.bfloat16)
    assert quantize(xb, "mxfp6") == quantize(xb.astype(np.float32), "mxfp6")
    with pytest.raises(FormatError, match=r"longdouble|float128"):
        quantize(x.astype(np.longdouble), "mxfp6")


def block_error_bound(fmt, scales: np.ndarray) -> np.ndarray:
    """Per-block bound on |x - dequantize(quantize(x))|: the larger of half an ulp of the top binade,
    2^(emax - mbits - 1), and the floor-rule clamp, 2^(emax + 1) - max_normal, times the block scale."""
    half_ulp = 2.0 ** (fmt.emax - fmt.mbits - 1)
    clamp = 2.0 ** (fmt.emax + 1) - fmt.max_normal
    return max(half_ulp, clamp) * 2.0 ** (scales.astype(np.float64) - 127)


finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 80)), elements=finite32),
    name=st.sampled_from(ALL_FORMATS),
    block_size=st.sampled_from([8, 32]),
)
def test_error_bound_and_idempotence(x, name, block_size):
    fmt = get_format(name)
    mx = quantize(x, fmt, block_size=block_size)
    out = mx.dequantize(np.float64)
    pad = -x.shape[1] % block_size
    err = np.abs(np.pad(out - x.astype(np.float64), ((0, 0), (0, pad)))).reshape(x.shape[0], -1, block_size)
    assert np.all(err.max(axis=-1) <= block_error_bound(fmt, mx.scales))
    again = quantize(mx.dequantize(), fmt, block_size=block_size)
    assert again == mx


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_bytes_round_trip(name, rng):
    mx = quantize(rng.standard_normal((3, 5, 70)).astype(np.float32), name, axis=1)
    again = MXTensor.from_bytes(mx.to_bytes())
    assert again == mx
    np.testing.assert_array_equal(again.dequantize(), mx.dequantize())


def test_bytes_validation(rng):
    data = quantize(rng.standard_normal((4, 64)).astype(np.float32), "mxfp6").to_bytes()
    with pytest.raises(FormatError, match=r"truncated|checksum"):
        MXTensor.from_bytes(data[:-10], name="w")
    with pytest.raises(FormatError, match="truncated"):
        MXTensor.from_bytes(data[:6], name="w")
    with pytest.raises(FormatError, match="magic"):
        MXTensor.from_bytes(b"XXXX" + data[4:], name="w")
    corrupted = bytearray(data)
    corrupted[40] ^= 0x10
    with pytest.raises(FormatError, match="'w': checksum"):
        MXTensor.from_bytes(bytes(corrupted), name="w")


def test_bad_inputs_name_the_problem():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(FormatError, match=r"'w'.*int64.*allowed"):
        quantize(np.ones((4, 64), np.int64), "mxfp6", name="w")
    with pytest.raises(FormatError, match="complex"):
        quantize(np.ones(4, np.complex64), "mxfp6")
    with pytest.raises(FormatError, match="bool"):
        quantize(np.ones(4, bool), "mxfp6")
    with pytest.raises(FormatError, match="known formats"):
        quantize(x, "mxfp7")
    with pytest.raises(FormatError, match="'w': axis 2 out of range"):
        quantize(x, "mxfp6", axis=2, name="w")
    with pytest.raises(FormatError, match="axis -3"):
        quantize(x, "mxfp6", axis=-3)
    for bad in (0, -32, 2.5, True):
        with pytest.raises(FormatError, match=r"block_size must be an int in 1\.\.65536"):
            quantize(x, "mxfp6", block_size=bad)
    with pytest.raises(FormatError, match="0-d"):
        quantize(np.float32(1.0), "mxfp6")
    mx = quantize(x, "mxfp6")
    with pytest.raises(FormatError, match="scales shape"):
        MXTensor(mx.fmt, (4, 96), 1, 32, mx.codes, mx.scales, name="w")
    with pytest.raises(FormatError, match="codes must be 1-D with"):
        MXTensor(mx.fmt, mx.shape, 1, 32, mx.codes[:-1], mx.scales)


@pytest.mark.parametrize(("shape", "axis"), [((4, 64), -1), ((4, 70), -1), ((64, 4), 0)])
def test_dequantize_into_out(shape, axis, rng):
    mx = quantize(rng.standard_normal(shape).astype(np.float32), "mxfp6", axis=axis)
    out = np.full(shape, np.nan, np.float32)
    assert mx.dequantize(out=out) is out
    np.testing.assert_array_equal(out, mx.dequantize())
    with pytest.raises(FormatError, match="out must be"):
        mx.dequantize(out=np.empty((1, 2), np.float32))
