"""Storage cost of weight and KV-cache number formats, in bits per element *including* their scales.

MX formats (OCP Microscaling v1.0, docs/formats.md): one 8-bit E8M0 scale per block of 32 elements, so
MXFP6 = 6 + 8/32 = 6.25 bits = 0.390625 of FP16, MXFP4 = 4.25, MXFP8 / MXINT8 = 8.25.

Integer and float8 weight-only formats (assumptions, stated here once):
- ``int8``: per-output-channel scale; one fp16 scale per row of thousands of elements is < 0.01 bit/element,
  counted as 8.0. ``fp8``: float8 weights with a per-tensor or per-channel scale, 8.0 bits.
- ``int4``: group size 128 with a 16-bit scale and a 16-bit zero point per group (the gpt-fast / GPTQ layout):
  4 + 32/128 = 4.25 bits. ``int4-g32`` / ``int4-g64`` / ... name other group sizes: 4 + 32/g bits
  (gpt-fast's default G=32: 5.0 bits; torchao's ``int4wo-64``: 4.5 bits).

Compute: MX, integer and fp8 weights are expanded to the compute dtype before the matrix product (weight-only
quantization; on Cloud AI 100 ``-mxfp6-matmul`` compresses MatMul weights offline and compute stays FP16). So every
format computes at ``fp16`` peak except ``fp32`` (fp32 peak) and ``bf16`` (bf16 peak if the device lists one).
"""

from __future__ import annotations

import re

from accel.errors import SimError

MX_BLOCK_SIZE = 32  # OCP MX v1.0: k = 32 elements per shared scale
MX_SCALE_BITS = 8  # E8M0 scale

# element bits before scales
_ELEMENT_BITS = {
    "fp32": 32.0,
    "fp16": 16.0,
    "bf16": 16.0,
    "fp8": 8.0,  # float8 (E4M3/E5M2) with a per-tensor/per-channel scale
    "mxfp8": 8.0,
    "mxfp6": 6.0,
    "mxfp4": 4.0,
    "mxint8": 8.0,
    "int8": 8.0,
    "int4": 4.0,
}
MX_FORMATS = frozenset({"mxfp8", "mxfp6", "mxfp4", "mxint8"})
FLOAT_FORMATS = frozenset({"fp32", "fp16", "bf16"})  # stored as computed: nothing to decompress
INT4_GROUP_SIZE = 128
INT4_GROUP_OVERHEAD_BITS = 32  # 16-bit scale + 16-bit zero point per group
_INT4_GROUP = re.compile(r"^int4g(\d+)$")

WEIGHT_FORMATS = tuple(_ELEMENT_BITS)
KV_FORMATS = ("fp32", "fp16", "bf16", "fp8", "int8", "mxfp8", "mxint8", "mxfp6", "mxfp4")


def normalize_format(fmt: str, *, allowed: tuple[str, ...] = WEIGHT_FORMATS, what: str = "weight format") -> str:
    """Return the canonical lower-case name of ``fmt`` or raise ``SimError`` listing the allowed names.
    Weight formats also accept ``int4-g<N>`` (group size N, a power of two from 16 to 4096)."""
    if not isinstance(fmt, str):
        raise SimError(f"{what} must be a string, got {type(fmt).__name__}; allowed: {', '.join(allowed)}")
    key = fmt.strip().lower().replace("-", "").replace("_", "")
    key = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float8": "fp8"}.get(key, key)
    m = _INT4_GROUP.match(key)
    if m and "int4" in allowed:
        g = int(m.group(1))
        if g < 16 or g > 4096 or g & (g - 1):
            raise SimError(f"{what} {fmt!r}: int4 group size must be a power of two in [16, 4096], got {g}")
        return "int4" if g == INT4_GROUP_SIZE else f"int4-g{g}"
    if key not in allowed:
        raise SimError(f"unknown {what} {fmt!r}; allowed: {', '.join(allowed)} (and int4-g<N>)")
    return key


def bits_per_element(fmt: str, *, allowed: tuple[str, ...] = WEIGHT_FORMATS, what: str = "weight format") -> float:
    """True storage cost of one element in bits, including MX block scales and int4 group scales."""
    key = normalize_format(fmt, allowed=allowed, what=what)
    if key.startswith("int4-g"):
        return 4.0 + INT4_GROUP_OVERHEAD_BITS / int(key[6:])
    bits = _ELEMENT_BITS[key]
    if key in MX_FORMATS:
        bits += MX_SCALE_BITS / MX_BLOCK_SIZE
    elif key == "int4":
        bits += INT4_GROUP_OVERHEAD_BITS / INT4_GROUP_SIZE
    return bits


def bytes_per_element(fmt: str, *, allowed: tuple[str, ...] = WEIGHT_FORMATS, what: str = "weight format") -> float:
    """True storage cost of one element in bytes (see :func:`bits_per_element`)."""
    return bits_per_element(fmt, allowed=allowed, what=what) / 8.0


def kv_bytes_per_element(fmt: str) -> float:
    """Bytes per KV-cache element for ``fmt`` (one of ``KV_FORMATS``)."""
    return bytes_per_element(fmt, allowed=KV_FORMATS, what="KV-cache format")


def is_mx(fmt: str) -> bool:
    """True for the OCP MX formats."""
    return normalize_format(fmt) in MX_FORMATS


def decompress_key(fmt: str) -> str | None:
    """The key of ``Hardware.decompress_elements_per_s`` that prices expanding ``fmt`` weights (``None`` for
    fp32/fp16/bf16, which are computed as stored). Every int4 group size shares ``int4``."""
    key = normalize_format(fmt)
    if key in FLOAT_FORMATS:
        return None
    return "int4" if key.startswith("int4") else key


def compute_dtype(fmt: str) -> str:
    """The dtype the matrix products run in for weights stored as ``fmt`` (weight-only quantization)."""
    key = normalize_format(fmt)
    return {"fp32": "fp32", "bf16": "bf16"}.get(key, "fp16")
