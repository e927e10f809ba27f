"""Shared block scales in E8M0 (OCP MX v1.0 §5.4.1, §6.3).

The floor rule: ``e = floor(log2(amax)) - emax_elem``, clamped to [-127, 127]; the scale code is ``e + 127``.
An all-zero block gets the smallest scale (code 0, 2^-127). A block holding a NaN or ±Inf gets the NaN scale 0xFF:
the spec computes X from amax, and for amax = NaN or Inf no power of two exists, so the block decodes to NaN
(accel's choice: an Inf is never silently turned into a finite number).

floor(log2(amax)) is taken from ``np.frexp`` (exact for every normal and subnormal float), never from ml_dtypes'
float8_e8m0fnu cast, which rounds to the nearest power of two (docs/reference.md §1).
"""

from __future__ import annotations

import numpy as np

from accel.formats.constants import E8M0_BIAS, E8M0_MAX_EXP, E8M0_MIN_EXP, E8M0_NAN
from accel.formats.elements import ElementFormat


def block_scale_codes(blocks: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """E8M0 scale code (uint8) of each block; ``blocks`` has the block elements on the last axis."""
    if not blocks.shape[-1]:
        return np.zeros(blocks.shape[:-1], np.uint8)
    if blocks.dtype == np.float32:
        # the bits of |x| order like |x| (NaN > Inf > finite), and an int max is ~3x faster than a float max
        amax_bits = np.max(np.ascontiguousarray(blocks).view(np.int32) & 0x7FFFFFFF, axis=-1)
        return _scale_codes_from_float32_bits(amax_bits, fmt)
    return scale_codes_from_amax(np.max(np.abs(blocks), axis=-1), fmt)


def _scale_codes_from_float32_bits(amax_bits: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """The floor rule on float32 bit patterns of amax: floor(log2 amax) is the exponent field - 127 for normals; a
    subnormal amax reads as -127, which clamps to the same code 0 that its true exponent (< -126) gives."""
    field = amax_bits >> 23
    codes = np.clip(field - fmt.emax, E8M0_BIAS + E8M0_MIN_EXP, E8M0_BIAS + E8M0_MAX_EXP).astype(np.uint8)
    codes[amax_bits == 0] = 0
    codes[field == 0xFF] = E8M0_NAN  # Inf or NaN
    return codes


def scale_codes_from_amax(amax: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """E8M0 scale codes from block absolute maxima by the floor rule (NaN/Inf amax -> 0xFF, zero -> 0)."""
    amax = np.asarray(amax)
    _, e2 = np.frexp(amax)  # amax = m * 2^e2, m in [0.5, 1) => floor(log2 amax) = e2 - 1
    e = np.clip(e2.astype(np.int32) - 1 - fmt.emax, E8M0_MIN_EXP, E8M0_MAX_EXP)
    codes = (e + E8M0_BIAS).astype(np.uint8)
    codes[amax == 0] = 0
    codes[~np.isfinite(amax)] = E8M0_NAN
    return codes


def scale_exponents(codes: np.ndarray) -> np.ndarray:
    """Unbiased exponent (int32) of each E8M0 code; meaningless for the NaN code 0xFF."""
    return codes.astype(np.int32) - E8M0_BIAS


def scale_values(dtype: type = np.float32) -> np.ndarray:
    """Value of every E8M0 code 0..255 in ``dtype``: 2^(code - 127), NaN for 0xFF."""
    table = np.ldexp(np.ones(256, dtype=np.float64), np.arange(256) - E8M0_BIAS)
    table[E8M0_NAN] = np.nan
    return table.astype(dtype)
