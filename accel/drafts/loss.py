"""The distillation loss: KL(target || draft) with the target truncated to its top k tokens and renormalised."""

from __future__ import annotations

import math

import torch

__all__ = ["sampled_topk_kl", "topk_kl"]


def topk_kl(
    draft_logits: torch.Tensor, topk_ids: torch.Tensor, topk_logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean over masked positions of ``sum_{x in top-k} p~(x) (log p~(x) - log q(x))`` in nats.

    ``p~`` is the target's top-k distribution renormalised (``softmax`` of the stored top-k log-probs); ``q`` is the
    draft's full softmax. Zero iff the draft puts all its mass on the target's top k in the same proportions. The
    truncation keeps memory at k floats per position; with k = 32 the top-k of a 135M-parameter chat model covers
    most of the mass at typical positions (the rest is a long tail a draft cannot match anyway).

    Shapes: ``draft_logits [B, S, V]``, ``topk_ids``/``topk_logp [B, S, k]``, ``mask [B, S]`` (bool).
    """
    p_logp = torch.log_softmax(topk_logp.float(), dim=-1)
    q_logp = torch.log_softmax(draft_logits.float(), dim=-1).gather(-1, topk_ids)
    kl = (p_logp.exp() * (p_logp - q_logp)).sum(-1)
    m = mask.to(kl.dtype)
    return (kl * m).sum() / m.sum().clamp(min=1.0)


def sampled_topk_kl(
    hidden: torch.Tensor,
    head_weight: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logp: torch.Tensor,
    num_negatives: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """``topk_kl`` with the draft's normaliser estimated on a subset of the vocabulary (sampled softmax).

    ``hidden [M, d]`` are final-norm hidden states, ``head_weight [V, d]`` the output layer, ``topk_* [M, k]``.
    Candidates: ``U`` = every token in the batch's teacher top-k (exact logits) plus ``num_negatives`` tokens drawn
    uniformly from the vocabulary, those outside ``U`` standing for the rest with weight ``(V - |U|) / n``:
    ``Z ~ sum_U exp(l) + (V - |U|) / n * sum_neg exp(l)``, an unbiased estimate of the full normaliser (the loss,
    through its log, is biased by O(1/n)). Cost: ``|U| + n`` output columns instead of V.
    """
    vocab = head_weight.shape[0]
    cand = torch.unique(topk_ids)  # sorted
    neg = torch.randint(0, vocab, (num_negatives,), generator=generator)
    neg = neg[~torch.isin(neg, cand)]
    l_cand = hidden @ head_weight[cand].T  # [M, |U|]
    parts = [l_cand]
    if len(neg):
        parts.append(hidden @ head_weight[neg].T + math.log((vocab - len(cand)) / len(neg)))
    log_z = torch.logsumexp(torch.cat(parts, dim=1).float(), dim=1, keepdim=True)
    q_logp = l_cand.float().gather(1, torch.searchsorted(cand, topk_ids)) - log_z
    p_logp = torch.log_softmax(topk_logp.float(), dim=-1)
    return (p_logp.exp() * (p_logp - q_logp)).sum(-1).mean()
