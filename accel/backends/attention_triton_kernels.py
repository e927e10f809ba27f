"""The Triton kernels of ``accel.backends.attention_triton`` (imported only where triton is; see that module)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["combine_kernel", "decode_attention_kernel"]

#: the masked score (float32's lowest finite value, as the torch attention uses)
LOWEST = tl.constexpr(-3.4028234663852886e38)


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, vis_ptr, o_ptr, part_ptr, HKV, CTX,
                            sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, svis_b, scale,
                            ITERS: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                            BLOCK_J: tl.constexpr, SPLITS: tl.constexpr):  # fmt: skip
    """One query token's attention for the G query heads of KV head ``h`` of row ``b`` over cache slots
    blocks ``split, split + SPLITS, ..`` of ``BLOCK_J`` slots (round robin, so the visible slots spread over the splits;
    an online softmax in float32). Only visible slots' keys and values are loaded. With one
    split the normalised output is stored in o's dtype; else (max, sum, unnormalised output) go to ``part``."""
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    g = tl.arange(0, GP)
    gmask = g < G
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + (h * G + g)[:, None] * sq_h + d[None, :], mask=gmask[:, None], other=0.0)
    q = q.to(tl.float32) * scale
    m = tl.full((GP,), LOWEST, tl.float32)
    total = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, D), tl.float32)
    for i in range(ITERS):
        j = (i * SPLITS + split) * BLOCK_J + tl.arange(0, BLOCK_J)
        inside = j < CTX
        vis = (tl.load(vis_ptr + b * svis_b + j, mask=inside, other=0) != 0) & inside
        k = tl.load(k_ptr + b * sk_b + h * sk_h + j[:, None] * sk_s + d[None, :], mask=vis[:, None], other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [GP, BLOCK_J]
        s = tl.where(vis[None, :], s, LOWEST)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.where(inside[None, :], tl.exp(s - m_new[:, None]), 0.0)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + j[:, None] * sv_s + d[None, :], mask=vis[:, None], other=0.0)
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m = m_new
    heads = (b * HKV + h) * G + g  # the flat (row, query head) index
    if SPLITS == 1:
        out = acc / total[:, None]
        tl.store(o_ptr + heads[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=gmask[:, None])
    else:  # part [B * HQ, SPLITS, D + 2]: the unnormalised output, then the max and the sum
        base = part_ptr + (heads * SPLITS + split) * (D + 2)
        tl.store(base[:, None] + d[None, :], acc, mask=gmask[:, None])
        tl.store(base + D, m, mask=gmask)
        tl.store(base + D + 1, total, mask=gmask)


@triton.jit
def combine_kernel(part_ptr, o_ptr, SPLITS: tl.constexpr, SP: tl.constexpr, D: tl.constexpr):
    """The output of one (row, query head) from its splits' partial softmax sums (rescaled to the largest max)."""
    head = tl.program_id(0)
    sp = tl.arange(0, SP)
    smask = sp < SPLITS
    d = tl.arange(0, D)
    base = part_ptr + (head * SPLITS + sp) * (D + 2)
    m = tl.load(base + D, mask=smask, other=LOWEST)
    total = tl.load(base + D + 1, mask=smask, other=0.0)
    acc = tl.load(base[:, None] + d[None, :], mask=smask[:, None], other=0.0)
    w = tl.where(smask, tl.exp(m - tl.max(m, axis=0)), 0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(total * w, axis=0)
    tl.store(o_ptr + head * D + d, out.to(o_ptr.dtype.element_ty))
