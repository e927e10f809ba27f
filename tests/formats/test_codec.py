"""Element encoding: exactness on representable values, ties to even, saturation, agreement with ml_dtypes casts."""

from __future__ import annotations

import numpy as np
import pytest

from accel.formats import decode_elements, encode_elements, get_format, quantize
from tests.helpers.formats import ALL_FORMATS, FLOAT_FORMATS, ml_dtype


def finite_codes(name: str) -> np.ndarray:
    """Every code with a finite value (MXINT8: without -2, which saturation to ±127/64 never produces)."""
    fmt = get_format(name)
    table = fmt.code_values()
    codes = np.arange(1 << fmt.bits)[np.isfinite(table)]
    if fmt.is_int:
        codes = codes[codes != 0x80]
    return codes.astype(np.uint8)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_encode_every_representable_value_is_exact(name):
    fmt = get_format(name)
    codes = finite_codes(name)
    values = fmt.code_values()[codes]
    got = encode_elements(values, fmt)
    # -0 and +0 both encode to their own code for float formats; MXINT8 has a single zero
    np.testing.assert_array_equal(got, codes)
    np.testing.assert_array_equal(decode_elements(got, fmt), values)


@pytest.mark.parametrize("name", ALL_FORMATS)
@pytest.mark.parametrize("k", [-127, -20, -1, 0, 3, 40, 100])
def test_quantize_representable_values_times_scale_is_exact(name, k):
    """A block whose first element is max_normal * 2^k gets scale 2^k, so every code * 2^k survives exactly."""
    fmt = get_format(name)
    codes = finite_codes(name)
    values = fmt.code_values()[codes].astype(np.float64)
    n = len(values)
    blocks = np.empty((n, 32))
    blocks[:, 0] = fmt.max_normal
    blocks[:, 1:] = values[:, None]
    x = np.ldexp(blocks, k)
    mx = quantize(x, fmt)
    assert np.all(mx.scales == k + 127)
    np.testing.assert_array_equal(mx.unpacked_codes()[:, 0, 1], codes)
    np.testing.assert_array_equal(mx.dequantize(np.float64), x)


def tie_points(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Midpoints between consecutive non-negative representable values, and the even code each must round to."""
    fmt = get_format(name)
    codes = finite_codes(name)
    table = fmt.code_values()
    pos = np.array(sorted((c for c in codes if table[c] >= 0 and not np.signbit(table[c])), key=lambda c: table[c]))
    lo, hi = pos[:-1], pos[1:]
    mids = (table[lo].astype(np.float64) + table[hi]) / 2
    even = np.where(lo % 2 == 0, lo, hi)
    return mids, even.astype(np.uint8)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_ties_round_to_even(name):
    fmt = get_format(name)
    mids, even = tie_points(name)
    np.testing.assert_array_equal(encode_elements(mids.astype(np.float32), fmt), even)
    # and negated: the magnitude rounds the same way, with the sign bit (two's complement for MXINT8)
    neg = encode_elements(-mids.astype(np.float32), fmt)
    expected_neg = (-even.astype(np.int16)).astype(np.uint8) if fmt.is_int else even | (1 << (fmt.bits - 1))
    np.testing.assert_array_equal(neg, expected_neg)
    # just above / below a midpoint rounds away from / towards the lower neighbour
    up = encode_elements(np.nextafter(mids, np.inf), fmt)
    np.testing.assert_array_equal(up, _upper_neighbour(name, mids))
    down = encode_elements(np.nextafter(mids, 0), fmt)
    np.testing.assert_array_equal(decode_elements(down, fmt) < mids, True)


def _upper_neighbour(name: str, mids: np.ndarray) -> list[int]:
    fmt = get_format(name)
    table = fmt.code_values()
    codes = [c for c in finite_codes(name) if table[c] >= 0 and not np.signbit(table[c])]
    return np.array([min((c for c in codes if table[c] > m), key=lambda c: table[c]) for m in mids], np.uint8)


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_saturation(name):
    fmt = get_format(name)
    big = np.array([fmt.max_normal * 1.01, fmt.max_normal * 1000, np.inf, -np.inf, -fmt.max_normal * 3], np.float32)
    vals = decode_elements(encode_elements(big, fmt), fmt)
    np.testing.assert_array_equal(
        vals, [fmt.max_normal, fmt.max_normal, fmt.max_normal, -fmt.max_normal, -fmt.max_normal]
    )


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_agrees_with_ml_dtypes_in_range(name, rng):
    """Bit-exact with ml_dtypes' RNE cast on random, tie, subnormal and boundary inputs within ±max_normal."""
    fmt = get_format(name)
    dt = ml_dtype(name)
    mids, _ = tie_points(name)
    table = fmt.code_values()
    finite = table[np.isfinite(table)]
    random = rng.standard_normal(20000) * fmt.max_normal / 4
    log_uniform = np.exp2(rng.uniform(np.log2(fmt.min_subnormal) - 3, np.log2(fmt.max_normal), 20000))
    log_uniform *= rng.choice([-1, 1], 20000)
    adversarial = np.concatenate(
        [
            mids,
            -mids,
            np.nextafter(mids, 0),
            np.nextafter(mids, np.inf),
            finite,
            [0.0, -0.0, fmt.min_subnormal / 2, fmt.min_subnormal / 2 * 1.0001, 1e-30],
        ]
    )
    x = np.concatenate([random, log_uniform, adversarial]).astype(np.float32)
    x = x[np.abs(x) <= fmt.max_normal]
    ours = encode_elements(x, fmt)
    theirs = x.astype(dt).view(np.uint8)
    bad = np.flatnonzero(ours != theirs)
    assert bad.size == 0, f"{bad.size} mismatches, first {x[bad[:5]]}: ours {ours[bad[:5]]} theirs {theirs[bad[:5]]}"


@pytest.mark.parametrize("name", ["mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_e2m1"])
def test_ml_dtypes_traps_differ_from_mx(name):
    """ml_dtypes' FP6/FP4 casts silently map NaN to -0 and ±Inf to ±max (docs/reference.md §1). accel does not: a block
    holding NaN or Inf gets the NaN scale 0xFF and decodes to NaN."""
    fmt = get_format(name)
    dt = ml_dtype(name)
    specials = np.array([np.nan, np.inf, -np.inf], np.float32)
    theirs = specials.astype(dt).astype(np.float32)
    assert theirs[0] == 0 and np.signbit(theirs[0])  # NaN -> -0
    assert list(theirs[1:]) == [fmt.max_normal, -fmt.max_normal]  # Inf -> ±max
    for value in specials:
        block = np.ones(32, np.float32)
        block[5] = value
        mx = quantize(block, fmt)
        assert mx.scales[0] == 0xFF
        assert np.all(np.isnan(mx.dequantize()))


@pytest.mark.parametrize("name", ALL_FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_elements_get_code_zero(name, dtype):
    """NaN elements get code 0 whatever their sign bit (their block gets the NaN scale, see test_scaling)."""
    x = np.array([np.nan, -np.nan, 1.0], dtype)
    np.testing.assert_array_equal(encode_elements(x, get_format(name))[:2], [0, 0])


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_float64_path_equals_float32_path(name, rng):
    """The generic (frexp/ldexp) path used for float64 input gives the same codes as the float32 bit path."""
    fmt = get_format(name)
    x = (rng.standard_normal(5000) * fmt.max_normal / 3).astype(np.float32)
    x = np.concatenate([x, np.float32(2.0**-149) * np.arange(5), [0.0, -0.0, np.inf, -np.inf]]).astype(np.float32)
    np.testing.assert_array_equal(encode_elements(x, fmt), encode_elements(x.astype(np.float64), fmt))
