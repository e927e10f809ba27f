"""GGUF block types the kernel runs after an exact repacking: K-quants (``Q2_K``, ``Q3_K``, ``Q4_K``, ``Q5_K``,
``Q6_K``), ``IQ4_XS``, ``IQ4_NL`` and ``Q5_0`` / ``Q5_1``.

These types store a 256-weight super-block (K-quants) or a 32-weight block (``Q5_*``) whose codes and scales the
fused kernel cannot read as they are. Each is rewritten, once at load time, into one of two kernel layouts of 32-weight
blocks with float32 scales (``accel.formats.ggml``; ``accel/formats/mxkernel.h``, fast 7 to 10):

- ``Q4_F32`` (from ``Q4_K``): the 4-bit codes as ``Q4_1`` lays them out (byte ``j``: weight ``j`` low nibble, weight
  ``j + 16`` high), and per block float32 ``d = d_super * sc`` and ``m = -(dmin * min)``: 6 bits a weight (the file:
  4.5);
- ``Q5S_F32`` (from ``Q5_0``) and ``Q5_F32`` (from ``Q5_1``, ``Q5_K``): ``Q4_1``'s nibbles of the low 4 bits, then 4
  bytes whose bit ``i`` is weight ``i``'s fifth bit (``Q5_0``'s and ``Q5_1``'s own ``qs`` and ``qh``), and per block
  float32 ``d`` and ``m``; ``Q5S_F32`` subtracts 16 from the codes (``Q5_0``: ``d * (q - 16)``, ``m = -0.0``): 7
  bits a weight (the files: 5.5 to 6);
- ``I8_F32`` (from ``Q6_K``, ``Q3_K``, ``Q2_K``, ``IQ4_XS``, ``IQ4_NL``): one int8 code a weight, and per 16
  weights float32 ``d`` and ``m``: 12 bits a weight. ``Q6_K``: ``d * sc`` and ``m = -0.0``, codes ``q - 32``;
  ``Q3_K``: ``d * (sc - 32)`` and ``m = -0.0``, codes ``q - 4`` where the high-bit mask is clear; ``Q2_K``:
  ``d * sc`` and ``m = -(dmin * min)``, codes 0..3; ``IQ4_XS`` / ``IQ4_NL``: ``d * (sc - 32)`` / ``d`` and
  ``m = -0.0``, codes the 16 non-linear values (-127 .. 113) their 4-bit indices name. Twelve bits is more than
  these files hold (2.6 to 6.6), but under half of float32's.

What is exact: each weight the kernel computes, ``fma(q, d, m)``, equals the ``gguf`` package's dequantized value
(and llama.cpp's reference ``dequantize_row_*``) bit for bit: the products of a float16 scale and an integer sub-scale
(at most 8 bits) are exact in float32, so are their products with the codes (at most 24 significant bits), and the
one rounding left is the offset's, the same in both; ``m = -0.0`` leaves ``d * q`` unchanged, signed zeros included.
``tests/formats/test_ggml_repack.py`` checks every type against the ``gguf`` package on random blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from accel.errors import FormatError

__all__ = ["REPACKED", "Repacked", "repack"]

QK_K = 256  # weights a K-quant super-block
_F32 = np.float32


class Repacked:
    """How one GGUF type is repacked: its ``name``, bytes a file block of ``weights`` weights, the kernel layout it
    becomes (``"Q4_F32"``, ``"Q5S_F32"``, ``"Q5_F32"`` or ``"I8_F32"``) and the function (raw blocks ``[rows, blocks,
    block_bytes]`` -> codes, scales planes)."""

    def __init__(
        self, name: str, weights: int, block_bytes: int, layout: str, fn: Callable[[np.ndarray], tuple]
    ) -> None:
        self.name, self.weights, self.block_bytes, self.layout, self.fn = name, weights, block_bytes, layout, fn


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 bytes ``[..., 2]`` -> float32 ``[...]`` (exact)."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(_F32)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit sub-scales and sub-mins of K-quant scale bytes ``[..., 12]`` (llama.cpp's get_scale_min_k4)."""
    lo, hi, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], axis=-1)
    return sc.astype(_F32), mn.astype(_F32)


def _nibble_layout(q: np.ndarray) -> np.ndarray:
    """Codes 0..15 ``[..., 32]`` -> ``Q4_1``'s 16 bytes ``[..., 16]`` (byte j: code j low, code j + 16 high)."""
    q = q.astype(np.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def _split_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``Q4_K`` / ``Q5_K`` super-blocks -> per 32-weight block float32 ``d`` and ``m = -dmin * min`` ``[..., 8]``,
    and the rest of the bytes."""
    d, dmin = _f16(raw[..., 0:2])[..., None], _f16(raw[..., 2:4])[..., None]
    sc, mn = _scale_min_k4(raw[..., 4:16])
    return d * sc, -(dmin * mn), raw[..., 16:]


def _low_nibbles_k(qs: np.ndarray) -> np.ndarray:
    """``Q4_K`` / ``Q5_K``'s 128 code bytes -> the low 4 bits of each weight ``[..., 8, 32]`` (bytes 32c .. 32c + 31:
    low nibbles are block 2c, high nibbles block 2c + 1)."""
    qs = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return ((qs >> np.array([0, 4], np.uint8).reshape(2, 1)) & 0x0F).reshape(*qs.shape[:-3], 8, 32)


def _q4_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, m, rest = _split_k(raw)
    q = _low_nibbles_k(rest[..., :128])
    return _flat(_nibble_layout(q)), _flat(np.stack([d, m], axis=-1))


def _q5_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, m, rest = _split_k(raw)
    qh, qs = rest[..., :32], rest[..., 32:160]
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1  # [..., 8, 32]: bit b of byte l
    fifth = np.packbits(high.astype(np.uint8), axis=-1, bitorder="little")  # [..., 8, 4]: bit i = weight i's
    codes = np.concatenate([_nibble_layout(_low_nibbles_k(qs)), fifth], axis=-1)
    return _flat(codes), _flat(np.stack([d, m], axis=-1))


def _q6_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ql, qh = raw[..., 0:128], raw[..., 128:192]
    sc = raw[..., 192:208].view(np.int8).astype(_F32)
    d = _f16(raw[..., 208:210])[..., None] * sc  # [..., 16]: per 16 weights
    lead = raw.shape[:-1]
    low = (ql.reshape(*lead, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)) & 0x0F  # [..., 2, 2, 64]
    high = (qh.reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 0x03  # [..., 2, 4, 32]
    q = low.reshape(*lead, 8, 32).astype(np.int16) | (high.reshape(*lead, 8, 32).astype(np.int16) << 4)
    codes = (q - 32).astype(np.int8)
    return _flat(codes.view(np.uint8)), _flat(_per_16(d, np.full_like(d, -0.0)))


def _two_bit_codes(qs: np.ndarray) -> np.ndarray:
    """``Q2_K`` / ``Q3_K``'s 64 bytes of 2-bit codes -> the codes 0..3 in weight order ``[..., 8, 32]`` (bytes 32h ..
    32h + 31 hold weights 128h + 32j + l at bits 2j, 2j + 1)."""
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return ((qs.reshape(*qs.shape[:-1], 2, 1, 32) >> shifts) & 0x03).reshape(*qs.shape[:-1], 8, 32)


def _per_16(d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Float32 ``d`` and ``m`` per 16 weights ``[..., 2 k]`` -> ``I8_F32``'s scale values ``[..., k, 4]`` (``d``,
    ``m`` of each half of a 32-weight block)."""
    return np.stack([d, m], axis=-1).reshape(*d.shape[:-1], -1, 4)


def _q2_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Q2_K`` (scales 16 bytes: low nibble the scale, high the min of 16 weights; 2-bit codes; d; dmin): weight
    ``d * sc * q - dmin * min`` = ``fma(q, d * sc, -(dmin * min))``."""
    sc = raw[..., 0:16]
    d = _f16(raw[..., 80:82])[..., None] * (sc & 0x0F).astype(_F32)
    m = -(_f16(raw[..., 82:84])[..., None] * (sc >> 4).astype(_F32))
    codes = _two_bit_codes(raw[..., 16:80]).astype(np.int8)
    return _flat(codes.view(np.uint8)), _flat(_per_16(d, m))


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """``Q3_K``'s 12 scale bytes -> the 16 six-bit scales, minus 32, as float32: scale i's low 4 bits are byte i's
    low nibble (i < 8) or byte i - 8's high nibble, its high 2 bits are bits 2 (i // 4) of byte 8 + i % 4."""
    low = np.concatenate([s[..., 0:8] & 0x0F, s[..., 0:8] >> 4], axis=-1)
    high = (s[..., None, 8:12] >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 0x03  # [..., 4, 4]
    return (low | (high.reshape(*s.shape[:-1], 16) << 4)).astype(_F32) - 32.0


def _q3_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Q3_K`` (hmask 32 bytes, 2-bit codes 64, scales 12, d): weight ``d * (sc - 32) * (q - 4 * (1 - h))``, ``h``
    bit 4h' + j of hmask byte l for weight 128h' + 32j + l (a set bit means no offset)."""
    d = _f16(raw[..., 108:110])[..., None] * _q3_k_scales(raw[..., 96:108])
    hm = raw[..., 0:32]
    high = (hm[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1  # [..., 8, 32]
    codes = _two_bit_codes(raw[..., 32:96]).astype(np.int8) - 4 * (1 - high.astype(np.int8))
    return _flat(codes.astype(np.int8).view(np.uint8)), _flat(_per_16(d, np.full_like(d, -0.0)))


#: IQ4_NL's and IQ4_XS's 16 non-linear code values (llama.cpp's kvalues_iq4nl)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def _iq4_codes(qs: np.ndarray) -> np.ndarray:
    """16 bytes a 32-weight block (``Q4_1``'s nibble order) -> the int8 code values ``[..., 32]``."""
    return IQ4_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=-1)]


def _iq4_nl(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``IQ4_NL`` (d, 16 bytes of 4-bit indices; blocks of 32): weight ``d * IQ4_VALUES[q]``."""
    d = np.repeat(_f16(raw[..., 0:2])[..., None], 2, axis=-1)  # [..., 2]: both halves of the block
    codes = _iq4_codes(raw[..., 2:18])
    return _flat(codes.view(np.uint8)), _flat(_per_16(d, np.full_like(d, -0.0)))


def _iq4_xs(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``IQ4_XS`` (d, 16 high bits and 4 bytes of low nibbles of 8 six-bit scales, 128 bytes of indices): weight
    ``d * (ls - 32) * IQ4_VALUES[q]``, ``ls`` the 32-weight block's scale."""
    lead = raw.shape[:-1]
    high = raw[..., 2:4].copy().view("<u2")  # [..., 1]
    high = (high >> np.arange(0, 16, 2, dtype=np.uint16)) & 0x03  # [..., 8]
    low = np.concatenate([raw[..., 4:8, None] & 0x0F, raw[..., 4:8, None] >> 4], axis=-1).reshape(*lead, 8)
    d = _f16(raw[..., 0:2])[..., None] * ((low | (high.astype(np.uint8) << 4)).astype(_F32) - 32.0)  # [..., 8]
    codes = _iq4_codes(raw[..., 8:136].reshape(*lead, 8, 16))
    d2 = np.repeat(d, 2, axis=-1)  # [..., 16]: per 16 weights
    return _flat(codes.view(np.uint8)), _flat(_per_16(d2, np.full_like(d2, -0.0)))


def _q5_legacy(raw: np.ndarray, offset: bool) -> tuple[np.ndarray, np.ndarray]:
    """``Q5_0`` (d, qh, qs: ``d * (q - 16)``) or ``Q5_1`` (d, m, qh, qs: ``d * q + m``) blocks of 32: their ``qs``
    (``Q4_1``'s nibble order) and ``qh`` (bit i: weight i's fifth bit) are the 5-bit layouts' codes as they are."""
    d = _f16(raw[..., 0:2])
    m = _f16(raw[..., 2:4]) if offset else np.full_like(d, -0.0)
    at = 4 if offset else 2
    qh, qs = raw[..., at : at + 4], raw[..., at + 4 : at + 20]
    return _flat(np.concatenate([qs, qh], axis=-1)), _flat(np.stack([d, m], axis=-1))


def _flat(a: np.ndarray) -> np.ndarray:
    """Per-block values ``[rows, ..., values]`` (C order: row, 32-weight block, value) as their bytes (``repack``
    reshapes them to ``[rows, K / 32, bytes]``)."""
    return np.ascontiguousarray(a).view(np.uint8)


REPACKED: dict[str, Repacked] = {
    r.name: r
    for r in (
        Repacked("Q4_K", QK_K, 144, "Q4_F32", _q4_k),
        Repacked("Q5_K", QK_K, 176, "Q5_F32", _q5_k),
        Repacked("Q6_K", QK_K, 210, "I8_F32", _q6_k),
        Repacked("Q2_K", QK_K, 84, "I8_F32", _q2_k),
        Repacked("Q3_K", QK_K, 110, "I8_F32", _q3_k),
        Repacked("IQ4_XS", QK_K, 136, "I8_F32", _iq4_xs),
        Repacked("IQ4_NL", 32, 18, "I8_F32", _iq4_nl),
        Repacked("Q5_0", 32, 22, "Q5S_F32", lambda raw: _q5_legacy(raw, offset=False)),
        Repacked("Q5_1", 32, 24, "Q5_F32", lambda raw: _q5_legacy(raw, offset=True)),
    )
}


def repack(raw: np.ndarray, name: str, shape: tuple[int, int]) -> tuple[str, np.ndarray, np.ndarray]:
    """The GGUF bytes ``raw`` of a weight ``shape`` ``[N, K]`` stored as ``name`` -> (kernel layout name, codes
    plane, scales plane) (module docstring); FormatError when the bytes or K do not fit the type."""
    r = REPACKED[name]
    n, k = shape
    if k % r.weights:
        raise FormatError(f"{name} weight {shape}: K must be a multiple of {r.weights}")
    want = n * (k // r.weights) * r.block_bytes
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.size != want:
        raise FormatError(f"{name} weight {shape}: need {want} bytes of blocks, got {raw.dtype} x {raw.size}")
    with np.errstate(invalid="ignore", over="ignore"):  # infinite or NaN scales give NaN weights, as in the file
        codes, scales = r.fn(raw.reshape(n, k // r.weights, r.block_bytes))
    return r.layout, codes.reshape(n, k // 32, -1), scales.reshape(n, k // 32, -1)
