"""``evaluate_heads``: per-head acceptance and tokens per target call of Hydra heads on fixed token sequences.

On the target's own greedy continuations these are exact for greedy speculative decoding: a round that starts with
the row's last token at position r (root) uses the base state at r - 1; head i is right when its argmax is the token
at r + i given the true tokens before it (the only paths greedy verification can accept), and a tree round emits
1 + the depth of the deepest tree node on the sequence's own path. Every position after the prompt with room for all
the heads' tokens after it is a start (the same rounds for every statistic).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from accel.drafts.checkpoint import load_text_tokenizer
from accel.drafts.data import self_generate
from accel.drafts.feature import target_features
from accel.drafts.hydra.config import HeadsEval
from accel.drafts.hydra.model import HydraHeads
from accel.drafts.hydra.tree import TreeShape, grow_trees
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["evaluate_heads", "held_out_sequences"]


@torch.no_grad()
def evaluate_heads(
    heads: HydraHeads,
    sequences: Sequence[torch.Tensor],
    prompt_lengths: Sequence[int],
    hidden: Sequence[torch.Tensor],
    *,
    shape: TreeShape | None = None,
    top_k: int = 4,
) -> HeadsEval:
    """Teacher-forced quality of ``heads`` (``HeadsEval``). ``sequences``: 1-D token tensors; ``hidden``: the target's
    final-norm states ``[L, H]`` of each (float32); ``prompt_lengths``: the prompt part of each (>= 2 tokens: a
    round needs a base state before its root); ``shape``: the tree the proposer grows (default ``TreeShape()``)."""
    shape = _check_inputs(heads, sequences, prompt_lengths, hidden, shape)
    K = heads.config.num_heads
    hits1, hitsk, counts = np.zeros(K), np.zeros(K), np.zeros(K)
    chain_hits, chain_counts = np.zeros(K), np.zeros(K)
    tree_tokens, tree_nodes, rounds = 0.0, 0.0, 0
    heads.eval()
    for seq, plen, hid in zip(sequences, prompt_lengths, hidden, strict=True):
        seq = seq.long()
        length = len(seq)
        _check_sequence(heads, length, plen, hid)
        roots = np.arange(plen - 1, length - 1 - K)  # a round's root (its last token): K tokens follow it
        right = _head_hits(heads, seq, hid.float(), roots, top_k)
        for i, (ok1, okk) in enumerate(right):
            hits1[i] += ok1.sum()
            hitsk[i] += okk.sum()
            counts[i] += len(ok1)
        run = np.ones(len(roots), dtype=bool)
        for i, (ok1, _) in enumerate(right):
            run = run & ok1
            chain_hits[i] += run.sum()
            chain_counts[i] += len(run)
        accepted, nodes = _tree_rounds(heads, seq, hid.float(), roots, shape)
        tree_tokens += float((accepted + 1).sum())
        tree_nodes += float(nodes.sum())
        rounds += len(roots)
    chain = [float(h / c) if c else 0.0 for h, c in zip(chain_hits, chain_counts, strict=True)]
    return HeadsEval(
        positions=rounds,
        sequences=len(sequences),
        top_k=top_k,
        top1=[float(h / c) if c else 0.0 for h, c in zip(hits1, counts, strict=True)],
        topk_coverage=[float(h / c) if c else 0.0 for h, c in zip(hitsk, counts, strict=True)],
        chain_accept_by_position=chain,
        chain_tokens_per_call=[1.0 + sum(chain[: j + 1]) for j in range(K)],
        tree=shape.as_dict(),
        tree_tokens_per_call=tree_tokens / max(rounds, 1),
        tree_nodes=tree_nodes / max(rounds, 1),
    )


def _check_inputs(
    heads: HydraHeads,
    sequences: Sequence[torch.Tensor],
    prompt_lengths: Sequence[int],
    hidden: Sequence[torch.Tensor],
    shape: TreeShape | None,
) -> TreeShape:
    """The tree shape to grow (default: one level per head); ``DraftError`` on inconsistent inputs."""
    shape = shape or TreeShape(depth=heads.config.num_heads)
    if shape.depth > heads.config.num_heads:
        raise DraftError(
            f"a tree of depth {shape.depth} needs {shape.depth} heads; these have {heads.config.num_heads}"
        )
    if not len(sequences) or len(sequences) != len(prompt_lengths) or len(sequences) != len(hidden):
        raise DraftError("evaluate_heads needs one prompt length and one hidden-state tensor per sequence")
    return shape


def _check_sequence(heads: HydraHeads, length: int, plen: int, hid: torch.Tensor) -> None:
    """``DraftError`` unless a sequence has room for every head after its prompt and ``hid`` matches it."""
    K = heads.config.num_heads
    if not 2 <= plen < length - K:
        raise DraftError(
            f"prompt length {plen} must be in 2..{length - K - 1} for a sequence of {length} tokens ({K} heads)"
        )
    if tuple(hid.shape) != (length, heads.config.hidden_size):
        raise DraftError(f"hidden states {tuple(hid.shape)} do not match a sequence of {length} tokens")


def _head_hits(heads: HydraHeads, seq: torch.Tensor, hid: torch.Tensor, roots: np.ndarray, top_k: int):
    """Per head i: (top-1 right, in top-k) ``[R]`` bool over the roots r (r + i is inside the sequence)."""
    states = heads.teacher_forced(hid[None], seq[None])  # head i at base t = states[i-1][0, t]
    out = []
    for i, st in enumerate(states, start=1):
        starts = roots
        logits = st[0, starts - 1] @ heads.lm_weight.T
        top = heads.token_ids[logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices]  # [R, k]
        truth = seq[torch.from_numpy(starts + i)]
        out.append(((top[:, 0] == truth).numpy(), (top == truth[:, None]).any(-1).numpy()))
    return out


def _tree_rounds(heads: HydraHeads, seq: torch.Tensor, hid: torch.Tensor, roots: np.ndarray, shape: TreeShape):
    """Accepted tokens and tree sizes of a greedy round at every root (trees grown by the torch heads)."""
    base = heads.base_states(hid[None])[0, roots - 1][:, None, :]  # [R, 1, H]

    def expand(level: int, paths: np.ndarray):
        logp = heads.level_logp(level, base, torch.from_numpy(paths))
        values, cols = logp.topk(min(shape.top_k, logp.shape[-1]), dim=-1)
        return heads.token_ids[cols].numpy(), values.numpy()

    room = (len(seq) - 1 - roots).astype(np.int64)  # tokens after the root
    trees = grow_trees(expand, seq[torch.from_numpy(roots)].numpy(), shape, max_depth=room)
    truth = seq.numpy()
    accepted = np.zeros(len(roots), dtype=np.int64)
    nodes = np.zeros(len(roots), dtype=np.int64)
    for b, (r, tree) in enumerate(zip(roots, trees, strict=True)):
        nodes[b] = len(tree.tokens) - 1
        v, depth = 0, 0
        while True:
            kids = np.flatnonzero(tree.parents == v)
            match = [c for c in kids if tree.tokens[c] == truth[r + depth + 1]]
            if not match:
                break
            v, depth = int(match[0]), depth + 1
        accepted[b] = depth
    return accepted, nodes


@torch.no_grad()
def held_out_sequences(
    target: Decoder, tokenizer_dir, prompts: Sequence[str] | None = None, gen_tokens: int = 128
) -> tuple[list[torch.Tensor], list[int], list[torch.Tensor]]:
    """Greedy continuations of ``prompts`` (default ``HELD_OUT_PROMPTS``) by ``target`` (up to ``gen_tokens``, cut
    after an end-of-sequence token), their prompt lengths and the target's float32 hidden states of each."""
    tok = load_text_tokenizer(tokenizer_dir)
    ids = [tok.encode(p).ids for p in (prompts or HELD_OUT_PROMPTS)]
    data = self_generate(
        target, ids, [0.0] * len(ids), gen_tokens, 1, seed=0, eos_token_ids=target.config.eos_token_ids
    )
    seqs = [row[: int(m.nonzero().max()) + 2] for row, m in zip(data.tokens, data.mask, strict=True)]
    hidden = [target_features(target, s[None], dtype=torch.float32)[0] for s in seqs]
    return seqs, [len(p) for p in ids], hidden
