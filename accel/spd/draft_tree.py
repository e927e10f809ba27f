"""``DraftTree``: a draft model proposes a dynamic token tree per round (EAGLE-2's tree, Li et al. 2024).

A node's *score* is the draft's cumulative probability of its path (the product of the draft's probabilities along
it, kept as a log). Per round, for the rows asked:

1. the catch-up call (``accel.spd.draft_model``) gives the draft's distribution after the root: its ``top_k`` tokens
   are the first candidates;
2. **expand**, level by level up to ``depth``: the ``top_k`` best-scored candidates of the newest level are fed to
   the draft in one tree call (each sees the committed prefix and its own ancestors; a feature draft gets its
   parent's estimated hidden state), and each gets its ``top_k`` tokens as candidates. A level whose best candidate
   cannot enter the final tree any more (a child never scores above its parent) ends the expansion;
3. **rerank**: the ``nodes`` best-scored candidates form the tree (ties favour shallower nodes, so every parent is
   kept with its children), siblings ordered by score: the draft's top-1 chain is the first-child chain.

Candidates are the draft's top-k tokens, a deterministic function of the row's tokens, so the tree is verified as
point masses (``accel.spd.tree``): exact under greedy and sampling alike. With sampling, candidates and scores come
from the draft's distribution after the run's warps. The draft's cache holds the tree's nodes at scratch slots after
the committed prefix; after the round it re-feeds the accepted tokens at their positions (the catch-up).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from accel.backends.base import Backend, BackendInfo, TreeInputs
from accel.errors import SpdError
from accel.models.config import MASKED_LOGIT
from accel.spd.draft_model import DraftModel, draft_probs
from accel.spd.proposers import ProposerInfo, RowOutcome, RunState
from accel.spd.tree import TokenTree, log_floor
from accel.spd.warps import check_logits

__all__ = ["DraftTree"]


@dataclass
class _Pool:
    """One row's candidates: token, parent (-1 = root), depth, log score, draft slot (-1 = not fed), estimate."""

    base: int  # the row's committed length n (the root sits at slot n - 1)
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    estimates: dict[int, np.ndarray] = field(default_factory=dict)

    def add(self, parent: int, tokens: np.ndarray, logp: np.ndarray, floor: float = -np.inf) -> None:
        """Add ``parent``'s children ``tokens`` (log draft probabilities ``logp``); those whose score falls below
        ``floor`` (a log probability) are left out."""
        base_score = self.scores[parent] if parent >= 0 else 0.0
        depth = self.depths[parent] + 1 if parent >= 0 else 1
        for t, lp in zip(tokens.tolist(), logp.tolist(), strict=True):
            if not base_score + lp >= floor:
                continue
            self.tokens.append(int(t))
            self.parents.append(parent)
            self.depths.append(depth)
            self.scores.append(base_score + float(lp))
            self.slots.append(-1)

    def ranked(self) -> list[int]:
        """Candidate indices, best first (score, then shallower, then older)."""
        return sorted(range(len(self.tokens)), key=lambda i: (-self.scores[i], self.depths[i], i))

    def ancestors(self, i: int) -> list[int]:
        out = []
        while i >= 0:
            out.append(i)
            i = self.parents[i]
        return out


class DraftTree:
    """Dynamic token trees from a draft backend (module docstring).

    Args:
        draft: the draft backend; it needs the ``"tree"`` capability (a torch backend, or an ONNX graph exported
            with ``tree=True``), the target's vocabulary and batch size, and ``max_seq_len >= depth + 1``.
        nodes: the node budget: most nodes below the root (the target scores ``nodes + 1`` tokens per call). The
            default 4 was the best greedy budget of the shipped feature draft on the 2-core CPU (benchmarks/spd.py:
            budgets 4 / 8 / 12 / 16 gave 2.36x / 1.80x / 1.63x / 1.43x AR); a flat-costed accelerator wants more.
        top_k: candidates per expanded node, and nodes expanded per level.
        depth: most levels (tokens a round can accept); ``nodes`` by default, capped at 8.
        min_prob: the *dynamic tree* threshold in ``[0, 1)``: a candidate whose score (cumulative draft probability)
            is below it is neither proposed nor expanded, so trees shrink, and rounds end their expansion early,
            where the draft is unsure (0: always ``nodes`` nodes). A function of the draft's outputs only: the
            output law is unchanged.
        expand_prob: a candidate is fed to the draft for children (expanded) only if its score is at least this
            (None: ``min_prob``). A draft call whose best candidate scores low rarely yields an accepted child: for the
            shipped feature draft, expansions whose best node scored below 0.1 gave 0.01 accepted tokens per call,
            0.1-0.2 gave 0.06, 0.3-0.5 gave 0.25 (docs/spd.md). Also a function of the draft's outputs only.
    """

    def __init__(
        self,
        draft: Backend,
        nodes: int = 4,
        top_k: int = 4,
        depth: int | None = None,
        min_prob: float = 0.0,
        expand_prob: float | None = None,
    ) -> None:
        for name, v in (("nodes", nodes), ("top_k", top_k), ("depth", depth if depth is not None else 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise SpdError(f"DraftTree {name} must be an integer >= 1; got {v!r}")
        for name, p in (("min_prob", min_prob), ("expand_prob", 0.0 if expand_prob is None else expand_prob)):
            if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
                raise SpdError(f"DraftTree {name} must be a probability in [0, 1); got {p!r}")
        self.model = DraftModel(draft)
        self.nodes, self.top_k = int(nodes), int(top_k)
        self.depth = int(depth) if depth is not None else min(self.nodes, 8)
        self.min_prob = float(min_prob)
        self.expand_prob = self.min_prob if expand_prob is None else float(expand_prob)
        self._floor, self._expand_floor = log_floor(self.min_prob), log_floor(self.expand_prob)
        self._support: np.ndarray | None = None  # a restricted head's scored columns (None: all, or not seen yet)
        self._support_known = False

    @property
    def info(self) -> ProposerInfo:
        feat = "feature " if self.model.feature else ""
        dyn = f", min_prob={self.min_prob:g}" if self.min_prob else ""
        if self.expand_prob != self.min_prob:
            dyn += f", expand_prob={self.expand_prob:g}"
        return ProposerInfo(
            f"{feat}tree(nodes={self.nodes}, top_k={self.top_k}, depth={self.depth}{dyn})",
            self.nodes,
            self.depth,
            branching=self.top_k > 1,
            needs_hidden=self.model.feature,
            ctx_len=self.model.info.ctx_len,
        )

    def check(self, target: BackendInfo) -> None:
        limit = min(target.max_seq_len, target.ctx_len)
        if self.nodes + 1 > limit:
            raise SpdError(f"nodes={self.nodes} too large: the target scores nodes+1 tokens but allows {limit}")
        if "tree" not in self.model.info.capabilities:
            raise SpdError("DraftTree needs a draft backend with tree inputs: export the draft with tree=True")
        if self.model.info.max_seq_len < max(self.depth + 1, self.top_k):
            raise SpdError(
                f"the draft's max_seq_len {self.model.info.max_seq_len} is below what a tree round feeds it "
                f"(depth + 1 = {self.depth + 1} catch-up tokens, top_k = {self.top_k} nodes per level)"
            )
        self.model.check(target, self.depth + 1)

    def start(self, run: RunState) -> None:
        self.model.start(run)

    def _candidates(self, run: RunState, logits: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``top_k`` best tokens of each row of ``logits [R, V]`` (rows where ``rows``), best first, and their log
        draft probabilities (``-inf`` for other rows and for tokens the warps remove). Greedy and temperature-only
        sampling rank the raw logits directly (``top_logprobs``: no full-vocabulary softmax); with ``top_k``/``top_p``
        warps the warped distribution is ranked. Either way the candidates are a deterministic function of the
        draft's outputs, so this choice changes which tokens are proposed, never the output law."""
        s = run.sampling
        k = min(self.top_k, logits.shape[-1])
        tok = np.zeros((logits.shape[0], k), dtype=np.int64)
        lp = np.full((logits.shape[0], k), -np.inf)
        idx = np.flatnonzero(rows)
        if idx.size == 0:
            return tok, lp
        if s.greedy or (s.top_k is None and s.top_p is None):
            cols = self._head_columns(logits[idx[0]], k)
            rows_logits = logits[idx] if idx.size < logits.shape[0] else logits
            if cols is not None:
                rows_logits = np.take(rows_logits, cols, axis=1)
            t, v = top_logprobs(rows_logits, k, 1.0 if s.greedy else s.temperature)
            if cols is not None:
                t = cols[t]
        else:
            t, v = _top(_log(draft_probs(run, logits[idx], np.ones(idx.size, dtype=bool))), k)
        tok[idx], lp[idx] = t, v
        return tok, lp

    def _head_columns(self, row: np.ndarray, k: int) -> np.ndarray | None:
        """The columns a restricted LM head scores (every other logit is exactly ``MASKED_LOGIT``: probability 0, never
        a top-k token), found from the draft's first logits row; None for a full head. Ranking only these columns
        gives the same candidates and log probabilities at a sixth of the host time for the shipped feature draft
        (8,192 of 49,152 tokens)."""
        if not self._support_known:
            cols = np.flatnonzero(row != np.float32(MASKED_LOGIT))
            self._support = cols if k <= cols.size < row.size // 2 else None
            self._support_known = True
        return self._support

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        logits, hidden = self.model.catch_up(run, rows)
        budget = np.where(rows, np.minimum(self.nodes, run.max_nodes), 0)
        levels = np.where(rows, np.minimum(self.depth, run.max_depth), 0)
        free = self.model.info.ctx_len - run.n  # draft slots after the committed prefix
        root_est = self.model.estimate(hidden, run.batch)
        pools: dict[int, _Pool] = {}
        tok, lp = self._candidates(run, logits, rows)
        for b in np.flatnonzero(rows).tolist():
            pools[b] = _Pool(int(run.n[b]))
            keep = np.isfinite(lp[b])
            pools[b].add(-1, tok[b][keep], lp[b][keep], self._floor)
        for level in range(1, self.depth):
            expand = self._frontier(pools, level, budget, levels, free)
            if not expand:
                break
            self._expand(run, pools, expand, level, root_est)
        out: list[TokenTree | None] = [None] * run.batch
        for b, pool in pools.items():
            out[b] = self._tree(run, b, pool, int(budget[b]), int(levels[b]))
        return out

    def _frontier(self, pools, level: int, budget, levels, free) -> dict[int, list[int]]:
        """Per row: the candidates of depth ``level`` to feed (best first), at most ``top_k``, only those that can
        still make the final tree, score at least ``expand_prob``, and whose children fit the row's depth and the
        draft's cache."""
        out = {}
        for b, pool in pools.items():
            if level >= levels[b]:
                continue
            ranked = pool.ranked()
            cut = pool.scores[ranked[budget[b] - 1]] if len(ranked) >= budget[b] else -np.inf
            cut = max(cut, self._expand_floor)
            fed = sum(s >= 0 for s in pool.slots)
            pick = [i for i in ranked if pool.depths[i] == level and pool.scores[i] >= cut][: self.top_k]
            pick = pick[: max(0, int(free[b]) - fed)]
            if pick:
                out[b] = pick
        return out

    def _expand(self, run: RunState, pools, expand: dict[int, list[int]], level: int, root_est) -> None:
        """One draft tree call feeding the ``expand`` candidates of every row; adds their top-k children."""
        width = max(len(v) for v in expand.values())
        info = self.model.info
        ids = np.zeros((run.batch, width), dtype=np.int64)
        pos = np.full((run.batch, width), -1, dtype=np.int64)
        slots = np.zeros((run.batch, width), dtype=np.int64)
        mask = np.zeros((run.batch, width, info.ctx_len), dtype=bool)
        feats = np.zeros((run.batch, width, info.feature_size), np.float32) if self.model.feature else None
        for b, nodes in expand.items():
            pool = pools[b]
            next_slot = pool.base + sum(s >= 0 for s in pool.slots)
            for j, i in enumerate(nodes):
                pool.slots[i] = next_slot + j
                ids[b, j], pos[b, j], slots[b, j] = pool.tokens[i], pool.base - 1 + level, pool.slots[i]
                mask[b, j, : pool.base] = True
                mask[b, j, [pool.slots[a] for a in pool.ancestors(i)]] = True
                if feats is not None:
                    parent = pool.parents[i]
                    est = root_est[b, 0] if parent < 0 else pool.estimates[parent]
                    feats[b, j] = est
        out, hidden = self.model.call(run, ids, pos, num_logits=width, tree=TreeInputs(slots, mask), features=feats)
        est = self.model.estimate(hidden, run.batch)
        rows = np.zeros(run.batch, dtype=bool)
        rows[list(expand)] = True
        flat = out.reshape(-1, out.shape[-1])
        flat_rows = np.repeat(rows, width) & (pos.reshape(-1) >= 0)
        tok, lp = self._candidates(run, flat, flat_rows)
        tok, lp = tok.reshape(run.batch, width, -1), lp.reshape(run.batch, width, -1)
        for b, nodes in expand.items():
            for j, i in enumerate(nodes):
                keep = np.isfinite(lp[b, j])
                pools[b].add(i, tok[b, j][keep], lp[b, j][keep], self._floor)
                if est is not None:
                    pools[b].estimates[i] = est[b, j]

    def _tree(self, run: RunState, b: int, pool: _Pool, budget: int, levels: int) -> TokenTree | None:
        """The ``budget`` best candidates within ``levels`` as a tree, siblings by score (best first)."""
        chosen = [i for i in pool.ranked() if pool.depths[i] <= levels][:budget]
        if not chosen:
            return None
        chosen.sort(key=lambda i: (pool.depths[i], -pool.scores[i], i))  # parents first, siblings best first
        index = {i: j + 1 for j, i in enumerate(chosen)}
        tokens = [int(run.tokens[b, run.n[b] - 1])] + [pool.tokens[i] for i in chosen]
        parents = [-1] + [index.get(pool.parents[i], 0) if pool.parents[i] >= 0 else 0 for i in chosen]
        return TokenTree(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64))

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        for b, o in enumerate(outcomes):
            if o is not None:  # the tree's nodes sat at scratch slots: re-feed the accepted tokens at their positions
                self.model.fed[b] = o.n_old


def top_logprobs(logits: np.ndarray, k: int, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries of each row of ``logits [R, V]`` (first index on ties), best first, and their log
    softmax at ``temperature`` (float64 ``[R, k]``; the normaliser is summed from float32 exponentials, relative error
    ~1e-7). ``k`` arg-max passes and one exponential pass: several times cheaper than ``argpartition`` plus a float64
    log-softmax over a 49k vocabulary. ``SpdError`` on NaN/inf logits."""
    work = np.array(logits, dtype=np.float32)  # a private copy: the picked entries are masked in place
    rows = np.arange(work.shape[0])
    tok = np.empty((work.shape[0], k), dtype=np.int64)
    val = np.empty((work.shape[0], k), dtype=np.float32)
    for j in range(k):
        tok[:, j] = np.argmax(work, axis=-1)
        val[:, j] = work[rows, tok[:, j]]
        work[rows, tok[:, j]] = -np.inf
    if not np.all(np.isfinite(val[:, 0])):
        check_logits(logits, "draft logits")  # raises, naming the first bad index
    np.put_along_axis(work, tok, val, axis=-1)  # restored: ``work`` is the row again
    m = val[:, :1]
    work -= m
    work *= np.float32(1.0 / temperature)
    np.exp(work, out=work)
    lse = np.log(work.sum(axis=-1, dtype=np.float64))
    logp = (val.astype(np.float64) - m) / temperature - lse[:, None]
    return tok, np.where(np.isfinite(val), logp, -np.inf)


def _log(probs: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(probs)


def _top(logp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best tokens of each row of ``logp [R, V]``, best first, and their values (the warped path)."""
    idx = np.argpartition(-logp, k - 1, axis=-1)[:, :k]
    vals = np.take_along_axis(logp, idx, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(idx, order, axis=-1), np.take_along_axis(vals, order, axis=-1)
