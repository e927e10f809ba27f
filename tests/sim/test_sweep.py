"""Vectorized sweep equals the scalar predictions."""

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import best_k, expected_tokens, step_time, sweep
from accel.sim.roofline import CallShape
from accel.sim.sweeps import SweepAxes

T, D, HW = "llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra"


def test_sweep_matches_scalar_step_times():
    fmts, bs, ls, ks, al = ["fp16", "mxfp6", "int4"], [1, 8], [0, 700], [1, 3, 7], [0.0, 0.55, 1.0]
    r = sweep(T, D, HW, k=ks, alpha=al, axes=SweepAxes(target_format=fmts, batch_size=bs, context_len=ls))
    assert r.speedup.shape == (3, 2, 2, 3, 3) and r.size == 108
    rng = np.random.default_rng(0)
    for _ in range(12):
        f, b, n_tok, k, a = (int(rng.integers(n)) for n in r.speedup.shape)
        fmt, B, L, K, A = fmts[f], bs[b], ls[n_tok], ks[k], al[a]
        t_tgt = step_time(T, HW, CallShape(batch_size=B, context_len=L), weight_format=fmt).time_s
        t_score = step_time(
            T, HW, CallShape(batch_size=B, context_len=L, new_tokens=K + 1, num_logits=K + 1), weight_format=fmt
        ).time_s
        t_draft = sum(step_time(D, HW, CallShape(batch_size=B, context_len=L + j), devices=4).time_s for j in range(K))
        # after an all-accepted loop (prob A^K) the draft's first call feeds 2 tokens
        catch_up = (
            step_time(D, HW, CallShape(batch_size=B, context_len=L, new_tokens=2), devices=4).time_s
            - step_time(D, HW, CallShape(batch_size=B, context_len=L), devices=4).time_s
        )
        t_draft += A**K * catch_up
        e = expected_tokens(A, K)
        assert r.target_step_s[f, b, n_tok, k, a] == pytest.approx(t_tgt, rel=1e-12)
        assert r.loop_s[f, b, n_tok, k, a] == pytest.approx(t_draft + t_score, rel=1e-12)
        assert r.speedup[f, b, n_tok, k, a] == pytest.approx(e * t_tgt / (t_draft + t_score), rel=1e-12)
        t16 = step_time(T, HW, CallShape(batch_size=B, context_len=L), weight_format="fp16").time_s
        assert r.speedup_vs_fp16[f, b, n_tok, k, a] == pytest.approx(e * t16 / (t_draft + t_score), rel=1e-12)


def test_best_k_matches_scalar_function():
    r = sweep(
        T, D, HW, k=range(1, 17), alpha=[0.6, 0.8, 0.9], axes=SweepAxes(target_format=["mxfp6"], context_len=[512])
    )
    for i, a in enumerate([0.6, 0.8, 0.9]):
        k, s = best_k(T, D, HW, a, context_len=512)
        assert r.best_k[0, 0, 0, i] == k
        assert r.speedup[0, 0, 0, k - 1, i] == pytest.approx(s, rel=1e-12)


def test_sweep_without_fp16_axis_and_bad_input():
    r = sweep(T, D, HW, k=[4], alpha=[0.7], axes=SweepAxes(target_format="mxfp4", context_len=[512]))
    t16 = step_time(T, HW, CallShape(context_len=512)).time_s
    assert r.speedup_vs_fp16[0, 0, 0, 0, 0] == pytest.approx(r.spd_tokens_per_s[0, 0, 0, 0, 0] * t16, rel=1e-12)
    with pytest.raises(SimError, match="alpha"):
        sweep(T, D, HW, alpha=[0.5, 2.0])
    with pytest.raises(SimError, match="K"):
        sweep(T, D, HW, k=[0, 1])
    with pytest.raises(SimError, match="batch_size"):
        sweep(T, D, HW, axes=SweepAxes(batch_size=[-1]))
