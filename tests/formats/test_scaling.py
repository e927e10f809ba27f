"""E8M0 block scales: the floor rule of OCP MX v1.0 §6.3, recomputed independently here with math.log2."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accel.formats import block_scale_codes, get_format, quantize, scale_codes_from_amax
from tests.helpers.formats import ALL_FORMATS


def floor_rule(amax: float, emax: int) -> int:
    """Reference: 0xFF for NaN/Inf, 0 for an all-zero block, else clamp(floor(log2 amax) - emax, -127, 127) + 127."""
    if math.isnan(amax) or math.isinf(amax):
        return 0xFF
    if amax == 0:
        return 0
    e = math.floor(math.log2(amax))
    # log2 of a float64 near a power of two: check the floor by exact powers, so the reference cannot be off by one
    while 2.0**e > amax:
        e -= 1
    while 2.0 ** (e + 1) <= amax:
        e += 1
    return min(max(e - emax, -127), 127) + 127


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_scale_codes_follow_floor_rule(name, rng):
    fmt = get_format(name)
    powers = np.ldexp(1.0, np.arange(-149, 128)).astype(np.float32)
    below = np.nextafter(powers, np.float32(0))
    amax = np.concatenate(
        [
            np.abs(rng.standard_normal(2000)).astype(np.float32)
            * 10.0 ** rng.uniform(-40, 38, 2000).astype(np.float32),
            powers,
            below[below > 0],
            [0.0, np.inf, np.nan, np.float32(3.4e38), 1e-45],
        ]
    ).astype(np.float32)
    ours = scale_codes_from_amax(amax, fmt)
    ref = np.array([floor_rule(float(a), fmt.emax) for a in amax], np.uint8)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_block_scales_of_quantize(name, rng):
    fmt = get_format(name)
    x = (rng.standard_normal((8, 96)) * np.exp2(rng.integers(-30, 30, (8, 1)))).astype(np.float32)
    x[3, 32:64] = 0.0  # an all-zero block
    mx = quantize(x, fmt)
    amax = np.abs(x).reshape(8, 3, 32).max(axis=-1)
    ref = np.array([[floor_rule(float(a), fmt.emax) for a in row] for row in amax], np.uint8)
    np.testing.assert_array_equal(mx.scales, ref)
    assert mx.scales[3, 1] == 0  # all-zero block -> smallest scale
    assert np.all(mx.dequantize()[3, 32:64] == 0)


def test_tiny_blocks_clamp_to_smallest_scale():
    """float32 subnormals: floor(log2 amax) - emax < -127 clamps to the scale 2^-127; elements then lose bits."""
    fmt = get_format("mxfp6_e2m3")
    x = np.full(32, 2.0**-140, np.float32)
    mx = quantize(x, fmt)
    assert mx.scales[0] == 0
    # 2^-140 / 2^-127 = 2^-13 is below E2M3's min subnormal 0.125 and rounds to zero
    assert np.all(mx.dequantize() == 0)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_float32_bit_path_equals_float_path(name, rng):
    """block_scale_codes reads float32 bit patterns; it must agree with the float floor rule on every kind of amax."""
    fmt = get_format(name)
    special = np.array(
        [
            0.0,
            -0.0,
            1e-45,
            2.0**-126,
            np.nextafter(np.float32(2.0**-126), 0),
            3.4e38,
            np.inf,
            -np.inf,
            np.nan,
            1.0,
            np.nextafter(np.float32(1), 0),
        ],
        np.float32,
    )
    blocks = (rng.standard_normal((400, 32)) * np.exp2(rng.integers(-149, 127, (400, 1)))).astype(np.float32)
    blocks[: special.size, 7] = special
    blocks[: special.size, :7] = 0
    blocks[: special.size, 8:] = 0
    np.testing.assert_array_equal(
        block_scale_codes(blocks, fmt), scale_codes_from_amax(np.max(np.abs(blocks.astype(np.float64)), axis=-1), fmt)
    )
