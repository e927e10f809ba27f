"""Element encode / decode: a float (already divided by the block scale) to an element code and back.

Encoding follows OCP MX v1.0 §6.3: round to nearest, ties to even, saturating to ±max_normal; subnormals are kept.
It is exact arithmetic in the input's float type (float32 or float64): dividing by a power of two is exact, and
``np.rint`` rounds half to even, so the result is bit-exact (it matches ml_dtypes' casts inside the range).

The code of a float element is computed without a table: with e = max(floor(log2|v|), emin) and
k = rint(|v| / 2^(e - mbits)), the magnitude code is ((e + bias - 1) << mbits) + k. That one formula covers
subnormals (e = emin gives exponent field 0), normals, and a round-up that carries into the next binade.
"""

from __future__ import annotations

import numpy as np

from accel.errors import FormatError
from accel.formats.elements import ElementFormat, get_format


def encode_elements(v: np.ndarray, fmt: ElementFormat | str) -> np.ndarray:
    """Element codes (uint8) of the real array ``v``: RNE, saturating to ±max_normal.

    ``fmt`` is an ElementFormat or a format name (``"mxfp6"``). float32 and float64 are encoded as they are; other
    real dtypes (float16, bfloat16, integers, bool) are widened to float32 first. NaN elements get code 0 (the caller
    marks their block with a NaN scale, so the element code is never read); ±Inf saturate to ±max_normal. The sign
    of zero is kept for float formats (-0 has the sign bit set), as ml_dtypes.
    """
    fmt = get_format(fmt)
    v = _real_array(v)
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float32)
    if v.dtype == np.float32 and not fmt.is_int:
        return _encode_float32(v, fmt)
    sign = np.signbit(v)
    a = np.abs(v)
    np.minimum(a, a.dtype.type(fmt.max_normal), out=a)  # saturation (NaN propagates, handled below)
    nan = np.isnan(a)
    if fmt.is_int:
        k = np.rint(np.ldexp(a, fmt.mbits))  # |v| * 64, exact; <= 127 after saturation
        k[nan] = 0
        k = k.astype(np.int16)
        return np.where(sign, -k, k).astype(np.uint8)
    _, e2 = np.frexp(a)  # a = m * 2^e2, m in [0.5, 1): floor(log2 a) = e2 - 1 (a > 0)
    e = np.maximum(e2 - 1, fmt.emin).astype(np.int32)
    k = np.rint(np.ldexp(a, fmt.mbits - e))  # exact scaling by a power of two, then RNE
    k[nan] = 0
    code = ((e + (fmt.bias - 1)) << fmt.mbits) + k.astype(np.int32)
    code[a == 0] = 0
    code |= sign.astype(np.int32) << (fmt.bits - 1)
    code[nan] = 0
    return code.astype(np.uint8)


def _encode_float32(v: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """The float32 fast path of ``encode_elements`` (same result; in-place integer work on the float bits).

    floor(log2 a) comes from the float32 exponent field: exact for normals; subnormals and 0 read as -127 and are
    lifted to emin by the max, which is what they need. 2^(mbits - e) is built from its bits (a normal float32 for
    every e in [emin, emax]), so ``a * 2^(mbits - e)`` is an exact power-of-two scaling before ``rint``.
    """
    bits = np.ascontiguousarray(v).view(np.int32)
    a = (bits & 0x7FFFFFFF).view(np.float32)  # |v|, NaN stays NaN
    np.minimum(a, np.float32(fmt.max_normal), out=a)  # saturation (±Inf too); NaN propagates
    e = a.view(np.int32) >> 23  # biased exponent field: 255 only for NaN now
    nan = (a != a) if e.size and e.max() == 255 else None
    if nan is not None:
        a[nan] = 0
        e[nan] = 0
    np.maximum(e, 127 + fmt.emin, out=e)
    k = np.subtract(254 + fmt.mbits, e)
    k <<= 23  # bits of 2^(mbits - (e - 127))
    np.multiply(a, k.view(np.float32), out=a)
    np.rint(a, out=a)
    e += fmt.bias - 1 - 127
    e <<= fmt.mbits
    code = np.add(e, a.astype(np.int32), out=e)  # a == 0: e = emin gives ((emin + bias - 1) << m) + 0 = 0
    code |= (bits >> 31) & (1 << (fmt.bits - 1))  # sign bit (arithmetic shift: -1 for negatives)
    if nan is not None:
        code[nan] = 0
    return code.astype(np.uint8)


def _real_array(v) -> np.ndarray:
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as exc:
        raise FormatError(f"cannot encode {type(v).__name__}: not an array of numbers ({exc})") from exc
    if a.dtype.kind not in "fiub" and a.dtype.name != "bfloat16":
        raise FormatError(f"cannot encode elements of dtype {a.dtype}; allowed: real numbers (float, int, bool)")
    return a


def decode_elements(codes: np.ndarray, fmt: ElementFormat | str) -> np.ndarray:
    """Float32 value of each element code (a table look-up); ``codes`` are integers in ``[0, 2**fmt.bits)``."""
    fmt = get_format(fmt)
    try:
        c = np.asarray(codes)
    except (ValueError, TypeError) as exc:
        raise FormatError(f"cannot decode {type(codes).__name__}: not an array of codes ({exc})") from exc
    if c.dtype.kind not in "iu":
        raise FormatError(f"element codes must be integers, got dtype {c.dtype}")
    if c.size and (int(c.min()) < 0 or int(c.max()) >= 1 << fmt.bits):
        raise FormatError(
            f"element codes of {fmt.name} must be in [0, {1 << fmt.bits}); got min {int(c.min())}, max {int(c.max())}"
        )
    return fmt.code_values()[c.astype(np.intp, copy=False)]
