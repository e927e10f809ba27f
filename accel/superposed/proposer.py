"""``SuperposedProposer``: superposed drafts as a proposer for exact speculative decoding (docs/superposed.md, "As a
proposer").

Per round, for the rows asked: the draft catches up on the row's un-consumed tokens (ordinary inputs, the root
last), which gives the first level's distribution; then ``depth - 1`` superposed calls (one mixed column per row)
grow k drafts (``accel.superposed.decode.Beams``). The k drafts become one token tree: a trie (shared prefixes
merged) whose siblings are ordered by their best draft's score, cut to the round's ``max_nodes`` / ``max_depth``.
Every node is a deterministic guess (``sampled`` False), verified as a point mass: greedy output equals the target's
greedy decoding and sampling keeps the target's law, whatever the drafts are. The mixed columns leave the draft's
cache wrong at positions ``>= n_old``; ``update`` rewinds ``fed`` to ``n_old`` so the next catch-up overwrites them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from accel.backends.base import Backend, BackendInfo, MixInputs, require
from accel.errors import SpdError, SuperposedError
from accel.spd.draft_model import DraftModel
from accel.spd.proposers import ProposerInfo, RowOutcome, RunState
from accel.spd.tree import TokenTree
from accel.superposed.decode import Beams, Draft
from accel.superposed.scoring import SuperposedConfig
from accel.superposed.store import NgramStore

__all__ = ["SuperposedProposer", "trie"]


def trie(root: int, drafts: Sequence[Draft], max_nodes: int, max_depth: int) -> TokenTree | None:
    """The token tree of ``drafts`` (best first) below ``root``: shared prefixes merged, children in the order their
    first draft comes, each draft cut at ``max_depth`` and at the first token past end of sequence, drafts added
    while the tree has at most ``max_nodes`` nodes below the root. None when no node fits."""
    tokens, parents = [int(root)], [-1]
    children: dict[tuple[int, int], int] = {}
    for d in drafts:
        path = [int(t) for t in d.tokens[:max_depth]]
        node, have = 0, 0
        while have < len(path) and (node, path[have]) in children:
            node, have = children[(node, path[have])], have + 1
        if have == len(path) or len(tokens) - 1 + len(path) - have > max_nodes:
            continue  # already in the tree, or too big for the budget
        for t in path[have:]:
            children[(node, t)] = len(tokens)
            tokens.append(t)
            parents.append(node)
            node = len(tokens) - 1
    if len(tokens) == 1:
        return None
    return TokenTree(np.asarray(tokens, np.int64), np.asarray(parents, np.int64), None, None, "superposed")


class SuperposedProposer:
    """k superposed drafts of ``depth`` tokens per round from ``depth`` draft calls, proposed as one tree.

    Args:
        draft: a draft backend with the ``"mix"`` capability (same vocabulary and batch size as the target).
        depth: draft tokens per branch (>= 1); the tree has at most ``k * depth`` nodes below the root.
        config: Superposed Decoding settings (``k`` branches; default: the paper's).
        store: n-gram counts for the drafts' scores (None: the draft's log-probabilities alone).
    """

    def __init__(
        self, draft: Backend, depth: int = 4, config: SuperposedConfig | None = None, store: NgramStore | None = None
    ) -> None:
        if "mix" not in draft.info.capabilities:
            raise SuperposedError("the superposed proposer's draft needs mixed inputs: export it with mix_inputs=True")
        if not 1 <= depth <= 64:
            raise SuperposedError(f"depth must be in 1..64 tokens; got {depth}")
        if store is not None and store.vocab_size != draft.info.vocab_size:
            raise SuperposedError(f"the n-gram store's vocabulary ({store.vocab_size}) is not the draft's")
        self.model = DraftModel(draft)
        self.mixer = require(draft, "mix")  # the draft as a MixBackend, for the superposed calls
        self.depth, self.cfg, self.store = depth, config or SuperposedConfig(), store

    @property
    def info(self) -> ProposerInfo:
        k = self.cfg.k
        return ProposerInfo(
            f"superposed(k={k}, depth={self.depth})",
            k * self.depth,
            self.depth,
            branching=k > 1,
            ctx_len=self.model.info.ctx_len,
        )

    def check(self, target: BackendInfo) -> None:
        if self.model.feature:
            raise SpdError("a feature draft cannot be a superposed proposer (it reads the target's hidden states)")
        if self.cfg.k * self.depth + 1 > target.max_seq_len:
            raise SpdError(f"k * depth + 1 = {self.cfg.k * self.depth + 1} nodes exceed the target's max_seq_len")
        self.model.check(target, 2)

    def start(self, run: RunState) -> None:
        self.model.start(run)

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        depth = np.where(rows, np.minimum(self.depth, np.minimum(run.max_depth, run.max_nodes)), 0)
        logits, _ = self.model.catch_up(run, rows)
        contexts = [run.tokens[b, : run.n[b]].tolist() if rows[b] else [0] for b in range(run.batch)]
        beams = Beams(contexts, self.cfg, self.store)
        beams.stop(~rows | (depth < 1))
        levels = int(depth.max(initial=0))
        for j in range(levels):
            beams.advance(logits, last=j == levels - 1)
            beams.stop(depth == j + 1)
            if beams.all_done:
                break
            ids, pos, mix_ids, mix_w = beams.mix_inputs()
            with run.draft_work(int(ids.shape[1])):
                out = self.mixer.forward(ids, pos, num_logits=1, mix=MixInputs(mix_ids, mix_w))
            logits = out[:, -1, :]
        drafts = beams.drafts()
        out_trees: list[TokenTree | None] = [None] * run.batch
        for b in np.flatnonzero(rows & (depth >= 1)):
            root = int(run.tokens[b, run.n[b] - 1])
            out_trees[b] = trie(root, drafts[b], int(run.max_nodes[b]), int(depth[b]))
        return out_trees

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        for b, o in enumerate(outcomes):
            if o is not None:  # the mixed columns wrote positions >= n_old: refeed them
                self.model.fed[b] = min(int(self.model.fed[b]), o.n_old)
