"""The ``Backend`` protocols: what the speculative decoding loop needs from a runtime.

A backend owns one model instance and its KV cache (the position-indexed contract of docs/reference.md §2): every call
writes the keys/values of its tokens at ``position_ids`` and attends to every cache slot ``<=`` the query's position.
Nothing is ever rolled back: a rejected speculative token is simply overwritten by a later call at the same position.

Conventions (every backend follows them, so the SpD loop is backend-agnostic):

- ``input_ids``: int64 ``[B, S]`` with ``B == info.batch_size`` and ``1 <= S <= info.max_seq_len``.
- ``position_ids``: int64 ``[B, S]``; ``-1`` marks a padding slot (its token is ignored, its K/V are not written, its
  logits are garbage). Valid positions must be ``< info.ctx_len``.
- ``forward`` returns float32 numpy logits ``[B, N, V]`` for the last ``N = num_logits`` columns (all ``S`` if None).
- Capabilities: what a backend can do beyond a plain call, listed in ``info.capabilities``. Each has a protocol that
  says how it is called; a caller that needs one narrows to it with :func:`require` (``BackendError`` naming what is
  missing) instead of passing options to a plain ``Backend``. Implemented:

  - ``"hidden_states"`` (``HiddenBackend``): ``forward_hidden`` returns ``(logits, hidden)`` with ``hidden`` the
    float32 final-norm hidden states ``[B, S, info.hidden_size]`` of every column (what the LM head reads);
  - ``"features"`` (``FeatureBackend``; a feature draft, ``accel.drafts.feature``): ``forward`` requires ``features``,
    float32 ``[B, S, info.feature_size]``, the target's hidden state at each column's position - 1.
  - ``"tree"`` (``TreeBackend``; token trees, docs/backends.md "Tree calls"): ``forward(..., tree=TreeInputs(slot_ids,
    tree_mask))``: ``slot_ids`` (int64 ``[B, S]``, the cache slot each token's K/V are written to, unique per row) and
    ``tree_mask`` (bool ``[B, S, ctx_len]``: token s attends to slot j iff ``tree_mask[b, s, j]``: its row's committed
    slots, its ancestors' slots and its own). Positions only drive RoPE then, so siblings may share one. Without them
    a call is a chain call (``slot_ids = position_ids``, slot j visible iff ``j <= position``). Such a backend also has
    ``move_cache(src, dst)``, which copies K/V between slots (the compaction after a tree is accepted).
  - ``"mix"`` (``MixBackend``; superposed inputs, ``accel.superposed``): ``forward(..., mix=MixInputs(ids,
    weights))`` with ``ids`` int64 ``[B, S, M]`` and ``weights`` float32 ``[B, S, M]``. Column s then enters the
    layers as the weighted sum of token embeddings ``sum_m weights[b, s, m] * E[ids[b, s, m]]`` instead of
    ``E[input_ids[b, s]]`` (``input_ids`` are validated but not read; pass ``ids[..., 0]``). One id of weight 1 is
    exactly the ordinary call. The weights need not sum to 1; padding columns ignore them.

  ``forward_hidden`` takes the keywords of ``forward`` too (a feature draft's tree call: ``features`` and ``tree``).
  Layer-range execution is a later capability of the same form.

Deprecated (one release): the keywords ``return_hidden=True`` (now ``forward_hidden``), ``slot_ids``/``tree_mask``
(now ``tree=TreeInputs(...)``) and ``mix_ids``/``mix_weights`` (now ``mix=MixInputs(...)``) still work in ``forward``
with a ``DeprecationWarning``; every backend hands them to :func:`legacy_forward`, which translates them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, overload, runtime_checkable

import numpy as np

from accel.errors import BackendError

__all__ = [
    "Backend",
    "BackendError",
    "BackendInfo",
    "FeatureBackend",
    "HiddenBackend",
    "MixBackend",
    "MixInputs",
    "ScoringBackend",
    "TreeBackend",
    "TreeInputs",
    "chain_tree_inputs",
    "check_extensions",
    "check_mix",
    "check_moves",
    "check_step_inputs",
    "check_tree_inputs",
    "legacy_forward",
    "prefill",
    "require",
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
            prefilled in chunks by :func:`prefill`.
        num_layers: transformer layers (for statistics and the simulator).
        capabilities: what this backend can do beyond a plain call (``"hidden_states"``, ``"features"``, ``"tree"``,
            ``"mix"``; module docstring).
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
    """The inputs of a token-tree call (``"tree"``; module docstring): ``slot_ids`` int ``[B, S]``, the cache slot
    each token writes, and ``tree_mask`` bool ``[B, S, ctx_len]``, the slots each token sees. Checked by the backend
    (:func:`check_tree_inputs`)."""

    slot_ids: np.ndarray
    tree_mask: np.ndarray


@dataclass(frozen=True, eq=False)
class MixInputs:
    """Superposed inputs of one call (``"mix"``; module docstring): token ``ids`` int ``[B, S, M]`` and their
    ``weights`` float ``[B, S, M]``. Checked by the backend (:func:`check_mix`)."""

    ids: np.ndarray
    weights: np.ndarray


@runtime_checkable
class Backend(Protocol):
    """A model plus its KV cache that scores tokens at given positions."""

    @property
    def info(self) -> BackendInfo:
        """Static facts (vocab size, ctx_len, batch size, longest call, capabilities)."""
        ...

    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, *, num_logits: int | None = None) -> np.ndarray:
        """Write K/V for the tokens at ``position_ids`` and return float32 logits ``[B, N, V]`` of the last N
        columns."""
        ...

    def reset(self) -> None:
        """Forget the cached sequence (zero the KV cache)."""
        ...


@runtime_checkable
class FeatureBackend(Backend, Protocol):
    """A feature draft (``"features"``): every call takes ``features [B, S, info.feature_size]``."""

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        features: np.ndarray | None = None,
    ) -> np.ndarray:
        """``Backend.forward`` with the target's hidden state at each column's position - 1 as ``features``."""
        ...


@runtime_checkable
class HiddenBackend(Backend, Protocol):
    """A backend with the ``"hidden_states"`` capability: ``forward_hidden``."""

    def forward_hidden(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        features: np.ndarray | None = None,
        tree: TreeInputs | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``forward``'s logits and the float32 final-norm hidden states ``[B, S, info.hidden_size]`` of every column
        (``features``/``tree`` where the backend has those capabilities too)."""
        ...


@runtime_checkable
class TreeBackend(Backend, Protocol):
    """A backend with the ``"tree"`` capability: tree calls (``tree=TreeInputs(...)``) and cache moves."""

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        tree: TreeInputs | None = None,
    ) -> np.ndarray:
        """``Backend.forward``; with ``tree`` a token-tree call (None: a chain call)."""
        ...

    def move_cache(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy the K/V of every layer from slots ``src`` to slots ``dst`` (int ``[B, M]``, -1 = no move) of each row;
        all sources are read before any destination is written. See :func:`check_moves`."""
        ...


@runtime_checkable
class MixBackend(Backend, Protocol):
    """A backend with the ``"mix"`` capability: superposed inputs (``mix=MixInputs(...)``)."""

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        mix: MixInputs | None = None,
    ) -> np.ndarray:
        """``Backend.forward``; with ``mix`` each column enters as a weighted sum of token embeddings."""
        ...


class ScoringBackend:
    """``forward`` and ``forward_hidden`` of a whole-model backend, both one validated call of its ``_score`` (the
    backend's own: logits of the last ``num_logits`` columns and, with ``hidden``, the hidden states of every column);
    old keywords go through ``legacy_forward``. ``OrtBackend`` and ``TorchBackend`` share them."""

    def _score(
        self, input_ids, position_ids, num_logits: int | None, features, tree, mix, *, hidden: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        features: np.ndarray | None = None,
        tree: TreeInputs | None = None,
        mix: MixInputs | None = None,
        **legacy: Any,
    ) -> np.ndarray:
        """Score tokens at positions; returns float32 logits ``[B, N, V]``; ``features``: a feature draft's input,
        ``tree``: a tree call, ``mix``: superposed inputs (module docstring; ``legacy``: ``legacy_forward``)."""
        if legacy:
            return legacy_forward(
                cast(Backend, self), input_ids, position_ids, legacy, num_logits=num_logits, features=features,
                tree=tree, mix=mix,
            )  # fmt: skip
        return self._score(input_ids, position_ids, num_logits, features, tree, mix, hidden=False)[0]

    def forward_hidden(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        features: np.ndarray | None = None,
        tree: TreeInputs | None = None,
        mix: MixInputs | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``forward``'s logits and the float32 final-norm hidden states ``[B, S, H]`` of every column
        (``"hidden_states"``)."""
        logits, hidden = self._score(input_ids, position_ids, num_logits, features, tree, mix, hidden=True)
        assert hidden is not None
        return logits, hidden


_PROTOCOLS: dict[str, type] = {
    "hidden_states": HiddenBackend,
    "features": FeatureBackend,
    "tree": TreeBackend,
    "mix": MixBackend,
}
_HOW = {
    "hidden_states": "it does not output hidden states: export the model with hidden_output=True",
    "features": "it is not a feature draft (no 'features' input)",
    "tree": "it has no tree inputs (slot_ids, tree_mask): export the model with tree=True",
    "mix": "it takes no mixed inputs (mix ids and weights): export the model with mix_inputs=True",
}


@overload
def require(backend: Backend, capability: Literal["hidden_states"]) -> HiddenBackend: ...
@overload
def require(backend: Backend, capability: Literal["features"]) -> FeatureBackend: ...
@overload
def require(backend: Backend, capability: Literal["tree"]) -> TreeBackend: ...
@overload
def require(backend: Backend, capability: Literal["mix"]) -> MixBackend: ...
def require(backend: Backend, capability: str) -> Any:
    """``backend`` as the protocol of ``capability`` (module docstring), or ``BackendError`` naming what is missing:
    the capability in ``info.capabilities`` (with the backend's own reason where it gives one, e.g.
    ``QaicBackend.no_tree_reason``) or a method of the protocol."""
    _check_capability(backend, capability)
    return backend


def _check_capability(backend: Backend, capability: str) -> None:
    """``BackendError`` unless ``backend`` lists ``capability`` and has the methods of its protocol (``require``)."""
    proto = _PROTOCOLS.get(capability)
    if proto is None:
        raise BackendError(f"unknown capability {capability!r}; known: {', '.join(_PROTOCOLS)}")
    info = backend.info
    if capability not in info.capabilities:
        why = getattr(backend, "no_tree_reason", None) if capability == "tree" else None
        raise BackendError(f"this {info.name} backend has no {capability!r} capability: {why or _HOW[capability]}")
    if (type(backend), capability) in _CONFORMS:
        return
    if not isinstance(backend, proto):
        raise BackendError(
            f"{type(backend).__name__} lists the {capability!r} capability but is no {proto.__name__} (a method of "
            "that protocol is missing)"
        )
    _CONFORMS.add((type(backend), capability))


#: (backend class, capability) pairs whose class was found to have the protocol's methods: a runtime_checkable
#: isinstance costs ~25 us, and the loop narrows its target and drafts every round
_CONFORMS: set[tuple[type, str]] = set()


#: deprecated ``forward`` keyword -> its replacement
_DEPRECATED = {
    "return_hidden": "forward_hidden(...)",
    "slot_ids": "tree=TreeInputs(slot_ids, tree_mask)",
    "tree_mask": "tree=TreeInputs(slot_ids, tree_mask)",
    "mix_ids": "mix=MixInputs(ids, weights)",
    "mix_weights": "mix=MixInputs(ids, weights)",
}
#: current ``forward`` keyword -> the capability that takes it
_KEYWORDS = {"features": "features", "tree": "tree", "mix": "mix"}
#: the deprecated pairs: new keyword -> (old keywords, the dataclass that replaces them)
_PAIRS: dict[str, tuple[str, str, type]] = {
    "tree": ("slot_ids", "tree_mask", TreeInputs),
    "mix": ("mix_ids", "mix_weights", MixInputs),
}


def legacy_forward(
    backend: Backend, input_ids: np.ndarray, position_ids: np.ndarray, legacy: dict[str, Any], **call: Any
) -> Any:
    """One ``forward`` call of ``backend`` given its own keywords ``call`` and the keywords ``legacy`` that its
    signature does not name (its ``**legacy``; every backend hands them here). Each deprecated keyword warns
    (``DeprecationWarning`` naming the replacement) and is translated; ``return_hidden=True`` returns
    ``forward_hidden``'s ``(logits, hidden)`` as it used to. A capability keyword (``features``, ``tree``, ``mix``)
    the backend lacks is a ``BackendError`` naming it (None is accepted); any other keyword is a ``TypeError``."""
    unknown = sorted(set(legacy) - set(_DEPRECATED) - set(_KEYWORDS))
    if unknown:
        raise TypeError(
            f"{type(backend).__name__}.forward() got unexpected keyword(s) {', '.join(unknown)}; it takes "
            f"num_logits, {', '.join(_KEYWORDS)}"
        )
    given: dict[str, list[str]] = {}  # replacement -> the deprecated keywords given that it replaces
    for name in sorted(legacy.keys() & _DEPRECATED.keys()):
        given.setdefault(_DEPRECATED[name], []).append(f"{name}=...")
    for new, names in given.items():
        warnings.warn(f"forward({', '.join(names)}) is deprecated: use {new}", DeprecationWarning, stacklevel=3)
    call = _translated(legacy, call)
    for name, capability in _KEYWORDS.items():
        if call.get(name) is not None:
            _check_capability(backend, capability)
    unnamed = sorted(k for k in _KEYWORDS.keys() & legacy.keys() if legacy[k] is not None)
    if unnamed:  # the backend lists the capability but its forward has no such keyword
        raise TypeError(f"{type(backend).__name__}.forward() takes no {', '.join(unnamed)}")
    call = {k: v for k, v in call.items() if v is not None}
    if legacy.get("return_hidden", False):
        return require(backend, "hidden_states").forward_hidden(input_ids, position_ids, **call)
    return backend.forward(input_ids, position_ids, **call)


def _translated(legacy: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    """``call`` with the capability keywords of ``legacy`` and the ``tree``/``mix`` of its deprecated pairs."""
    out = {**call, **{k: legacy[k] for k in _KEYWORDS if k in legacy}}
    for new, (a, b, cls) in _PAIRS.items():
        x, y = legacy.get(a), legacy.get(b)
        if x is None and y is None:
            continue
        if x is None or y is None:
            raise BackendError(f"a {new} call needs both {a} and {b}; got only one")
        if out.get(new) is not None:
            raise BackendError(f"give {new}= or {a}/{b}, not both")
        out[new] = cls(x, y)
    return out


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
    f = np.asarray(features)
    want = (*ids.shape, info.feature_size)
    if f.shape != want:
        raise BackendError(f"features have shape {f.shape}; expected {want} ([batch, seq, feature_size])")
    if not np.issubdtype(f.dtype, np.floating) or not np.all(np.isfinite(f)):
        raise BackendError("features must be finite floating-point values")
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
        logits = backend.forward(chunk_ids, chunk_pos, num_logits=1)
    assert logits is not None
    return logits[:, -1, :]


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
