"""What one backend call takes and its validation, shared by every backend (re-exported by ``accel.backends.base``,
whose protocols use them): ``BackendInfo`` (the facts a call is checked against), the inputs of a tree call
(``TreeInputs``) and of a superposed one (``MixInputs``), and the checks ``check_step_inputs`` (ids and positions),
``check_extensions`` (features, hidden states; ``check_float_rows`` for any per-token float input), ``check_mix``,
``check_tree_inputs`` (``chain_tree_inputs`` builds a chain call's) and ``check_moves`` (``move_cache``). Each check
returns the arrays in the dtype and layout a runtime takes, or raises ``BackendError`` naming the problem
(docs/backends.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accel.errors import BackendError

__all__ = [
    "BackendInfo",
    "MixInputs",
    "TreeInputs",
    "chain_tree_inputs",
    "check_extensions",
    "check_float_rows",
    "check_mix",
    "check_moves",
    "check_step_inputs",
    "check_tree_inputs",
]


@dataclass(frozen=True)
class BackendInfo:
    """Static facts about a backend instance.

    Attributes:
        name: human-readable runtime name, e.g. ``"onnxruntime"``, ``"torch"``, ``"qaic"``.
        vocab_size: number of logits per position (tokens).
        ctx_len: KV-cache length in tokens; valid positions are ``0 .. ctx_len - 1``.
        batch_size: rows per call (fixed, as a compiled accelerator graph requires).
        max_seq_len: most tokens ``S`` per call (the compiled prompt-chunk length); prompts longer than this are
            prefilled in chunks by ``accel.backends.base.prefill``.
        num_layers: transformer layers (for statistics and the simulator).
        capabilities: what this backend can do beyond a plain call (``"hidden_states"``, ``"features"``, ``"tree"``,
            ``"mix"``; ``accel.backends.base``).
        hidden_size: width of the ``hidden_states`` output (0 when unknown).
        feature_size: width of the ``features`` input of a feature draft (0: not a feature draft).
    """

    name: str
    vocab_size: int
    ctx_len: int
    batch_size: int
    max_seq_len: int
    num_layers: int = 0
    capabilities: frozenset[str] = field(default_factory=frozenset)
    hidden_size: int = 0
    feature_size: int = 0


@dataclass(frozen=True, eq=False)
class TreeInputs:
    """The inputs of a token-tree call (``"tree"``; ``accel.backends.base``): ``slot_ids`` int ``[B, S]``, the cache
    slot each token writes, and ``tree_mask`` bool ``[B, S, ctx_len]``, the slots each token sees. Checked by the
    backend (:func:`check_tree_inputs`)."""

    slot_ids: np.ndarray
    tree_mask: np.ndarray


@dataclass(frozen=True, eq=False)
class MixInputs:
    """Superposed inputs of one call (``"mix"``; ``accel.backends.base``): token ``ids`` int ``[B, S, M]`` and their
    ``weights`` float ``[B, S, M]``. Checked by the backend (:func:`check_mix`)."""

    ids: np.ndarray
    weights: np.ndarray


def check_step_inputs(
    info: BackendInfo, input_ids: np.ndarray, position_ids: np.ndarray, num_logits: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Validate one ``forward`` call against ``info`` and return the inputs as contiguous int64 arrays.

    Raises ``BackendError`` naming the problem: wrong rank/shape, batch size mismatch, a sequence longer than the
    compiled length, token ids outside ``[0, vocab_size)``, positions ``>= ctx_len`` or below -1, or a bad
    ``num_logits``.
    """
    ids = np.asarray(input_ids)
    pos = np.asarray(position_ids)
    if ids.ndim != 2 or pos.ndim != 2:
        raise BackendError(
            f"input_ids and position_ids must be 2-D [batch, seq]; got shapes {ids.shape} and {pos.shape}"
        )
    if ids.shape != pos.shape:
        raise BackendError(f"input_ids shape {ids.shape} differs from position_ids shape {pos.shape}")
    if not (np.issubdtype(ids.dtype, np.integer) and np.issubdtype(pos.dtype, np.integer)):
        raise BackendError(f"input_ids/position_ids must be integer arrays; got {ids.dtype} and {pos.dtype}")
    batch, seq = ids.shape
    if batch != info.batch_size:
        raise BackendError(f"batch size {batch} does not match the backend's batch size {info.batch_size}")
    if seq < 1 or seq > info.max_seq_len:
        raise BackendError(f"sequence length {seq} is outside 1..{info.max_seq_len} (the backend's max_seq_len)")
    low = int(pos.min())
    if low < -1:
        raise BackendError(f"position_ids below -1 (the padding marker): min {low}")
    top = int(pos.max())  # padding (-1) is below every valid position
    if top >= info.ctx_len:
        raise BackendError(
            f"position {top} is beyond the KV cache: ctx_len is {info.ctx_len} (valid positions 0..{info.ctx_len - 1})"
        )
    padded = low < 0  # a call without padding (every decode step) checks its ids by two reductions, no masks
    valid = pos >= 0 if padded else None
    if padded or int(ids.min()) < 0 or int(ids.max()) >= info.vocab_size:
        bad = (ids < 0) | (ids >= info.vocab_size)
        if valid is not None:
            bad &= valid
        if np.any(bad):
            raise BackendError(f"token id {int(ids[bad][0])} is outside the vocabulary [0, {info.vocab_size})")
    if num_logits is not None and not (1 <= num_logits <= seq):
        raise BackendError(f"num_logits={num_logits} must be in 1..{seq} (the call's sequence length)")
    # padding slots may hold any id; give the runtime a harmless one
    ids = (ids if valid is None else np.where(valid, ids, 0)).astype(np.int64, copy=False)
    # writable C-contiguous copies where needed (np.broadcast_to views are read-only; torch.from_numpy warns on them)
    return (
        np.require(ids, np.int64, ["C_CONTIGUOUS", "WRITEABLE"]),
        np.require(pos, np.int64, ["C_CONTIGUOUS", "WRITEABLE"]),
    )


def check_extensions(
    info: BackendInfo, ids: np.ndarray, features: np.ndarray | None, hidden: bool
) -> np.ndarray | None:
    """Validate the ``features`` of one call (``hidden``: a ``forward_hidden`` call); returns them as C-contiguous
    float32.

    ``BackendError`` when hidden states are asked of a backend without ``"hidden_states"``, when a feature draft gets
    no ``features`` (or another model gets some), or when their shape is not ``[B, S, info.feature_size]`` or they
    hold NaN/inf.
    """
    if hidden and "hidden_states" not in info.capabilities:
        raise BackendError(
            f"this {info.name} backend does not output hidden states (forward_hidden); export the model with "
            "hidden_output=True"
        )
    if not info.feature_size:
        if features is not None:
            raise BackendError("features given to a backend that is not a feature draft (no 'features' input)")
        return None
    if features is None:
        raise BackendError(f"this backend is a feature draft: forward needs features [B, S, {info.feature_size}]")
    return check_float_rows(features, (*ids.shape, info.feature_size), "features", "[batch, seq, feature_size]")


def check_float_rows(value: Any, want: tuple[int, ...], name: str, layout: str) -> np.ndarray:
    """``value`` (a call's per-token float input: features, a stage's ``hidden_in``) as C-contiguous, writeable
    float32 of shape ``want``; ``BackendError`` naming ``name`` and its ``layout`` when the shape differs, and when
    the values are not floating point or hold NaN/inf."""
    f = np.asarray(value)
    if f.shape != want:
        raise BackendError(f"{name} has shape {f.shape}; expected {want} ({layout})")
    if not np.issubdtype(f.dtype, np.floating) or not np.all(np.isfinite(f)):
        raise BackendError(f"{name} must hold finite floating-point values")
    return np.require(f, np.float32, ["C_CONTIGUOUS", "WRITEABLE"])


def check_mix(
    info: BackendInfo, ids: np.ndarray, pos: np.ndarray, mix: MixInputs | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Validate the ``mix`` of one ``forward`` call (``ids``/``pos`` already checked); returns C-contiguous
    ``(int64 ids, float32 weights)`` with padding columns zeroed, or None for an ordinary call (``mix`` None).

    ``BackendError`` when the backend has no ``"mix"`` capability, the shapes are not one ``[B, S, M]`` with
    ``M >= 1``, an id of a real column is outside the vocabulary, or a weight is NaN/inf.
    """
    if mix is None:
        return None
    if not isinstance(mix, MixInputs):
        raise BackendError(f"mix must be an accel.backends.MixInputs(ids, weights); got {type(mix).__name__}")
    if "mix" not in info.capabilities:
        raise BackendError(
            f"this {info.name} backend takes no mixed inputs (mix ids and weights): export the model with "
            "mix_inputs=True"
        )
    m_ids, m_w = np.asarray(mix.ids), np.asarray(mix.weights)
    if m_ids.ndim != 3 or m_ids.shape[:2] != ids.shape or m_ids.shape[2] < 1 or m_w.shape != m_ids.shape:
        raise BackendError(
            f"mix ids {m_ids.shape} and weights {m_w.shape} must both be [batch, seq, M] = "
            f"[{ids.shape[0]}, {ids.shape[1]}, M >= 1]"
        )
    if not np.issubdtype(m_ids.dtype, np.integer):
        raise BackendError(f"mix ids must be integers; got {m_ids.dtype}")
    if not np.issubdtype(m_w.dtype, np.floating) or not np.all(np.isfinite(m_w)):
        raise BackendError("mix weights must be finite floating-point values")
    real = (pos >= 0)[:, :, None]
    bad = real & ((m_ids < 0) | (m_ids >= info.vocab_size))
    if np.any(bad):
        raise BackendError(f"mix id {int(m_ids[bad][0])} is outside the vocabulary [0, {info.vocab_size})")
    return (
        np.ascontiguousarray(np.where(real, m_ids, 0), dtype=np.int64),
        np.ascontiguousarray(np.where(real, m_w, 0.0), dtype=np.float32),
    )


def chain_tree_inputs(position_ids: np.ndarray, ctx_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(slot_ids, tree_mask)`` of a chain call: each token at the slot of its position, seeing slots
    ``0 .. position`` (padding sees nothing). A graph with tree inputs computes the chain contract from these."""
    pos = np.asarray(position_ids, dtype=np.int64)
    slots = np.where(pos >= 0, pos, 0)
    mask = np.arange(ctx_len, dtype=np.int64)[None, None, :] <= pos[:, :, None]
    return np.ascontiguousarray(slots), mask


def check_tree_inputs(
    info: BackendInfo, position_ids: np.ndarray, tree: TreeInputs | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Validate the ``tree`` of one ``forward`` call (``position_ids`` already checked); returns it as C-contiguous
    ``(int64 slot_ids, bool tree_mask)``, or None for a chain call (``tree`` None).

    ``BackendError`` naming the problem when the backend has no ``"tree"`` capability, a shape is
    not ``[B, S]`` / ``[B, S, ctx_len]``, the mask is not boolean, a token's slot is outside the cache or shared with
    another token of its row, a token does not see its own slot, or a token sees the slot of another token of the
    call that is not at an earlier position (a sibling, a descendant, or a cycle: in-call ancestors come first).
    Padding columns (position -1) write nothing; their slots and mask rows are ignored.
    """
    if tree is None:
        return None
    if not isinstance(tree, TreeInputs):
        raise BackendError(f"tree must be an accel.backends.TreeInputs(slot_ids, tree_mask); got {type(tree).__name__}")
    if "tree" not in info.capabilities:
        raise BackendError(
            f"this {info.name} backend has no tree inputs (slot_ids, tree_mask): export the model with tree=True"
        )
    pos = np.asarray(position_ids)
    slots, mask = np.asarray(tree.slot_ids), np.asarray(tree.tree_mask)
    if slots.shape != pos.shape or not np.issubdtype(slots.dtype, np.integer):
        raise BackendError(f"slot_ids must be an integer array of shape {pos.shape}; got {slots.dtype} {slots.shape}")
    want = (*pos.shape, info.ctx_len)
    if mask.shape != want:
        raise BackendError(f"tree_mask has shape {mask.shape}; expected {want} ([batch, seq, ctx_len])")
    if mask.dtype != np.bool_:
        raise BackendError(f"tree_mask must be a boolean array; got {mask.dtype}")
    valid = pos >= 0
    bad = valid & ((slots < 0) | (slots >= info.ctx_len))
    if bad.any():
        raise BackendError(f"slot {int(slots[bad][0])} is outside the KV cache (slots 0..{info.ctx_len - 1})")
    slots = np.where(valid, slots, 0).astype(np.int64)
    for b in np.flatnonzero(valid.any(axis=1)):
        row = slots[b, valid[b]]
        if np.unique(row).size != row.size:
            dup = int(np.flatnonzero(np.bincount(row) > 1)[0])
            raise BackendError(f"row {b}: slot {dup} is written by two tokens of one call (slots must be unique)")
    # sees[b, s, t]: token s sees the slot token t writes
    sees = np.take_along_axis(mask, np.broadcast_to(slots[:, None, :], mask.shape[:2] + slots.shape[1:]), axis=2)
    pair = valid[:, :, None] & valid[:, None, :]
    own = np.diagonal(sees, axis1=1, axis2=2)
    if np.any(valid & ~own):
        b, s = np.argwhere(valid & ~own)[0]
        raise BackendError(f"row {b}, column {s}: tree_mask hides the token's own slot {int(slots[b, s])}")
    later = sees & pair & ~np.eye(pos.shape[1], dtype=bool)[None] & (pos[:, None, :] >= pos[:, :, None])
    if later.any():
        b, s, t = np.argwhere(later)[0]
        raise BackendError(
            f"row {b}: column {s} (position {int(pos[b, s])}) sees column {t} (position {int(pos[b, t])}), which "
            "is not an ancestor: a token may see only tokens of the call at earlier positions (no siblings, "
            "descendants or cycles)"
        )
    return slots, np.ascontiguousarray(mask)


def check_moves(info: BackendInfo, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate a ``move_cache`` request: int arrays ``[B, M]`` of equal shape, -1 marking no move (in both), slots
    otherwise in ``0 .. ctx_len - 1``, destinations unique per row. Returns them as int64 (BackendError otherwise)."""
    s, d = np.asarray(src), np.asarray(dst)
    if s.shape != d.shape or s.ndim != 2 or s.shape[0] != info.batch_size:
        raise BackendError(
            f"move_cache needs src and dst of one shape [batch={info.batch_size}, M]; got {s.shape}, {d.shape}"
        )
    if not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(d.dtype, np.integer)):
        raise BackendError("move_cache slots must be integers")
    if np.any((s < 0) != (d < 0)):
        raise BackendError("move_cache: -1 (no move) must appear in src and dst at the same places")
    for name, a in (("src", s), ("dst", d)):
        if np.any(a < -1) or np.any(a >= info.ctx_len):
            raise BackendError(
                f"move_cache {name} slots must be in 0..{info.ctx_len - 1} (or -1); got {a.min()}..{a.max()}"
            )
    for b in range(d.shape[0]):
        row = d[b][d[b] >= 0]
        if np.unique(row).size != row.size:
            raise BackendError(f"move_cache: row {b} writes one destination slot twice")
    return s.astype(np.int64), d.astype(np.int64)
