"""accel's own GPU measurements as simulator observations (``accel.sim.measured``): they describe the calls
``step_time`` prices; the ``h200`` catalog entry is the least-squares fit to the float16 curves documented in
``accel/sim/catalog.py`` (``H200_MEASURED``), and predicts the held-out Llama-2-7B bfloat16 AR step."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from accel.sim import SimWarning, calibrate, hardware, preset, step_time
from accel.sim.catalog import H200_MEASURED
from accel.sim.measured import GPU_TOKENS, batch_points, fit_points, gpu_errors, gpu_points, held_out_points
from accel.sim.roofline import CallShape

FIT = [
    "call_overhead_s",
    "layer_overhead_s",
    "row_overhead_s",
    "multi_token_penalty",
    "multi_token_exponent",
    "kv_bandwidth_efficiency",
]


def batched(model: str) -> list:
    """The batched AR steps of ``model`` (observations)."""
    return [o for _, o in batch_points(model)]


def test_points_are_the_calls_step_time_prices():
    pts = gpu_points()
    assert len(pts) == 5 * len(GPU_TOKENS) and {d for d, _ in pts} == {"h200"}
    assert len({o.label for _, o in pts}) == len(pts)
    errors = gpu_errors("h200")
    _, obs = next((d, o) for d, o in pts if o.label == "llama-2-7b bf16 S=16")
    st = step_time(
        preset("llama-2-7b"),
        "h200",
        CallShape(new_tokens=16, num_logits=16, context_len=256, kv_slots=1025),
        weight_format="bf16",
    )
    assert errors["llama-2-7b bf16 S=16"] == pytest.approx(st.time_s / obs.measured_s - 1, rel=1e-9)


def test_h200_entry_is_the_documented_fit_to_the_float16_curves():
    """From the family's assumed fixed costs, the measured copy rate (0.875 of 4.8 TB/s) for weights and cache alike,
    a least-squares fit of the six terms to the two float16 curves and the Llama-2-7B batched steps gives the
    catalog's values (rounded)."""
    start = hardware("h200").with_(
        call_overhead_s=30e-6,
        layer_overhead_s=30e-6,
        row_overhead_s=0.0,
        multi_token_penalty=0.0,
        kv_bandwidth_efficiency=None,
    )
    assert start.bandwidth_efficiency == 0.875
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimWarning)
        fitted = calibrate(start, [o for _, o in fit_points()], fit=FIT)
    for term in FIT:
        assert fitted.calibration.fitted[term] == pytest.approx(H200_MEASURED[term], rel=0.05), term
    assert fitted.calibration.rms_relative_error < 0.02


def test_stock_h200_on_the_measured_rows():
    """Stock: every float16 row within 5 % (fitted), the held-out Llama-2-7B bfloat16 curve within 15 % (its AR step
    within 2 %); float32 multi-row calls are priced at the CUDA-core FP32 peak (67 TFLOP/s), not the FP16 tensor
    cores' 989 (they were off by up to 66 %)."""
    errors = gpu_errors("h200")
    assert max(abs(e) for k, e in errors.items() if " fp16 " in k) < 0.05
    assert max(abs(e) for k, e in errors.items() if k.startswith("llama-2-7b bf16")) < 0.15
    assert abs(errors["llama-2-7b bf16 S=1"]) < 0.02
    assert abs(errors["tinyllama-1.1b fp32 S=64"]) < 0.15
    st = step_time(preset("tinyllama-1.1b"), "h200", CallShape(new_tokens=64, num_logits=64), weight_format="fp32")
    assert st.compute_s == pytest.approx(st.flops / (67e12 * hardware("h200").compute_efficiency), rel=1e-9)


def test_fp16_calibration_predicts_the_held_out_bf16_7b_step():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimWarning)
        fitted = calibrate("h200", [o for _, o in gpu_points("fp16")])
    errors = gpu_errors(fitted)
    assert abs(errors["llama-2-7b fp16 S=1"]) < 0.05
    assert abs(errors["llama-2-7b bf16 S=1"]) < 0.05  # held out


@pytest.mark.xfail(
    strict=True,
    reason="issue 37 goal not met on the held-out dtypes: TinyLlama bfloat16 runs 25 % slower than float16 at the "
    "same bytes (-20 %), float32 multi-row calls on CUDA cores at 10-20 % of their peak for S = 2-16 (-55 %) "
    "(docs/sim.md §8)",
)
def test_every_measured_row_within_ten_percent_issue_37():
    """Issue 37's goal: the simulator within 10 % of every row accel measured on the H200. Strict: when the model
    meets it, this test fails until the marker is removed."""
    assert np.max(np.abs(list(gpu_errors("h200").values()))) <= 0.10


def test_held_out_13b_curve_within_ten_percent():
    """The Llama-2-13B float16 curve, measured after the h200 entry was fitted (7B and 1.1B float16 curves): every
    call S = 1..64 within 10 %."""
    errors = gpu_errors("h200", held_out_points())
    curve = {k: e for k, e in errors.items() if k.startswith("llama-2-13b fp16 S=")}
    assert len(curve) == len(GPU_TOKENS)
    assert max(map(abs, curve.values())) < 0.10


def test_held_out_batched_steps_are_priced_with_their_batch():
    """Batched AR steps (B = 4, 16, 64) are observations of that batch: the simulator's time grows with B as the
    measurement does (each sequence reads its own 1025-slot cache); the 13B steps are held out, the 7B ones fitted."""
    assert {o.label for _, o in held_out_points() if " B=" in o.label} == {o.label for o in batched("llama-2-13b")}
    assert {o.label for _, o in fit_points() if " B=" in o.label} == {o.label for o in batched("llama-2-7b")}
    points = dict((o.label, o) for _, o in batch_points())
    errors = gpu_errors("h200", list(("h200", o) for o in points.values()))
    for model in ("llama-2-7b", "llama-2-13b"):
        b = [points[f"{model} fp16 B={n}"] for n in (4, 16, 64)]
        assert [o.batch_size for o in b] == [4, 16, 64]
        assert b[0].measured_s < b[1].measured_s < b[2].measured_s
        assert abs(errors[f"{model} fp16 B=4"]) < 0.10


def test_held_out_13b_batched_steps_within_ten_percent():
    """The Llama-2-13B batched AR steps (B = 4, 16, 64; caches of 2.7-54 GB a step) were in no fit: within 10 %
    because the cache is read at its own fitted rate (0.55 of 4.8 TB/s, from the 7B batched steps)."""
    errors = gpu_errors("h200", [("h200", o) for o in batched("llama-2-13b")])
    assert len(errors) == 3 and max(map(abs, errors.values())) <= 0.10


def test_the_cache_read_rate_is_what_the_batched_steps_need():
    """Without the KV-cache term (the cache read at the weights' rate) the same entry misprices the B = 64 steps by
    over 20 %: the term is what the batched points see."""
    same = hardware("h200").with_(kv_bandwidth_efficiency=None)
    points = [("h200", o) for o in batched("llama-2-7b") + batched("llama-2-13b")]
    assert min(gpu_errors(same, points).values()) < -0.20
    assert max(abs(e) for e in gpu_errors("h200", points).values()) <= 0.10
