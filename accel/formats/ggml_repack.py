"""GGUF block types the kernel runs after an exact repacking: K-quants (``Q4_K``, ``Q5_K``, ``Q6_K``) and ``Q5_0`` /
``Q5_1``.

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
- ``I8_F32`` (from ``Q6_K``): one int8 code a weight, and per 16 weights float32 ``d`` and ``m`` (``-0.0``): 12 bits
  a weight (the file: 6.56).

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
    dm = np.stack([d, np.full_like(d, -0.0)], axis=-1).reshape(*lead, 8, 4)  # d, m per 16 weights
    return _flat(codes.view(np.uint8)), _flat(dm)


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
