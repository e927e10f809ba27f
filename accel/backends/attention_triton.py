"""A Triton attention kernel for decode calls (one query token per row) over the position-indexed static cache: the
torch path's math (``accel.models.decoder.attend``: scaled dot products, masked, float32 softmax, weighted values)
in one kernel per layer, that reads only the cache slots the query sees.

Why: the torch path runs two batched matrix-vector products and a softmax over *every* slot of the static cache
(``ctx_len + 1`` of them, whatever the context), which cuBLAS serves at ~1.2 TB/s on an H200 (13% of a Llama-2-7B
step at ctx_len 1024; benchmarks/RESULTS.md, "GPU decode"). Here each program owns one KV head of one row (all its
query heads: grouped-query attention reads each key once) and a round-robin share of the slots in blocks of
``BLOCK_J`` (``splits`` programs per head; a second kernel combines their partial softmax sums); masked-off slots'
keys and values are never loaded, so a call costs what its context costs.

Numerics: scores, softmax and the weighted sum in float32 from the cache's values (the torch path rounds scores and
probabilities to the compute dtype between its matmuls): equal to float32 math on the same values up to summation
order; the result is rounded once to the query's dtype. A query that sees no slot (a padding column) gets zeros
(the torch path: the mean of every slot's value); its outputs are discarded either way. Calls of more than one
token per row (verify and tree calls) run the torch path.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch
from torch import nn

from accel.backends.gemv_triton import available
from accel.backends.triton_support import pow2
from accel.models.decoder import Attention
from accel.models.decoder import attend as attend_torch

__all__ = ["TUNED_SPLITS", "attend", "decode_attention", "launch_config", "use_decode_attention"]

#: (row x KV-head programs, cache slots) -> splits, where measured (benchmarks/gpu_gemv.py fills it in its run)
TUNED_SPLITS: dict[tuple[int, int], int] = {}
#: programs a call aims for (splitting each head's slots) where nothing is tuned: a few per SM of a large GPU
TARGET_PROGRAMS = 512


def _kernels() -> Any:
    return importlib.import_module("accel.backends.attention_triton_kernels")


def launch_config(heads: int, slots: int, group: int, splits: int | None = None) -> tuple[int, int]:
    """(BLOCK_J, splits) for ``heads`` row x KV-head programs over ``slots`` cache slots with ``group`` query heads
    per KV head: 64 slots a block (fewer for wide groups: registers), and ``splits`` where given, else
    ``TUNED_SPLITS`` or enough splits to reach ``TARGET_PROGRAMS``; at most one split a block."""
    block = max(8, 64 // pow2(group))
    blocks = -(-slots // block)
    if splits is None:
        splits = TUNED_SPLITS.get((heads, slots)) or -(-TARGET_PROGRAMS // heads)
    return block, max(1, min(int(splits), blocks))


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor, splits: int | None = None
) -> torch.Tensor:
    """Attention of one query token per row: ``q [B, HQ, 1, D]``, caches ``[B, HKV, ctx, D]`` (HQ a multiple of
    HKV; D a power of two), ``visible`` bool with ``B * ctx`` elements (the slots each row's query sees). Returns
    ``[B, HQ, 1, D]`` in q's dtype. ``splits``: programs per head (default ``launch_config``)."""
    bsz, hq, seq, dim = q.shape
    hkv, ctx = k_cache.shape[1], k_cache.shape[2]
    if seq != 1 or hq % hkv or dim & (dim - 1) or visible.numel() != bsz * ctx:
        raise ValueError(
            f"decode attention: q {tuple(q.shape)} (one token per row, a power-of-two head size), caches "
            f"{tuple(k_cache.shape)}, visible {tuple(visible.shape)}: shapes do not fit"
        )
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or q.stride(3) != 1:
        raise ValueError("decode attention: the head dimension must be contiguous")
    group = hq // hkv
    block, split_count = launch_config(bsz * hkv, ctx, group, splits)
    blocks = -(-ctx // block)
    iters = -(-blocks // split_count)  # blocks per split
    vis = visible.reshape(bsz, ctx)
    vis = vis.view(torch.uint8) if vis.dtype == torch.bool else (vis != 0).view(torch.uint8)  # no copy of a bool mask
    out = torch.empty((bsz, hq, 1, dim), dtype=q.dtype, device=q.device)
    part = out if split_count == 1 else torch.empty((bsz * hq, split_count, dim + 2), dtype=torch.float32,
                                                    device=q.device)  # fmt: skip
    kern = _kernels()
    kern.decode_attention_kernel[(bsz * hkv, split_count)](
        q, k_cache, v_cache, vis, out, part, hkv, ctx, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), vis.stride(0),
        1.0 / math.sqrt(dim),
        ITERS=iters, G=group, GP=pow2(group), D=dim, BLOCK_J=block, SPLITS=split_count,
    )  # fmt: skip
    if split_count > 1:
        kern.combine_kernel[(bsz * hq,)](part, out, SPLITS=split_count, SP=pow2(split_count), D=dim)
    return out


@torch.library.custom_op("accel::decode_attention", mutates_args=())
def decode_attention_op(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """``decode_attention`` as an op opaque to ``torch.compile`` (and captured in CUDA graphs)."""
    return decode_attention(q, k_cache, v_cache, visible)


@decode_attention_op.register_fake
def _(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """``accel.models.decoder.attend`` with decode calls (one token per row, the cache in q's dtype) through the
    kernel and every other call through the torch path (``use_decode_attention`` installs it where the kernel
    runs)."""
    if q.shape[2] != 1 or k_cache.dtype != q.dtype:
        return attend_torch(q, k_cache, v_cache, visible)
    return decode_attention_op(q, k_cache, v_cache, visible)


def use_decode_attention(model: nn.Module, device: torch.device) -> int:
    """Set ``attend`` as the attention of every ``Attention`` module of ``model`` (in place) where the kernel runs on
    ``device`` (``gemv_triton.available``) and the head size is a power of two; returns how many."""
    if not available(device):
        return 0
    layers = [m for m in model.modules() if isinstance(m, Attention) and not m.head_dim & (m.head_dim - 1)]
    for layer in layers:
        layer.attend = attend
    return len(layers)
