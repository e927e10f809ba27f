"""accel's own GPU measurements as simulator observations (``accel.sim.measured``): they describe the calls
``step_time`` prices, and calibrating on the float16 curves predicts the held-out Llama-2-7B bfloat16 AR step."""

from __future__ import annotations

import warnings

import pytest

from accel.sim import SimWarning, calibrate, preset, step_time
from accel.sim.measured import GPU_TOKENS, gpu_errors, gpu_points


def test_points_are_the_calls_step_time_prices():
    pts = gpu_points()
    assert len(pts) == 5 * len(GPU_TOKENS) and {d for d, _ in pts} == {"h200"}
    assert len({o.label for _, o in pts}) == len(pts)
    errors = gpu_errors("h200")
    _, obs = next((d, o) for d, o in pts if o.label == "llama-2-7b bf16 S=16")
    st = step_time(
        preset("llama-2-7b"), "h200", weight_format="bf16", new_tokens=16, num_logits=16, context_len=256, kv_slots=1025
    )
    assert errors["llama-2-7b bf16 S=16"] == pytest.approx(st.time_s / obs.measured_s - 1, rel=1e-9)


def test_fp16_calibration_predicts_the_held_out_bf16_7b_step():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimWarning)
        fitted = calibrate("h200", [o for _, o in gpu_points("fp16")])
    errors = gpu_errors(fitted)
    assert abs(errors["llama-2-7b fp16 S=1"]) < 0.05
    assert abs(errors["llama-2-7b bf16 S=1"]) < 0.05  # held out
    assert abs(gpu_errors("h200")["llama-2-7b bf16 S=1"]) > 0.10  # the stock entry misses it: the fit did the work
