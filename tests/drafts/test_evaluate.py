"""``evaluate_draft``: exact values for a perfect draft, low values for a random one, and the run-acceptance maths."""

from __future__ import annotations

import inspect
import itertools
import textwrap

import numpy as np
import pytest
import torch

from accel.drafts import evaluate_draft
from accel.drafts.evaluate import run_acceptance
from accel.models.decoder import Decoder
from tests.helpers.drafts import tiny_config

TEXT = inspect.getsource(textwrap)[:1500]


def test_draft_equal_to_target_agrees_everywhere(tiny_target):
    ev = evaluate_draft(tiny_target, tiny_target, [TEXT, TEXT[:300]], temperature=0.7, max_k=5)
    assert ev.greedy_agreement == 1.0
    assert ev.alpha == pytest.approx(1.0, abs=1e-9)
    assert ev.accept_rate_by_position == [1.0] * 5
    assert ev.expected_tokens_per_step == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert ev.target_nll == pytest.approx(ev.draft_nll)
    assert ev.sequences == 2


def test_random_draft_agrees_rarely(tiny_target):
    draft = Decoder(tiny_config()).init_weights(seed=99, std=0.15)
    ev = evaluate_draft(tiny_target, draft, [TEXT], temperature=1.0)
    # two independent random models over 256 tokens: agreement near chance, alpha well below 1
    assert ev.greedy_agreement < 0.2
    assert 0.0 < ev.alpha < 0.9
    assert all(a >= b for a, b in itertools.pairwise(ev.accept_rate_by_position))
    assert ev.accept_rate_by_position[2] < 0.05


def test_temperature_zero_alpha_is_greedy_agreement(tiny_target):
    draft = Decoder(tiny_config()).init_weights(seed=7, std=0.15)
    ids = np.random.default_rng(0).integers(0, 256, size=(2, 60))
    ev = evaluate_draft(tiny_target, draft, ids, temperature=0.0)
    assert ev.alpha == pytest.approx(ev.greedy_agreement)
    assert ev.positions == 2 * 59


def test_alpha_matches_direct_overlap(tiny_target):
    from accel.drafts.architecture import causal_logits
    from accel.models import load_checkpoint

    t = load_checkpoint(tiny_target)
    d = Decoder(tiny_config()).init_weights(seed=11, std=0.15)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    ev = evaluate_draft(t, d, ids.numpy(), temperature=0.5)
    with torch.no_grad():
        p = torch.softmax(causal_logits(t, ids)[0, :-1].double() / 0.5, -1)
        q = torch.softmax(causal_logits(d, ids)[0, :-1].double() / 0.5, -1)
    assert ev.alpha == pytest.approx(float(torch.minimum(p, q).sum(-1).mean()), rel=1e-9)


def test_run_acceptance_by_exhaustive_enumeration():
    # every agreement pattern of length 6: P_j = P(positions s..s+j all agree), averaged over valid starts
    for bits in itertools.product([0, 1], repeat=6):
        a = np.array(bits, dtype=bool)
        got = run_acceptance([a], 3)
        for j in range(3):
            starts = range(0, 6 - j)
            expect = np.mean([a[s : s + j + 1].all() for s in starts])
            # the reported vector is made non-increasing (P_j <= P_{j-1})
            assert got[j] <= expect + 1e-12
            if j == 0:
                assert got[0] == pytest.approx(expect)
    assert run_acceptance([np.array([1, 1, 1, 0, 1, 1], bool)], 2) == pytest.approx([5 / 6, 3 / 5])


def test_prompt_lengths_restrict_scoring_to_the_continuation(tiny_target):
    draft = Decoder(tiny_config()).init_weights(seed=7, std=0.15)
    ids = np.random.default_rng(1).integers(0, 256, size=(1, 50))
    full = evaluate_draft(tiny_target, draft, ids, temperature=0.0)
    tail = evaluate_draft(tiny_target, draft, ids, temperature=0.0, prompt_lengths=[30])
    assert tail.positions == 50 - 30 and full.positions == 49
    from accel.errors import DraftError

    with pytest.raises(DraftError, match="no token after their prompt"):
        evaluate_draft(tiny_target, draft, ids, prompt_lengths=[50])


def test_restricted_head_counts_what_it_cannot_propose(tiny_target):
    """A copy of the target whose head keeps only some tokens: it agrees exactly where the target's argmax is kept,
    and ``draft_zero_prob`` is the fraction of next tokens outside the head (its NLL is over the others only)."""
    from accel.drafts import restrict_head
    from accel.drafts.architecture import causal_logits
    from accel.drafts.checkpoint import load_model

    target = load_model(tiny_target, "target")
    seq = list(range(3, 200, 3))
    kept = torch.arange(0, target.config.vocab_size, 2)  # even ids
    draft = restrict_head(target, kept)
    ev = evaluate_draft(target, draft, [seq], temperature=0.0)
    with torch.no_grad():
        best = causal_logits(target, torch.tensor([seq]))[0, :-1].argmax(-1)
    assert ev.greedy_agreement == pytest.approx(float((best % 2 == 0).float().mean()))
    nxt = torch.tensor(seq[1:])
    assert ev.draft_zero_prob == pytest.approx(float((nxt % 2 == 1).float().mean()))
    assert 0.0 < ev.draft_nll < 50.0  # finite: positions the head cannot score are left out, not counted as 1e9
