"""Input checks of ``generate``/``generate_ar``: vocabularies, prompts, limits (``SpdError``). Proposers check their own
models (``Proposer.check``)."""

from __future__ import annotations

import numpy as np

from accel.backends.base import Backend, BackendInfo
from accel.errors import SpdError
from accel.spd.warps import Sampling

__all__ = ["check_backend", "check_compatible", "eos_set", "make_rng", "validate"]


def check_compatible(target: Backend, draft: Backend, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Raise ``SpdError`` unless draft and target share a vocabulary (size, and token->id maps when given).

    Tokenizers are compared with ``get_vocab()`` (``tokenizers.Tokenizer`` / transformers tokenizers).
    """
    tv, dv = target.info.vocab_size, draft.info.vocab_size
    if tv != dv:
        raise SpdError(f"draft vocab_size {dv} differs from target vocab_size {tv}: they must share a vocabulary")
    if target_tokenizer is not None and draft_tokenizer is not None:
        a, b = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if a != b:
            diff = sorted(set(a.items()) ^ set(b.items()))[:3]
            raise SpdError(f"draft and target tokenizers differ (e.g. {diff}): they must share a vocabulary")


def _as_prompts(prompt_ids, vocab_size: int) -> list[np.ndarray]:
    if isinstance(prompt_ids, np.ndarray):
        if prompt_ids.ndim != 2:
            raise SpdError(f"prompt_ids array must be 2-D [batch, len]; got shape {prompt_ids.shape}")
        rows = list(prompt_ids)
    else:
        rows = list(prompt_ids)
        if rows and np.ndim(rows[0]) == 0:
            raise SpdError("prompt_ids must be a list of token lists (one per batch row) or a 2-D array")
    out = []
    for i, r in enumerate(rows):
        a = np.asarray(r)
        if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
            raise SpdError(f"prompt row {i} must be a non-empty 1-D list of token ids; got {r!r:.80}")
        if a.min() < 0 or a.max() >= vocab_size:
            raise SpdError(f"prompt row {i} has token ids outside the vocabulary [0, {vocab_size})")
        out.append(a.astype(np.int64))
    if not out:
        raise SpdError("prompt_ids is empty: give at least one row")
    return out


def _is_token_id(t) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)) and bool(t >= 0)


def eos_set(eos_token_id, vocab_size: int | None = None) -> np.ndarray:
    """The end-of-sequence ids as an int64 array: ``None``, a token id, or a sequence of them; ``SpdError`` for
    anything else, for an id beyond int64, and when no given id is in the vocabulary ``[0, vocab_size)`` (no row
    could ever end on EOS). In a list, ids beyond the vocabulary are allowed beside one inside it (a model's list of
    stop tokens may name ids it never emits)."""
    if eos_token_id is None:
        return np.zeros(0, dtype=np.int64)
    ids = list(eos_token_id) if isinstance(eos_token_id, (list, tuple, np.ndarray)) else [eos_token_id]
    if not all(_is_token_id(t) for t in ids):
        raise SpdError(f"eos_token_id must be a token id (int >= 0), a list of them, or None; got {eos_token_id!r}")
    if vocab_size is not None and ids and all(int(t) >= vocab_size for t in ids):
        raise SpdError(
            f"eos_token_id {eos_token_id!r} is outside the vocabulary [0, {vocab_size}): no row could end on it"
        )
    top = np.iinfo(np.int64).max
    if any(int(t) > top for t in ids):
        raise SpdError(f"eos_token_id {max(int(t) for t in ids)} is not a token id: ids are below 2**63")
    return np.asarray([int(t) for t in ids], dtype=np.int64).reshape(-1)


def make_rng(seed) -> np.random.Generator:
    """The generator of a ``seed`` argument: an int >= 0 (not a bool) or a ``np.random.Generator`` (SpdError
    otherwise, instead of numpy's bare ValueError for ``seed=-1``)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if not _is_token_id(seed):
        raise SpdError(f"seed must be an int >= 0 or a np.random.Generator; got {seed!r}")
    return np.random.default_rng(int(seed))


def check_backend(backend, name: str) -> None:
    """SpdError unless ``backend`` is a Backend (has a ``BackendInfo``): ``generate(None, ...)`` or a path given
    where a backend belongs would otherwise fail as an AttributeError deep inside."""
    if not isinstance(getattr(backend, "info", None), BackendInfo):
        raise SpdError(f"{name} must be a Backend (TorchBackend, OrtBackend, ...); got {type(backend).__name__}")


def validate(
    target: Backend, prompt_ids, max_new_tokens, sampling: Sampling, ctx_len: int | None = None
) -> tuple[list[np.ndarray], np.ndarray]:
    """Prompts (one int64 array per row) and per-row limits, after checking them against ``target`` and the context
    (``ctx_len``: the tighter of the target's and the proposer's, default the target's); ``SpdError`` otherwise."""
    prompts = _as_prompts(prompt_ids, target.info.vocab_size)
    limits = np.asarray(max_new_tokens)
    if (
        limits.ndim > 1
        or (limits.ndim == 1 and limits.shape != (len(prompts),))
        or not np.issubdtype(limits.dtype, np.integer)
        or np.any(limits < 0)
    ):
        raise SpdError(
            f"max_new_tokens must be an integer >= 0 or one per row ({len(prompts)} rows); got {max_new_tokens!r}"
        )
    if target.info.batch_size != len(prompts):
        raise SpdError(
            f"prompt batch {len(prompts)} does not match the target backend's batch_size {target.info.batch_size}"
        )
    ctx = min(target.info.ctx_len, ctx_len or target.info.ctx_len)
    too_long = [i for i, p in enumerate(prompts) if len(p) > ctx]
    if too_long:
        raise SpdError(f"prompt rows {too_long} are longer than the context ({ctx} tokens)")
    sampling.validate()
    return prompts, np.broadcast_to(limits, (len(prompts),)).astype(np.int64)
