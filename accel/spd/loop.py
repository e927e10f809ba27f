"""The batched speculative decoding loop (``generate``) and its autoregressive baseline (``generate_ar``).

State per row (``n`` = tokens so far, prompt included): the target has consumed positions ``0 .. n-2`` (its cache
holds them at slots ``0 .. n-2``); the last token (position ``n-1``) is fed at the start of the next round. One round:

1. **propose**: the proposer (``accel.spd.proposers``) returns a token tree per row below its last token (None: a
   plain target step), within this round's limits (``room`` = tokens the row may still emit, from
   ``max_new_tokens`` and the context: depth <= room - 1, so no row emits beyond its limit);
2. **verify**: one target call scores every row's tree (``accel.spd.tree.TreeCall``: trees right-aligned, node i at
   slot ``n - 1 + i`` and position ``n - 1 + depth``; a chain call when all trees are chains), then greedy or
   recursive rejection sampling (``accel.spd.verify``) walks each tree (a root alone, a plain step, takes the
   target's next token directly: what the walk gives, with the same random draws, ~0.15 ms sooner a step; a round
   in which no row has a proposal skips the trees altogether: ``_plain_round``);
3. **accept**: each row emits its accepted path and one target token (stopping at EOS or ``max_new_tokens``);
4. **compact**: accepted nodes off the first-child chain are moved to the slots of their positions
   (``move_cache``), so the committed cache is contiguous again; stale slots beyond it stay masked;
5. **stats**: the round is recorded (``accel.spd.stats``), and the proposer is told how its trees fared.

Finished rows ride along as padding (position -1: they write nothing). ``generate_ar`` is the same loop with no
proposer (every tree is the root), so both share truncation rules, warps and statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from accel.backends.base import Backend, TreeInputs, require
from accel.errors import SpdError
from accel.spd.checks import check_backend, eos_set, make_rng, validate
from accel.spd.draft_model import left_padded
from accel.spd.mrs import sample, sample_logits
from accel.spd.proposers import FirstOf, Proposer, RowOutcome, RunState, proposals
from accel.spd.stats import GenerationResult, StatsAccumulator
from accel.spd.tree import TokenTree, TreeCall, check_tree, layout
from accel.spd.verify import TreeOutcome, verify_greedy, verify_sampled
from accel.spd.warps import Sampling, check_logits

__all__ = ["StreamCallback", "generate", "generate_ar"]

_EXPORT_TREE = "export it with tree=True (accel export --tree)"
_BATCH_VOCAB = 4096  # up to this vocabulary a round warps all its columns at once (below: only the visited nodes)

StreamCallback = Callable[[int, list, list], None]
"""``stream(row, tokens, accepted_from_draft)``: called per row and round with the newly emitted tokens."""


class _Loop:
    """One generation run: per-row buffers and positions, the proposer's view of them, and the target calls."""

    def __init__(
        self,
        target: Backend,
        proposer: Proposer | None,
        prompts: list[np.ndarray],
        max_new_tokens: np.ndarray,
        sampling: Sampling,
        rng: np.random.Generator,
        eos: np.ndarray,
        stream: StreamCallback | None,
    ) -> None:
        self.target, self.proposer, self.sampling, self.rng, self.stream = target, proposer, sampling, rng, stream
        self.eos = frozenset(int(e) for e in eos)
        self.batch = len(prompts)
        # read once per generate: the limits of every round (AutoTune's info joins its arms': ~0.3 ms a read)
        self.pinfo = pinfo = proposer.info if proposer is not None else None
        self.ctx = min(target.info.ctx_len, (pinfo.ctx_len if pinfo and pinfo.ctx_len else target.info.ctx_len))
        self.max_new = np.asarray(max_new_tokens, dtype=np.int64)
        n = np.array([len(p) for p in prompts], dtype=np.int64)
        self.buf = np.zeros((self.batch, max(self.ctx, int(n.max()))), dtype=np.int64)
        for b, p in enumerate(prompts):
            self.buf[b, : len(p)] = p
        self.new = np.zeros(self.batch, dtype=np.int64)
        self.active = np.ones(self.batch, dtype=bool)
        self.reasons: list[str | None] = [None] * self.batch
        self.from_draft: list[list[bool]] = [[] for _ in range(self.batch)]
        self.messages: list[str] = []
        depth = pinfo.max_depth if pinfo else 0
        self.acc = StatsAccumulator(
            "spd" if pinfo else "ar", pinfo.max_nodes if pinfo else 0, self.batch, depth, pinfo.name if pinfo else ""
        )
        self.want_hidden = bool(pinfo and pinfo.needs_hidden)
        # proposers that read hidden states checked that the target has them (Proposer.check)
        self.hidden_target = require(target, "hidden_states") if self.want_hidden else None
        hidden = None
        if self.want_hidden:  # the target's final-norm states by position, for proposers that read them
            hidden = np.zeros((self.batch, self.buf.shape[1], target.info.hidden_size), dtype=np.float32)
        self.run = RunState(target.info, sampling, rng, self.buf, n, self.active, hidden, self.acc)
        self.n = self.run.n

    # ------------------------------------------------------------------ target calls

    def _target(
        self, ids: np.ndarray, pos: np.ndarray, num_logits: int, prefill: bool = False, tree: TreeInputs | None = None
    ):
        """Logits (and hidden states when wanted) of one target call; ``tree``: a tree call."""
        with self.acc.timed("target", prefill):
            if self.hidden_target is not None:
                out, hidden = self.hidden_target.forward_hidden(ids, pos, num_logits=num_logits, tree=tree)
            elif tree is not None:  # generate() checked the "tree" capability (the proposer is branching)
                out, hidden = require(self.target, "tree").forward(ids, pos, num_logits=num_logits, tree=tree), None
            else:
                out, hidden = self.target.forward(ids, pos, num_logits=num_logits), None
        self.acc.target_calls += 1
        return out, hidden

    def prefill(self) -> None:
        """Feed every prompt but its last token into the target (chunks of its ``max_seq_len``), then the proposer."""
        stops = self.n - 1
        if stops.max() > 0:
            ids, pos = left_padded(self.buf, np.zeros_like(stops), stops, np.ones(self.batch, dtype=bool))
            step = self.target.info.max_seq_len
            for s in range(0, ids.shape[1], step):
                chunk = pos[:, s : s + step]
                if np.any(chunk >= 0):
                    _, hidden = self._target(ids[:, s : s + step], chunk, 1, prefill=True)
                    if hidden is not None and self.run.hidden is not None:
                        rows, cols = np.nonzero(chunk >= 0)
                        self.run.hidden[rows, chunk[rows, cols]] = hidden[rows, cols]
        if self.proposer is not None:
            self.proposer.start(self.run)

    # ------------------------------------------------------------------ one round

    def _trees(self) -> list[TokenTree | None]:
        """Propose, check and lay out this round's trees (root-only trees for rows without a proposal)."""
        room = np.minimum(self.max_new - self.new, self.ctx - self.n)
        info = self.target.info
        self.run.max_depth[:] = np.where(self.active, room - 1, 0).clip(min=0)
        self.run.max_nodes[:] = np.where(self.active, np.minimum(info.max_seq_len - 1, info.ctx_len - self.n), 0)
        if self.pinfo is not None:
            self.run.max_depth[:] = np.minimum(self.run.max_depth, self.pinfo.max_depth)
            self.run.max_nodes[:] = np.minimum(self.run.max_nodes, self.pinfo.max_nodes).clip(min=0)
        ask = self.active & (self.run.max_depth >= 1) & (self.run.max_nodes >= 1)
        proposed = self._propose(ask)
        trees: list[TokenTree | None] = []
        for b in range(self.batch):
            if not self.active[b]:
                trees.append(None)
                continue
            root = int(self.buf[b, self.n[b] - 1])
            tree = proposed[b] if b < len(proposed) and ask[b] else None
            if tree is None:
                trees.append(TokenTree.chain(root, []))
                continue
            check_tree(tree, b, root, info.vocab_size, int(self.run.max_nodes[b]), int(self.run.max_depth[b]))
            trees.append(layout(tree))
        return trees

    def _propose(self, ask: np.ndarray) -> list[TokenTree | None]:
        """The proposer's trees for the rows in ``ask`` (one entry per row; ``SpdError`` otherwise)."""
        return proposals(self.proposer, self.run, ask) if self.proposer is not None and ask.any() else []

    def _verify_all(self, trees: list[TokenTree | None], call: TreeCall, logits: np.ndarray):
        """Walk every row's tree against its nodes' target logits (``logits [B, W, V]``). With a small vocabulary
        every column is warped (or arg-maxed) in one batched call; with a large one only the visited nodes are."""
        pre = self._prewarp(logits, call.pos)
        outcomes: list[TreeOutcome | None] = [None] * self.batch
        for b, tree in enumerate(trees):
            if tree is None:
                continue
            cols = int(call.offsets[b]) + np.arange(tree.size)

            def node(i: int, b: int = b, cols: np.ndarray = cols) -> Any:
                return pre[b, cols[i]] if pre is not None else self._node(logits[b, cols[i]])

            if tree.size == 1:  # the root alone (a plain step): what verify_* returns for it, without the walk
                outcomes[b] = TreeOutcome([0], self._root(logits, pre, b, int(cols[0])))
            elif self.sampling.greedy:
                vocab = self.target.info.vocab_size
                outcomes[b] = verify_greedy(tree, lambda i, node=node: int(node(i)), vocab)  # type: ignore[misc]
            else:
                outcomes[b] = verify_sampled(tree, node, self.rng)
        return outcomes

    def _prewarp(self, logits: np.ndarray, pos: np.ndarray) -> np.ndarray | None:
        """Up to ``_BATCH_VOCAB`` tokens, every column's arg-max (greedy) or warped law ``[B, W(, V)]`` in one
        batched call, after checking the logits (padding columns hold garbage: zeroed first); None above, where only
        the visited nodes are warped (``_node``)."""
        if logits.shape[-1] > _BATCH_VOCAB:
            return None
        x = np.where((pos >= 0)[:, :, None], logits, 0.0)
        check_logits(x, "target logits")
        return np.argmax(x, axis=-1) if self.sampling.greedy else self.sampling.probs(x)

    def _root(self, logits: np.ndarray, pre: np.ndarray | None, b: int, col: int) -> int:
        """Row ``b``'s next token after column ``col``, where nothing is verified against the law (a root alone):
        from its ``_prewarp`` value (the arg-max itself, or one draw from the law), else from its raw logits
        (``sample_logits``: the same law, not normalised; one uniform either way)."""
        if pre is None:
            return sample_logits(logits[b, col], self.sampling, self.rng)
        q = pre[b, col]
        return int(q) if self.sampling.greedy else int(sample(q[None], self.rng)[0])

    def _node(self, row: np.ndarray):
        """One node's argmax (greedy) or warped distribution, after checking its logits."""
        if not np.isfinite(np.sum(row)):
            check_logits(row, "target logits")  # raises
        return int(np.argmax(row)) if self.sampling.greedy else self.sampling.probs(row)

    def round(self) -> None:
        if self.proposer is None:
            self._plain_round()
            return
        trees = self._trees()
        if all(t is None or (t.size == 1 and t.source != "lookup") for t in trees):
            self._plain_round()  # nothing proposed (a lookup that found no match, no speculation)
            return
        self._tree_round(trees)

    def _tree_round(self, trees: list[TokenTree | None]) -> None:
        """Score, verify and emit this round's ``trees`` (one per row, None for a finished row)."""
        call = TreeCall.build(trees, self.n, self.target.info.ctx_len)
        width = call.ids.shape[1]
        logits, hidden = self._target(call.ids, call.pos, width, tree=call.tree_inputs)
        self.acc.add_round(width)
        outcomes = self._verify_all(trees, call, logits)
        paths = [o.path if o is not None else None for o in outcomes]
        moves = call.compaction(paths, self.n) if call.tree_inputs is not None else None
        if moves is not None:
            require(self.target, "tree").move_cache(*moves)
        if hidden is not None and self.run.hidden is not None:
            for b, path in enumerate(paths):
                if path is not None:
                    cols = call.offsets[b] + np.asarray(path)
                    self.run.hidden[b, self.n[b] - 1 : self.n[b] - 1 + len(path)] = hidden[b, cols]
        self._emit(trees, outcomes)

    def _plain_round(self) -> None:
        """A round in which no row has a proposal (autoregressive decoding, a lookup that found nothing, a
        controller's round without speculation): each active row feeds its last token and takes the target's next
        one. The same call, warps, random draws, tokens, statistics and proposer update as a round of root-only trees
        (tests/spd/test_loop.py), without building, laying out or walking them (0.1-0.17 ms less host time a SmolLM2
        step: docs/spd.md)."""
        rows = np.flatnonzero(self.active)
        last = self.n[rows] - 1
        ids = np.zeros((self.batch, 1), dtype=np.int64)
        pos = np.full((self.batch, 1), -1, dtype=np.int64)
        ids[rows, 0], pos[rows, 0] = self.buf[rows, last], last
        out, hidden = self._target(ids, pos, 1)
        self.acc.add_round(1)
        if hidden is not None and self.run.hidden is not None:
            self.run.hidden[rows, last] = hidden[rows, 0]
        for b, token in zip(rows.tolist(), self._next_tokens(out, pos, rows), strict=True):
            self.buf[b, self.n[b]] = token
            self.n[b] += 1
            self.new[b] += 1
            self.from_draft[b].append(False)
            self.acc.add_plain(1)
            if self.stream is not None:
                self.stream(b, [token], [False])
            if token in self.eos:
                self._finish(b, "eos")
        if self.proposer is not None:
            self.proposer.update(self.run, [None] * self.batch)
        self._check_done()

    def _next_tokens(self, logits: np.ndarray, pos: np.ndarray, rows: np.ndarray) -> list[int]:
        """The target's next token for each row of ``rows`` from its one column of ``logits [B, 1, V]``, as
        ``_verify_all`` takes a root's (``_prewarp``, ``_root``): the arg-max, or one draw per row in row order."""
        pre = self._prewarp(logits, pos)
        return [self._root(logits, pre, b, 0) for b in rows.tolist()]

    def _emit(self, trees: list[TokenTree | None], outcomes: list[TreeOutcome | None]) -> None:
        n_old = self.n.copy()
        reports: list[RowOutcome | None] = [None] * self.batch
        for b, (tree, out) in enumerate(zip(trees, outcomes, strict=True)):
            if tree is None or out is None:
                continue
            m = out.accepted
            toks = [int(tree.tokens[i]) for i in out.path[1:]] + [out.next_token]
            flags = [True] * m + [False]
            hit = next((i for i, t in enumerate(toks) if t in self.eos), None) if self.eos else None
            if hit is not None:
                toks, flags = toks[: hit + 1], flags[: hit + 1]
            n0 = int(self.n[b])
            self.buf[b, n0 : n0 + len(toks)] = toks
            self.n[b] += len(toks)
            self.new[b] += len(toks)
            self.from_draft[b].extend(flags)
            kids = tree.children()
            depth = max(tree.depths())
            self.acc.add_row(
                tree.size - 1,
                depth,
                any(len(k) > 1 for k in kids),
                out,
                not kids[out.path[-1]],
                len(toks),
                sum(flags),
                tree.source == "lookup",
            )
            if tree.size > 1:
                reports[b] = RowOutcome(int(n_old[b]), tree, out.path)
            if self.stream is not None:
                self.stream(int(b), toks, flags)
            if hit is not None:
                self._finish(b, "eos")
        if self.proposer is not None:
            self.proposer.update(self.run, reports)
        self._check_done()

    def _finish(self, b: int | np.integer, reason: str) -> None:
        self.active[b] = False
        self.reasons[b] = reason
        if reason == "context":
            self.messages.append(
                f"row {b}: context full ({self.ctx} tokens = prompt {int(self.run.prompt_len[b])} + "
                f"{int(self.new[b])} generated); stopped before max_new_tokens={int(self.max_new[b])}"
            )

    def _check_done(self) -> None:
        for b in np.flatnonzero(self.active):
            if self.new[b] >= self.max_new[b]:
                self._finish(b, "length")
            elif self.n[b] >= self.ctx:
                self._finish(b, "context")

    def run_all(self) -> GenerationResult:
        self.target.reset()
        self._check_done()
        if self.active.any():
            self.prefill()
        while self.active.any():
            self.round()
        pl = self.run.prompt_len
        return GenerationResult(
            tokens=[[int(t) for t in self.buf[b, pl[b] : self.n[b]]] for b in range(self.batch)],
            from_draft=self.from_draft,
            finish_reasons=self.reasons,
            messages=self.messages,
            stats=self.acc.finish(),
        )


def generate(
    target: Backend,
    proposer: Proposer | Sequence[Proposer] | None,
    prompt_ids: Sequence[Sequence[int]] | np.ndarray,
    *,
    max_new_tokens: int | Sequence[int],
    sampling: Sampling | None = None,
    seed: int | np.random.Generator = 0,
    eos_token_id: int | Sequence[int] | None = None,
    stream: StreamCallback | None = None,
) -> GenerationResult:
    """Speculative decoding: ``proposer`` proposes a token tree per row and round, ``target`` verifies them all in
    one call.

    Args:
        target: the target backend (``batch_size == len(prompt_ids)``; the ``"tree"`` capability when the proposer
            branches).
        proposer: an ``accel.spd.Proposer`` (``DraftChain(draft, k=4)``, ``DraftTree(draft, nodes=...)``,
            ``NgramLookup(n, k)``, ...), a sequence of them (``FirstOf``: each row takes the first proposal), or
            None (autoregressive decoding, as ``generate_ar``).
        prompt_ids: one token list per row (ragged lengths allowed) or a 2-D int array.
        max_new_tokens: most tokens generated per row (one int for all rows, or one per row).
        sampling: the warps (``Sampling(temperature, top_k, top_p, greedy)``; default: temperature 1), applied to
            the target and to every proposal distribution alike.
        seed: seed or ``np.random.Generator`` for proposals and rejection sampling.
        eos_token_id: token id(s) that end a row (the EOS is emitted).
        stream: ``stream(row, tokens, accepted_from_draft)`` called as tokens are accepted.

    Returns:
        :class:`~accel.spd.stats.GenerationResult`. Every row's tokens are distributed exactly as the target's
        (warped) autoregressive samples; with ``Sampling(greedy=True)`` they equal greedy decoding of the target.
    """
    check_backend(target, "target")
    sampling = sampling if sampling is not None else Sampling()
    if isinstance(sampling, Sampling) is False:
        raise SpdError(f"sampling must be an accel.spd.Sampling; got {type(sampling).__name__}")
    if proposer is not None and not isinstance(proposer, Proposer):
        items = list(proposer) if isinstance(proposer, Sequence) else []
        if not items or not all(isinstance(p, Proposer) for p in items):
            raise SpdError(f"proposer must be an accel.spd.Proposer, a sequence of them, or None; got {proposer!r:.80}")
        proposer = items[0] if len(items) == 1 else FirstOf(*items)
    if proposer is not None:
        proposer.check(target.info)
    prompts, limits = validate(
        target, prompt_ids, max_new_tokens, sampling, proposer.info.ctx_len if proposer is not None else None
    )
    if proposer is not None:
        if proposer.info.branching and "tree" not in target.info.capabilities:
            why = getattr(target, "no_tree_reason", None)  # a backend that cannot run trees at all says why
            raise SpdError(
                f"the proposer {proposer.info.name} makes token trees, but the {target.info.name} target backend "
                + (f"cannot score them: {why}" if why else f"has no tree inputs: {_EXPORT_TREE}")
            )
    rng = make_rng(seed)
    return _Loop(
        target, proposer, prompts, limits, sampling, rng, eos_set(eos_token_id, target.info.vocab_size), stream
    ).run_all()


def generate_ar(
    target: Backend,
    prompt_ids: Sequence[Sequence[int]] | np.ndarray,
    *,
    max_new_tokens: int | Sequence[int],
    sampling: Sampling | None = None,
    seed: int | np.random.Generator = 0,
    eos_token_id: int | Sequence[int] | None = None,
    stream: StreamCallback | None = None,
) -> GenerationResult:
    """Autoregressive baseline on the same backend protocol: one target call per token (arguments as ``generate``)."""
    return generate(
        target,
        None,
        prompt_ids,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        eos_token_id=eos_token_id,
        stream=stream,
    )
