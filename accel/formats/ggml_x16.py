"""GGUF ``Q8_0``, ``Q4_0`` and ``Q4_1`` blocks interleaved 16 output rows at a time, for int8 activations.

The int8-activation kernel of the stored layout (``GGMLKernel.matmul_q8``) multiplies one block of one weight row at
a time and keeps 8 float partial sums a block. Interleaved, one 512-bit register holds 4 codes of each of 16 rows
(two 256-bit registers of 8 rows on AVX2): 8 integer multiply-adds complete block ``b`` of 16 rows against one
activation block broadcast to every lane, and each (row, block) then costs one float32 step, so a weight block is
decoded once for all 16 rows and each extra activation row (a verify call's) costs a fraction of the first.
llama.cpp repacks its CPU weights the same way at load time (``Q4_0_8_8``, ``Q4_0x8``).

``interleave16(t)`` rearranges the stored bytes (nothing is decoded or rounded: the planes hold the file's codes and
float16 halves, padded with zero rows to a multiple of 16); ``reference_q8_x16`` states the arithmetic in numpy
(accel/formats/mxkernel_gx16.c): per output row, x row and block, the exact integer dot product ``P_b`` of the int8
activation codes with the weight's integers, then ``acc = acc + float(P_b) * (d_b * dx_b)`` in block order, and for
``Q4_1`` ``off = off + m_b * (dx_b * sum(q_b))``, ``y = acc + off``. Every kernel path (portable C, AVX2, AVX-512
VNNI) computes exactly that, so ``matmul_q8_x16`` equals the reference bit for bit. The float32 steps differ from
the stored layout's (8 lanes a block there), so the two agree to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np

from accel.errors import FormatError
from accel.formats.ggml import BLOCK, GGMLTensor
from accel.formats.mxkernel_q8 import quantize_q8

__all__ = ["GROUP", "X16_TYPES", "interleave16", "reference_q8_x16", "x16_plane_bytes", "x16_runs"]

#: weight rows a group interleaves (one 512-bit register: 16 lanes of 4 codes)
GROUP = 16
#: the block types the interleaved kernel runs
X16_TYPES = ("Q8_0", "Q4_0", "Q4_1")
_F32 = np.float32


def x16_runs(t: object) -> bool:
    """Whether ``t`` is a weight the interleaved kernel runs (a ``GGMLTensor`` of ``X16_TYPES``)."""
    return isinstance(t, GGMLTensor) and t.qtype.name in X16_TYPES


def _groups(a: np.ndarray) -> np.ndarray:
    """``a`` ``[N, ...]`` padded with zero rows to a multiple of ``GROUP`` rows, as ``[G, GROUP, ...]``."""
    pad = -a.shape[0] % GROUP
    if pad:
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
    return a.reshape(-1, GROUP, *a.shape[1:])


def interleave16(t: GGMLTensor) -> tuple[np.ndarray, np.ndarray]:
    """The code and scale planes of ``t`` in the interleaved layout (uint8, 1-D; module docstring and
    accel/formats/mxkernel_gx16.c): per group of 16 rows and block, the 16 rows' codes in 4-code chunks (``Q8_0``: 8
    chunks of 64 bytes; ``Q4_0``, ``Q4_1``: 4 chunks of 64 bytes, each byte a code and the code 16 places later, as
    stored), then the 16 rows' float16 ``d`` (and ``Q4_1``'s ``m``). FormatError for another block type."""
    if not x16_runs(t):
        got = t.qtype.name if isinstance(t, GGMLTensor) else type(t).__name__
        raise FormatError(f"the interleaved layout holds {', '.join(X16_TYPES)} blocks; got {got}")
    nb, cb = t.nblocks, t.qtype.code_bytes
    codes = _groups(t.codes).reshape(-1, GROUP, nb, cb // 4, 4)  # [G, row, block, chunk, code]
    codes = codes.transpose(0, 2, 3, 1, 4)  # [G, block, chunk, row, code]
    halves = t.qtype.scale_bytes // 2  # d, or d and m
    scales = _groups(t.scales).reshape(-1, GROUP, nb, halves, 2).transpose(0, 2, 3, 1, 4)  # [G, block, d|m, row, 2]
    return np.ascontiguousarray(codes).reshape(-1), np.ascontiguousarray(scales).reshape(-1)


def x16_plane_bytes(t: GGMLTensor) -> tuple[int, int]:
    """Bytes of the interleaved code and scale planes of ``t`` (its rows padded to a multiple of 16)."""
    rows = -(-t.shape[0] // GROUP) * GROUP
    return rows * t.nblocks * t.qtype.code_bytes, rows * t.nblocks * t.qtype.scale_bytes


def reference_q8_x16(t: GGMLTensor, x: np.ndarray) -> np.ndarray:
    """``quantize_q8(x) @ W.T`` in the interleaved kernel's exact order of float32 operations (module docstring):
    float32 ``[S, N]`` for ``x`` ``[S, K]``. Slow (tests)."""
    if not x16_runs(t):
        raise FormatError(f"the interleaved layout holds {', '.join(X16_TYPES)} blocks; got {t.qtype.name}")
    x = np.asarray(x, _F32).reshape(-1, t.shape[1])
    nb = t.shape[1] // BLOCK
    q, dx = quantize_q8(x, nb)
    q = q.reshape(-1, nb, BLOCK).astype(np.int64)
    p = np.einsum("sbe,nbe->snb", q, t.integer_codes().astype(np.int64)).astype(_F32)  # |P| < 2^24: exact
    d, m = t._d_m()
    with np.errstate(over="ignore", invalid="ignore"):
        prod = (p * (d[None, ..., 0] * dx[:, None, :]).astype(_F32)).astype(_F32)  # [S, N, B]
        acc = np.zeros(prod.shape[:2], _F32)
        for b in range(nb):
            acc = (acc + prod[..., b]).astype(_F32)
        if m is None:
            return acc
        u = (dx * q.sum(axis=2).astype(_F32)).astype(_F32)  # [S, B]
        terms = (m[None, ..., 0] * u[:, None, :]).astype(_F32)
        off = np.zeros_like(acc)
        for b in range(nb):
            off = (off + terms[..., b]).astype(_F32)
        return (acc + off).astype(_F32)
