"""The Triton kernel of ``accel.backends.gemv_triton`` (imported only where triton is; see that module)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["gemv_kernel"]


@triton.jit
def gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_x, stride_w, M,
                PER_SPLIT: tl.constexpr, MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN: tl.constexpr):  # fmt: skip
    """``out[split, m, n]`` = sum over in_features chunks ``split * PER_SPLIT ..`` of ``x[m, :] * w[n, :]``: products
    accumulate elementwise in float32 registers ``[MP, BLOCK_N, BLOCK_K]`` and are summed over the chunk's lanes once,
    at the end; the store rounds to ``out``'s dtype. ``EVEN``: N, K and the splits need no masks."""
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, MP)
    mmask = rm < M
    lanes = tl.arange(0, BLOCK_K)
    acc = tl.zeros((MP, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for i in range(PER_SPLIT):
        cols = (split * PER_SPLIT + i) * BLOCK_K + lanes
        wptr = w_ptr + rows[:, None] * stride_w + cols[None, :]
        xptr = x_ptr + rm[:, None] * stride_x + cols[None, :]
        if EVEN:
            w = tl.load(wptr)
            x = tl.load(xptr, mask=mmask[:, None], other=0.0)
        else:
            kmask = cols < K
            w = tl.load(wptr, mask=(rows < N)[:, None] & kmask[None, :], other=0.0)
            x = tl.load(xptr, mask=mmask[:, None] & kmask[None, :], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    out = out_ptr + split * M * N + rm[:, None] * N + rows[None, :]
    tl.store(out, tl.sum(acc, axis=2).to(out_ptr.dtype.element_ty), mask=mmask[:, None] & (rows < N)[None, :])
