"""Predictive Pipelined Decoding: Theorem 4.1 against an event-level Monte Carlo; the stage placements
(same device, one device per stage) on hand-worked examples."""

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import hardware, predict_ppd, preset, step_time
from accel.sim.ppd import PPDRun, ppd_expected_compute, ppd_expected_latency
from accel.sim.ppd_stages import PPDPlacement, PPDStageTimes, ppd_step_time, transfer_s
from accel.sim.roofline import CallShape


def _simulate_latency(d, dbar, p, n_tok, runs, rng):
    """Timeline per run: token i starts at s_i; its early prediction is ready at s_i + dbar. If the prediction matches
    (prob p) the next token was already started then (s_{i+1} = s_i + dbar); otherwise it starts at s_i + d.
    The run ends when the last token's d layers finish."""
    start = np.zeros(runs)
    for _ in range(n_tok - 1):
        hit = rng.random(runs) < p
        start += np.where(hit, dbar, d)
    return start + d


@pytest.mark.parametrize("d,dbar,p,n_tok", [(32, 16, 0.6, 50), (40, 30, 0.9, 20), (24, 24, 0.5, 10), (12, 8, 0.0, 5)])
def test_expected_latency_vs_monte_carlo(d, dbar, p, n_tok):
    rng = np.random.default_rng(99)
    x = _simulate_latency(d, dbar, p, n_tok, 100_000, rng)
    se = max(x.std() / np.sqrt(x.size), 1e-12)
    assert abs(x.mean() - ppd_expected_latency(d, dbar, p, n_tok)) <= 4.5 * se


def test_compute_and_approximations():
    d, dbar, k, p, n_tok = 32, 16, 3, 0.7, 10_000
    assert (
        ppd_expected_compute(d, dbar, k, p, n_tok) == ppd_expected_latency(d, dbar, p, n_tok) + k * (d - dbar) * n_tok
    )
    r = predict_ppd("llama-2-7b", "a100-80gb", PPDRun(dbar=dbar, k=k, p=p, gen_len=n_tok))
    assert r.approx_latency_units_per_token == pytest.approx(d * (1 - p / 2))
    assert r.approx_busy_units == pytest.approx((k + 2 - p) / (2 - p))
    assert r.expected_latency_units / n_tok == pytest.approx(r.approx_latency_units_per_token, rel=1e-3)


def test_device_mapping():
    ar = step_time("llama-2-7b", "a100-80gb", CallShape(context_len=128)).time_s
    none = predict_ppd("llama-2-7b", "a100-80gb", PPDRun(dbar=20, k=2, p=0.0, gen_len=100))
    assert none.latency_s == pytest.approx(100 * ar) and none.speedup == pytest.approx(1.0)
    half = predict_ppd("llama-2-7b", "a100-80gb", PPDRun(dbar=16, k=2, p=1.0, gen_len=100))
    assert 1.5 < half.speedup < 2.0  # layers twice as fast at most; per-token head/overhead not saved
    assert half.layer_s * 32 + half.per_token_fixed_s == pytest.approx(ar)


def test_bad_input():
    with pytest.raises(SimError, match="dbar"):
        predict_ppd("llama-2-7b", "l4", PPDRun(dbar=8, k=2, p=0.5, gen_len=10))  # < d/2
    with pytest.raises(SimError, match="p "):
        predict_ppd("llama-2-7b", "l4", PPDRun(dbar=20, k=2, p=1.5, gen_len=10))
    with pytest.raises(SimError, match="k "):
        predict_ppd("llama-2-7b", "l4", PPDRun(dbar=20, k=0, p=0.5, gen_len=10))


# --- stage placements (accel.sim.ppd_stages): hand-worked examples -------------------------------------------------

MS = 1e-3


def _times(**kw):
    base = dict(front_s=6 * MS, back_s=10 * MS, miss_s=5 * MS)
    return PPDStageTimes(**{**base, **kw})


def test_same_device_step_by_hand():
    # measured concurrency s = 1.5: P = max(10, 6, 16 / 1.5) = 10.667 ms; E = 1 + 10.667 + 0.7 * 5 = 15.167 ms
    par, tok = ppd_step_time(_times(), 0.3, PPDPlacement(kind="same-device", concurrency=1.5, host_s=1 * MS))
    assert par == pytest.approx(16 / 1.5 * MS) and tok == pytest.approx((1 + 16 / 1.5 + 3.5) * MS)
    # s = 2 (independent units): the slower stage alone; s = 1: the two one after the other
    assert ppd_step_time(_times(), 1.0, PPDPlacement(kind="same-device", concurrency=2.0))[0] == pytest.approx(10 * MS)
    assert ppd_step_time(_times(), 1.0, PPDPlacement(kind="same-device", concurrency=1.0))[0] == pytest.approx(16 * MS)
    # the roofline's default: the busy parts add (8 + 5 = 13 ms), the overheads hide behind them
    t = _times(back_busy_s=8 * MS, front_busy_s=5 * MS)
    par, tok = ppd_step_time(t, 0.5, PPDPlacement(kind="same-device"))
    assert par == pytest.approx(13 * MS) and tok == pytest.approx((13 + 2.5) * MS)
    t = _times(back_busy_s=3 * MS, front_busy_s=2 * MS)  # overhead-bound calls: the slower stage sets the pace
    assert ppd_step_time(t, 0.5, PPDPlacement(kind="same-device"))[0] == pytest.approx(10 * MS)


def test_per_stage_step_by_hand():
    t = _times(transfer_k_s=0.5 * MS, transfer_1_s=0.2 * MS, link_latency_s=0.1 * MS)
    par, tok = ppd_step_time(t, 0.3, PPDPlacement(kind="per-stage", host_s=1 * MS))
    assert par == pytest.approx(10.1 * MS)  # max(10, 6 + 0.5) + 0.1
    assert tok == pytest.approx((1 + 10.1 + 0.7 * 5.2) * MS)
    slow_front = t.model_copy(update={"front_s": 12 * MS})
    assert ppd_step_time(slow_front, 1.0, PPDPlacement(kind="per-stage"))[0] == pytest.approx(12.6 * MS)


def test_transfer_by_hand():
    hw = hardware("cloud-ai-100-ultra")
    want = hw.link_latency_s + 3 * 5120 * 2 / hw.link_bandwidth_bytes_per_s  # 3 fp16 rows of 5120
    assert transfer_s(hw, 3, 5120) == pytest.approx(want)


def test_predict_same_device_is_the_stage_calls_of_the_roofline():
    e, k = 12, 3
    spec = preset("llama-2-7b")
    front = step_time(
        spec.model_copy(update={"n_layers": e}), "a100-80gb", CallShape(batch_size=k, context_len=128), devices=1
    )
    back = step_time(spec.model_copy(update={"n_layers": 32 - e}), "a100-80gb", CallShape(context_len=128), devices=1)
    place = PPDPlacement(kind="same-device", concurrency=1.0, host_s=0.5 * MS)
    r = predict_ppd(spec, "a100-80gb", PPDRun(dbar=e, k=k, p=0.0, gen_len=10), devices=1, placement=place)
    # p = 0, s = 1: back + front side by side take their sum, then the miss runs the front call again
    assert r.per_token_s == pytest.approx(0.5 * MS + back.time_s + 2 * front.time_s)
    assert r.latency_s == pytest.approx(10 * r.per_token_s)
    ar = step_time(spec, "a100-80gb", CallShape(context_len=128), devices=1).time_s
    assert r.ar_per_token_s == pytest.approx(ar + 0.5 * MS) and r.speedup < 1
    assert r.stage_times.front_s == pytest.approx(front.time_s) and r.stage_times.back_s == pytest.approx(back.time_s)
    # the roofline's concurrency: memory-bound calls share the bandwidth, so P ~ the sum less the overheads
    dflt = predict_ppd(spec, "a100-80gb", PPDRun(dbar=e, k=k, p=0.0, gen_len=10), devices=1, placement="same-device")
    busy = back.time_s - back.overhead_s + front.time_s - front.overhead_s
    assert dflt.parallel_s == pytest.approx(busy)
    # Theorem 4.1's fields keep the paper's figure for dbar = max(e, d - e)
    assert dflt.expected_latency_units == pytest.approx(ppd_expected_latency(32, 20, 0.0, 10))


def test_predict_per_stage_by_hand():
    e, k, p = 16, 2, 0.4
    hw = hardware("cloud-ai-100-ultra")
    spec = preset("llama-2-7b")
    front = step_time(spec.model_copy(update={"n_layers": e}), hw, CallShape(batch_size=k, context_len=128), devices=1)
    back = step_time(spec.model_copy(update={"n_layers": 32 - e}), hw, CallShape(context_len=128), devices=1)
    r = predict_ppd(spec, hw, PPDRun(dbar=e, k=k, p=p, gen_len=100), devices=1, placement="per-stage")
    xk, x1 = transfer_s(hw, k, 4096), transfer_s(hw, 1, 4096)
    par = max(back.time_s, front.time_s + xk) + hw.link_latency_s
    assert r.parallel_s == pytest.approx(par)
    assert r.per_token_s == pytest.approx(par + (1 - p) * (front.time_s + x1))
    ar1 = step_time(spec, hw, CallShape(context_len=128), devices=1).time_s
    ar2 = step_time(spec, hw, CallShape(context_len=128), devices=2).time_s
    assert r.speedup == pytest.approx(ar1 / r.per_token_s) and r.tensor_parallel_speedup == pytest.approx(ar1 / ar2)
    assert 1.0 < r.speedup < r.tensor_parallel_speedup  # PPD beats one SoC, not AR in TP over the same two


def test_stage_placement_errors():
    with pytest.raises(SimError, match="exit layer must be an integer in \\[1, 31\\]"):
        predict_ppd("llama-2-7b", "l4", PPDRun(dbar=32, k=2, p=0.5, gen_len=10), placement="per-stage")
    with pytest.raises(SimError, match="exit layer"):
        predict_ppd("llama-2-7b", "l4", PPDRun(dbar=0, k=2, p=0.5, gen_len=10), placement="same-device")
    with pytest.raises(SimError, match="batch 1"):
        predict_ppd("llama-2-7b", "l4", PPDRun(dbar=16, k=2, p=0.5, gen_len=10, batch_size=2), placement="same-device")
    with pytest.raises(SimError, match="kind"):
        predict_ppd("llama-2-7b", "l4", PPDRun(dbar=16, k=2, p=0.5, gen_len=10), placement="two-gpus")
    with pytest.raises(SimError, match="concurrency"):
        PPDPlacement(kind="same-device", concurrency=2.5)
    with pytest.raises(SimError, match="same-device term"):
        ppd_step_time(_times(), 0.5, PPDPlacement(kind="per-stage", concurrency=1.5))
    with pytest.raises(SimError, match="match rate"):
        ppd_step_time(_times(), 1.2, PPDPlacement(kind="same-device"))
    with pytest.raises(SimError, match="not 'paper'"):
        ppd_step_time(_times(), 0.5, PPDPlacement())


def test_the_where_ppd_pays_table_in_the_docs_is_what_predict_ppd_gives():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ppd.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and "x / " in line]
    assert len(rows) >= 8
    for line in rows:
        model, hw, n, ar, same, split, tp = [c.strip() for c in line.strip("|").split("|")]
        L = preset(model).n_layers
        got = {}
        for place in ("same-device", "per-stage"):
            for k, p in ((1, 0.26), (3, 0.47)):
                got[place, k] = predict_ppd(
                    model,
                    hw,
                    PPDRun(dbar=L // 2, k=k, p=p, gen_len=256, context_len=1024),
                    placement=place,
                    devices=int(n),
                )
        assert f"{got['same-device', 1].ar_per_token_s * 1e3:.2f}" == ar, line
        assert f"{got['same-device', 1].speedup:.2f}x / {got['same-device', 3].speedup:.2f}x" == same, line
        assert f"{got['per-stage', 1].speedup:.2f}x / {got['per-stage', 3].speedup:.2f}x" == split, line
        assert f"{got['per-stage', 1].tensor_parallel_speedup:.2f}x" == tp, line
