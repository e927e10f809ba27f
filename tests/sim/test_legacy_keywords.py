"""The keywords that typed objects replaced (``accel._legacy``, one release): each old call form still works, gives
exactly what the new form gives and warns (``DeprecationWarning`` naming the replacement); an unknown keyword is
refused by name, and an object given together with its deprecated keywords is ambiguous."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from accel.errors import SimError
from accel.sim import Deployment, hardware, measure_host, predict_ppd, predict_speedup, preset, step_time, sweep
from accel.sim import host as host_module
from accel.sim.formats import kv_bytes_per_element
from accel.sim.host import HostProbe
from accel.sim.ppd import PPDRun
from accel.sim.roofline import CallShape, format_arrays, step_arrays
from accel.sim.sweeps import SweepAxes

T, D, HW = "llama-2-7b", "qualcomm-llama2-draft-115m", "cloud-ai-100-ultra"


def _no_warning(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return fn(*args, **kw)


def test_step_time_keywords():
    new = _no_warning(step_time, T, HW, CallShape(batch_size=2, new_tokens=8, context_len=300, num_logits=8))
    with pytest.warns(DeprecationWarning, match=r"step_time\(\).*call=CallShape\(batch_size=..., new_tokens=..."):
        old = step_time(T, HW, batch_size=2, new_tokens=8, context_len=300, num_logits=8)
    assert old == new
    with pytest.warns(DeprecationWarning):
        assert step_time(T, HW, num_logits=None) == step_time(T, HW)  # None meant one logit
    with pytest.raises(TypeError, match="call= and the deprecated new_tokens"):
        step_time(T, HW, CallShape(), new_tokens=2)


def test_step_arrays_keywords():
    spec, hw = preset(T), hardware(HW)
    common = dict(fmt=format_arrays(hw, "mxfp6"), kv_bpe=kv_bytes_per_element("fp16"), devices=4)
    L = np.array([0.0, 100.0, 1000.0])
    new = _no_warning(step_arrays, spec, hw, CallShape(4, 3, L, 3, 2048), **common)
    with pytest.warns(
        DeprecationWarning, match=r"batch=, new_tokens=.* -> call=CallShape\(batch_size=..., new_tokens="
    ):
        old = step_arrays(spec, hw, batch=4, new_tokens=3, context_len=L, num_logits=3, kv_slots=2048, **common)
    assert old.keys() == new.keys() and all(np.array_equal(old[k], new[k]) for k in new)


def test_predict_speedup_strict():
    args = ("chinchilla-70b", "chinchilla-4b-draft", "cloud-ai-100-standard")
    new = _no_warning(predict_speedup, *args, k=3)
    with pytest.raises(SimError, match="DOES NOT FIT") as raised:
        new.require_fit()
    with pytest.warns(DeprecationWarning, match=r"strict= -> predict_speedup\(...\).require_fit\(\)"):
        with pytest.raises(SimError, match="DOES NOT FIT") as old:
            predict_speedup(*args, k=3, strict=True)
    assert str(old.value) == str(raised.value)
    with pytest.warns(DeprecationWarning, match="strict="):
        assert predict_speedup(T, D, HW, k=5, strict=False) == predict_speedup(T, D, HW, k=5)
    fits = predict_speedup(T, D, HW, k=5)
    assert fits.require_fit() is fits


def test_predict_ppd_keywords():
    kw = dict(weight_format="mxfp6", devices=2, placement="same-device")
    new = _no_warning(predict_ppd, T, HW, PPDRun(dbar=16, k=3, p=0.5, gen_len=64, context_len=512), **kw)
    with pytest.warns(DeprecationWarning, match=r"predict_ppd\(\).*run=PPDRun\(dbar=..., k=..., p=..., gen_len="):
        old = predict_ppd(T, HW, dbar=16, k=3, p=0.5, gen_len=64, context_len=512, **kw)
    assert old == new
    with pytest.raises(TypeError, match="needs run=PPDRun"):
        predict_ppd(T, HW)


def test_sweep_axes_keywords():
    dep = Deployment(target=T, draft=D, hardware=HW)
    axes = SweepAxes(target_format=["fp16", "mxfp4"], batch_size=[1, 8], context_len=[0, 700])
    new = _no_warning(sweep, dep, k=[1, 4], alpha=[0.5, 0.9], axes=axes)
    with pytest.warns(DeprecationWarning, match=r"sweep\(\).*axes=SweepAxes\(target_format=..., batch_size=..."):
        old = sweep(dep, k=[1, 4], alpha=[0.5, 0.9], target_format=["fp16", "mxfp4"], batch_size=[1, 8],
                    context_len=[0, 700])  # fmt: skip
    for name in ("speedup", "speedup_vs_fp16", "loop_s", "best_k", "expected_tokens"):
        assert np.array_equal(getattr(old, name), getattr(new, name))
    # the other keywords are still Deployment fields
    with pytest.raises(SimError, match="bogus"):
        sweep(T, D, HW, bogus=1)


class _Stop(Exception):
    pass


def test_measure_host_keywords(monkeypatch):
    seen: list[float] = []

    def copy_bandwidth(nbytes: float, repeats: int = 5) -> float:
        seen.append(nbytes)
        raise _Stop  # the probe reached the measurements: no need to time anything

    monkeypatch.setattr(host_module, "measure_copy_bandwidth", copy_bandwidth)
    with pytest.raises(_Stop):
        _no_warning(measure_host, HostProbe(copy_bytes=8e6, layer_calls=3), ort_threads=1)
    with pytest.warns(DeprecationWarning, match=r"copy_bytes=, layer_calls= -> probe=HostProbe\(copy_bytes=..."):
        with pytest.raises(_Stop):
            measure_host(copy_bytes=8e6, layer_calls=3, ort_threads=1)
    assert seen == [8e6, 8e6]


@pytest.mark.parametrize(
    "call",
    [
        lambda: step_time(T, HW, bogus=1),
        lambda: predict_ppd(T, HW, PPDRun(dbar=16, k=3, p=0.5, gen_len=8), bogus=1),
        lambda: measure_host(bogus=1),
        lambda: step_arrays(preset(T), hardware(HW), fmt=(2.0, np.inf, 1e15), kv_bpe=2.0, devices=1, bogus=1),
    ],
)
def test_unknown_keywords_are_refused_by_name(call):
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*bogus"):
        call()


def test_plot_keywords(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from accel.sim import plots

    calls: list[tuple] = []

    def step(*args, **kw):
        calls.append((args[2:], kw))
        return step_time(*args, **kw)

    monkeypatch.setattr(plots, "step_time", step)
    _no_warning(plots.roofline, T, HW, tmp_path / "new.png", plots.RooflinePoints(k=3, prompt_len=64, batch_size=2))
    with pytest.warns(DeprecationWarning, match=r"roofline\(\).*points=RooflinePoints\(k=..., prompt_len="):
        plots.roofline(T, HW, tmp_path / "old.png", k=3, prompt_len=64, batch_size=2)
    assert calls[:3] == calls[3:] and (tmp_path / "old.png").exists()
    # speedup_heatmap's older form (target, draft, hardware, path, **fields) keeps its defaults, without a warning
    swept: list[tuple] = []

    def grid(*args, **kw):
        swept.append((args, kw))
        return sweep(*args, **kw)

    monkeypatch.setattr(plots, "sweep", grid)
    fields = dict(target_format="mxfp4", batch_size=4, devices=2)
    _no_warning(plots.speedup_heatmap, T, D, HW, tmp_path / "old-heat.png", k_max=3, alpha=[0.5, 0.9], **fields)
    dep = Deployment(target=T, draft=D, hardware=HW, draft_format="fp16", draft_devices=1, devices=2)
    (args, kw) = swept[0]
    assert args == (dep,) and kw["axes"] == SweepAxes(["mxfp4"], [4], [512])
    same = dep.with_(target_format="mxfp4", batch_size=4)
    _no_warning(plots.speedup_heatmap, same, path=tmp_path / "new-heat.png", k_max=3, alpha=[0.5, 0.9])
    assert swept[1][1]["axes"] == kw["axes"]
    with pytest.raises(SimError, match="needs a path"):
        plots.speedup_heatmap(dep)
