"""Shared block scales in E8M0 (OCP MX v1.0 §5.4.1, §6.3).

The floor rule: ``e = floor(log2(amax)) - emax_elem``, clamped to [-127, 127]; the scale code is ``e + 127``.
An all-zero block gets the smallest scale (code 0, 2^-127). A block holding a NaN or ±Inf gets the NaN scale 0xFF:
the spec computes X from amax, and for amax = NaN or Inf no power of two exists, so the block decodes to NaN
(accel's choice: an Inf is never silently turned into a finite number).

floor(log2(amax)) is taken from ``np.frexp`` (exact for every normal and subnormal float), never from ml_dtypes'
float8_e8m0fnu cast, which rounds to the nearest power of two (docs/reference.md §1).

The clamp at 2^-127 only flushes tiny blocks towards zero. The clamp at 2^127 would silently saturate a block whose
amax is at least 2^(128 + emax) (possible only for float64 input: float32 stops below 2^128), so such a block is an
error (``FormatError``) rather than a wrong value.
"""

from __future__ import annotations

import numpy as np

from accel.errors import FormatError
from accel.formats.constants import E8M0_BIAS, E8M0_MAX_EXP, E8M0_MIN_EXP, E8M0_NAN
from accel.formats.elements import ElementFormat, get_format


def block_scale_codes(blocks: np.ndarray, fmt: ElementFormat | str, name: str | None = None) -> np.ndarray:
    """E8M0 scale code (uint8) of each block; ``blocks`` (float) has the block elements on the last axis.

    ``name`` labels errors (a block beyond the E8M0 range, see the module docstring)."""
    fmt = get_format(fmt)
    blocks = np.asarray(blocks)
    if blocks.ndim == 0 or blocks.dtype.kind != "f":
        raise FormatError(
            f"blocks must be a float array with the block on the last axis; got {blocks.dtype} of shape {blocks.shape}"
        )
    if not blocks.shape[-1]:
        return np.zeros(blocks.shape[:-1], np.uint8)
    if blocks.dtype == np.float32:
        # the bits of |x| order like |x| (NaN > Inf > finite), and an int max is ~3x faster than a float max
        amax_bits = np.max(np.ascontiguousarray(blocks).view(np.int32) & 0x7FFFFFFF, axis=-1)
        return _scale_codes_from_float32_bits(amax_bits, fmt)
    return scale_codes_from_amax(np.max(np.abs(blocks), axis=-1), fmt, name)


def _scale_codes_from_float32_bits(amax_bits: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """The floor rule on float32 bit patterns of amax: floor(log2 amax) is the exponent field - 127 for normals; a
    subnormal amax reads as -127, which clamps to the same code 0 that its true exponent (< -126) gives."""
    field = amax_bits >> 23
    codes = np.clip(field - fmt.emax, E8M0_BIAS + E8M0_MIN_EXP, E8M0_BIAS + E8M0_MAX_EXP).astype(np.uint8)
    codes[amax_bits == 0] = 0
    codes[field == 0xFF] = E8M0_NAN  # Inf or NaN
    return codes


def scale_codes_from_amax(amax: np.ndarray, fmt: ElementFormat | str, name: str | None = None) -> np.ndarray:
    """E8M0 scale codes from block absolute maxima by the floor rule (NaN/Inf amax -> 0xFF, zero -> 0).

    FormatError when a finite amax needs a scale above 2^127 (see the module docstring).
    """
    fmt = get_format(fmt)
    amax = np.asarray(amax)
    if amax.dtype.kind != "f":
        raise FormatError(f"amax must be a float array, got dtype {amax.dtype}")
    _, e2 = np.frexp(amax)  # amax = m * 2^e2, m in [0.5, 1) => floor(log2 amax) = e2 - 1
    e = e2.astype(np.int32) - 1 - fmt.emax
    check_scale_range(e, np.isfinite(amax), fmt, name)
    e = np.clip(e, E8M0_MIN_EXP, E8M0_MAX_EXP)
    codes = (e + E8M0_BIAS).astype(np.uint8)
    codes[amax == 0] = 0
    codes[~np.isfinite(amax)] = E8M0_NAN
    return codes


def check_scale_range(exponents: np.ndarray, finite: np.ndarray, fmt: ElementFormat, name: str | None = None) -> None:
    """FormatError if a finite block needs a scale exponent above E8M0's 127 (it would saturate silently)."""
    over = finite & (exponents > E8M0_MAX_EXP)
    if np.any(over):
        top = E8M0_MAX_EXP + 1 + fmt.emax
        label = f"tensor {name!r}: " if name else ""
        raise FormatError(
            f"{label}{int(np.count_nonzero(over))} block(s) hold values of magnitude >= 2^{top} ({2.0**top:.3g}), "
            f"beyond the range of {fmt.name} (E8M0 scales stop at 2^127): they would saturate silently; "
            "scale the tensor down first"
        )


def scale_exponents(codes: np.ndarray) -> np.ndarray:
    """Unbiased exponent (int32) of each E8M0 code; meaningless for the NaN code 0xFF."""
    return codes.astype(np.int32) - E8M0_BIAS


def scale_values(dtype: type = np.float32) -> np.ndarray:
    """Value of every E8M0 code 0..255 in ``dtype``: 2^(code - 127), NaN for 0xFF."""
    table = np.ldexp(np.ones(256, dtype=np.float64), np.arange(256) - E8M0_BIAS)
    table[E8M0_NAN] = np.nan
    return table.astype(dtype)
