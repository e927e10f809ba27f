"""``DraftChain``: a draft model proposes a chain of up to K tokens per round (classic speculative decoding).

Per round, for the rows asked: ``k_b = min(K, max_depth_b, max_nodes_b)`` autoregressive draft calls shared by all
rows; the first is the catch-up (``accel.spd.draft_model``), rows needing fewer tail tokens left-padded. Greedy
proposes the draft's argmax; sampling draws from the draft's warped distribution and reports it (a *sampled* chain:
``accel.spd.tree``). **Dynamic draft length** (``min_draft_prob``): a row ends its chain after a proposal to which
the draft itself gave probability below the threshold (the proposal is still made); the decision uses the draft's
side only, so the output law is unchanged. A feature draft's estimates are stale once the target has scored those
positions, so it re-feeds everything from the round's first drafted position; a standalone draft keeps its cache up
to the last accepted token it consumed.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from accel.backends.base import Backend, BackendInfo
from accel.errors import SpdError
from accel.spd.draft_model import DraftModel, draft_probs, proposal_prob
from accel.spd.mrs import sample
from accel.spd.proposers import ProposerInfo, RowOutcome, RunState
from accel.spd.tree import TokenTree

__all__ = ["DraftChain"]


class DraftChain:
    """Chain proposals from a draft backend (module docstring).

    Args:
        draft: the draft backend (same vocabulary and batch size as the target; a feature draft when its
            ``info.feature_size > 0``).
        k: most draft tokens per round (``1 <= k``; the target scores ``k + 1`` per call).
        min_draft_prob: dynamic draft length threshold in ``[0, 1]`` (None or 0: always ``k``).
    """

    def __init__(self, draft: Backend, k: int = 4, min_draft_prob: float | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise SpdError(f"k (draft tokens per round) must be an integer >= 1; got {k!r}")
        t = 0.0 if min_draft_prob is None else min_draft_prob
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0.0 <= t <= 1.0:
            raise SpdError(f"min_draft_prob must be a probability in [0, 1] or None; got {min_draft_prob!r}")
        self.model: DraftModel = DraftModel(draft)
        self.k: int = int(k)
        self.min_draft_prob: float = float(t)

    @property
    def info(self) -> ProposerInfo:
        dyn = f", min_draft_prob={self.min_draft_prob:g}" if self.min_draft_prob else ""
        feat = "feature " if self.model.feature else ""
        return ProposerInfo(
            f"{feat}chain(k={self.k}{dyn})",
            self.k,
            self.k,
            needs_hidden=self.model.feature,
            ctx_len=self.model.info.ctx_len,
        )

    def check(self, target: BackendInfo) -> None:
        limit = min(target.max_seq_len, target.ctx_len)
        if self.k + 1 > limit:
            raise SpdError(
                f"k={self.k} too large: the target scores k+1 tokens per call but its max_seq_len/ctx_len allow "
                f"{limit} (k <= {limit - 1})"
            )
        self.model.check(target, self.k + 1)

    def start(self, run: RunState) -> None:
        self.model.start(run)

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        k_rows = np.where(rows, np.minimum(self.k, np.minimum(run.max_depth, run.max_nodes)), 0).clip(min=0)
        k_round = int(k_rows.max(initial=0))
        drafts = np.zeros((run.batch, k_round), dtype=np.int64)
        p = None if run.sampling.greedy else np.zeros((run.batch, k_round, run.target.vocab_size))
        estimate = None  # a feature draft's own hidden state of the previous step [B, 1, H]
        for j in range(k_round):
            act = rows & (k_rows > j)
            if not act.any():  # every row stopped early (min_draft_prob)
                break
            if j == 0:  # catch-up: the un-consumed tail, [last] or [d_K, bonus] (longer after lookup rounds)
                logits, hidden = self.model.catch_up(run, act)
            else:
                ids = np.where(act, drafts[:, j - 1], 0)[:, None]
                pos = np.where(act, run.n - 1 + j, -1)[:, None]
                out, hidden = self.model.call(run, ids, pos, features=estimate)
                logits = out[:, -1, :]
            estimate = self.model.estimate(hidden, run.batch)
            probs = draft_probs(run, logits, act)
            tok = np.argmax(probs, axis=-1) if run.sampling.greedy else sample(probs, run.rng)
            drafts[:, j] = np.where(act, tok, drafts[:, j])
            if p is not None:
                p[act, j] = probs[act]
            if self.min_draft_prob > 0:
                unsure = act & (proposal_prob(run, probs, tok) < self.min_draft_prob)
                k_rows = np.where(unsure, j + 1, k_rows)  # d_j is still proposed; no more drafts this round
        out_trees: list[TokenTree | None] = [None] * run.batch
        for b in np.flatnonzero(rows & (k_rows >= 1)):
            kb = int(k_rows[b])
            dists = None if p is None else p[b, :kb]
            out_trees[b] = TokenTree.chain(int(run.tokens[b, run.n[b] - 1]), drafts[b, :kb], dists)
        return out_trees

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        for b, o in enumerate(outcomes):
            if o is None or o.tree.size < 2:
                continue
            if self.model.feature:  # positions >= n_old were drafted from estimates: refeed them
                self.model.fed[b] = o.n_old
            else:  # the draft consumed [tail .. d_{k-1}]; valid up to the last accepted token
                self.model.fed[b] = min(o.n_old - 1 + o.tree.size - 1, o.n_old + o.accepted)
