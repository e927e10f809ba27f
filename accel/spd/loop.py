"""The batched speculative decoding loop (``generate``) and its autoregressive baseline (``generate_ar``).

State per row (``n`` = tokens so far, prompt included): the target has consumed positions ``0 .. n-2``; the last token
(position ``n-1``) is fed at the start of the next round. The draft has consumed ``0 .. draft_fed-1`` with
``draft_fed`` in ``{n-1, n-2}``. One round (gpt-fast's ``speculative_decode``, batched):

1. draft ``k_b`` tokens autoregressively; the first draft call of the round feeds the row's un-consumed tail
   ``tokens[draft_fed:n]`` (1 token, or 2 = ``[d_K, bonus]`` after an all-accepted round: the cache catch-up of
   docs/reference.md §2), rows needing fewer tokens left-padded with position -1. With ``min_draft_prob`` a row stops
   drafting early, after a proposal the draft itself gave less than that probability (dynamic draft length: the
   decision uses the draft's side only, so sampling stays exact);
   With ``ngram`` (``accel.spd.lookup``), a row whose recent tokens occurred earlier takes what followed them as its
   drafts instead (a point-mass proposal) and skips the draft model this round; its ``draft_fed`` stays, so the next
   catch-up feeds the draft everything since (in chunks of its ``max_seq_len``);
2. score ``[last, d_1 .. d_k]`` at positions ``n-1 .. n-1+k`` in one target call (``num_logits = K+1``);
3. modified rejection sampling (``accel.spd.mrs``) accepts ``m`` drafts and emits one more token.

Rows advance by their own ``m + 1``; finished rows ride along with position -1 (they write nothing). Nothing is rolled
back: stale K/V beyond a row's position are masked and later overwritten (the position-indexed cache contract).
``k_b = min(K, room - 1)`` where ``room`` = tokens the row may still emit (``max_new_tokens`` and the context), so no
call writes past the context and no row emits beyond ``max_new_tokens``. A row stops at EOS (inclusive),
``max_new_tokens`` or a full context (``prompt + generated == ctx_len``, reported in ``messages``).

A feature draft (``draft.info.feature_size > 0``, ``accel.drafts.feature``) also reads the target's hidden states:
the target returns them (``return_hidden``) for every position it scores, kept per row in ``feat``; a draft call at
position ``p`` gets ``feat[p - 1]`` (zeros at 0), and while drafting, its own hidden-state estimate of the previous
step (zeros for a draft whose width is not the feature width: ``accel.drafts.feature.augment_draft``). Those inputs
are stale once the target has scored the positions, so after a round the draft's cache is valid only below the
round's first drafted position: ``draft_fed = n`` (old ``n``), and the next catch-up feeds every token emitted since
(``m + 1 <= K + 1`` of them) with the target's true features.

``generate_ar`` is the same loop with no draft and ``K = 0`` (each round scores the last token and samples from
``q``), so both share truncation rules, warps and statistics.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import numpy as np

from accel.backends.base import Backend
from accel.errors import SpdError
from accel.spd.checks import check_compatible, eos_set, validate
from accel.spd.lookup import check_ngram, ngram_proposal
from accel.spd.mrs import greedy_accept, sample, speculative_accept
from accel.spd.stats import GenerationResult, StatsAccumulator
from accel.spd.warps import Sampling, check_logits

__all__ = ["StreamCallback", "check_compatible", "generate", "generate_ar"]

StreamCallback = Callable[[int, list, list], None]
"""``stream(row, tokens, accepted_from_draft)``: called per row and round with the newly emitted tokens."""


class _Loop:
    """One generation run: per-row buffers, positions, and the backends' call bookkeeping."""

    def __init__(
        self,
        target: Backend,
        draft: Backend | None,
        prompts: list[np.ndarray],
        k: int,
        max_new_tokens: np.ndarray,
        sampling: Sampling,
        rng: np.random.Generator,
        eos: np.ndarray,
        stream: StreamCallback | None,
        min_draft_prob: float = 0.0,
        ngram: int = 0,
        ngram_k: int = 0,
    ) -> None:
        self.target, self.draft, self.k, self.min_draft_prob = target, draft, k, min_draft_prob
        self.ngram, self.ngram_k = ngram, ngram_k
        self.sampling, self.rng, self.stream = sampling, rng, stream
        self.eos = frozenset(int(e) for e in eos)
        self.greedy = sampling.greedy
        self.batch = len(prompts)
        infos = [target.info] + ([draft.info] if draft is not None else [])
        self.ctx = min(i.ctx_len for i in infos)
        self.max_new = np.asarray(max_new_tokens, dtype=np.int64)  # [B]
        self.n = np.array([len(p) for p in prompts], dtype=np.int64)
        self.buf = np.zeros((self.batch, max(self.ctx, int(self.n.max()))), dtype=np.int64)
        for b, p in enumerate(prompts):
            self.buf[b, : len(p)] = p
        self.prompt_len = self.n.copy()
        self.draft_fed = self.n - 1
        self.new = np.zeros(self.batch, dtype=np.int64)
        self.active = np.ones(self.batch, dtype=bool)
        self.reasons: list[str | None] = [None] * self.batch
        self.from_draft: list[list[bool]] = [[] for _ in range(self.batch)]
        self.messages: list[str] = []
        self.acc = StatsAccumulator("spd" if draft is not None or ngram else "ar", k, self.batch, max(k, ngram_k))
        feature_size = draft.info.feature_size if draft is not None else 0
        self.feature = feature_size > 0
        # a draft whose hidden states live in the feature space feeds them back while drafting (EAGLE); another
        # feature draft (a standalone draft given the target's states, accel.drafts.feature.augment_draft) gets zeros
        self.estimates = draft is not None and self.feature and draft.info.hidden_size == feature_size
        # target hidden states by position (feature drafts only): feat[b, p] = target's final-norm state at p
        self.feat = np.zeros(
            (self.batch, self.buf.shape[1], feature_size) if self.feature else (0, 0, 0), dtype=np.float32
        )

    # ------------------------------------------------------------------ backend calls

    def _backend(self, which: str) -> Backend:
        """The target, or the draft (which exists whenever a draft call is made)."""
        backend = self.target if which == "target" else self.draft
        assert backend is not None, "a draft call without a draft backend"
        return backend

    def _call(
        self,
        which: str,
        ids: np.ndarray,
        pos: np.ndarray,
        num_logits: int,
        prefill: bool = False,
        features: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(logits, hidden)`` of one call; ``hidden`` only with a feature draft (else None). Target hidden states
        are stored in ``feat`` at the call's positions."""
        backend = self._backend(which)
        hidden = None
        with self.acc.timed(which, prefill):
            if self.feature:
                out, hidden = backend.forward(ids, pos, num_logits=num_logits, features=features, return_hidden=True)
            else:
                out = backend.forward(ids, pos, num_logits=num_logits)
        if which == "target":
            self.acc.target_calls += 1
            if hidden is not None:
                rows, cols = np.nonzero(pos >= 0)
                self.feat[rows, pos[rows, cols]] = hidden[rows, cols]
        else:
            self.acc.draft_calls += 1
            self.acc.draft_decode_calls += not prefill
        return out, hidden

    def _features_at(self, pos: np.ndarray) -> np.ndarray | None:
        """A feature draft's input for tokens at ``pos [B, S]``: the target's state at ``pos - 1`` (zeros at 0 and
        for padding); None for an ordinary draft."""
        if not self.feature:
            return None
        out = np.zeros((*pos.shape, self.feat.shape[2]), dtype=np.float32)
        rows, cols = np.nonzero(pos >= 1)
        out[rows, cols] = self.feat[rows, pos[rows, cols] - 1]
        return out

    def _left_padded(self, starts: np.ndarray, stops: np.ndarray, rows: np.ndarray):
        """ids/positions ``[B, W]`` with row b holding ``buf[b, starts:stops]`` right-aligned (others: -1)."""
        width = int(max(1, (stops - starts)[rows].max(initial=1)))
        ids = np.zeros((self.batch, width), dtype=np.int64)
        pos = np.full((self.batch, width), -1, dtype=np.int64)
        for b in np.flatnonzero(rows):
            length = int(stops[b] - starts[b])
            if length > 0:
                ids[b, width - length :] = self.buf[b, starts[b] : stops[b]]
                pos[b, width - length :] = np.arange(starts[b], stops[b])
        return ids, pos

    def _catch_up(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The draft call that feeds each drafting row's un-consumed tail ``tokens[draft_fed:n]``. A tail longer than
        the draft's ``max_seq_len`` (possible after n-gram lookup rounds) goes in chunks; the last gives the logits."""
        ids, pos = self._left_padded(self.draft_fed, self.n, rows)
        step = self._backend("draft").info.max_seq_len
        lead = max(0, ids.shape[1] - step)
        for s in range(0, lead, step):
            chunk = pos[:, s : min(s + step, lead)]
            if np.any(chunk >= 0):
                self._call("draft", ids[:, s : min(s + step, lead)], chunk, 1, features=self._features_at(chunk))
        return self._call("draft", ids[:, lead:], pos[:, lead:], 1, features=self._features_at(pos[:, lead:]))

    def prefill(self) -> None:
        """Feed every prompt but its last token into both models (chunks of each backend's ``max_seq_len``)."""
        stops = self.n - 1
        if stops.max() <= 0:
            return
        ids, pos = self._left_padded(np.zeros_like(stops), stops, np.ones(self.batch, dtype=bool))
        for which in ("target", "draft") if self.draft is not None else ("target",):
            step = self._backend(which).info.max_seq_len
            for s in range(0, ids.shape[1], step):
                chunk = pos[:, s : s + step]
                if np.any(chunk >= 0):
                    feats = self._features_at(chunk) if which == "draft" else None
                    self._call(which, ids[:, s : s + step], chunk, 1, prefill=True, features=feats)

    # ------------------------------------------------------------------ one round

    def _probs(self, logits: np.ndarray, rows: np.ndarray, what: str) -> np.ndarray:
        """Warped distributions (greedy: the checked logits) for ``rows``; other rows' padding garbage is zeroed."""
        x = logits if rows.all() else np.where(rows.reshape(rows.shape + (1,) * (logits.ndim - 1)), logits, 0.0)
        if self.greedy:
            if not np.all(np.isfinite(x)):
                check_logits(x, what)  # raises, naming the first bad index
            return x  # greedy paths only need argmaxes
        return self.sampling.probs(x)

    def _proposal_prob(self, probs: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """The draft's probability of each row's proposal ``tok`` (greedy: softmax of the logits at their argmax)."""
        if self.greedy:  # _probs returned the raw logits
            return 1.0 / np.exp(probs - probs.max(axis=-1, keepdims=True)).sum(axis=-1)
        return np.take_along_axis(probs, tok[:, None], axis=-1)[:, 0]

    def _lookups(self, room: np.ndarray) -> dict[int, np.ndarray]:
        """Rows whose drafts come from n-gram lookup this round (``accel.spd.lookup``): row -> proposed tokens."""
        found = {}
        for b in np.flatnonzero(self.active & (room >= 2)):
            prop = ngram_proposal(
                self.buf[b, : self.n[b]], self.ngram, int(min(self.ngram_k, room[b] - 1)), n_min=min(2, self.ngram)
            )
            if prop.size:
                found[int(b)] = prop
        return found

    def round(self) -> None:
        room = np.minimum(self.max_new - self.new, self.ctx - self.n)
        k_rows = np.where(self.active, np.minimum(self.k, room - 1), 0).clip(min=0)
        lookups = self._lookups(room) if self.ngram else {}
        looked_up = np.zeros(self.batch, dtype=bool)
        for b, prop in lookups.items():
            k_rows[b], looked_up[b] = prop.size, True
        k_round = int(k_rows.max(initial=0))
        vocab = self.target.info.vocab_size
        drafts = np.zeros((self.batch, k_round), dtype=np.int64)
        p = None if self.greedy else np.zeros((self.batch, k_round, vocab))
        for b, prop in lookups.items():  # a deterministic guess: the draft distribution is a point mass
            drafts[b, : prop.size] = prop
            if p is not None:
                p[b, np.arange(prop.size), prop] = 1.0
        drafting = self.active & (k_rows >= 1) & ~looked_up
        estimate = None  # a feature draft's own hidden state of the previous step [B, 1, H]
        for j in range(k_round):
            rows = drafting & (k_rows > j)
            if not rows.any():  # every row stopped early (min_draft_prob), or none drafts with the model
                break
            if j == 0:  # catch-up: the un-consumed tail, [last] or [d_K, bonus] (longer after lookup rounds)
                logits, hidden = self._catch_up(rows)
            else:
                ids = np.where(rows, drafts[:, j - 1], 0)[:, None]
                pos = np.where(rows, self.n - 1 + j, -1)[:, None]
                logits, hidden = self._call("draft", ids, pos, 1, features=estimate)
            logits = logits[:, -1, :]
            if hidden is not None:
                estimate = (
                    np.ascontiguousarray(hidden[:, -1:, :])
                    if self.estimates
                    else np.zeros((self.batch, 1, self.feat.shape[2]), np.float32)
                )
            probs = self._probs(logits, rows, "draft logits")
            tok = np.argmax(probs, axis=-1) if self.greedy else sample(probs, self.rng)
            drafts[:, j] = np.where(rows, tok, drafts[:, j])
            if p is not None:  # (lookup rows keep their point masses)
                p[~looked_up, j] = probs[~looked_up]
            if self.min_draft_prob > 0:
                unsure = rows & (self._proposal_prob(probs, tok) < self.min_draft_prob)
                k_rows = np.where(unsure, j + 1, k_rows)  # d_j is still proposed; no more drafts this round
        if k_rows.max(initial=0) < k_round:
            k_round = int(k_rows.max(initial=0))
            drafts = drafts[:, :k_round]
            p = None if p is None else p[:, :k_round]
        # target scores [last, d_1..d_k] right-aligned in K_round+1 columns
        width = k_round + 1
        ids = np.zeros((self.batch, width), dtype=np.int64)
        pos = np.full((self.batch, width), -1, dtype=np.int64)
        for b in np.flatnonzero(self.active).tolist():
            kb = int(k_rows[b])
            ids[b, width - kb - 1 :] = np.concatenate(([self.buf[b, self.n[b] - 1]], drafts[b, :kb]))
            pos[b, width - kb - 1 :] = np.arange(self.n[b] - 1, self.n[b] + kb)
        logits, _ = self._call("target", ids, pos, width)
        # realign so that slot i of row b is the distribution after [last, d_1..d_i]
        if self.active.all() and np.all(k_rows == k_round):
            q_logits = logits  # already aligned (the common case at batch 1)
        else:
            cols = np.minimum(width - 1 - k_rows[:, None] + np.arange(width)[None, :], width - 1)
            q_logits = np.take_along_axis(logits, cols[:, :, None], axis=1)
        q = self._probs(q_logits, self.active, "target logits")
        if self.greedy:
            res = greedy_accept(drafts, q, k_rows)
        else:
            assert p is not None  # sampled rounds keep the draft distributions
            res = speculative_accept(drafts, p, q, self.rng, k_rows)
        self._emit(k_rows, drafts, res, looked_up)

    def _emit(self, k_rows: np.ndarray, drafts: np.ndarray, res, looked_up: np.ndarray) -> None:
        emitted = np.zeros(self.batch, dtype=np.int64)
        emitted_draft = np.zeros(self.batch, dtype=np.int64)
        was_active = self.active.copy()
        for b in np.flatnonzero(self.active):
            m, kb = int(res.num_accepted[b]), int(k_rows[b])
            toks = [int(t) for t in drafts[b, :m]] + [int(res.next_token[b])]
            flags = [True] * m + [False]
            hit = next((i for i, t in enumerate(toks) if t in self.eos), None) if self.eos else None
            if hit is not None:
                toks, flags = toks[: hit + 1], flags[: hit + 1]
            room = min(int(self.max_new[b] - self.new[b]), self.ctx - int(self.n[b]))
            toks, flags = toks[:room], flags[:room]  # never triggers (k_b <= room - 1); kept as a guard
            n0 = int(self.n[b])
            self.buf[b, n0 : n0 + len(toks)] = toks
            self.n[b] += len(toks)
            self.new[b] += len(toks)
            self.from_draft[b].extend(flags)
            emitted[b], emitted_draft[b] = len(toks), sum(flags)
            if looked_up[b]:  # the draft model consumed nothing this round; its next catch-up feeds these too
                pass
            elif kb >= 1 and self.feature:  # positions >= n0 were drafted from estimates: refeed them
                self.draft_fed[b] = n0
            elif kb >= 1:  # the draft consumed [tail .. d_{k-1}]; valid up to the last accepted token
                self.draft_fed[b] = min(n0 - 1 + kb, n0 + m)
            if self.stream is not None:
                self.stream(int(b), toks, flags)
            if hit is not None:
                self._finish(b, "eos")
        self.acc.add_round(was_active, k_rows, res.num_accepted, res.overlap, emitted, emitted_draft, looked_up)
        self._check_done()

    def _finish(self, b: int | np.integer, reason: str) -> None:
        self.active[b] = False
        self.reasons[b] = reason
        if reason == "context":
            self.messages.append(
                f"row {b}: context full ({self.ctx} tokens = prompt {int(self.prompt_len[b])} + "
                f"{int(self.new[b])} generated); stopped before max_new_tokens={int(self.max_new[b])}"
            )

    def _check_done(self) -> None:
        for b in np.flatnonzero(self.active):
            if self.new[b] >= self.max_new[b]:
                self._finish(b, "length")
            elif self.n[b] >= self.ctx:
                self._finish(b, "context")

    def run(self) -> GenerationResult:
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()
        self._check_done()
        if self.active.any():
            self.prefill()
        while self.active.any():
            self.round()
        return GenerationResult(
            tokens=[[int(t) for t in self.buf[b, self.prompt_len[b] : self.n[b]]] for b in range(self.batch)],
            from_draft=self.from_draft,
            finish_reasons=self.reasons,
            messages=self.messages,
            stats=self.acc.finish(),
        )


def generate(
    target: Backend,
    draft: Backend | None,
    prompt_ids: Sequence[Sequence[int]] | np.ndarray,
    *,
    k: int,
    max_new_tokens: int | Sequence[int],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    seed: int | np.random.Generator = 0,
    eos_token_id: int | Sequence[int] | None = None,
    stream: StreamCallback | None = None,
    min_draft_prob: float | None = None,
    ngram: int | None = None,
    ngram_k: int | None = None,
) -> GenerationResult:
    """Speculative decoding: ``draft`` proposes ``k`` tokens per round, ``target`` verifies them in one call.

    Args:
        target, draft: backends with the same vocabulary and ``batch_size == len(prompt_ids)``. ``draft=None`` with
            ``ngram``: lookup drafts only (prompt lookup decoding); rows without a match take a plain target step.
        prompt_ids: one token list per row (ragged lengths allowed) or a 2-D int array.
        k: draft tokens per round (``1 <= k``, ``k + 1 <= target max_seq_len``).
        max_new_tokens: most tokens generated per row (one int for all rows, or one per row).
        temperature, top_k, top_p, greedy: the warps (``accel.spd.warps.warp``), applied identically to both models.
        seed: seed or ``np.random.Generator`` for draft sampling and rejection sampling.
        eos_token_id: token id(s) that end a row (the EOS is emitted).
        stream: ``stream(row, tokens, accepted_from_draft)`` called as tokens are accepted.
        min_draft_prob: dynamic draft length. A row ends its drafting for the round after a proposal to which the
            draft gave probability below this (under the warped distribution it sampled from; greedy: the softmax of
            its logits), so ``k`` becomes a cap: confident stretches get long proposals, uncertain ones short. The
            unsure token is still proposed (it costs the target one more scored column, nearly free). ``None`` or 0:
            always ``k``. In ``[0, 1]``; the output distribution does not depend on it (the decision uses only the
            draft's side).
        ngram: n-gram lookup drafts (``accel.spd.lookup``): when a row's last ``ngram`` tokens (or, failing that, a
            shorter suffix down to 2 tokens) occurred earlier in the row, the tokens that followed that occurrence
            are this round's drafts and the draft model is not called for the row. ``None``/0: off. Exact: the
            guess is a point-mass draft distribution, verified like any other.
        ngram_k: tokens proposed from a match (default ``k``; ``ngram_k + 1 <= target max_seq_len``).

    Returns:
        :class:`~accel.spd.stats.GenerationResult`. Every row's tokens are distributed exactly as the target's
        (warped) autoregressive samples; with ``greedy=True`` they equal greedy decoding of the target.
    """
    sampling = Sampling(temperature, top_k, top_p, greedy)
    if draft is None and not ngram:
        raise SpdError(
            "generate needs a draft backend, or ngram=n for lookup drafts only (generate_ar decodes without either)"
        )
    prompts, limits = validate(target, draft, prompt_ids, k, max_new_tokens, sampling)
    threshold = 0.0 if min_draft_prob is None else min_draft_prob
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0.0 <= threshold <= 1.0:
        raise SpdError(f"min_draft_prob must be a probability in [0, 1] or None; got {min_draft_prob!r}")
    if draft is None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
        raise SpdError(f"k (default tokens per lookup guess) must be an integer >= 1; got {k!r}")
    n_gram, n_k = check_ngram(ngram, ngram_k, int(k))
    if n_k + 1 > target.info.max_seq_len:
        raise SpdError(f"ngram_k + 1 = {n_k + 1} tokens exceed the target's max_seq_len {target.info.max_seq_len}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return _Loop(
        target,
        draft,
        prompts,
        int(k) if draft is not None else 0,
        limits,
        sampling,
        rng,
        eos_set(eos_token_id),
        stream,
        float(threshold),
        n_gram,
        n_k,
    ).run()


def generate_ar(
    target: Backend,
    prompt_ids: Sequence[Sequence[int]] | np.ndarray,
    *,
    max_new_tokens: int | Sequence[int],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    seed: int | np.random.Generator = 0,
    eos_token_id: int | Sequence[int] | None = None,
    stream: StreamCallback | None = None,
) -> GenerationResult:
    """Autoregressive baseline on the same backend protocol: one target call per token (arguments as ``generate``)."""
    sampling = Sampling(temperature, top_k, top_p, greedy)
    prompts, limits = validate(target, None, prompt_ids, 0, max_new_tokens, sampling)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return _Loop(target, None, prompts, 0, limits, sampling, rng, eos_set(eos_token_id), stream).run()
