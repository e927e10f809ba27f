"""Element code tables against the spec (docs/reference.md §1, OCP MX v1.0 §5.3) and against ml_dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats import ALIASES, FORMATS, get_format
from tests.helpers.formats import ALL_FORMATS, FLOAT_FORMATS, ml_dtype

SPEC = {
    "mxfp8_e5m2": (57344.0, 2.0**-14, 2.0**-16),
    "mxfp8_e4m3": (448.0, 2.0**-6, 2.0**-9),
    "mxfp6_e3m2": (28.0, 0.25, 0.0625),
    "mxfp6_e2m3": (7.5, 1.0, 0.125),
    "mxfp4_e2m1": (6.0, 1.0, 0.5),
}
# OCP MX v1.0 §5.3.3: the eight FP4 E2M1 magnitudes
FP4_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def formula_decode(code: int, bits: int, ebits: int, mbits: int, bias: int) -> float:
    """Independent decode: (-1)^S * 2^(E - bias) * 1.M for E > 0, (-1)^S * 2^(1 - bias) * 0.M for E = 0."""
    s = (code >> (ebits + mbits)) & 1
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    frac = m / (1 << mbits)
    mag = 2.0 ** (1 - bias) * frac if e == 0 else 2.0 ** (e - bias) * (1 + frac)
    return -mag if s else mag


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_code_values_match_formula_and_spec_extremes(name):
    fmt = get_format(name)
    table = fmt.code_values()
    assert table.dtype == np.float32 and table.shape == (1 << fmt.bits,)
    for code, value in enumerate(table):
        expected = formula_decode(code, fmt.bits, fmt.ebits, fmt.mbits, fmt.bias)
        e_all_ones = (code >> fmt.mbits) & ((1 << fmt.ebits) - 1) == (1 << fmt.ebits) - 1
        mant = code & ((1 << fmt.mbits) - 1)
        if name == "mxfp8_e5m2" and e_all_ones:  # IEEE-like: Inf for M = 0, NaN otherwise
            assert np.isinf(value) if mant == 0 else np.isnan(value), code
        elif name == "mxfp8_e4m3" and e_all_ones and mant == 7:  # S.1111.111 is NaN
            assert np.isnan(value), code
        else:
            assert value == expected, (code, value, expected)
    max_normal, min_normal, min_sub = SPEC[name]
    finite = table[np.isfinite(table)]
    assert finite.max() == max_normal == fmt.max_normal
    assert finite.min() == -max_normal
    positive = finite[finite > 0]
    assert positive.min() == min_sub == fmt.min_subnormal
    assert fmt.min_normal == min_normal == 2.0 ** (1 - fmt.bias)
    assert 2.0**fmt.emax <= fmt.max_normal < 2.0 ** (fmt.emax + 1)


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_code_values_match_ml_dtypes(name):
    dt = ml_dtype(name)
    fmt = get_format(name)
    theirs = np.arange(1 << fmt.bits, dtype=np.uint8).view(dt).astype(np.float32)
    ours = fmt.code_values()
    np.testing.assert_array_equal(ours, theirs)  # NaNs in the same places, -0 vs +0 compared below
    finite = ~np.isnan(ours)
    assert np.array_equal(np.signbit(ours[finite]), np.signbit(theirs[finite]))  # the sign of NaN carries nothing


def test_fp4_table_is_the_spec_table():
    table = get_format("mxfp4").code_values()
    assert list(table[:8]) == FP4_MAGNITUDES
    assert list(table[8:]) == [-v for v in FP4_MAGNITUDES]
    assert np.signbit(table[8])  # code 0b1000 is -0


def test_mxint8_table():
    fmt = get_format("mxint8")
    table = fmt.code_values()
    # two's complement with an implicit scale 2^-6 (OCP MX v1.0 §5.3.4): -2 .. 127/64
    assert table[0x7F] == 127 / 64 == fmt.max_normal
    assert table[0x80] == -2.0
    assert table[0xFF] == -1 / 64
    assert np.all(np.diff(table[:128]) == 1 / 64)


def test_aliases_and_lookup():
    assert get_format("mxfp4") is FORMATS["mxfp4_e2m1"]
    assert get_format("mxfp8") is FORMATS["mxfp8_e4m3"]
    assert get_format("MXFP6_E3M2") is FORMATS["mxfp6_e3m2"]
    assert get_format("mxfp6").name == ALIASES["mxfp6"]
    assert get_format(FORMATS["mxint8"]) is FORMATS["mxint8"]


def test_unknown_format_lists_known_names():
    with pytest.raises(FormatError) as err:
        get_format("mxfp5")
    for name in [*ALL_FORMATS, "mxfp6"]:
        assert name in str(err.value)
    with pytest.raises(FormatError):
        get_format(6)  # type: ignore[arg-type]


def test_formats_are_frozen():
    with pytest.raises(AttributeError):
        FORMATS["mxfp4_e2m1"].bits = 5  # type: ignore[misc]
    table = FORMATS["mxfp4_e2m1"].code_values()
    with pytest.raises(ValueError):
        table[0] = 1.0
