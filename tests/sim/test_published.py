"""The simulator against published decode measurements (accel/sim/published.py): the one-point protocol's goals."""

import pytest

from accel.sim import hardware
from accel.sim.published import PUBLISHED, mean_abs_error, summary, validate, validate_leave_one_source_out


@pytest.fixture(scope="module")
def calibrated():
    return validate(calibrate_first=True)


def test_every_point_cites_its_source():
    for p in PUBLISHED:
        assert "http" in p.source and "20" in p.source and p.where, p.run.label
        hardware(p.device)  # a catalog device
    assert len({p.device for p in PUBLISHED}) >= 4 and len(PUBLISHED) >= 40


def test_within_ten_percent_after_one_point_per_device(calibrated):
    """Goal of issue 20: mean |error| <= 10 % on the points not used for calibration (one point per device)."""
    assert sum(r.calibration_point for r in calibrated) == len({p.device for p in PUBLISHED})
    assert mean_abs_error(calibrated) <= 0.10
    for r in calibrated:
        if r.calibration_point:
            assert abs(r.error) < 1e-6  # one point, one term: fitted exactly


def test_within_twenty_five_percent_with_stock_defaults():
    rows = validate(calibrate_first=False)
    assert mean_abs_error(rows) <= 0.25
    assert summary(rows)["points"] == len(PUBLISHED)


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
    """Each device calibrated on a point of another source predicts this source's points: mean |error| <= 10% and
    no device's mean above 15% (issue goal); devices with one source (H100: torchao only) have no row."""
    rows = validate_leave_one_source_out()
    devices = {r.device for r in rows}
    assert "h100-sxm" not in devices and {"a100-80gb", "cloud-ai-100-standard", "cloud-ai-100-ultra"} <= devices
    assert len(rows) == sum(p.device in devices for p in PUBLISHED)  # every point of those devices, held out
    s = summary(rows)
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
    assert s["mean_abs_error"] <= 0.10
    assert all(s[d] <= 0.15 for d in devices)


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
