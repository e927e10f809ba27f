"""A draft model's side of the loop: its cache bookkeeping, catch-up calls and features (shared by ``DraftChain`` and
``DraftTree``).

The draft has consumed each row's tokens ``0 .. fed - 1``; a round's first draft call (the *catch-up*) feeds the
un-consumed tail ``tokens[fed:n]`` (the row's last token, plus whatever the draft did not see: after an all-accepted
chain ``[d_K, bonus]``, docs/reference.md §2; after lookup rounds or a tree every token since it last drafted), in
chunks of its ``max_seq_len``. A feature draft (EAGLE-style, ``accel.drafts.feature``; ``info.feature_size > 0``)
reads with each token at position p the target's final-norm hidden state at p - 1 (``RunState.hidden``), and while
drafting its own estimate of the previous step's state (zeros for a draft whose width is not the feature width:
``accel.drafts.feature.augment_draft``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from accel.backends.base import Backend, BackendInfo, TreeInputs, require
from accel.errors import SpdError
from accel.spd.checks import check_backend
from accel.spd.proposers import RunState
from accel.spd.warps import check_logits

__all__ = ["DraftModel", "check_compatible_info", "draft_probs", "left_padded", "proposal_prob"]


def left_padded(tokens: np.ndarray, starts: np.ndarray, stops: np.ndarray, rows: np.ndarray):
    """ids/positions ``[B, W]`` with row b holding ``tokens[b, starts:stops]`` right-aligned (others: position -1)."""
    batch = tokens.shape[0]
    width = int(max(1, (stops - starts)[rows].max(initial=1)))
    ids = np.zeros((batch, width), dtype=np.int64)
    pos = np.full((batch, width), -1, dtype=np.int64)
    for b in np.flatnonzero(rows):
        length = int(stops[b] - starts[b])
        if length > 0:
            ids[b, width - length :] = tokens[b, starts[b] : stops[b]]
            pos[b, width - length :] = np.arange(starts[b], stops[b])
    return ids, pos


class DraftModel:
    """A draft backend and the positions it has consumed (module docstring)."""

    def __init__(self, backend: Backend) -> None:
        check_backend(backend, "the draft")
        self.backend = backend
        info = backend.info
        self.feature = info.feature_size > 0
        # a draft whose hidden states live in the feature space feeds them back while drafting (EAGLE)
        self.estimates = self.feature and info.hidden_size == info.feature_size
        self.fed = np.zeros(0, dtype=np.int64)
        self._run: RunState | None = None  # the run started last (proposers sharing this model start it once)

    @property
    def info(self) -> BackendInfo:
        return self.backend.info

    def behind(self, run: RunState, rows: np.ndarray) -> int:
        """Tokens the next catch-up of ``rows`` would feed (the most over the rows): ``n - fed``, or ``n`` when this
        model has not started ``run`` yet."""
        if not rows.any():
            return 0
        fed = self.fed if self._run is run and self.fed.shape == run.n.shape else np.zeros_like(run.n)
        return int((run.n - fed)[rows].max())

    def check(self, target: BackendInfo, catch_up: int) -> None:
        """Vocabulary, batch and feature checks; ``catch_up``: the longest catch-up a round can need (tokens)."""
        check_compatible_info(target, self.info)
        if self.info.max_seq_len < 2:
            raise SpdError("the draft backend's max_seq_len must be >= 2 (the cache catch-up feeds [d_K, bonus])")
        if not self.feature:
            return
        if "hidden_states" not in target.capabilities:
            raise SpdError(
                "the draft is a feature draft (it reads the target's hidden states) but the target backend "
                "does not output them: export the target with hidden_output=True"
            )
        if target.hidden_size != self.info.feature_size:
            raise SpdError(
                f"the feature draft reads features of width {self.info.feature_size} but the target's hidden "
                f"states have width {target.hidden_size}: it was trained for another target"
            )
        if self.info.max_seq_len < catch_up:
            raise SpdError(
                f"a feature draft's catch-up feeds up to {catch_up} tokens; its max_seq_len is {self.info.max_seq_len}"
            )

    def features_at(self, run: RunState, pos: np.ndarray) -> np.ndarray | None:
        """A feature draft's input for tokens at ``pos [B, S]``: the target's state at ``pos - 1`` (zeros at 0 and for
        padding); None for an ordinary draft."""
        if not self.feature:
            return None
        assert run.hidden is not None
        out = np.zeros((*pos.shape, run.hidden.shape[2]), dtype=np.float32)
        rows, cols = np.nonzero(pos >= 1)
        out[rows, cols] = run.hidden[rows, pos[rows, cols] - 1]
        return out

    def call(
        self,
        run: RunState,
        ids: np.ndarray,
        pos: np.ndarray,
        *,
        num_logits: int = 1,
        prefill: bool = False,
        features: np.ndarray | None = None,
        tree: TreeInputs | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(logits, hidden)`` of one draft call, timed and counted (``RunState.draft_work``); hidden: a feature
        draft's final-norm states (it reads ``features``), else None. ``tree``: a tree call (``"tree"``, checked by
        the proposer)."""
        with run.draft_work(int(ids.shape[1]), prefill=prefill):
            if self.feature:
                return require(self.backend, "hidden_states").forward_hidden(
                    ids, pos, num_logits=num_logits, features=features, tree=tree
                )
            if tree is not None:
                return require(self.backend, "tree").forward(ids, pos, num_logits=num_logits, tree=tree), None
            return self.backend.forward(ids, pos, num_logits=num_logits), None

    def start(self, run: RunState) -> None:
        """Reset the cache and prefill every prompt but its last token (chunks of ``max_seq_len``); once per run
        (proposers sharing this model, ``accel.spd.autotune_arm.share_draft_models``, each start it). Started later in
        a run (``AutoTune`` starts an arm at its first round), it feeds every token but the last one so far, and those
        calls count as decode work, not prefill (``GenerationStats``)."""
        if self._run is run:
            return
        self._run = run
        self.backend.reset()
        self.fed = run.n - 1
        stops = run.n - 1
        if stops.max(initial=0) <= 0 or not run.active.any():
            return
        ids, pos = left_padded(run.tokens, np.zeros_like(stops), stops, np.ones(run.batch, dtype=bool))
        step, prefill = self.info.max_seq_len, run.at_prompt
        for s in range(0, ids.shape[1], step):
            chunk = pos[:, s : s + step]
            if np.any(chunk >= 0):
                self.call(run, ids[:, s : s + step], chunk, prefill=prefill, features=self.features_at(run, chunk))

    def catch_up(self, run: RunState, rows: np.ndarray) -> tuple[np.ndarray, Any]:
        """The draft call(s) feeding each row's tail ``tokens[fed:n]``; returns the last column's ``(logits [B, V],
        hidden [B, 1, H] or None)``; afterwards ``fed = n`` for ``rows``."""
        ids, pos = left_padded(run.tokens, self.fed, run.n, rows)
        step = self.info.max_seq_len
        lead = max(0, ids.shape[1] - step)
        for s in range(0, lead, step):
            chunk = pos[:, s : min(s + step, lead)]
            if np.any(chunk >= 0):
                self.call(run, ids[:, s : min(s + step, lead)], chunk, features=self.features_at(run, chunk))
        logits, hidden = self.call(run, ids[:, lead:], pos[:, lead:], features=self.features_at(run, pos[:, lead:]))
        self.fed = np.where(rows, run.n, self.fed)
        return logits[:, -1, :], None if hidden is None else hidden[:, -1:, :]

    def estimate(self, hidden: np.ndarray | None, batch: int) -> np.ndarray | None:
        """The feature input for the next drafting step from this call's hidden states ``[B, S, H]`` (each column's
        own estimate, or zeros for a draft that cannot estimate features); None for an ordinary draft."""
        if hidden is None:
            return None
        if self.estimates:
            return np.ascontiguousarray(hidden)
        return np.zeros((batch, hidden.shape[1], self.info.feature_size), np.float32)


def check_compatible_info(target: BackendInfo, draft: BackendInfo) -> None:
    """``SpdError`` unless the draft has the target's vocabulary size and batch size."""
    if target.vocab_size != draft.vocab_size:
        raise SpdError(
            f"draft vocab_size {draft.vocab_size} differs from target vocab_size {target.vocab_size}: they must "
            "share a vocabulary"
        )
    if draft.batch_size != target.batch_size:
        raise SpdError(
            f"the draft backend's batch_size {draft.batch_size} differs from the target's {target.batch_size}"
        )


def draft_probs(run: RunState, logits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Warped draft distributions ``[B, V]`` for ``rows`` (greedy: the checked logits themselves, since only their
    argmax matters); other rows' padding garbage is zeroed first."""
    x = logits if rows.all() else np.where(rows[:, None], logits, 0.0)
    if run.sampling.greedy:
        if not np.all(np.isfinite(x)):
            check_logits(x, "draft logits")  # raises, naming the first bad index
        return x
    return run.sampling.probs(x)


def proposal_prob(run: RunState, probs: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """The draft's probability of each row's proposal ``tok`` (greedy: the softmax of the logits at their argmax)."""
    if run.sampling.greedy:  # draft_probs returned the raw logits
        return 1.0 / np.exp(probs - probs.max(axis=-1, keepdims=True)).sum(axis=-1)
    return np.take_along_axis(probs, tok[:, None], axis=-1)[:, 0]
