"""The Triton kernels of ``accel.backends.mx_triton`` (imported only where triton is; see that module)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["mx_decode_kernel", "mx_matmul_kernel"]


@triton.jit
def pow2(biased):
    """2^(biased - 127) as float32 from its bits (0.0 for biased <= 0)."""
    b = tl.minimum(tl.maximum(biased, 0), 254)
    return (b << 23).to(tl.float32, bitcast=True)


@triton.jit
def values(code, BITS: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
           IS_INT: tl.constexpr):  # fmt: skip
    """Float32 values of int32 element codes (the fields' arithmetic of ``torch_mx_device.element_values``)."""
    if IS_INT:
        signed = tl.where(code >= 128, code - 256, code)
        return signed.to(tl.float32) * pow2(127 - MBITS)
    mant = code & ((1 << MBITS) - 1)
    e = (code >> MBITS) & ((1 << EBITS) - 1)
    whole = tl.where(e > 0, mant + (1 << MBITS), mant)
    mag = whole.to(tl.float32) * pow2(tl.maximum(e, 1) - BIAS - MBITS + 127)
    return tl.where(((code >> (BITS - 1)) & 1) == 1, -mag, mag)


@triton.jit
def quarter(lo_ptr, hi_ptr, rows, nmask, c, KP, Q: tl.constexpr, BITS: tl.constexpr):
    """Element codes (int32 ``[BLOCK_N, 32]``) of quarter Q of chunk c for output rows ``rows``."""
    lanes = tl.arange(0, 32)
    if BITS == 8:
        ptr = lo_ptr + rows[:, None] * KP + c * 128 + Q * 32 + lanes[None, :]
        return tl.load(ptr, mask=nmask[:, None], other=0).to(tl.int32)
    ptr = lo_ptr + rows[:, None] * (KP // 2) + c * 64 + (Q % 2) * 32 + lanes[None, :]
    low = tl.load(ptr, mask=nmask[:, None], other=0).to(tl.int32)
    code = (low >> ((Q // 2) * 4)) & 0x0F
    if BITS == 6:
        hptr = hi_ptr + rows[:, None] * (KP // 4) + c * 32 + lanes[None, :]
        top = tl.load(hptr, mask=nmask[:, None], other=0).to(tl.int32)
        code = code | (((top >> (2 * Q)) & 3) << 4)
    return code


@triton.jit
def halves(lo_ptr, hi_ptr, rows, cmask, c, KP, BITS: tl.constexpr):
    """Element codes (int32 ``[BLOCK_N, 64]`` each) of chunk c's first and second 64 elements."""
    t = tl.arange(0, 64)
    if BITS == 8:
        ptr = lo_ptr + rows[:, None] * KP + c * 128 + t[None, :]
        first = tl.load(ptr, mask=cmask[:, None], other=0).to(tl.int32)
        second = tl.load(ptr + 64, mask=cmask[:, None], other=0).to(tl.int32)
        return first, second
    low = tl.load(lo_ptr + rows[:, None] * (KP // 2) + c * 64 + t[None, :], mask=cmask[:, None], other=0).to(tl.int32)
    first = low & 0x0F  # byte t: element t (quarters 0, 1) in the low nibble, element 64 + t in the high one
    second = low >> 4
    if BITS == 6:
        hptr = hi_ptr + rows[:, None] * (KP // 4) + c * 32 + (t % 32)[None, :]
        top = tl.load(hptr, mask=cmask[:, None], other=0).to(tl.int32)
        shift = 2 * (t // 32)[None, :]
        first = first | (((top >> shift) & 3) << 4)
        second = second | (((top >> (shift + 4)) & 3) << 4)
    return first, second


@triton.jit
def mx_matmul_kernel(x_ptr, lo_ptr, hi_ptr, sc_ptr, part_ptr, N, K, KP, stride_x, M,
                     CHUNKS: tl.constexpr, PER_SPLIT: tl.constexpr, MP: tl.constexpr, BITS: tl.constexpr,
                     EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, IS_INT: tl.constexpr,
                     BLOCK_N: tl.constexpr):  # fmt: skip
    """Partial sums ``part[split, m, n]`` of ``x @ W.T`` over chunks ``split * PER_SPLIT ..`` (float32): products
    accumulate elementwise in registers and are summed over the 64 lanes once, at the end."""
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rows < N
    rm = tl.arange(0, MP)
    mmask = rm < M
    t = tl.arange(0, 64)
    acc = tl.zeros((MP, BLOCK_N, 64), dtype=tl.float32)
    for i in range(PER_SPLIT):
        c = split * PER_SPLIT + i
        cmask = nmask & (c < CHUNKS)
        first, second = halves(lo_ptr, hi_ptr, rows, cmask, c, KP, BITS)
        sptr = sc_ptr + rows[:, None] * (KP // 32) + c * 4 + (t // 32)[None, :]
        s_first = tl.load(sptr, mask=cmask[:, None], other=0).to(tl.int32)
        s_second = tl.load(sptr + 2, mask=cmask[:, None], other=0).to(tl.int32)
        w_first = values(first, BITS, EBITS, MBITS, BIAS, IS_INT) * pow2(s_first)
        w_second = values(second, BITS, EBITS, MBITS, BIAS, IS_INT) * pow2(s_second)
        cols = c * 128 + t
        xptr = x_ptr + rm[:, None] * stride_x + cols[None, :]
        xa = tl.load(xptr, mask=mmask[:, None] & (cols[None, :] < K), other=0.0).to(tl.float32)
        xb = tl.load(xptr + 64, mask=mmask[:, None] & (cols[None, :] + 64 < K), other=0.0).to(tl.float32)
        acc += xa[:, None, :] * w_first[None, :, :] + xb[:, None, :] * w_second[None, :, :]
    out = part_ptr + split * M * N + rm[:, None] * N + rows[None, :]
    tl.store(out, tl.sum(acc, axis=2), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def mx_decode_kernel(lo_ptr, hi_ptr, sc_ptr, w_ptr, N, K, KP,
                     BITS: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                     IS_INT: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.program_id(1)
    nmask = rows < N
    lanes = tl.arange(0, 32)
    for q in tl.static_range(4):
        v = values(quarter(lo_ptr, hi_ptr, rows, nmask, c, KP, q, BITS), BITS, EBITS, MBITS, BIAS, IS_INT)
        sc = tl.load(sc_ptr + rows * (KP // 32) + c * 4 + q, mask=nmask, other=0).to(tl.int32)
        cols = c * 128 + q * 32 + lanes
        ptr = w_ptr + rows[:, None] * K + cols[None, :]
        w = v * pow2(sc)[:, None]
        tl.store(ptr, w.to(w_ptr.dtype.element_ty), mask=nmask[:, None] & (cols[None, :] < K))
