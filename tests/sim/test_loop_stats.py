"""Feature drafts (they re-feed each loop) and measured loop statistics (dynamic draft length) in accel.sim."""

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import (
    LoopStats,
    ModelSpec,
    alpha_for_expected_tokens,
    best_k,
    break_even_alpha,
    expected_tokens,
    predict_speedup,
    preset,
    step_time,
    sweep,
)
from accel.sim.roofline import CallShape
from accel.sim.sweeps import SweepAxes

T, HW = "llama-2-7b", "cloud-ai-100-ultra"
D = "qualcomm-llama2-draft-115m"


def _feature_draft() -> ModelSpec:
    """A one-layer feature draft of the 7B target: reads the target's 4096-wide hidden state, 8192-token head."""
    t = preset(T)
    return ModelSpec(
        name="feature-draft",
        n_layers=1,
        d_model=t.d_model,
        n_heads=t.n_heads,
        ffn_dim=t.ffn_dim,
        vocab_size=t.vocab_size,
        head_vocab=8192,
        feature_dim=t.d_model,
        embed_dim=256,
    )


def _one_more_token_s(draft, L):
    return (
        step_time(draft, HW, CallShape(context_len=L, new_tokens=2), devices=4).time_s
        - step_time(draft, HW, CallShape(context_len=L), devices=4).time_s
    )


def test_alpha_for_expected_tokens_inverts_expected_tokens():
    for k in (1, 3, 7):
        for a in (0.0, 0.3, 0.77, 1.0):
            assert alpha_for_expected_tokens(expected_tokens(a, k), k) == pytest.approx(a, abs=1e-9)
    assert alpha_for_expected_tokens(0.5, 3) == pytest.approx(0.0, abs=1e-9)  # clipped to [1, K+1]
    with pytest.raises(SimError, match="finite"):
        alpha_for_expected_tokens(float("nan"), 3)


def test_feature_draft_pays_e_minus_one_refeed_tokens_per_loop():
    fd = _feature_draft()
    plain = fd.model_copy(update={"feature_dim": 0, "embed_dim": 0})
    L, k, a = 100, 3, 0.7
    kw = dict(k=k, acceptance=a, prompt_len=L, gen_len=2)  # one decode step at past length L
    pf, pp = predict_speedup(T, fd, HW, **kw), predict_speedup(T, plain, HW, **kw)
    assert pf.feature_draft and not pp.feature_draft
    e = expected_tokens(a, k)
    # both loops: K draft calls + the scoring call; the catch-up differs: E - 1 extra tokens vs a^K * one token
    extra_f = (e - 1) * _one_more_token_s(fd, L)
    t_score = step_time(
        T, HW, CallShape(new_tokens=k + 1, num_logits=k + 1, context_len=L), weight_format="mxfp6"
    ).time_s
    drafts = sum(step_time(fd, HW, CallShape(context_len=L + j), devices=4).time_s for j in range(k))
    assert pf.config("mxfp6 + SpD").loop_s == pytest.approx(drafts + t_score + extra_f, rel=1e-12)
    # the plain spec has fewer weights (no fc) so compare its loop with its own by-hand value
    drafts_p = sum(step_time(plain, HW, CallShape(context_len=L + j), devices=4).time_s for j in range(k))
    assert pp.config("mxfp6 + SpD").loop_s == pytest.approx(
        drafts_p + t_score + a**k * _one_more_token_s(plain, L), rel=1e-12
    )


def test_feature_draft_sweep_best_k_and_break_even_agree():
    fd = _feature_draft()
    r = sweep(
        T, fd, HW, k=range(1, 9), alpha=[0.0, 0.6, 0.9], axes=SweepAxes(target_format=["mxfp6"], context_len=[512])
    )
    for i, a in enumerate([0.0, 0.6, 0.9]):
        k, s = best_k(T, fd, HW, a, context_len=512, k_max=8)
        assert r.best_k[0, 0, 0, i] == k
        assert r.speedup[0, 0, 0, k - 1, i] == pytest.approx(s, rel=1e-12)
        e = expected_tokens(a, 3)
        drafts = sum(step_time(fd, HW, CallShape(context_len=512 + j), devices=4).time_s for j in range(3))
        assert r.draft_steps_s[0, 0, 0, 2, i] == pytest.approx(drafts + (e - 1) * _one_more_token_s(fd, 512), rel=1e-12)
    a = break_even_alpha(T, fd, HW, 4, context_len=512)
    assert 0 < a < 1
    r = sweep(T, fd, HW, k=[4], alpha=[a], axes=SweepAxes(target_format=["mxfp6"], context_len=[512]))
    assert r.speedup[0, 0, 0, 0, 0] == pytest.approx(1.0, abs=1e-7)


def test_loop_stats_of_a_fixed_k_run_reproduce_the_fixed_k_prediction():
    k, a = 4, 0.65
    stats = LoopStats(tokens_per_loop=expected_tokens(a, k), drafts_per_loop=k, all_accepted_fraction=a**k)
    for draft in (D, _feature_draft()):
        fixed = predict_speedup(T, draft, HW, k=k, acceptance=a, prompt_len=200, gen_len=64)
        measured = predict_speedup(T, draft, HW, k=k, loop_stats=stats, prompt_len=200, gen_len=64)
        f, m = fixed.config("mxfp6 + SpD"), measured.config("mxfp6 + SpD")
        # the K draft calls are costed at the mean past length instead of summed exactly: linear in L, so equal
        assert m.tpot_s == pytest.approx(f.tpot_s, rel=1e-9)
        assert m.expected_tokens_per_loop == pytest.approx(f.expected_tokens_per_loop, rel=1e-12)
        assert measured.acceptance == pytest.approx(a, abs=1e-9)  # derived for best_k / break-even
        assert measured.loop_stats == stats and "measured" in measured.table()


def test_dynamic_loop_stats_interpolate_between_fixed_lengths():
    """A run drafting 2.5 tokens per loop costs between the 2- and 3-draft loops with the same tokens per loop."""
    tpot = {}
    for d in (2.0, 2.5, 3.0):
        p = predict_speedup(
            T,
            D,
            HW,
            k=6,
            loop_stats={"tokens_per_loop": 2.2, "drafts_per_loop": d, "all_accepted_fraction": 0.2},
            prompt_len=64,
            gen_len=32,
        )
        tpot[d] = p.config("mxfp6 + SpD").tpot_s
    assert tpot[2.0] < tpot[2.5] < tpot[3.0]
    assert tpot[2.5] == pytest.approx((tpot[2.0] + tpot[3.0]) / 2, rel=0.02)  # the S-curve is nearly linear here


def test_loop_stats_from_generation_stats_and_bad_input():
    class Stats:  # the fields LoopStats.from_stats reads from accel.spd.GenerationStats
        mean_tokens_per_loop, mean_drafts_per_loop, all_accepted_rounds, row_calls = 1.8, 2.4, 30, 100

    s = LoopStats.from_stats(Stats())
    assert (s.tokens_per_loop, s.drafts_per_loop, s.all_accepted_fraction) == (1.8, 2.4, 0.3)
    assert LoopStats(tokens_per_loop=2.0, drafts_per_loop=2.0).all_accepted() == pytest.approx(0.25)
    with pytest.raises(SimError, match="exceeds drafts_per_loop"):
        LoopStats(tokens_per_loop=3.5, drafts_per_loop=2.0)
    with pytest.raises(SimError, match="tokens_per_loop"):
        LoopStats(tokens_per_loop=0.5, drafts_per_loop=2.0)
    with pytest.raises(SimError, match="all_accepted_fraction"):
        LoopStats(tokens_per_loop=1.5, drafts_per_loop=2.0, all_accepted_fraction=1.5)
    with pytest.raises(SimError, match="cap"):
        predict_speedup(T, D, HW, k=2, loop_stats={"tokens_per_loop": 2.0, "drafts_per_loop": 3.0})
    with pytest.raises(SimError, match="loop_stats"):
        predict_speedup(T, D, HW, k=2, loop_stats=[2.0, 3.0])
    assert np.isclose(predict_speedup(T, D, HW, k=3).acceptance, 0.8)  # the default without loop_stats


def test_lookup_loops_price_only_draft_model_calls_and_the_later_catch_up():
    """n-gram lookup drafts (accel.spd.generate(ngram=...)): a loop costs its draft-model calls (draft_calls_per_loop),
    not one per draft, plus the scoring call of drafts_per_loop + 1 tokens, plus the catch-up on the lookup loops'
    tokens: E - (1 - f) extra tokens for a feature draft, p_all + f E for a standalone one."""
    L = 100
    fd = _feature_draft()
    base = dict(tokens_per_loop=2.5, drafts_per_loop=3.0, all_accepted_fraction=0.2)
    kw = dict(k=3, prompt_len=L, gen_len=2)
    for draft, extra in ((fd, lambda e, f, p: e - (1 - f)), (D, lambda e, f, p: p + f * e)):
        plain = predict_speedup(T, draft, HW, loop_stats=base, **kw).config("mxfp6 + SpD").loop_s
        look = (
            predict_speedup(
                T, draft, HW, loop_stats={**base, "draft_calls_per_loop": 1.2, "lookup_fraction": 0.6}, **kw
            )
            .config("mxfp6 + SpD")
            .loop_s
        )
        one = step_time(
            draft, HW, CallShape(context_len=L + 1), devices=4
        ).time_s  # a call at the loop's mean past length
        more = _one_more_token_s(draft, L)
        want = plain - (3.0 - 1.2) * one + (extra(2.5, 0.6, 0.2) - extra(2.5, 0.0, 0.2)) * more
        assert look == pytest.approx(want, rel=1e-6)
        assert look < plain  # fewer draft calls outweigh the longer catch-up here
    # drafts beyond K are allowed with lookup (its guesses may be longer than K); draft calls are not
    ok = predict_speedup(
        T,
        D,
        HW,
        k=2,
        loop_stats={
            "tokens_per_loop": 3.0,
            "drafts_per_loop": 3.5,
            "draft_calls_per_loop": 1.0,
            "lookup_fraction": 0.5,
        },
    )
    assert ok.config("mxfp6 + SpD").tpot_s > 0
    with pytest.raises(SimError, match=r"draft_calls_per_loop 2.5 exceeds K=2"):
        predict_speedup(
            T,
            D,
            HW,
            k=2,
            loop_stats={
                "tokens_per_loop": 3.0,
                "drafts_per_loop": 3.5,
                "draft_calls_per_loop": 2.5,
                "lookup_fraction": 0.5,
            },
        )
    with pytest.raises(SimError, match="without lookup drafts"):
        LoopStats(tokens_per_loop=2.0, drafts_per_loop=2.0, draft_calls_per_loop=3.0)
    with pytest.raises(SimError, match="lookup_fraction"):
        LoopStats(tokens_per_loop=2.0, drafts_per_loop=2.0, lookup_fraction=1.5)

    class Stats:  # accel.spd.GenerationStats with lookup rounds
        mean_tokens_per_loop, mean_drafts_per_loop, all_accepted_rounds, row_calls = 2.0, 2.4, 30, 100
        draft_calls_per_loop, lookup_rounds = 1.1, 40

    s = LoopStats.from_stats(Stats())
    assert (s.draft_calls_per_loop, s.lookup_fraction, s.draft_calls()) == (1.1, 0.4, 1.1)
