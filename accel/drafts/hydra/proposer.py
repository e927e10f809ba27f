"""``HydraProposer``: exported Hydra heads (``HydraRuntime``) as a tree proposer for ``accel.spd.generate``.

Per round, for each row asked (``n`` tokens, root = the last one at position ``n - 1``):

1. the base state: the target's final-norm hidden state at position ``n - 2`` (``RunState.hidden``: the state whose
   LM head gave the root), or with Hydra++ the prefix layer's output there. The prefix layer keeps its own
   position-indexed KV cache; every round it is fed the target states it has not seen yet (positions
   ``fed .. n - 2`` of every asked row, one call), so it never re-reads the prefix and never needs a rollback (only
   committed positions have target states);
2. the tree: ``grow_trees`` (``accel.drafts.hydra.tree``), one head call per level for all rows and all expanded
   nodes, top-k in the graph, within the round's node and depth limits.

Every node is a top-k token of the heads, a deterministic function of the row's tokens and the target's states, so
the tree is verified as point masses (``accel.spd.verify``): greedy output equals the target's greedy decoding and
sampled output has the target's law. numpy + onnxruntime only (no torch).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from accel.backends.base import BackendInfo
from accel.drafts.hydra.runtime import HydraRuntime
from accel.drafts.hydra.tree import TreeShape, grow_trees
from accel.errors import DraftError, SpdError
from accel.spd.proposers import ProposerInfo, RowOutcome, RunState
from accel.spd.tree import TokenTree

__all__ = ["HydraProposer"]


class HydraProposer:
    """Token trees from Hydra heads (module docstring).

    Args:
        heads: the exported heads on onnxruntime (their ``batch_size`` must be the target's).
        shape: how trees are grown (``TreeShape``; default ``TreeShape.for_decoding(heads.num_heads)``: depth
            ``min(4, heads)``, top-4 children, 4 nodes expanded per level, ``DECODE_BUDGET`` = 4 nodes).
            ``TreeShape.chain(k)``: a chain of the heads' top-1 tokens.
    """

    def __init__(self, heads: HydraRuntime, shape: TreeShape | None = None) -> None:
        if not isinstance(heads, HydraRuntime):
            raise DraftError(f"HydraProposer needs a HydraRuntime (exported heads); got {type(heads).__name__}")
        shape = shape or TreeShape.for_decoding(heads.num_heads)
        if shape.depth > heads.num_heads:
            raise DraftError(f"a tree of depth {shape.depth} needs {shape.depth} heads; these have {heads.num_heads}")
        if shape.top_k > heads.head_vocab:
            raise DraftError(f"top_k {shape.top_k} exceeds the heads' {heads.head_vocab} LM-head tokens")
        self.heads, self.shape = heads, shape
        self.fed = np.zeros(0, dtype=np.int64)  # per row: target states fed to the prefix layer (positions 0 .. fed-1)
        self.base = np.zeros((0, heads.hidden_size), dtype=np.float32)  # prefix output at position fed - 1

    @property
    def info(self) -> ProposerInfo:
        s, h = self.shape, self.heads
        kind = "hydra++" if h.prefix else "hydra"
        thr = f", min_prob={s.min_prob:g}" if s.min_prob else ""
        if s.expand_prob is not None:
            thr += f", expand_prob={s.expand_prob:g}"
        return ProposerInfo(
            f"{kind}(depth={s.depth}, top_k={s.top_k}, beam={s.beam}, nodes={s.budget}{thr})",
            s.max_nodes,
            s.depth,
            branching=s.top_k > 1,
            needs_hidden=True,
            ctx_len=h.ctx_len if h.prefix else None,
        )

    def check(self, target: BackendInfo) -> None:
        h = self.heads
        if target.vocab_size != h.vocab_size:
            raise SpdError(f"the Hydra heads have vocabulary {h.vocab_size}; the target has {target.vocab_size}")
        if "hidden_states" not in target.capabilities:
            raise SpdError(
                "Hydra heads read the target's hidden states, but the target backend does not output them: export "
                "the target with hidden_output=True"
            )
        if target.hidden_size != h.hidden_size:
            raise SpdError(
                f"the Hydra heads read states of width {h.hidden_size}; the target's are {target.hidden_size}"
            )
        if target.batch_size != h.batch_size:
            raise SpdError(
                f"the Hydra heads were exported for batch {h.batch_size}; the target runs batch {target.batch_size}"
            )
        limit = min(target.max_seq_len, target.ctx_len)
        if self.shape.max_nodes + 1 > limit:
            raise SpdError(f"a Hydra tree of {self.shape.max_nodes} nodes + the root exceeds the target's {limit}")

    def start(self, run: RunState) -> None:
        self.fed = np.zeros(run.batch, dtype=np.int64)
        self.base = np.zeros((run.batch, self.heads.hidden_size), dtype=np.float32)
        if self.heads.prefix:
            self.heads.reset()
            self._feed(run, run.n >= 2, prefill=run.at_prompt)

    def _feed(self, run: RunState, rows: np.ndarray, prefill: bool = False) -> None:
        """Feed the prefix layer the target states of ``rows`` it has not seen (positions ``fed .. n - 2``)."""
        assert run.hidden is not None
        stops = np.where(rows, run.n - 1, self.fed)
        todo = rows & (stops > self.fed)
        if not todo.any():
            return
        width = int((stops - self.fed)[todo].max())
        hidden = np.zeros((run.batch, width, self.heads.hidden_size), dtype=np.float32)
        pos = np.full((run.batch, width), -1, dtype=np.int64)
        for b in np.flatnonzero(todo):
            length = int(stops[b] - self.fed[b])
            pos[b, width - length :] = np.arange(self.fed[b], stops[b])
            hidden[b, width - length :] = run.hidden[b, self.fed[b] : stops[b]]
        with run.draft_work(int(todo.sum()) * width, prefill=prefill):
            out = self.heads.prefix_states(hidden, pos)
        self.base[todo] = out[todo, -1]
        self.fed[todo] = stops[todo]

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        assert run.hidden is not None
        ok = rows & (run.n >= 2)  # a base state needs one target state before the root
        out: list[TokenTree | None] = [None] * run.batch
        if not ok.any():
            return out
        if self.heads.prefix:
            self._feed(run, ok)
            base = self.base
        else:
            last = np.maximum(run.n - 2, 0)
            base = run.hidden[np.arange(run.batch), last]
        top_k = self.shape.top_k

        def expand(level: int, paths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with run.draft_work(paths.shape[0] * paths.shape[1]):
                return self.heads.level(level, base, paths, top_k)

        rows_idx = np.arange(run.batch)
        roots = run.tokens[rows_idx, np.maximum(run.n - 1, 0)]
        trees = grow_trees(expand, roots, self.shape, np.where(ok, run.max_nodes, 0), np.where(ok, run.max_depth, 0))
        for b in np.flatnonzero(ok):
            t = trees[b]
            if t.tokens.size > 1:
                out[b] = TokenTree(t.tokens, t.parents, source="hydra")
        return out

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        pass  # the prefix layer catches up from RunState.hidden in the next propose
