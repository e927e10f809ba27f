"""The simulator against published decode measurements (accel/sim/published.py): the one-point protocol's goals.

Two sets: ``FIRST_SET`` (issue 20; some catalog defaults were read off it) holds issue 20's goals; ``PUBLISHED``
(``FIRST_SET`` + gpt-fast's Mixtral table and Llama 3.1 rows + ``published_added.ADDED``, held out) holds issue 35's."""

import re

import numpy as np
import pytest

from accel.sim import hardware
from accel.sim.catalog import NCCL_ALLREDUCE_EXTRA_S
from accel.sim.published import (
    ADDED,
    FIRST_SET,
    GPT_FAST_LLAMA31,
    GPT_FAST_MOE,
    PUBLISHED,
    STACK_OF,
    allreduce_extra_s,
    at_stack,
    mean_abs_error,
    stack_factor,
    stack_of,
    summary,
    validate,
    validate_leave_one_source_out,
)


@pytest.fixture(scope="module")
def calibrated():
    return validate(FIRST_SET, calibrate_first=True)


def _multi_source_devices(points):
    return {d for d in {p.device for p in points} if len({p.source for p in points if p.device == d}) > 1}


def test_every_point_cites_its_source():
    """Every point: a URL, a year, the table or figure it was read from, a catalog device, a measured rate."""
    for p in PUBLISHED:
        assert re.search(r"https?://\S+", p.source) and re.search(r"\b20\d\d\b", p.source), p.source
        assert p.where.strip(), p.run.label
        hardware(p.device)  # a catalog device
        assert np.isfinite(p.run.tokens_per_s) and p.run.tokens_per_s > 0
    assert PUBLISHED == FIRST_SET + GPT_FAST_MOE + GPT_FAST_LLAMA31 + ADDED


def test_published_set_size_issue_35():
    """Issue 35: >= 60 points over >= 6 device types, multi-device ones included; sources beyond the first set's."""
    assert len(PUBLISHED) >= 60
    devices = {p.device for p in PUBLISHED}
    assert len(devices) >= 6 and {"tpu-v4", "mi300x"} <= devices
    multi = [p for p in PUBLISHED if (p.run.devices or 1) > 1]
    assert len(multi) >= 20 and len({p.device for p in multi}) >= 3  # tensor parallel over GPUs and TPU chips
    assert len({p.source for p in ADDED} - {p.source for p in FIRST_SET}) >= 5
    gpt_fast = GPT_FAST_MOE + GPT_FAST_LLAMA31
    assert all(p.source in {q.source for q in FIRST_SET} for p in gpt_fast)  # grouped with gpt-fast


def test_within_ten_percent_after_one_point_per_device(calibrated):
    """Goal of issue 20 (first set): mean |error| <= 10 % on the points not used for calibration (one per device)."""
    assert sum(r.calibration_point for r in calibrated) == len({p.device for p in FIRST_SET})
    assert mean_abs_error(calibrated) <= 0.10
    for r in calibrated:
        if r.calibration_point:
            assert abs(r.error) < 1e-6  # one point, one term: fitted exactly


def test_within_twenty_five_percent_with_stock_defaults():
    rows = validate(FIRST_SET, calibrate_first=False)
    assert mean_abs_error(rows) <= 0.25
    assert summary(rows)["points"] == len(FIRST_SET)


def test_stock_defaults_within_twenty_percent_on_the_whole_set():
    """Issue 35: the catalog's stock defaults, every published point held out, mean |error| <= 20 %."""
    rows = validate(PUBLISHED, calibrate_first=False)
    assert len(rows) == len(PUBLISHED) and all(np.isfinite(r.error) for r in rows)
    assert mean_abs_error(rows) <= 0.20


def test_one_point_protocol_covers_every_device():
    rows = validate(PUBLISHED)
    devices = list(dict.fromkeys(p.device for p in PUBLISHED))
    cal = [r for r in rows if r.calibration_point]
    assert [r.device for r in cal] == devices  # the first point of each device, in order
    assert all(abs(r.error) < 1e-6 for r in cal)
    assert len(rows) == len(PUBLISHED)


def test_mx_gains_are_not_a_byte_ratio(calibrated):
    """MXFP6 over FP16 on the same card: published 1.6-1.8x (one outlier 2.1x); a pure byte ratio said 2.3-2.5x."""
    by = {(r.device, r.label): r for r in calibrated}
    for device in ("cloud-ai-100-ultra", "cloud-ai-100-standard"):
        for model in ("gpt-j-6b", "opt-2.7b", "llama-2-7b", "xgen-7b"):
            fp16, mx = by.get((device, f"{model} fp16")), by.get((device, f"{model} mxfp6"))
            if fp16 is None or mx is None:
                continue
            gain = mx.predicted_tokens_per_s / fp16.predicted_tokens_per_s
            assert 1.5 < gain < 1.95, (device, model, gain)


def test_leave_one_source_out():
    """Issue 20's set: each device calibrated on a point of another source predicts this source's points: mean
    |error| <= 10% and no device's mean above 15%; devices with one source (H100 there: torchao only) have no row."""
    rows = validate_leave_one_source_out(FIRST_SET)
    devices = {r.device for r in rows}
    assert "h100-sxm" not in devices and {"a100-80gb", "cloud-ai-100-standard", "cloud-ai-100-ultra"} <= devices
    assert len(rows) == sum(p.device in devices for p in FIRST_SET)  # every point of those devices, held out
    s = summary(rows)
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
    assert s["mean_abs_error"] <= 0.10
    assert all(s[d] <= 0.15 for d in devices)


def test_leave_one_source_out_runs_over_the_added_points():
    """The whole set: every point of a device with two or more sources gets a held-out row (the added ones
    included: H100 and MI300X now have two sources each); a device with one source (TPU v4) has none."""
    rows = validate_leave_one_source_out(PUBLISHED)
    multi = _multi_source_devices(PUBLISHED)
    assert {"a100-80gb", "h100-sxm", "mi300x"} <= multi and "tpu-v4" not in multi
    assert {r.device for r in rows} == multi
    assert len(rows) == sum(p.device in multi for p in PUBLISHED)
    assert all(np.isfinite(r.error) and not r.calibration_point for r in rows)
    held = {(r.device, r.label, r.source) for r in rows}
    assert all((p.device, p.run.label, p.source) in held for p in ADDED if p.device in multi)


def test_leave_one_source_out_no_device_above_fifteen_percent_issue_35():
    """Issue 35's per-device goal on the whole set: no device's leave-one-source-out mean above 15 % (H100 was
    17.8 %: the stack factor of TensorRT-LLM against gpt-fast's stack, read off their A100 points, now scales the
    profile read off TensorRT-LLM's H100 point when torchao's H100 points are held out)."""
    s = summary(validate_leave_one_source_out(PUBLISHED))
    devices = [d for d in s if d not in ("mean_abs_error", "points")]
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
    assert all(s[d] <= 0.15 for d in devices)


def test_leave_one_source_out_goal_issue_35():
    """Issue 35's goal on the whole set: leave-one-source-out mean |error| <= 10 %, no device above 15 % (13.2 %
    while the set held gpt-fast's first Mixtral table, which its authors replaced after a w2 layout fix)."""
    s = summary(validate_leave_one_source_out(PUBLISHED))
    devices = [d for d in s if d not in ("mean_abs_error", "points")]
    assert s["mean_abs_error"] <= 0.10
    assert all(s[d] <= 0.15 for d in devices)


def test_every_source_has_a_stack_and_torchao_is_gpt_fasts():
    assert {p.source for p in PUBLISHED} == set(STACK_OF)
    by = {stack_of(p) for p in PUBLISHED if "torchao" in p.source or "gpt-fast" in p.source}
    assert by == {"gpt-fast"}


def _doubled(points, which):
    return [
        p.model_copy(update={"run": p.run.model_copy(update={"tokens_per_s": 2 * p.run.tokens_per_s})})
        if which(p)
        else p
        for p in points
    ]


def test_stack_factor_reads_other_sources_only():
    """The factor that scales a held-out source's predictions comes from the other sources' points: doubling the
    held-out source's own rates leaves its predictions unchanged, doubling the other stack's rates moves them."""
    pool = [p for p in PUBLISHED if "torchao" not in p.source]  # torchao's points held out
    f = stack_factor(pool, "gpt-fast", "tensorrt-llm")
    assert 0.85 < f < 0.99  # TensorRT-LLM v0.5's GPT-J on A100 runs ~6 % slower than gpt-fast's stack predicts
    assert stack_factor(pool, "tensorrt-llm", "tensorrt-llm") == 1.0
    no_trt = [p for p in pool if stack_of(p) != "tensorrt-llm"]
    assert stack_factor(no_trt, "gpt-fast", "tensorrt-llm") == 1.0  # no device with both: no information
    trt_doubled = _doubled(pool, lambda p: stack_of(p) == "tensorrt-llm")
    assert stack_factor(trt_doubled, "gpt-fast", "tensorrt-llm") == pytest.approx(2 * f, rel=1e-6)

    def torchao_h100(points):
        return {r.label: r.predicted_tokens_per_s for r in validate_leave_one_source_out(points)
                if r.device == "h100-sxm" and "torchao" in r.source}  # fmt: skip

    base = torchao_h100(PUBLISHED)
    assert len(base) == 4
    assert torchao_h100(_doubled(PUBLISHED, lambda p: "torchao" in p.source)) == base  # its own rates: unused
    moved = torchao_h100(_doubled(PUBLISHED, lambda p: p.device == "a100-80gb" and stack_of(p) == "tensorrt-llm"))
    assert all(moved[k] == pytest.approx(base[k] / 2, rel=1e-6) for k in base)


def test_leave_one_source_out_calibrates_on_the_other_source():
    """Two sources of one device, the second's points doubled: held out, they show it (predicted at about half),
    and the first source, calibrated on a doubled point, is over-predicted (a calibration on a point of their own
    source would have absorbed both)."""
    a100 = [p for p in PUBLISHED if p.device == "a100-80gb"]
    first, second = a100[0].source, next(p.source for p in a100 if p.source != a100[0].source)
    pts = [p for p in a100 if p.source == first][:3] + [p for p in a100 if p.source == second][:3]
    doubled = [
        p.model_copy(update={"run": p.run.model_copy(update={"tokens_per_s": 2 * p.run.tokens_per_s})})
        if p.source == second
        else p
        for p in pts
    ]
    errs = {r.source: [] for r in validate_leave_one_source_out(doubled)}
    for r in validate_leave_one_source_out(doubled):
        errs[r.source].append(r.error)
    assert all(e < -0.4 for e in errs[second])  # predicted at about half the doubled rate
    assert all(e > 0.1 for e in errs[first])  # calibrated on a doubled point, the first source is over-predicted


def test_nccl_stacks_pay_nccls_all_reduce_latency():
    """A stack that all-reduces through NCCL (lmdeploy's TurboMind, IBM's torch.compile) pays NCCL's small-message
    latency over the GPU family's default (gpt-fast's intra-node one-shot): 20.71 us on 8 NVLink GPUs against the
    family's 13.9 us. Priced per all-reduce: a decode step of Llama 2 70B on 4 A100s (80 layers x 2) pays 160 x that;
    one device, another library or a non-GPU family pays nothing; switching back restores the hardware."""
    a100, tpu = hardware("a100-80gb"), hardware("tpu-v4")
    extra = NCCL_ALLREDUCE_EXTRA_S["gpu-nvlink"]
    assert extra == pytest.approx(20.71e-6 - 13.9e-6)
    assert allreduce_extra_s(a100, "lmdeploy-turbomind") == extra == allreduce_extra_s(a100, "ibm-torch-compile")
    assert allreduce_extra_s(a100, "gpt-fast") == 0.0 and allreduce_extra_s(tpu, "lmdeploy-turbomind") == 0.0
    nccl = at_stack(a100, "lmdeploy-turbomind")
    assert nccl.allreduce_latency_s == pytest.approx(a100.allreduce_latency_s + extra)
    back = at_stack(nccl, "gpt-fast", "lmdeploy-turbomind")
    assert back.allreduce_latency_s == pytest.approx(a100.allreduce_latency_s)
    assert at_stack(a100, "gpt-fast") is a100
    tp4 = next(p for p in ADDED if p.run.label == "llama-2-70b fp16 TP4 1/128")
    tp1 = next(p for p in ADDED if p.run.label == "llama-2-7b fp16 1/128")
    calls = tp4.run.gen_len  # an end-to-end run of 128 tokens: one prefill call and 127 decode steps
    assert tp4.run.predicted_s(nccl) - tp4.run.predicted_s(a100) == pytest.approx(calls * 160 * extra, rel=1e-3)
    assert tp1.run.predicted_s(nccl) == pytest.approx(tp1.run.predicted_s(a100), rel=1e-12)


def test_lmdeploys_tensor_parallel_rows_priced_with_nccl():
    """Held out, lmdeploy's 70B TP4 rows (calibrated on gpt-fast's first A100 point) were +11.6 to +20.0 % with
    gpt-fast's all-reduce; with NCCL's they are +7 to +16 %, and its one-GPU rows are unchanged (within 5.1 %)."""
    rows = [r for r in validate_leave_one_source_out(PUBLISHED) if "lmdeploy" in r.source]
    tp4 = [r.error for r in rows if "TP4" in r.label]
    assert len(tp4) == 5 and all(0.0 < e < 0.17 for e in tp4) and np.mean(tp4) < 0.12
    assert all(abs(r.error) < 0.051 for r in rows if "TP4" not in r.label)
