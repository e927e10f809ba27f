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

from accel.formats.elements import ElementFormat


def encode_elements(v: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """Element codes (uint8) of the float array ``v``: RNE, saturating to ±max_normal.

    NaN elements get code 0 (the caller marks their block with a NaN scale, so the element code is never read);
    ±Inf saturate to ±max_normal. The sign of zero is kept for float formats (-0 has the sign bit set), as ml_dtypes.
    """
    v = np.asarray(v)
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float32)
    ftype = v.dtype.type
    sign = np.signbit(v)
    a = np.abs(v)
    np.minimum(a, ftype(fmt.max_normal), out=a)  # saturation (NaN propagates, handled below)
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
    code[nan] = 0
    code |= sign.astype(np.int32) << (fmt.bits - 1)
    code[nan] = 0
    return code.astype(np.uint8)


def decode_elements(codes: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """Float32 value of each element code (a table look-up)."""
    return fmt.code_values()[np.asarray(codes, dtype=np.uint8)]
