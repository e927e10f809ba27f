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
from typing import Any, Literal, Protocol, cast, overload, runtime_checkable

import numpy as np

from accel.backends.calls import (
    BackendInfo,
    MixInputs,
    TreeInputs,
    chain_tree_inputs,
    check_extensions,
    check_float_rows,
    check_mix,
    check_moves,
    check_step_inputs,
    check_tree_inputs,
)
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
    "check_float_rows",
    "check_mix",
    "check_moves",
    "check_step_inputs",
    "check_tree_inputs",
    "legacy_forward",
    "prefill",
    "require",
]


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
