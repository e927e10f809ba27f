"""The ``Proposer`` protocol: what makes a round's candidates, and the run state a proposer sees.

A round of ``generate`` is propose -> verify -> accept -> compact -> stats. A proposer does the first step: for each
row it is asked about, it returns a ``TokenTree`` (``accel.spd.tree``) below the row's last token, or None (the row
takes a plain target step). It owns whatever it proposes with (a draft backend and its cache, heads, a lookup
table) and is told after every round how far each of its trees was accepted (``update``), so it can keep its own
state in step. Nothing else about the loop changes with the proposer: the standalone and feature drafts
(``DraftChain``, ``DraftTree``), n-gram lookup (``NgramLookup``) and their combinations (``FirstOf``) all plug in
the same way, and so will Hydra heads, PPD's early exits and superposed drafts.

Exactness (greedy = the target's greedy decoding; sampling = the target's law) holds for any proposer whose trees
declare how each node was proposed (sampled from a reported distribution, or deterministic; ``accel.spd.tree``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from accel.backends.base import Backend, BackendInfo
from accel.errors import SpdError
from accel.spd.lookup import check_ngram, ngram_proposal
from accel.spd.stats import StatsAccumulator
from accel.spd.tree import TokenTree
from accel.spd.warps import Sampling

__all__ = ["FirstOf", "NgramLookup", "Proposer", "ProposerInfo", "RowOutcome", "RunState"]


@dataclass(frozen=True)
class ProposerInfo:
    """Static facts the loop checks and sizes its calls by.

    Attributes:
        name: a short description for statistics, e.g. ``"chain(k=4)"``.
        max_nodes: most nodes below the root of one tree (the target scores up to ``max_nodes + 1`` tokens).
        max_depth: most levels of one tree (tokens a round can accept).
        branching: whether trees may have a node with two children (the target then needs tree inputs).
        needs_hidden: whether the proposer reads the target's hidden states (``RunState.hidden``).
        ctx_len: the proposer's own context limit in tokens (a draft backend's), or None.
    """

    name: str
    max_nodes: int
    max_depth: int
    branching: bool = False
    needs_hidden: bool = False
    ctx_len: int | None = None


@dataclass(frozen=True)
class RowOutcome:
    """How a proposer's tree for one row fared: the row had ``n_old`` tokens, ``tree`` is the tree as verified (laid
    out depth first, ``accel.spd.tree.layout``), ``path`` the accepted node indices in it (root first)."""

    n_old: int
    tree: TokenTree
    path: list[int]

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


class RunState:
    """What a proposer sees of a run. Read its arrays, never write them; make backend calls through ``call``.

    Attributes:
        target: the target backend's ``BackendInfo``.
        sampling: the warps of the run (draft distributions must use the same ones).
        rng: the run's random generator (proposers that sample draw from it).
        tokens: int64 ``[B, capacity]``; row b's tokens (prompt included) are ``tokens[b, :n[b]]``.
        n, prompt_len: int64 ``[B]``.
        active: bool ``[B]``, rows still generating.
        max_nodes, max_depth: int64 ``[B]``, this round's limits for each row's tree (room in the context, the
            length limit and the target's ``max_seq_len``); trees beyond them are ``SpdError``s.
        loop_limits: the loop's own ``(max_nodes, max_depth)`` where a controller (``AutoTune``) lowered the two
            above to this round's budget for the proposer it wraps; None otherwise (``accel.spd.autotune_arm.
            Unbudgeted`` proposes within these).
        hidden: float32 ``[B, capacity, H]``, the target's final-norm hidden state at each position below
            ``n - 1`` (when some proposer ``needs_hidden``), else None.
    """

    def __init__(
        self,
        target: BackendInfo,
        sampling: Sampling,
        rng: np.random.Generator,
        tokens: np.ndarray,
        n: np.ndarray,
        active: np.ndarray,
        hidden: np.ndarray | None,
        stats: StatsAccumulator,
    ) -> None:
        self.target, self.sampling, self.rng = target, sampling, rng
        self.tokens, self.n, self.active, self.hidden = tokens, n, active, hidden
        self.prompt_len = n.copy()
        self.batch = int(n.shape[0])
        self.max_nodes = np.zeros(self.batch, dtype=np.int64)
        self.max_depth = np.zeros(self.batch, dtype=np.int64)
        self.loop_limits: tuple[np.ndarray, np.ndarray] | None = None
        self._stats = stats

    @property
    def at_prompt(self) -> bool:
        """Whether no row has generated a token yet: a proposer's ``start`` then feeds its models as prefill; started
        later (``AutoTune`` starts an arm at its first round), the same calls are decode work."""
        return bool(np.array_equal(self.n, self.prompt_len))

    def call(
        self, backend: Backend, ids: np.ndarray, pos: np.ndarray, *, num_logits: int = 1, prefill: bool = False
    ) -> np.ndarray:
        """``backend.forward(ids, pos, num_logits=...)``, timed and counted as a draft call (prefill or not); a call
        with a capability (``accel.backends.base.require``) goes inside ``draft_work``."""
        with self.draft_work(int(ids.shape[1]), prefill=prefill):
            return backend.forward(ids, pos, num_logits=num_logits)

    @contextmanager
    def draft_work(self, tokens: int, *, prefill: bool = False) -> Iterator[None]:
        """Time a proposer's own model call that is not a ``Backend`` (e.g. Hydra heads' onnxruntime sessions) and
        count it as one draft call of ``tokens`` tokens, as ``call`` does."""
        with self._stats.timed("draft", prefill):
            yield
        self._count_draft(tokens, prefill)

    def _count_draft(self, tokens: int, prefill: bool) -> None:
        self._stats.draft_calls += 1
        if not prefill:
            self._stats.draft_decode_calls += 1
            self._stats.draft_call_tokens += tokens


@runtime_checkable
class Proposer(Protocol):
    """Makes one token tree per row and round (module docstring)."""

    @property
    def info(self) -> ProposerInfo: ...

    def check(self, target: BackendInfo) -> None:
        """``SpdError`` if this proposer cannot serve ``target`` (vocabulary, batch, missing capabilities)."""
        ...

    def start(self, run: RunState) -> None:
        """A new run: reset own state, prefill own models with the prompts (all but each row's last token; the
        target's states of those positions are in ``run.hidden`` when ``needs_hidden``)."""
        ...

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        """One tree (or None) per row; only rows where ``rows`` (bool ``[B]``) holds are asked, within
        ``run.max_nodes`` / ``run.max_depth``."""
        ...

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        """After the round (``run.n`` already advanced): ``outcomes[b]`` for the rows whose tree was this
        proposer's, None for the others."""
        ...


def proposals(proposer: Proposer, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
    """``proposer.propose(run, rows)``, checked to be a list of one entry per row (``SpdError`` naming the proposer
    otherwise: a custom proposer returning None or a short list fails here, not deep in the loop)."""
    out = proposer.propose(run, rows)
    if not isinstance(out, (list, tuple)) or len(out) != run.batch:
        if isinstance(out, (list, tuple)):
            got = f"{len(out)} entries"
        else:
            got = "None" if out is None else f"a {type(out).__name__}"
        raise SpdError(
            f"the proposer {proposer.info.name}'s propose() must return a list of {run.batch} entries (a TokenTree "
            f"or None per row); got {got}"
        )
    return list(out)


class NgramLookup:
    """N-gram lookup drafts (prompt lookup decoding; ``accel.spd.lookup``): when a row's last ``n`` tokens (or a
    shorter suffix, down to 2) occurred earlier in the row, the up to ``k`` tokens that followed are a chain of
    deterministic guesses (point masses: exact under greedy and sampling). Rows without a match get None."""

    def __init__(self, n: int = 3, k: int = 4) -> None:
        self.n, self.k = check_ngram(n, k, k)
        if self.n == 0:
            raise SpdError("NgramLookup needs n >= 1")

    @property
    def info(self) -> ProposerInfo:
        return ProposerInfo(f"lookup(n={self.n}, k={self.k})", self.k, self.k)

    def check(self, target: BackendInfo) -> None:
        if self.k + 1 > target.max_seq_len:
            raise SpdError(f"ngram_k + 1 = {self.k + 1} tokens exceed the target's max_seq_len {target.max_seq_len}")

    def start(self, run: RunState) -> None:
        pass

    def proposal(self, tokens: np.ndarray, limit: int) -> np.ndarray:
        """The up to ``min(k, limit)`` tokens proposed after a row's ``tokens`` (empty: no match)."""
        return ngram_proposal(tokens, self.n, min(self.k, limit), n_min=min(2, self.n))

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        out: list[TokenTree | None] = [None] * run.batch
        for b in np.flatnonzero(rows):
            prop = self.proposal(run.tokens[b, : run.n[b]], int(min(run.max_depth[b], run.max_nodes[b])))
            if prop.size:
                out[b] = TokenTree.chain(int(run.tokens[b, run.n[b] - 1]), prop, source="lookup")
        return out

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        pass


class FirstOf:
    """Proposers tried in order: each row takes the first tree offered (e.g. ``FirstOf(NgramLookup(), DraftChain(draft,
    k=2))``: lookup where the text repeats, the draft model elsewhere)."""

    def __init__(self, *proposers: Proposer) -> None:
        if not proposers:
            raise SpdError("FirstOf needs at least one proposer")
        self.proposers = proposers
        self._owner = np.zeros(0, dtype=np.int64)

    @property
    def info(self) -> ProposerInfo:
        infos = [p.info for p in self.proposers]
        limits = [i.ctx_len for i in infos if i.ctx_len is not None]
        return ProposerInfo(
            " | ".join(i.name for i in infos),
            max(i.max_nodes for i in infos),
            max(i.max_depth for i in infos),
            any(i.branching for i in infos),
            any(i.needs_hidden for i in infos),
            min(limits) if limits else None,
        )

    def check(self, target: BackendInfo) -> None:
        for p in self.proposers:
            p.check(target)

    def start(self, run: RunState) -> None:
        self._owner = np.full(run.batch, -1, dtype=np.int64)
        for p in self.proposers:
            p.start(run)

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        out: list[TokenTree | None] = [None] * run.batch
        self._owner[:] = -1
        left = rows.copy()
        for i, p in enumerate(self.proposers):
            if not left.any():
                break
            for b, tree in enumerate(proposals(p, run, left)):
                if left[b] and tree is not None:
                    out[b], self._owner[b], left[b] = tree, i, False
        return out

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        for i, p in enumerate(self.proposers):
            p.update(run, [o if self._owner[b] == i else None for b, o in enumerate(outcomes)])
