"""The ``Backend`` protocol: what the speculative decoding loop needs from a runtime.

A backend owns one model instance and its KV cache (the position-indexed contract of docs/reference.md §2): every call
writes the keys/values of its tokens at ``position_ids`` and attends to every cache slot ``<=`` the query's position.
Nothing is ever rolled back: a rejected speculative token is simply overwritten by a later call at the same position.

Conventions (every backend follows them, so the SpD loop is backend-agnostic):

- ``input_ids``: int64 ``[B, S]`` with ``B == info.batch_size`` and ``1 <= S <= info.max_seq_len``.
- ``position_ids``: int64 ``[B, S]``; ``-1`` marks a padding slot (its token is ignored, its K/V are not written, its
  logits are garbage). Valid positions must be ``< info.ctx_len``.
- ``forward`` returns float32 numpy logits ``[B, N, V]`` for the last ``N = num_logits`` columns (all ``S`` if None).
- Extension points arrive as further keyword-only arguments of ``forward``; a backend lists the ones it supports in
  ``info.capabilities`` and raises ``BackendError`` for the others. Implemented:

  - ``"hidden_states"``: ``return_hidden=True`` makes ``forward`` return ``(logits, hidden)`` with ``hidden`` the
    float32 final-norm hidden states ``[B, S, info.hidden_size]`` of every column (what the LM head reads);
  - ``"features"`` (a feature draft, ``accel.drafts.feature``): ``forward`` requires ``features``, float32
    ``[B, S, info.feature_size]``, the target's hidden state at each column's position - 1.

  Layer-range execution, tree masks and ``inputs_embeds`` are later extension points of the same form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

import numpy as np

from accel.errors import BackendError

__all__ = ["Backend", "BackendError", "BackendInfo", "check_extensions", "check_step_inputs", "prefill"]


@dataclass(frozen=True)
class BackendInfo:
    """Static facts about a backend instance.

    Attributes:
        name: human-readable runtime name, e.g. ``"onnxruntime"``, ``"torch"``, ``"qaic"``.
        vocab_size: number of logits per position (tokens).
        ctx_len: KV-cache length in tokens; valid positions are ``0 .. ctx_len - 1``.
        batch_size: rows per call (fixed, as a compiled accelerator graph requires).
        max_seq_len: most tokens ``S`` per call (the compiled prompt-chunk length); prompts longer than this are
            prefilled in chunks by :func:`prefill`.
        num_layers: transformer layers (for statistics and the simulator).
        capabilities: optional ``forward`` features this backend supports (``"hidden_states"``, ``"features"``).
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


@runtime_checkable
class Backend(Protocol):
    """A model plus its KV cache that scores tokens at given positions."""

    @property
    def info(self) -> BackendInfo:
        """Static facts (vocab size, ctx_len, batch size, longest call)."""
        ...

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        features: np.ndarray | None = None,
        return_hidden: bool = False,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Write K/V for the tokens at ``position_ids`` and return float32 logits ``[B, N, V]`` of the last N columns
        (``(logits, hidden)`` with ``return_hidden``; see the module docstring for the extension arguments)."""
        ...

    def reset(self) -> None:
        """Forget the cached sequence (zero the KV cache)."""
        ...


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
    valid = pos >= 0
    if np.any(pos < -1):
        raise BackendError(f"position_ids below -1 (the padding marker): min {int(pos.min())}")
    if np.any(pos[valid] >= info.ctx_len):
        raise BackendError(
            f"position {int(pos[valid].max())} is beyond the KV cache: ctx_len is {info.ctx_len} "
            f"(valid positions 0..{info.ctx_len - 1})"
        )
    bad = valid & ((ids < 0) | (ids >= info.vocab_size))
    if np.any(bad):
        raise BackendError(f"token id {int(ids[bad][0])} is outside the vocabulary [0, {info.vocab_size})")
    if num_logits is not None and not (1 <= num_logits <= seq):
        raise BackendError(f"num_logits={num_logits} must be in 1..{seq} (the call's sequence length)")
    # padding slots may hold any id; give the runtime a harmless one
    ids = np.where(valid, ids, 0).astype(np.int64, copy=False)
    # writable C-contiguous copies where needed (np.broadcast_to views are read-only; torch.from_numpy warns on them)
    return (
        np.require(ids, np.int64, ["C_CONTIGUOUS", "WRITEABLE"]),
        np.require(pos, np.int64, ["C_CONTIGUOUS", "WRITEABLE"]),
    )


def check_extensions(
    info: BackendInfo, ids: np.ndarray, features: np.ndarray | None, return_hidden: bool
) -> np.ndarray | None:
    """Validate the extension arguments of one ``forward`` call; returns ``features`` as C-contiguous float32.

    ``BackendError`` when ``return_hidden`` is asked of a backend without ``"hidden_states"``, when a feature draft gets
    no ``features`` (or another model gets some), or when their shape is not ``[B, S, info.feature_size]`` or they
    hold NaN/inf.
    """
    if return_hidden and "hidden_states" not in info.capabilities:
        raise BackendError(
            f"this {info.name} backend does not output hidden states (return_hidden=True); export "
            "the model with hidden_output=True"
        )
    if not info.feature_size:
        if features is not None:
            raise BackendError("features given to a backend that is not a feature draft (no 'features' input)")
        return None
    if features is None:
        raise BackendError(f"this backend is a feature draft: forward needs features [B, S, {info.feature_size}]")
    f = np.asarray(features)
    want = (*ids.shape, info.feature_size)
    if f.shape != want:
        raise BackendError(f"features have shape {f.shape}; expected {want} ([batch, seq, feature_size])")
    if not np.issubdtype(f.dtype, np.floating) or not np.all(np.isfinite(f)):
        raise BackendError("features must be finite floating-point values")
    return np.require(f, np.float32, ["C_CONTIGUOUS", "WRITEABLE"])


def prefill(backend: Backend, input_ids: np.ndarray, position_ids: np.ndarray | None = None) -> np.ndarray:
    """Run a prompt through ``backend`` in chunks of at most ``info.max_seq_len`` tokens.

    Args:
        backend: any ``Backend``.
        input_ids: int ``[B, L]`` prompt tokens, left-padded (padding columns have position -1).
        position_ids: int ``[B, L]``; default ``0 .. L-1`` for every row (no padding).

    Returns:
        float32 logits ``[B, V]`` of each row's last column (left padding makes it every row's last real token).
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise BackendError(f"prompt must be a non-empty 2-D [batch, len] array; got shape {ids.shape}")
    if position_ids is None:
        position_ids = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape)
    pos = np.asarray(position_ids)
    if pos.shape != ids.shape:
        raise BackendError(f"position_ids shape {pos.shape} differs from input_ids shape {ids.shape}")
    if np.any(pos[:, -1] < 0):
        raise BackendError("the last prompt column is padding for some row: left-pad prompts (position -1 on the left)")
    step = backend.info.max_seq_len
    logits = None
    for start in range(0, ids.shape[1], step):
        chunk_ids = ids[:, start : start + step]
        chunk_pos = pos[:, start : start + step]
        logits = cast(np.ndarray, backend.forward(chunk_ids, chunk_pos, num_logits=1))
    assert logits is not None
    return logits[:, -1, :]
