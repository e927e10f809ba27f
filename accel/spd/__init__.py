"""Speculative decoding: logits warps, modified rejection sampling, the batched loop, statistics.

``generate(target, draft, prompt_ids, k=..., max_new_tokens=...)`` runs draft/target speculative decoding on any
``accel.backends.Backend`` (torch, onnxruntime, ...), greedy or multinomial, batched with ragged prompts, and exact:
every row's tokens are distributed as the target's own (warped) samples. ``generate_ar`` is the baseline.
``generate(..., ngram=n)`` also drafts by n-gram lookup where the text repeats itself (``accel.spd.lookup``).
This package needs numpy and pydantic only (no torch). See docs/spd.md.
"""

from accel.errors import SpdError
from accel.spd.lookup import ngram_proposal
from accel.spd.loop import StreamCallback, check_compatible, generate, generate_ar
from accel.spd.mrs import RoundResult, acceptance_probs, greedy_accept, residual, sample, speculative_accept
from accel.spd.stats import GenerationResult, GenerationStats
from accel.spd.warps import (
    Sampling,
    apply_temperature,
    greedy_probs,
    softmax,
    top_k_mask,
    top_p_mask,
    warp,
)

__all__ = [
    "GenerationResult",
    "GenerationStats",
    "RoundResult",
    "Sampling",
    "SpdError",
    "StreamCallback",
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
    "warp",
]
