"""MX weights times int8 activations: ``matmul_q8`` runs integer dot products per block on the fused kernel.

MXFP6 E2M3 and MXFP4 E2M1 weights are exact small integers times a power of two (value x 8 in [-60, 60], value x 2 in
[-12, 12]). With the activations quantized per block of 32 to int8 (llama.cpp's Q8_0 scheme: ``d = amax / 127``, ``q =
rint(x * (127 / amax))``) a block's dot product is an integer sum times two scales, which CPUs compute with integer
multiply-adds (AVX2 ``vpmaddubsw``, AVX-512 VNNI ``vpdpbusd``) instead of converting every weight to float.

What is exact and what is not: the weights are exact (as in ``PackedMX.matmul``); the activations are rounded to 8 bits
per block (relative error up to ``amax / 254`` per element: an approximation, measured against the float32 path in
benchmarks/mx_kernel.py, ``*-q8`` rows). Given the quantized activations, every path (portable C, AVX2, AVX-512 VNNI)
computes the same float32 result bit for bit: the integer sums of 4 products per lane (8 lanes a block, exact), then
``acc[b % 4][lane] += float(sum) * (w_scale_b * d_b)`` (a product and a sum, no FMA) and a fixed reduction of the 4
accumulators and 8 lanes (``reference_q8``, the numpy statement of it, is what the tests compare with). A row's result
does not depend on the rows per call or the threads. Blocks of 32 along the input features only (the MX default); other
formats and block sizes are refused.

llama.cpp's blocks (every ``GGMLTensor`` layout: ``Q8_0``, ``Q4_0``, ``Q4_1`` as stored, and the repacked ``Q4_F32``,
``I8_F32``, ``Q5S_F32``, ``Q5_F32``) take the same activations (``GGMLKernel.matmul_q8``, C file mxkernel_gq8.c), as
llama.cpp itself multiplies them: the block's integers (codes, nibble - 8, nibble, 5-bit codes) dotted with the int8
activations, times ``d * dx``, plus ``m * dx * sum(q)`` for the types with an offset ``m`` (``I8_F32``: a ``d`` and an
``m`` per 16 weights); ``reference_q8_ggml`` states the order of the float32 operations.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from accel.errors import FormatError
from accel.formats.elements import MXFP4_E2M1, MXFP6_E2M3
from accel.formats.ggml import GGMLTensor
from accel.formats.mx_tensor import MXTensor
from accel.formats.mxkernel import PackedMX
from accel.formats.packing import unpack_codes

__all__ = [
    "Q8_FORMATS",
    "linear_q8_call",
    "matmul_q8",
    "q8_kernel_path",
    "q8_path",
    "quantize_q8",
    "reference_q8",
    "reference_q8_ggml",
]

#: formats with an int8-activation path, and the shift of their integer weights (value * 2^shift is an integer)
Q8_FORMATS = {MXFP6_E2M3.name: 3, MXFP4_E2M1.name: 1}
_F32 = np.float32


def _check(w: MXTensor) -> None:
    if w.fmt.name not in Q8_FORMATS or w.block_size != 32 or len(w.shape) != 2 or w.axis != 1:
        raise FormatError(
            f"int8-activation matmul needs a 2-D MXFP6 E2M3 or MXFP4 E2M1 weight in blocks of 32 along axis 1; got "
            f"{w.fmt.name}, block {w.block_size}, shape {w.shape}, axis {w.axis}"
        )


def quantize_q8(x: np.ndarray, nblocks: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 activations ``[S, K]`` (K <= 32 * nblocks; zero-padded) -> int8 codes ``[S, nblocks, 32]`` and float32
    scales ``[S, nblocks]`` (module docstring; a block whose amax is NaN or infinite gets scale NaN and codes 0)."""
    rows = x.shape[0]
    xp = np.zeros((rows, nblocks * 32), _F32)
    xp[:, : x.shape[1]] = x
    xb = xp.reshape(rows, nblocks, 32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.max(np.abs(xb), axis=2)
        bad = ~(amax <= np.finfo(_F32).max)
        d = (amax / _F32(127)).astype(_F32)
        inv = np.where(amax > 0, _F32(127) / np.where(amax > 0, amax, _F32(1)), _F32(0)).astype(_F32)
        q = np.rint((xb * inv[..., None]).astype(_F32))
    q = np.clip(np.nan_to_num(q), -127, 127).astype(np.int8)
    q[bad] = 0
    d[bad] = np.nan
    return q, d


def _weight_ints(w: MXTensor) -> np.ndarray:
    """The weights as the integers value * 2^shift, int32 ``[N, nblocks, 32]`` (exact)."""
    shift = Q8_FORMATS[w.fmt.name]
    values = w.fmt.code_values().astype(np.float64) * 2.0**shift
    codes = unpack_codes(w.codes, w.fmt.bits, w.shape[0] * w.nblocks * 32)
    return values[np.asarray(codes, np.int64)].astype(np.int32).reshape(w.shape[0], w.nblocks, 32)


def reference_q8(w: MXTensor, x: np.ndarray) -> np.ndarray:
    """``quantize_q8(x) @ W.T`` in numpy, in the kernel's exact order of float32 operations (module docstring):
    float32 ``[S, N]`` for ``x`` ``[S, K]``. Slow (for tests)."""
    _check(w)
    x = np.asarray(x, _F32).reshape(-1, w.shape[1])
    q, d = quantize_q8(x, w.nblocks)
    wi = _weight_ints(w)  # [N, B, 32]
    shift = Q8_FORMATS[w.fmt.name]
    with np.errstate(over="ignore", invalid="ignore"):
        ws = np.where(w.scales == 255, np.nan, np.ldexp(1.0, w.scales.astype(np.int64) - 127 - shift)).astype(_F32)
        n, nb = w.shape[0], w.nblocks
        parts = np.einsum("sble,nble->snbl", q.reshape(-1, nb, 8, 4).astype(np.int64), wi.reshape(n, nb, 8, 4))
        scale = (ws.reshape(n, nb)[None, :, :] * d[:, None, :]).astype(_F32)  # [S, N, B]
        prod = (parts.astype(_F32) * scale[..., None]).astype(_F32)  # [S, N, B, 8]; |parts| < 2^24: exact
        acc = np.zeros((4, *prod.shape[:2], 8), _F32)
        for b in range(nb):
            acc[b % 4] = (acc[b % 4] + prod[:, :, b]).astype(_F32)
        t = ((acc[0] + acc[1]).astype(_F32) + (acc[2] + acc[3]).astype(_F32)).astype(_F32)
        lo = (t[..., 0] + t[..., 4]).astype(_F32) + (t[..., 2] + t[..., 6]).astype(_F32)
        hi = (t[..., 1] + t[..., 5]).astype(_F32) + (t[..., 3] + t[..., 7]).astype(_F32)
        return (lo.astype(_F32) + hi.astype(_F32)).astype(_F32)


def _lanes(v: np.ndarray) -> np.ndarray:
    """H(v) of mxkernel_gq8.c over the last axis (8 lanes): ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))."""
    lo = (v[..., 0] + v[..., 4]).astype(_F32) + (v[..., 2] + v[..., 6]).astype(_F32)
    hi = (v[..., 1] + v[..., 5]).astype(_F32) + (v[..., 3] + v[..., 7]).astype(_F32)
    return (lo.astype(_F32) + hi.astype(_F32)).astype(_F32)


def reference_q8_ggml(t: GGMLTensor, x: np.ndarray) -> np.ndarray:
    """``quantize_q8(x) @ W.T`` for a GGUF-block weight (any layout) in numpy, in the kernel's exact order of
    float32 operations (accel/formats/mxkernel_gq8.c: ``c_b = d_b * dx_b``, ``acc[b % 4] += float(p_b) * c_b`` per
    lane, offsets ``off[b % 8] += m_b * (dx_b * sum(q_b))``; ``I8_F32``: a d per 16 weights, and the offset term
    ``m_b0 * u_b0 + m_b1 * u_b1`` over the two halves' sums): float32 ``[S, N]`` for ``x`` ``[S, K]``. Slow (tests)."""
    x = np.asarray(x, _F32).reshape(-1, t.shape[1])
    nb = t.nblocks
    q, dx = quantize_q8(x, nb)
    wi = t.integer_codes().astype(np.int64)  # [N, B, 32]
    d, m = t._d_m()  # float32 [N, B, 1], or (I8_F32) [N, B, 32]: each weight's own
    halves = 2 if t.qtype.name == "I8_F32" else 1
    d_lane = np.repeat(d[..., :: 32 // halves], 8 // halves, axis=-1)  # [N, B, 8]: the d of each lane's weights
    with np.errstate(over="ignore", invalid="ignore"):
        parts = np.einsum("sble,nble->snbl", q.reshape(-1, nb, 8, 4).astype(np.int64), wi.reshape(-1, nb, 8, 4))
        c = (d_lane[None] * dx[:, None, :, None]).astype(_F32)  # [S, N, B, 8]
        prod = (parts.astype(_F32) * c).astype(_F32)  # |parts| < 2^24: exact as float32
        acc = np.zeros((4, *prod.shape[:2], 8), _F32)
        for b in range(nb):
            acc[b % 4] = (acc[b % 4] + prod[:, :, b]).astype(_F32)
        tsum = ((acc[0] + acc[1]).astype(_F32) + (acc[2] + acc[3]).astype(_F32)).astype(_F32)
        y = _lanes(tsum)
        if m is None:
            return y
        sums = q.astype(np.int64).reshape(*q.shape[:2], halves, 32 // halves).sum(axis=3)  # [S, B, halves]
        u = (dx[..., None] * sums.astype(_F32)).astype(_F32)
        m_half = m[..., :: 32 // halves]  # [N, B, halves]
        terms = (m_half[None] * u[:, None]).astype(_F32)  # [S, N, B, halves]
        o = terms[..., 0] if halves == 1 else (terms[..., 0] + terms[..., 1]).astype(_F32)
        off = np.zeros((*o.shape[:2], 8), _F32)
        for b in range(nb):
            off[..., b % 8] = (off[..., b % 8] + o[..., b]).astype(_F32)
        return (y + _lanes(off)).astype(_F32)


def q8_kernel_path(packed: PackedMX) -> str:
    """The code that runs ``matmul_q8`` (``q8_path``)."""
    return q8_path(packed._lib)


def q8_path(lib: ctypes.CDLL | None) -> str:
    """The int8-activation code the kernel ``lib`` runs now (``set_isa``): ``"avx512-vbmi-vnni"``,
    ``"avx512-vnni"``, ``"avx-vnni"`` (the AVX2 code with AVX-VNNI's ``vpdpbusd``), ``"avx2"``, ``"portable"`` (C)
    or ``"numpy"`` (no kernel)."""
    if lib is None:
        return "numpy"
    path = lib.mxk_q8_path()
    if path == 1 and lib.mxk_avxvnni():
        return "avx-vnni"
    return ("portable", "avx2", "avx512-vnni", "avx512-vbmi-vnni")[path]


def matmul_q8(packed: PackedMX, x: np.ndarray, threads: int | None = None) -> np.ndarray:
    """``x @ W.T`` with ``x`` quantized per block of 32 to int8: float32 ``[..., K]`` -> float32 ``[..., N]``, equal
    bit for bit to ``reference_q8`` (module docstring); the numpy reference itself where the kernel is not built."""
    w = packed.weight
    _check(w)
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim == 0 or x.shape[-1] != packed.in_features:
        raise FormatError(f"matmul_q8 needs float32 activations [..., {packed.in_features}], got {x.dtype} {x.shape}")
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x.reshape(-1, packed.in_features))
    if packed._lib is None:
        return reference_q8(w, x2).reshape(*lead, packed.out_features)
    width = w.nblocks * 32
    if width != packed.in_features:  # the kernel reads whole blocks: zero-pad
        padded = np.zeros((x2.shape[0], width), _F32)
        padded[:, : packed.in_features] = x2
        x2 = padded
    fast = 1 if w.fmt.name == MXFP6_E2M3.name else 2
    planes = (w.codes.ctypes.data, w.scales.ctypes.data)
    y = linear_q8_call(packed._lib, planes, fast, packed.out_features, w.nblocks, x2, packed._threads(threads))
    return y.reshape(*lead, packed.out_features)


def linear_q8_call(
    lib: Any,
    planes: tuple[int, int],
    fast: int,
    n: int,
    nblocks: int,
    x: np.ndarray,
    threads: int,
    interleaved: bool = False,
) -> np.ndarray:
    """``mxk_linear_q8`` of the weight whose code and scale planes are at ``planes`` (pointers), format code ``fast``,
    ``n`` outputs of ``nblocks`` blocks, on C-contiguous float32 activations ``x`` ``[S, >= 32 * nblocks]``: float32
    ``[S, n]`` (``interleaved``: ``mxk_linear_x16``, GGUF planes in ``accel.formats.ggml_x16``'s layout). MemoryError
    when the kernel cannot allocate the quantized activations, FormatError when it refuses."""
    y = np.empty((x.shape[0], n), _F32)
    call, what = (lib.mxk_linear_x16, "matmul_q8_x16") if interleaved else (lib.mxk_linear_q8, "matmul_q8")
    rc = call(*planes, fast, n, nblocks, x.ctypes.data, x.shape[0], x.shape[1], y.ctypes.data, threads)
    if rc == -2:
        raise MemoryError(f"{what}: the kernel could not allocate the quantized activations")
    if rc != 0:
        raise FormatError(f"{what}: the kernel refused format {fast} ({n} x {32 * nblocks}; code {rc})")
    return y
