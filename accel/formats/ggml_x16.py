"""GGUF blocks interleaved 16 output rows at a time, for int8 activations: every layout of the kernel.

The int8-activation kernel of the stored layout (``GGMLKernel.matmul_q8``) multiplies one block of one weight row at
a time and keeps 8 float partial sums a block. Interleaved, one 512-bit register holds 4 codes of each of 16 rows
(two 256-bit registers of 8 rows on AVX2): 8 integer multiply-adds complete block ``b`` of 16 rows against one
activation block broadcast to every lane, and each (row, block) then costs one float32 step, so a weight block is
decoded once for all 16 rows and each extra activation row (a verify call's) costs a fraction of the first.
llama.cpp repacks its CPU weights the same way at load time (``Q4_0_8_8``, ``Q4_0x8``).

``interleave16(t)`` rearranges the stored bytes (nothing is decoded or rounded: the planes hold the blocks' codes,
float16 halves and float32 scales, padded with zero rows to a multiple of 16), for every layout (``Q8_0``, ``Q4_0``,
``Q4_1`` as stored; ``Q4_F32``, ``I8_F32``, ``Q5S_F32``, ``Q5_F32`` holding the repacked K-quant, IQ4 and Q5 types);
``reference_q8_x16`` states the arithmetic in numpy (accel/formats/mxkernel_gx16.c): per output row, x row and block,
the exact integer dot product ``P_b`` of the int8 activation codes with the weight's integers, then ``acc = acc +
float(P_b) * (d_b * dx_b)`` in block order and, for the types with an offset, ``off = off + m_b * (dx_b *
sum(q_b))``, ``y = acc + off`` (``I8_F32``, a ``d`` and an ``m`` per 16 codes: the two halves' products summed, then
added). Every kernel path (portable C, AVX2, AVX-512 VNNI) computes exactly that, so ``matmul_q8_x16`` equals the
reference bit for bit. The float32 steps differ from the stored layout's (8 lanes a block there), so the two agree to
float32 rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np

from accel.errors import FormatError
from accel.formats.ggml import BLOCK, GGMLTensor
from accel.formats.mxkernel_q8 import quantize_q8

__all__ = ["GROUP", "interleave16", "reference_q8_x16", "x16_plane_bytes"]

#: weight rows a group interleaves (one 512-bit register: 16 lanes of 4 codes)
GROUP = 16
_F32 = np.float32


def _check(t: object) -> None:
    """FormatError unless ``t`` is a ``GGMLTensor`` (every kernel layout runs interleaved)."""
    if not isinstance(t, GGMLTensor):
        raise FormatError(f"the interleaved layout holds GGUF block weights; got {type(t).__name__}")


def _groups(a: np.ndarray) -> np.ndarray:
    """``a`` ``[N, ...]`` padded with zero rows to a multiple of ``GROUP`` rows, as ``[G, GROUP, ...]``."""
    pad = -a.shape[0] % GROUP
    if pad:
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
    return a.reshape(-1, GROUP, *a.shape[1:])


def interleave16(t: GGMLTensor) -> tuple[np.ndarray, np.ndarray]:
    """The code and scale planes of ``t`` in the interleaved layout (uint8, 1-D; accel/formats/mxkernel_gx16.c): per
    group of 16 rows and block, the 16 rows' codes in 4-code chunks (the int8 types: 8 chunks of 64 bytes; the nibble
    types: 4 chunks of 64 bytes, each byte a code and the code 16 places later, as stored; the 5-bit types then 8
    64-bit masks of fifth bits, one per register of 4 codes a row), then the 16 rows' scales, one row of 16 per scale
    value (``d``, ``m``; ``I8_F32``: ``d0``, ``m0``, ``d1``, ``m1``). FormatError for a tensor of another kind."""
    _check(t)
    nb, q = t.nblocks, t.qtype
    nibbles = _groups(t.codes[..., :16] if q.bits < 8 else t.codes)  # [G, 16, nb, 16 or 32]
    g = nibbles.shape[0]
    codes = nibbles.reshape(g, GROUP, nb, -1, 4).transpose(0, 2, 3, 1, 4).reshape(g, nb, -1)  # [G, nb, chunk|row|e]
    if q.bits == 5:  # the fifth bits: register r (codes 4r .. 4r + 3), row i, code e -> bit 4i + e of mask r
        word = np.ascontiguousarray(_groups(t.codes[..., 16:20])).view("<u4")[..., 0].astype(np.uint64)  # bit c: code c
        rows = np.arange(GROUP, dtype=np.uint64)[None, :, None, None]
        parts = (word[..., None] >> (4 * np.arange(8, dtype=np.uint64))) & np.uint64(15)  # [G, 16, nb, 8]
        masks = np.bitwise_or.reduce(parts << (np.uint64(4) * rows), axis=1)  # [G, nb, 8]
        codes = np.concatenate([codes, masks.astype("<u8").view(np.uint8).reshape(g, nb, 64)], axis=-1)
    unit = 4 if q.scale_bytes % 8 == 0 else 2  # float32 (d, m) pairs (the repacked types) or float16 halves
    scales = _groups(t.scales).reshape(g, GROUP, nb, q.scale_bytes // unit, unit).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(codes).reshape(-1), np.ascontiguousarray(scales).reshape(-1)


def x16_plane_bytes(t: GGMLTensor) -> tuple[int, int]:
    """Bytes of the interleaved code and scale planes of ``t`` (its rows padded to a multiple of 16)."""
    rows = -(-t.shape[0] // GROUP) * GROUP
    return rows * t.nblocks * t.qtype.code_bytes, rows * t.nblocks * t.qtype.scale_bytes


def reference_q8_x16(t: GGMLTensor, x: np.ndarray) -> np.ndarray:
    """``quantize_q8(x) @ W.T`` in the interleaved kernel's exact order of float32 operations (module docstring):
    float32 ``[S, N]`` for ``x`` ``[S, K]``. Slow (tests)."""
    _check(t)
    x = np.asarray(x, _F32).reshape(-1, t.shape[1])
    nb = t.shape[1] // BLOCK
    halves = 2 if t.qtype.name == "I8_F32" else 1  # I8_F32: a d and an m per 16 codes
    q, dx = quantize_q8(x, nb)
    q = q.reshape(-1, nb, halves, BLOCK // halves).astype(np.int64)
    w = t.integer_codes().astype(np.int64).reshape(t.shape[0], nb, halves, BLOCK // halves)
    p = np.einsum("sbhe,nbhe->snbh", q, w).astype(_F32)  # |P| < 2^24: exact
    d, m = t._d_m()
    d, m = d[..., :: BLOCK // halves], None if m is None else m[..., :: BLOCK // halves]  # [N, B, halves]
    with np.errstate(over="ignore", invalid="ignore"):
        prod = (p * (d[None] * dx[:, None, :, None]).astype(_F32)).astype(_F32)  # [S, N, B, halves]
        step = prod[..., 0] if halves == 1 else (prod[..., 0] + prod[..., 1]).astype(_F32)
        acc = np.zeros(step.shape[:2], _F32)
        for b in range(nb):
            acc = (acc + step[..., b]).astype(_F32)
        if m is None:
            return acc
        u = (dx[..., None] * q.sum(axis=3).astype(_F32)).astype(_F32)  # [S, B, halves]
        terms = (m[None] * u[:, None]).astype(_F32)
        o = terms[..., 0] if halves == 1 else (terms[..., 0] + terms[..., 1]).astype(_F32)
        off = np.zeros_like(acc)
        for b in range(nb):
            off = (off + o[..., b]).astype(_F32)
        return (acc + off).astype(_F32)
