"""``evaluate_draft``: how often a draft agrees with its target, in the quantities speculative decoding uses.

Everything is teacher-forced along the given sequences (one causal pass of each model). The per-position greedy
acceptance of a K-token run started at position s is exact for greedy SpD when the text is the target's own greedy
output (then every accepted draft token equals the text's next token); on other text it is an estimate. alpha at a
temperature is exact per position: sum_x min(p(x), q(x)) is the acceptance probability of modified rejection sampling
(Chen et al. 2023, Alg. 2; docs/reference.md §3).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from accel.drafts.architecture import causal_logits
from accel.drafts.checkpoint import check_pair, describe, load_model, load_text_tokenizer
from accel.drafts.config import DraftEval
from accel.errors import DraftError
from accel.models.config import MASKED_LOGIT
from accel.models.decoder import Decoder

__all__ = ["evaluate_draft", "run_acceptance"]

MAX_K = 64  # longest speculative run measured (its cost grows with max_k x tokens)


def evaluate_draft(
    target: Decoder | str | Path,
    draft: Decoder | str | Path,
    data: Sequence[str] | Sequence[Sequence[int]] | np.ndarray,
    *,
    temperature: float = 1.0,
    max_k: int = 8,
    tokenizer_dir: str | Path | None = None,
    max_len: int = 512,
    prompt_lengths: Sequence[int] | None = None,
) -> DraftEval:
    """Measure the draft's agreement with the target on ``data``.

    Args:
        target, draft: ``Decoder`` objects or checkpoint directories (``DraftError`` if missing, corrupted, or with
            different vocabularies).
        data: texts (tokenized with the target's tokenizer: ``tokenizer_dir`` or the target directory) or token-id
            sequences; each is cut to ``max_len`` tokens; sequences need >= 2 tokens.
        temperature: for ``alpha`` (0 means greedy: alpha is then the greedy agreement).
        max_k: longest speculative run for the per-position acceptance (K = 1..max_k).
        prompt_lengths: per sequence, the number of leading prompt tokens whose own predictions are not scored
            (only the predictions of tokens ``prompt_len ..`` count: what a draft faces while generating).

    Returns a ``DraftEval`` (fractions in [0, 1], tokens per step, nats per token).
    """
    if temperature < 0:
        raise DraftError(f"temperature must be >= 0; got {temperature}")
    if isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= MAX_K:
        raise DraftError(f"max_k must be an int in 1..{MAX_K}; got {max_k!r}")
    t_model = load_model(target, "target")
    d_model = load_model(draft, "draft")
    check_pair(t_model, d_model, describe(target), describe(draft))
    seqs = _as_token_lists(data, target, tokenizer_dir, max_len)
    starts = _prompt_starts(seqs, prompt_lengths)
    agree_all, alpha_sum, t_nll, d_nll, n, d_scored = _score_sequences(t_model, d_model, seqs, starts, temperature)
    rates = run_acceptance(agree_all, max_k)
    return DraftEval(
        positions=n,
        sequences=len(seqs),
        temperature=temperature,
        greedy_agreement=float(np.concatenate(agree_all).mean()),
        accept_rate_by_position=rates,
        expected_tokens_per_step=[1.0 + float(sum(rates[:k])) for k in range(1, max_k + 1)],
        alpha=alpha_sum / n,
        target_nll=t_nll / n,
        draft_nll=d_nll / max(d_scored, 1),
        draft_zero_prob=1.0 - d_scored / n,
    )


def _prompt_starts(seqs: list[list[int]], prompt_lengths: Sequence[int] | None) -> list[int]:
    """The first scored position of each sequence (0, or its prompt length - 1)."""
    if prompt_lengths is None:
        starts = [0] * len(seqs)
    else:
        if len(prompt_lengths) != len(seqs):
            raise DraftError(f"{len(prompt_lengths)} prompt_lengths for {len(seqs)} sequences")
        starts = [max(0, int(n) - 1) for n in prompt_lengths]
        short = [i for i, (s, n) in enumerate(zip(seqs, starts, strict=True)) if n >= len(s) - 1]
        if short:
            raise DraftError(f"sequence(s) {short[:5]} have no token after their prompt; nothing to score")
    return starts


def _score_sequences(
    t_model: Decoder, d_model: Decoder, seqs: list[list[int]], starts: list[int], temperature: float
) -> tuple[list[np.ndarray], float, float, float, int, int]:
    """Teacher-force both models on every sequence: (agreements, alpha sum, target NLL, draft NLL, n, draft scored)."""
    vocab = t_model.config.vocab_size
    agree_all: list[np.ndarray] = []
    alpha_sum, t_nll, d_nll, n, d_scored = 0.0, 0.0, 0.0, 0, 0
    with torch.no_grad():
        for ids, start in zip(seqs, starts, strict=True):
            if min(ids) < 0 or max(ids) >= vocab:
                raise DraftError(f"token id {max(ids) if max(ids) >= vocab else min(ids)} is outside [0, {vocab})")
            x = torch.tensor([ids])
            lp = torch.log_softmax(causal_logits(t_model, x)[0, start:-1].double(), -1)
            lq = torch.log_softmax(causal_logits(d_model, x)[0, start:-1].double(), -1)
            nxt = x[0, start + 1 :]
            agree = (lp.argmax(-1) == lq.argmax(-1)).numpy()
            agree_all.append(agree)
            if temperature == 0:
                alpha_sum += float(agree.sum())
            else:
                p = torch.softmax(lp / temperature, -1)
                q = torch.softmax(lq / temperature, -1)
                alpha_sum += float(torch.minimum(p, q).sum(-1).sum())
            t_nll -= float(lp.gather(-1, nxt[:, None]).sum())
            d_lp = lq.gather(-1, nxt[:, None])[:, 0]
            possible = d_lp > MASKED_LOGIT / 2  # a restricted head gives the other tokens probability 0
            d_nll -= float(d_lp[possible].sum())
            d_scored += int(possible.sum())
            n += len(agree)
    return agree_all, alpha_sum, t_nll, d_nll, n, d_scored


def run_acceptance(agreements: Sequence[np.ndarray], max_k: int) -> list[float]:
    """``P_j`` (j = 0..max_k-1): over every start s with s + j inside the sequence, the fraction where positions
    s..s+j all agree (so draft token j+1 of a greedy run started at s is accepted). Non-increasing in j."""
    hits = np.zeros(max_k)
    counts = np.zeros(max_k)
    for a in agreements:
        a = np.asarray(a, dtype=bool)
        n = len(a)
        run = np.zeros(n + 1, dtype=np.int64)  # run[s] = consecutive agreements starting at s
        for s in range(n - 1, -1, -1):
            run[s] = run[s + 1] + 1 if a[s] else 0
        for j in range(max_k):
            starts = n - j
            if starts <= 0:
                break
            hits[j] += float((run[:starts] > j).sum())
            counts[j] += starts
    out = [float(h / c) if c else 0.0 for h, c in zip(hits, counts, strict=True)]
    for j in range(1, max_k):  # fewer starts at larger j can break monotonicity by sampling noise; P_j <= P_{j-1}
        out[j] = min(out[j], out[j - 1])
    return out


def _as_token_lists(data, target, tokenizer_dir, max_len: int) -> list[list[int]]:
    if isinstance(data, np.ndarray):
        data = [row for row in data] if data.ndim == 2 else [data]
    if isinstance(data, (str, bytes)) or not len(data):
        raise DraftError("data must be a non-empty list of texts or token sequences")
    if all(isinstance(d, str) for d in data):
        tok_dir = tokenizer_dir or (None if isinstance(target, Decoder) else target)
        if tok_dir is None:
            raise DraftError("texts need the target's tokenizer: pass tokenizer_dir= or a target directory")
        tok = load_text_tokenizer(tok_dir)
        seqs = [tok.encode(t).ids for t in data]
    else:
        seqs = [[int(v) for v in np.asarray(d).reshape(-1)] for d in data]
    seqs = [s[:max_len] for s in seqs]
    short = [i for i, s in enumerate(seqs) if len(s) < 2]
    if short:
        raise DraftError(f"sequence(s) {short[:5]} have fewer than 2 tokens; nothing to predict")
    return seqs
