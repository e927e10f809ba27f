"""predict_speedup: limits, fit checks, inputs, table."""

import json

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import best_k, break_even_alpha, expected_tokens, hardware, predict_speedup, preset, step_time
from accel.sim.roofline import CallShape

T, D, HW = "llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra"


def _loop_by_hand(k, L, fmt="mxfp6", p_all=0.0):
    """K draft calls at past L..L+K-1 on the target's four SoCs (the draft follows the target) + one (K+1)-token
    scoring call on four, from scalar step_time;
    with probability p_all (all K accepted) the draft's first call of the next loop feeds 2 tokens."""
    draft = sum(step_time(D, HW, CallShape(context_len=L + j), devices=4).time_s for j in range(k))
    draft += p_all * (
        step_time(D, HW, CallShape(context_len=L, new_tokens=2), devices=4).time_s
        - step_time(D, HW, CallShape(context_len=L), devices=4).time_s
    )
    score = step_time(T, HW, CallShape(new_tokens=k + 1, num_logits=k + 1, context_len=L), weight_format=fmt).time_s
    return draft + score, step_time(T, HW, CallShape(context_len=L), weight_format=fmt).time_s


def test_four_configurations_and_speedups():
    p = predict_speedup(T, D, HW, k=7, acceptance=0.8)
    names = [c.name for c in p.configs]
    assert names == ["fp16 AR", "mxfp6 AR", "fp16 + SpD", "mxfp6 + SpD"]
    base = p.configs[0]
    assert base.speedup == 1.0 and base.decode_speedup == 1.0
    for c in p.configs:
        assert c.speedup == pytest.approx(base.total_s / c.total_s)
        assert c.tokens_per_s == pytest.approx(896 / c.total_s)
        assert c.total_s == pytest.approx(c.ttft_s + 895 * c.tpot_s)
        assert sum(c.breakdown_s.values()) == pytest.approx(c.tpot_s)
        assert c.bound in ("memory", "decompress")  # MXFP6 on Cloud AI 100: the on-chip decoder sets the pace
    assert p.config("mxfp6 AR").tpot_s < base.tpot_s
    assert p.config("mxfp6 + SpD").expected_tokens_per_loop == pytest.approx(expected_tokens(0.8, 7))
    assert p.fits


def test_ar_tpot_is_mean_of_decode_steps():
    p = predict_speedup(T, D, HW, k=3, acceptance=0.5, prompt_len=10, gen_len=5)
    steps = [step_time(T, HW, CallShape(context_len=L), weight_format="mxfp6").time_s for L in range(10, 14)]
    assert p.config("mxfp6 AR").tpot_s == pytest.approx(np.mean(steps), rel=1e-12)
    ttft = step_time(T, HW, CallShape(new_tokens=10, num_logits=1), weight_format="mxfp6").time_s
    assert p.config("mxfp6 AR").ttft_s == pytest.approx(ttft, rel=1e-12)


def test_alpha_zero_slowdown_equals_draft_overhead():
    p = predict_speedup(T, D, HW, k=4, acceptance=0.0, prompt_len=100, gen_len=3)
    loops, steps = zip(*[_loop_by_hand(4, L) for L in (100, 101)], strict=True)
    spd, ar = p.config("mxfp6 + SpD"), p.config("mxfp6 AR")
    assert spd.expected_tokens_per_loop == 1.0
    assert spd.tpot_s == pytest.approx(np.mean(loops), rel=1e-12)
    assert ar.tpot_s / spd.tpot_s == pytest.approx(np.mean(steps) / np.mean(loops), rel=1e-12)
    assert spd.tpot_s > ar.tpot_s  # speculation loses at alpha = 0


def test_alpha_one_gives_k_plus_one_tokens():
    p = predict_speedup(T, D, HW, k=5, acceptance=1.0, prompt_len=100, gen_len=3)
    assert p.config("fp16 + SpD").expected_tokens_per_loop == 6.0
    loops = [_loop_by_hand(5, L, p_all=1.0)[0] for L in (100, 101)]  # every loop pays the draft catch-up
    assert p.config("mxfp6 + SpD").loop_s == pytest.approx(np.mean(loops), rel=1e-12)
    vec = predict_speedup(T, D, HW, k=3, acceptance=[1.0, 1.0, 1.0, 0.0])
    assert vec.config("fp16 + SpD").expected_tokens_per_loop == 4.0


def test_best_k_and_break_even_consistent():
    _k, s = best_k(T, D, HW, 0.8, context_len=512)
    others = [best_k(T, D, HW, 0.8, context_len=512, k_max=kk)[1] for kk in range(1, 17)]
    assert s == pytest.approx(max(others))
    a = break_even_alpha(T, D, HW, 7, context_len=512)
    assert 0 < a < 1
    loop, step = _loop_by_hand(7, 512, p_all=a**7)
    assert expected_tokens(a, 7) * step / loop == pytest.approx(1.0, abs=1e-7)


def test_70b_fp16_does_not_fit_on_ai100_standard():
    p = predict_speedup("chinchilla-70b", "chinchilla-4b-draft", "cloud-ai-100-standard", k=3)
    assert not p.fits and not p.config("fp16 AR").fits
    assert "DOES NOT FIT" in p.fit_message and "fp16 AR" in p.fit_message
    assert p.config("fp16 AR").max_batch_size == 0
    with pytest.raises(SimError, match="DOES NOT FIT"):
        predict_speedup("chinchilla-70b", "chinchilla-4b-draft", "cloud-ai-100-standard", k=3).require_fit()


def test_max_batch_size_is_the_largest_that_fits():
    hw = hardware("cloud-ai-100-pro")  # 32 GB, one SoC
    p = predict_speedup(T, D, hw, k=7, prompt_len=1024, gen_len=1024)
    for c in p.configs:
        assert c.max_batch_size > 0
        at = predict_speedup(T, D, hw, k=7, prompt_len=1024, gen_len=1024, batch_size=c.max_batch_size)
        above = predict_speedup(T, D, hw, k=7, prompt_len=1024, gen_len=1024, batch_size=c.max_batch_size + 1)
        assert at.config(c.name).fits and not above.config(c.name).fits


def test_model_inputs_and_table(tmp_path):
    cfg = {
        "model_type": "llama",
        "hidden_size": 768,
        "num_hidden_layers": 9,
        "num_attention_heads": 12,
        "intermediate_size": 2176,
        "vocab_size": 32000,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    a = predict_speedup(preset(T), cfg, hardware(HW))
    b = predict_speedup(T, str(path), HW)
    assert a.config("mxfp6 + SpD").tpot_s == pytest.approx(b.config("mxfp6 + SpD").tpot_s)
    text = a.table()
    for word in ("fp16 AR", "mxfp6 + SpD", "TPOT", "best K", "break-even", "fits"):
        assert word in text


def test_bad_input():
    with pytest.raises(SimError, match="alpha"):
        predict_speedup(T, D, HW, acceptance=1.2)
    with pytest.raises(SimError, match="K"):
        predict_speedup(T, D, HW, k=0)
    with pytest.raises(SimError, match="gen_len"):
        predict_speedup(T, D, HW, gen_len=-5)
    with pytest.raises(SimError, match="known: "):
        predict_speedup(T, D, "cloud-ai-200")
    with pytest.raises(SimError, match="devices"):
        predict_speedup(T, D, HW, devices=0)
    with pytest.raises(SimError, match="at least K=7"):
        predict_speedup(T, D, HW, k=7, acceptance=[0.5, 0.5])


def test_draft_on_its_own_hardware_profile():
    hw = hardware(HW)
    same = predict_speedup(T, D, hw, draft_hardware=hw, draft_shares_devices=True)
    default = predict_speedup(T, D, hw)
    assert same.config("mxfp6 + SpD").tpot_s == default.config("mxfp6 + SpD").tpot_s
    # a draft_hardware of its own means devices of its own: sized per the draft (one SoC), memory apart
    own = predict_speedup(T, D, hw, draft_shares_devices=False)
    assert own.draft_devices == 1 and not own.draft_shares_devices
    assert own.config("mxfp6 + SpD").memory_bytes < default.config("mxfp6 + SpD").memory_bytes
    fast = predict_speedup(T, D, hw, draft_hardware=hw.with_(name="fast", bandwidth_efficiency=1.0))
    assert fast.draft_devices == 1 and not fast.draft_shares_devices
    assert fast.config("mxfp6 + SpD").tpot_s < own.config("mxfp6 + SpD").tpot_s
    assert fast.config("mxfp6 AR").tpot_s == default.config("mxfp6 AR").tpot_s
    assert fast.config("mxfp6 + SpD").breakdown_s["draft"] < own.config("mxfp6 + SpD").breakdown_s["draft"]
    assert "of fast" in fast.table()
