"""Speculative decoding: logits warps, token trees and their exact verification, pluggable proposers, the batched
loop, statistics.

``generate(target, proposer, prompt_ids, max_new_tokens=..., sampling=Sampling(...))`` runs speculative decoding on
any ``accel.backends.Backend`` (torch, onnxruntime, ...), greedy or multinomial, batched with ragged prompts, and
exact: every row's tokens are distributed as the target's own (warped) samples. A proposer makes each round's
candidates: ``DraftChain`` (a draft model's chain of K tokens, optionally of dynamic length), ``DraftTree`` (a draft
model's dynamic token tree, EAGLE-2 style), ``NgramLookup`` (what followed the last occurrence of the context's
suffix), ``FirstOf`` (the first that proposes). ``generate_ar`` is the baseline. This package needs numpy and
pydantic only (no torch). See docs/spd.md.
"""

from accel.errors import SpdError
from accel.spd.checks import check_compatible
from accel.spd.draft_chain import DraftChain
from accel.spd.draft_tree import DraftTree
from accel.spd.lookup import ngram_proposal
from accel.spd.loop import StreamCallback, generate, generate_ar
from accel.spd.merge import Merge
from accel.spd.mrs import RoundResult, acceptance_probs, greedy_accept, residual, sample, speculative_accept
from accel.spd.proposers import FirstOf, NgramLookup, Proposer, ProposerInfo, RowOutcome, RunState
from accel.spd.stats import GenerationResult, GenerationStats
from accel.spd.tree import TokenTree
from accel.spd.verify import TreeOutcome, verify_greedy, verify_sampled
from accel.spd.warps import (
    Sampling,
    apply_temperature,
    greedy_probs,
    softmax,
    top_k_mask,
    top_p_mask,
    warp,
)

GREEDY = Sampling(greedy=True)
"""The greedy ``Sampling`` (argmax decoding)."""

__all__ = [
    "GREEDY",
    "DraftChain",
    "DraftTree",
    "FirstOf",
    "GenerationResult",
    "GenerationStats",
    "Merge",
    "NgramLookup",
    "Proposer",
    "ProposerInfo",
    "RoundResult",
    "RowOutcome",
    "RunState",
    "Sampling",
    "SpdError",
    "StreamCallback",
    "TokenTree",
    "TreeOutcome",
    "acceptance_probs",
    "apply_temperature",
    "check_compatible",
    "generate",
    "generate_ar",
    "greedy_accept",
    "greedy_probs",
    "ngram_proposal",
    "residual",
    "sample",
    "softmax",
    "speculative_accept",
    "top_k_mask",
    "top_p_mask",
    "verify_greedy",
    "verify_sampled",
    "warp",
]
