"""``accel.sim.predict_band``: the speedup at quantiles of an acceptance distribution equals ``predict_speedup`` at
the matching acceptance (a range: the quantile's alpha, since the speedup is nondecreasing in alpha; samples: the
quantiles of the per-sample speedups), and bad input is a ``SimError``."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import predict_speedup
from accel.sim.band import predict_band

T, D, HW = "llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra"


def _speedups(acceptance, **kw) -> dict[str, float]:
    return {c.name: c.speedup for c in predict_speedup(T, D, HW, acceptance=acceptance, **kw).configs}


@pytest.mark.parametrize("kw", [{"k": 4}, {"k": 7}, {"tree": 12}])
def test_range_band_is_the_speedup_at_the_quantile_alphas(kw):
    band = predict_band(T, D, HW, acceptance_range=(0.5, 0.9), quantiles=(0.1, 0.5, 0.9), **kw)
    assert band.source == "range" and band.acceptance == pytest.approx([0.54, 0.7, 0.86])
    for i, alpha in enumerate(band.acceptance):
        for name, value in _speedups(alpha, **kw).items():
            assert band.speedup[name][i] == pytest.approx(value, rel=1e-12), name
    speculative = {c.name for c in predict_speedup(T, D, HW, **kw).configs if c.speculative}
    assert speculative and set(band.speedup) > speculative
    for name, values in band.speedup.items():
        assert values == sorted(values), name  # nondecreasing in alpha
        if name in speculative:
            assert values[-1] > values[0], name
        else:
            assert max(values) == pytest.approx(min(values)), name  # AR does not depend on acceptance
    # the monotonicity the range shortcut relies on: dense uniform samples give the same quantiles
    dense = predict_band(T, D, HW, acceptance_samples=list(np.linspace(0.5, 0.9, 81)), **kw)
    for name, values in band.speedup.items():
        np.testing.assert_allclose(dense.speedup[name], values, rtol=5e-3, err_msg=name)


def test_sample_band_is_the_quantiles_of_the_per_sample_speedups():
    samples = [0.62, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], 0.75, 0.81, [0.7] * 7]
    band = predict_band(T, D, HW, acceptance_samples=samples, quantiles=(0.0, 0.25, 1.0))
    per = [_speedups(a) for a in samples]
    for name in band.speedup:
        expected = np.quantile([p[name] for p in per], [0.0, 0.25, 1.0])
        np.testing.assert_allclose(band.speedup[name], expected, rtol=1e-12)
    assert band.n_predictions == 5 and band.source == "samples" and "p25" in band.table()


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({}, "exactly one"),
        ({"acceptance_range": (0.5, 0.9), "acceptance_samples": [0.5]}, "exactly one"),
        ({"acceptance_range": (0.9, 0.5)}, "lo <= hi"),
        ({"acceptance_range": (0.5, 1.2)}, "lo <= hi <= 1"),
        ({"acceptance_range": (0.5,)}, "(lo, hi)"),
        ({"acceptance_samples": []}, "1 .. 10000"),
        ({"acceptance_range": (0.5, 0.9), "quantiles": (0.9, 0.1)}, "ascending"),
        ({"acceptance_range": (0.5, 0.9), "quantiles": (1.5,)}, "in [0, 1]"),
        ({"acceptance_range": (0.5, 0.9), "acceptance": 0.7}, "drop acceptance"),
    ],
)
def test_bad_input_is_named(kw, named):
    with pytest.raises(SimError, match=named.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        predict_band(T, D, HW, **kw)


def test_a_band_needs_a_draft():
    with pytest.raises(SimError, match="draft"):
        predict_band(T, None, HW, acceptance_range=(0.5, 0.9))


def test_predict_cli_prints_the_band(capsys):
    from accel.cli import EXIT_ERROR, main

    argv = ["predict", "--target", T, "--draft", D, "--hardware", HW, "--acceptance-range", "0.6", "0.85"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    band = predict_band(T, D, HW, acceptance_range=(0.6, 0.85))
    assert "alpha uniform on [0.6, 0.85]" in out and band.table() in out
    assert main(["predict", "--target", T, "--hardware", HW, "--acceptance-range", "0.6", "0.85"]) == EXIT_ERROR
    assert "need --draft" in capsys.readouterr().err
