"""benchmarks/peers_support.py: speeds, greedy agreement, KL / top-1 quality, the Pareto check, table and plot.

No peer runtime is needed: these are the pure functions ``benchmarks/peers.py`` reports with.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.special import rel_entr, softmax

ROOT = Path(__file__).resolve().parents[1]
# loaded from its file, not by putting benchmarks/ on sys.path (its formats.py, spd.py, ... would shadow names)
_spec = importlib.util.spec_from_file_location("bench_peers_support", ROOT / "benchmarks" / "peers_support.py")
assert _spec is not None and _spec.loader is not None
ps = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ps  # dataclasses resolve the module's annotations through sys.modules
_spec.loader.exec_module(ps)


def test_log_softmax_normalises_and_survives_large_logits():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 50)).astype(np.float32) * 3
    lp = ps.log_softmax(x)
    assert lp.dtype == np.float64
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lp, np.log(softmax(x.astype(np.float64), axis=-1)), rtol=0, atol=1e-12)
    big = ps.log_softmax(np.array([[1e4, 1e4 - 1.0, -1e4]]))  # exp(1e4) overflows without the max shift
    assert np.all(np.isfinite(big[0, :2]))
    np.testing.assert_allclose(np.exp(big).sum(), 1.0, atol=1e-12)


@pytest.mark.parametrize("scale", [0.1, 1.0, 8.0])
def test_kl_matches_scipy(scale):
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((16, 300)) * scale
    row = ref + rng.standard_normal(ref.shape) * 0.5
    kl, top1 = ps.kl_top1(ps.log_softmax(ref), row.astype(np.float32))
    expect = rel_entr(softmax(ref, axis=-1), softmax(row.astype(np.float32).astype(np.float64), axis=-1)).sum(-1)
    np.testing.assert_allclose(kl, expect, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(top1, ref.argmax(-1) == row.argmax(-1))


def test_kl_by_hand():
    # p = (0.5, 0.5), q = (0.9, 0.1): KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5 ln(25/9) nats
    ref = ps.log_softmax(np.log([[0.5, 0.5]]))
    kl, _ = ps.kl_top1(ref, np.log([[0.9, 0.1]]))
    assert kl[0] == pytest.approx(0.5 * math.log(25 / 9), rel=1e-12)


def test_kl_is_zero_for_the_same_distribution_and_shift_invariant():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 100)).astype(np.float32)
    kl, top1 = ps.kl_top1(ps.log_softmax(x), x + np.float32(7.0))  # a constant shift is the same distribution
    assert np.all(kl >= 0) and kl.max() < 1e-6  # float32 rounding of x + 7
    assert top1.all()


def test_kl_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="differ in shape"):
        ps.kl_top1(np.zeros((3, 10)), np.zeros((4, 10)))


def test_quality_summary_pools_positions_of_every_sequence():
    rng = np.random.default_rng(3)
    refs = [rng.standard_normal((n, 40)) for n in (5, 15)]
    rows = [r + rng.standard_normal(r.shape) for r in refs]
    q = ps.quality_summary([ps.log_softmax(r) for r in refs], rows)
    kl = np.concatenate([rel_entr(softmax(r, -1), softmax(x, -1)).sum(-1) for r, x in zip(refs, rows, strict=True)])
    top1 = np.concatenate([r.argmax(-1) == x.argmax(-1) for r, x in zip(refs, rows, strict=True)])
    assert q["positions"] == 20
    assert q["mean_kl"] == pytest.approx(kl.mean(), rel=1e-9)
    assert q["p95_kl"] == pytest.approx(np.percentile(kl, 95), rel=1e-9)
    assert q["top1"] == pytest.approx(top1.mean())


def test_rates_leave_the_first_tokens_out_of_decode():
    ar = ps.Decoded(tokens=list(range(10)), total_s=2.0, first_s=0.5, first_tokens=1)
    spd = ps.Decoded(tokens=list(range(10)), total_s=1.0, first_s=0.25, first_tokens=3)
    assert ps.rates([ar]) == pytest.approx((5.0, 9 / 1.5))
    assert ps.rates([spd]) == pytest.approx((10.0, 7 / 0.75))
    # pooled as token and time sums, not as a mean of per-decode rates
    assert ps.rates([ar, spd]) == pytest.approx((20 / 3.0, 16 / 2.25))


def test_rates_without_time_are_nan():
    e2e, dec = ps.rates([ps.Decoded(tokens=[1], total_s=0.0, first_s=0.0, first_tokens=1)])
    assert math.isnan(e2e) and math.isnan(dec)


def test_median_rates_take_the_median_round():
    rounds = [[ps.Decoded(tokens=[0] * 10, total_s=t, first_s=0.0, first_tokens=0)] for t in (1.0, 2.0, 4.0)]
    m = ps.median_rates(rounds)
    assert m["tokens_per_s"] == pytest.approx(5.0)
    assert m["decode_tokens_per_s"] == pytest.approx(5.0)
    assert m["rounds_tokens_per_s"] == pytest.approx([10.0, 5.0, 2.5])


@pytest.mark.parametrize(
    ("a", "b", "n"), [([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 9, 3], 1), ([5], [6], 0), ([1, 2], [1, 2, 3], 2)]
)
def test_prefix_len(a, b, n):
    assert ps.prefix_len(a, b) == n


def test_greedy_agreement():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    got = [[1, 2, 3, 4], [5, 6, 0, 8], [0, 9, 9, 9]]
    assert ps.greedy_agreement(ref, got) == {"equal": 1, "prompts": 3, "mean_prefix": pytest.approx(2.0)}
    with pytest.raises(ValueError, match="2 outputs for 3"):
        ps.greedy_agreement(ref, got[:2])


def _row(name, runtime, speed, kl):
    return {"name": name, "runtime": runtime, "tokens_per_s": speed, "mean_kl": kl}


def test_pareto_finds_the_fastest_accel_row_at_no_worse_kl():
    rows = [
        _row("accel fp32", "accel", 30.0, 0.0),
        _row("accel mx", "accel", 40.0, 0.04),
        _row("llama F32", "llama.cpp", 20.0, 1e-6),
        _row("llama Q4_1", "llama.cpp", 60.0, 0.003),
        _row("genai int4", "onnxruntime-genai", 26.0, 0.4),
        _row("unmeasured", "llama.cpp", 99.0, None),
    ]
    got = {s["peer"]: s for s in ps.pareto(rows)}
    assert set(got) == {"llama F32", "llama Q4_1", "genai int4"}
    assert got["llama F32"]["best_accel"] == "accel fp32" and got["llama F32"]["speed_ratio"] == pytest.approx(1.5)
    assert got["llama F32"]["goal_met"]  # exactly 1.5x meets the goal
    assert got["llama Q4_1"]["best_accel"] == "accel fp32" and not got["llama Q4_1"]["goal_met"]
    assert got["genai int4"]["best_accel"] == "accel mx" and got["genai int4"]["speed_ratio"] == pytest.approx(40 / 26)
    assert got["genai int4"]["goal_met"]


def test_pareto_counts_kls_of_float_summation_order_as_equal():
    rows = [
        _row("accel fp32", "accel", 40.0, 0.0),
        _row("accel gguf-kernel", "accel", 90.0, 7.2e-12),
        _row("accel q8", "accel", 120.0, 0.0027),
        _row("genai fp32", "onnxruntime-genai", 36.0, 6.9e-12),
        _row("llama Q4_1", "llama.cpp", 83.0, 0.0031),
    ]
    got = {s["peer"]: s for s in ps.pareto(rows)}
    assert got["genai fp32"]["best_accel"] == "accel gguf-kernel"  # 7.2e-12 > 6.9e-12: the same model
    assert got["llama Q4_1"]["best_accel"] == "accel q8"
    assert (
        ps.pareto([_row("accel q8", "accel", 120.0, 0.0027), _row("genai fp32", "onnxruntime-genai", 36.0, 7e-12)])[0][
            "best_accel"
        ]
        is None
    )  # a quantization step is not noise


def test_pareto_without_an_accel_row_at_that_quality():
    rows = [_row("accel mx", "accel", 40.0, 0.04), _row("llama F32", "llama.cpp", 20.0, 1e-6)]
    (s,) = ps.pareto(rows)
    assert s["best_accel"] is None and s["speed_ratio"] is None and not s["goal_met"]
    assert "(none)" in ps.pareto_lines([s])[-1]


@pytest.mark.parametrize("q4_1", [False, True])
def test_markdown_table_has_one_cell_per_column(q4_1):
    rows = [
        {**_row("accel fp32 AR", "accel", 21.8, 0.0), "decode_tokens_per_s": 22.0, "x_fp32_ar": 1.0, "top1": 1.0,
         "p95_kl": 0.0, "greedy": {"equal": 8, "prompts": 8, "mean_prefix": 128.0}, "kl_vs_q4_1": 0.003},
        {**_row("onnxruntime-genai int4", "onnxruntime-genai", 99.1, None), "decode_tokens_per_s": float("nan")},
    ]  # fmt: skip
    lines = ps.markdown_table(rows, q4_1)
    assert len(lines) == 4
    assert len({line.count("|") for line in lines}) == 1
    assert "| accel fp32 AR | 21.8 | 22.0 | 1.00 | 8/8 | 128.0 | 0 | 0 | 100.0% |" in lines[2]
    assert ("0.003" in lines[2]) == q4_1


def test_genai_overlay_sets_threads_and_kv_length():
    o = ps.genai_overlay(3, 256)
    assert o["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 3
    assert o["search"]["max_length"] == 256 and o["search"]["do_sample"] is False


def test_llama_system_info_is_empty_without_llama_cpp(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    assert ps.llama_system_info() == ""


def test_plot_writes_a_png(tmp_path):
    rows = [_row("accel fp32 AR", "accel", 20.0, 0.0), _row("llama.cpp Q4_0", "llama.cpp", 70.0, 0.3)]
    path = ps.plot_speed_kl(rows, tmp_path / "out" / "peers.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["peers.png"]


def test_fds_to_sends_what_c_code_prints_to_the_log(tmp_path, capfd):
    log = tmp_path / "c.log"
    with ps.fds_to(log):
        os.write(1, b"stdout line\n")
        os.write(2, b"stderr line\n")
    os.write(1, b"after\n")
    assert log.read_text() == "stdout line\nstderr line\n"
    assert capfd.readouterr().out == "after\n"
