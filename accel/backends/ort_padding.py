"""Padding columns of ``OrtBackend`` calls: how many rows a call needs (``min_rows``), the padding itself (position
-1, on the left so the logits stay last), and the free-slot rule of the graph's padding writes (see ``onnx_graph``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from accel.backends.ort_graph import GraphContract
from accel.errors import BackendError

__all__ = ["check_free_slot", "check_padding_slot", "default_min_rows", "left_pad", "resolve_min_rows"]


def resolve_min_rows(min_rows: int | None, c: GraphContract, graph_ops: Any) -> int:
    """``min_rows`` as given (checked) or the graph's default, checked against its ``ctx_len``."""
    if min_rows is not None and (isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1):
        raise BackendError(f"min_rows must be an int >= 1; got {min_rows!r}")
    rows = min_rows if min_rows is not None else default_min_rows(c.metadata, graph_ops)
    if rows > 1 and c.ctx_len < 2:
        raise BackendError(f"min_rows={rows} pads with position -1, which needs ctx_len >= 2")
    return rows


def default_min_rows(metadata: dict[str, str], graph_ops: Any) -> int:
    """``OrtBackend``'s default ``min_rows`` for a graph with these ``accel.*`` metadata and operator types: 2 for a
    ``MatMulNBits`` graph (a one-row call would take other kernel paths), 1 for others and for a grouped-rows graph
    (``accel.attention_rows = grouped``, ``export_onnx`` since these were introduced) with >= 2 query heads per KV
    head, whose one-token calls are multi-row products already."""
    if "MatMulNBits" not in graph_ops:
        return 1
    if metadata.get("accel.attention_rows") == "grouped":
        try:
            cfg = json.loads(metadata.get("accel.model_config", "{}"))
            heads = int(cfg.get("num_attention_heads") or 0)
            groups = heads // int(cfg.get("num_key_value_heads") or heads or 1)
        except (ValueError, TypeError, AttributeError):
            groups = 0
        if groups >= 2:
            return 1
    return 2


def left_pad(extra: int, ctx_len: int, ids, pos, feats, tree, mix) -> tuple:
    """``extra`` padding columns on the left of every input of a call (position -1; logits stay last)."""
    b = ids.shape[0]
    ids = np.concatenate([np.zeros((b, extra), ids.dtype), ids], axis=1)
    pos = np.concatenate([np.full((b, extra), -1, pos.dtype), pos], axis=1)
    if feats is not None:
        feats = np.concatenate([np.zeros((b, extra, feats.shape[2]), feats.dtype), feats], axis=1)
    if tree is not None:
        tree = (
            np.concatenate([np.zeros((b, extra), np.int64), tree[0]], axis=1),
            np.concatenate([np.zeros((b, extra, ctx_len), bool), tree[1]], axis=1),
        )
    if mix is not None:
        zero_ids = np.zeros((b, extra, mix[0].shape[2]), np.int64)
        mix = (
            np.concatenate([zero_ids, mix[0]], axis=1),
            np.concatenate([zero_ids.astype(np.float32), mix[1]], axis=1),
        )
    return ids, pos, feats, tree, mix


def check_padding_slot(pos: np.ndarray, tree, ctx_len: int) -> None:
    """The graph sends padding to a free slot next to the row's slots (see onnx_graph): a row writing both slot 0 and
    slot ``ctx_len - 1`` has none, and the call is refused."""
    pad = pos < 0
    if not pad.any():
        return
    written = pos if tree is None else tree[0]
    vmin = np.where(pad, ctx_len, written).min(axis=1)
    vmax = np.where(pad, -1, written).max(axis=1)
    bad = pad.any(axis=1) & (vmin == 0) & (vmax == ctx_len - 1)
    if bad.any():
        raise BackendError(
            f"row {int(np.argmax(bad))} mixes padding with slots 0 and {ctx_len - 1} in one "
            "call: no cache slot is free for its padding; split the call"
        )


def check_free_slot(pos: np.ndarray, ctx_len: int) -> None:
    """BackendError for a padded row whose positions include both 0 and ``ctx_len - 1`` (no free slot for its
    padding writes; see ``onnx_graph``)."""
    pad = pos < 0
    vmin = np.where(pad, ctx_len, pos).min(axis=1)
    vmax = np.where(pad, -1, pos).max(axis=1)
    bad = pad.any(axis=1) & (vmin == 0) & (vmax == ctx_len - 1)
    if bad.any():
        raise BackendError(
            f"row {int(np.argmax(bad))} mixes padding with positions 0 and {ctx_len - 1} in one call: no cache slot "
            "is free for its padding; split the call"
        )
