"""Element formats of OCP Microscaling v1.0 (§5.3): frozen descriptions and the value of every code.

| element | bias | emax | max normal | min normal | min subnormal | Inf/NaN |      (docs/reference.md §1)
| FP8 E5M2 | 15 | 15 | 57344 | 2^-14 | 2^-16 | IEEE-like |
| FP8 E4M3 | 7 | 8 | 448 | 2^-6 | 2^-9 | NaN only (S.1111.111) |
| FP6 E3M2 | 3 | 4 | 28 | 0.25 | 0.0625 | none |
| FP6 E2M3 | 1 | 2 | 7.5 | 1.0 | 0.125 | none |
| FP4 E2M1 | 1 | 2 | 6 | 1.0 | 0.5 | none |
| INT8 | - | 0 | 127/64 (two's complement with an implicit scale 2^-6) | - | - | - |
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from accel.errors import FormatError


@dataclass(frozen=True)
class ElementFormat:
    """One MX element type.

    ``special`` says how the top codes are used: ``"ieee"`` (E5M2: exponent all ones = Inf / NaN), ``"fn"`` (E4M3:
    S.1111.111 = NaN, no Inf), ``"none"`` (FP6/FP4: every code is a finite number), ``"int"`` (MXINT8: two's
    complement integer times 2^-mbits). For MXINT8 ``min_normal`` and ``min_subnormal`` are both 2^-6, the step.
    """

    name: str
    bits: int
    ebits: int
    mbits: int
    bias: int
    emax: int
    max_normal: float
    min_normal: float
    min_subnormal: float
    special: str

    @property
    def is_int(self) -> bool:
        return self.special == "int"

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (1 - bias); subnormals share it."""
        return 1 - self.bias

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element with the default block of 32: element bits + 8 scale bits / 32."""
        return self.bits + 8 / 32

    def code_values(self) -> np.ndarray:
        """Float32 value of every code 0 .. 2**bits - 1 (NaN codes give NaN, E5M2 Inf codes give ±Inf).

        The returned array is read-only and shared; copy it before changing it.
        """
        return _code_values(self)


def _decode_code(fmt: ElementFormat, code: int) -> float:
    """Value of one code by the OCP MX v1.0 §5.3 formulas (float64, exact)."""
    if fmt.is_int:
        signed = code - 256 if code >= 128 else code
        return signed * 2.0**-fmt.mbits
    sign = -1.0 if code >> (fmt.bits - 1) else 1.0
    e_field = (code >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mant = code & ((1 << fmt.mbits) - 1)
    e_all_ones = e_field == (1 << fmt.ebits) - 1
    if fmt.special == "ieee" and e_all_ones:
        return sign * np.inf if mant == 0 else np.nan
    if fmt.special == "fn" and e_all_ones and mant == (1 << fmt.mbits) - 1:
        return np.nan
    if e_field == 0:  # subnormal: 0.m * 2^(1 - bias)
        return sign * mant * 2.0 ** (fmt.emin - fmt.mbits)
    return sign * (1.0 + mant / 2.0**fmt.mbits) * 2.0 ** (e_field - fmt.bias)


@functools.cache
def _code_values(fmt: ElementFormat) -> np.ndarray:
    table = np.array([_decode_code(fmt, c) for c in range(1 << fmt.bits)], dtype=np.float32)
    table.setflags(write=False)
    return table


MXFP8_E4M3 = ElementFormat("mxfp8_e4m3", 8, 4, 3, 7, 8, 448.0, 2.0**-6, 2.0**-9, "fn")
MXFP8_E5M2 = ElementFormat("mxfp8_e5m2", 8, 5, 2, 15, 15, 57344.0, 2.0**-14, 2.0**-16, "ieee")
MXFP6_E3M2 = ElementFormat("mxfp6_e3m2", 6, 3, 2, 3, 4, 28.0, 0.25, 0.0625, "none")
MXFP6_E2M3 = ElementFormat("mxfp6_e2m3", 6, 2, 3, 1, 2, 7.5, 1.0, 0.125, "none")
MXFP4_E2M1 = ElementFormat("mxfp4_e2m1", 4, 2, 1, 1, 2, 6.0, 1.0, 0.5, "none")
MXINT8 = ElementFormat("mxint8", 8, 0, 6, 0, 0, 127 / 64, 2.0**-6, 2.0**-6, "int")

FORMATS: dict[str, ElementFormat] = {
    f.name: f for f in (MXFP8_E4M3, MXFP8_E5M2, MXFP6_E3M2, MXFP6_E2M3, MXFP4_E2M1, MXINT8)
}

#: ``mxfp6`` is E2M3: on SmolLM2-135M's 210 linear weights (measured, docs/formats.md) its mean SQNR is 30.86 dB
#: against 25.30 dB for E3M2, and it wins on every single weight. ``mxfp8`` is E4M3 (more mantissa, as torchao).
ALIASES: dict[str, str] = {"mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e2m3", "mxfp4": "mxfp4_e2m1"}


def known_format_names() -> list[str]:
    """Every accepted name: the element formats and the aliases."""
    return sorted(FORMATS) + sorted(ALIASES)


def get_format(name: str | ElementFormat) -> ElementFormat:
    """The element format called ``name`` (aliases ``mxfp8``, ``mxfp6``, ``mxfp4`` accepted, case-insensitive)."""
    if isinstance(name, ElementFormat):
        return name
    if not isinstance(name, str):
        raise FormatError(f"format name must be a str, got {type(name).__name__}; known: {known_format_names()}")
    key = ALIASES.get(name.lower(), name.lower())
    if key not in FORMATS:
        raise FormatError(f"unknown MX format {name!r}; known formats: {', '.join(known_format_names())}")
    return FORMATS[key]
