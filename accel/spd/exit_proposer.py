"""``EarlyExit``: PPD's candidates as a proposer of the speculative decoding loop (``accel.spd.generate``).

PPD's k candidates for the next token are a token tree of depth 1: the root (the row's last token) with the early
exit's top-k tokens as its children, best first. ``EarlyExit(front, k)`` computes them with an exit stage of the
target (``accel.backends.stages``: layers ``[0, e)`` with exit logits, batch = the target's), so it needs no draft
model: each round its catch-up call feeds the stage the row's tokens since the last round (the root included, as a
draft's catch-up, ``accel.spd.draft_model``) and reads the exit logits at the root. The candidates are a
deterministic function of the row's tokens, verified as point masses (``accel.spd.tree``): exact under greedy and
sampling alike. A round accepts at most one candidate and then the target's next token (up to 2 tokens per target
call), for the cost of an extra ``e / L`` of a target call; ``accel.spd.ppd.generate_ppd`` is the pipelined schedule
of the same candidates (the front pass of a matching candidate is kept rather than recomputed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from accel.backends.base import BackendInfo, legacy_forward
from accel.backends.stages import StageBackend
from accel.errors import SpdError
from accel.spd.draft_model import DraftModel, draft_probs
from accel.spd.proposers import ProposerInfo, RowOutcome, RunState
from accel.spd.tree import TokenTree

__all__ = ["EarlyExit", "ExitStageBackend"]


class ExitStageBackend:
    """An exit stage (``[0, e)`` with exit logits) behind the ``Backend`` protocol: ``forward`` returns its exit
    logits ``[B, N, V]`` (the residual states are dropped)."""

    def __init__(self, stage: StageBackend) -> None:
        spec = stage.stage
        if not (spec.is_first and spec.exit_logits):
            raise SpdError(
                f"an early-exit proposer needs a stage [0, e) with exit logits; got [{spec.start}, {spec.stop}) "
                f"exit_logits={spec.exit_logits}"
            )
        self.stage_backend = stage

    @property
    def info(self) -> BackendInfo:
        return self.stage_backend.info

    def forward(
        self, input_ids: np.ndarray, position_ids: np.ndarray, *, num_logits: int | None = None, **legacy: Any
    ) -> np.ndarray:
        if legacy:  # an exit stage has no capabilities: legacy_forward refuses their keywords
            return legacy_forward(self, input_ids, position_ids, legacy, num_logits=num_logits)
        out = self.stage_backend.forward_stage(position_ids, input_ids=input_ids, num_logits=num_logits)
        assert out.logits is not None
        return out.logits

    def reset(self) -> None:
        self.stage_backend.reset()


class EarlyExit:
    """Proposer: the root and the exit's top ``k`` next tokens as its children (module docstring)."""

    def __init__(self, front: StageBackend, k: int = 3) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise SpdError(f"k (candidates per round) must be an integer >= 1; got {k!r}")
        self.exit_layer = front.stage.stop
        self.model = DraftModel(ExitStageBackend(front))
        self.k = int(k)

    @property
    def info(self) -> ProposerInfo:
        return ProposerInfo(
            f"exit(L{self.exit_layer}, k={self.k})", self.k, 1, branching=self.k > 1, ctx_len=self.model.info.ctx_len
        )

    def check(self, target: BackendInfo) -> None:
        if self.k + 1 > min(target.max_seq_len, target.ctx_len):
            raise SpdError(f"k={self.k} candidates need k+1 tokens per target call; the target allows fewer")
        if self.k > target.vocab_size:
            raise SpdError(f"k={self.k} exceeds the vocabulary ({target.vocab_size})")
        self.model.check(target, 2)

    def start(self, run: RunState) -> None:
        self.model.start(run)

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        out: list[TokenTree | None] = [None] * run.batch
        limits = np.where(rows, np.minimum(self.k, np.minimum(run.max_nodes, run.max_depth * self.k)), 0)
        ask = rows & (limits >= 1)
        if not ask.any():
            return out
        logits, _ = self.model.catch_up(run, ask)
        scores = draft_probs(run, logits, ask)  # the warped distribution (greedy: the logits); ranks alike
        part = np.argpartition(-scores, self.k - 1, axis=-1)[:, : self.k]
        order = np.argsort(-np.take_along_axis(scores, part, axis=-1), axis=-1, kind="stable")
        top = np.take_along_axis(part, order, axis=-1)  # the k best, best first
        for b in np.flatnonzero(ask):
            kids = top[b, : int(limits[b])]
            tokens = np.concatenate(([run.tokens[b, run.n[b] - 1]], kids)).astype(np.int64)
            parents = np.concatenate(([-1], np.zeros(kids.size, dtype=np.int64)))
            out[b] = TokenTree(tokens, parents, source="exit")
        return out

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        pass  # the next catch-up feeds whatever was accepted since (``DraftModel.fed``)
