"""accel.sim: roofline simulator of memory-bound decode and speculative decoding, for capacity planning.

Specs (pydantic): ``Hardware`` (catalog: ``hardware(name)``, ``list_hardware()``, ``load_hardware(path)``) and
``ModelSpec`` (``preset(name)``, ``list_presets()``, ``from_hf_config``). Time of one call: ``step_time`` ->
``StepTime``. Speculative decoding: ``expected_tokens``, ``tokens_pmf``, ``best_k``, ``break_even_alpha``;
``predict_speedup`` -> ``Prediction`` (measured loops of a dynamic draft length: ``LoopStats``); Predictive Pipelined
Decoding: ``predict_ppd``. Fitting: ``calibrate`` (``Observation``), ``measure_host``. Grids: ``sweep``. Figures:
``accel.sim.plots`` (imports matplotlib lazily).
See docs/sim.md. Nothing here imports torch or matplotlib.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.sim.formats import KV_FORMATS, WEIGHT_FORMATS, bits_per_element, bytes_per_element
from accel.sim.hardware import CalibrationReport, Hardware, hardware, list_hardware, load_hardware
from accel.sim.models import ModelSpec, from_hf_config, list_presets, preset, resolve_model, weight_breakdown
from accel.sim.predict import ConfigResult, Prediction, best_k, break_even_alpha, memory_bytes, predict_speedup
from accel.sim.roofline import StepTime, step_time
from accel.sim.spd import LoopStats, alpha_for_expected_tokens, expected_tokens, expected_tokens_from, tokens_pmf

_LAZY = {
    "predict_ppd": "accel.sim.ppd",
    "PPDResult": "accel.sim.ppd",
    "ppd_expected_latency": "accel.sim.ppd",
    "ppd_expected_compute": "accel.sim.ppd",
    "calibrate": "accel.sim.calibration",
    "Observation": "accel.sim.calibration",
    "measure_host": "accel.sim.host",
    "sweep": "accel.sim.sweeps",
    "SweepResult": "accel.sim.sweeps",
}


__getattr__ = lazy_getattr(__name__, _LAZY, {"plots": "accel.sim.plots"})


__all__ = [
    "KV_FORMATS",
    "WEIGHT_FORMATS",
    "bits_per_element",
    "bytes_per_element",
    "CalibrationReport",
    "Hardware",
    "hardware",
    "list_hardware",
    "load_hardware",
    "ModelSpec",
    "from_hf_config",
    "list_presets",
    "preset",
    "resolve_model",
    "weight_breakdown",
    "ConfigResult",
    "Prediction",
    "best_k",
    "break_even_alpha",
    "memory_bytes",
    "predict_speedup",
    "StepTime",
    "step_time",
    "LoopStats",
    "alpha_for_expected_tokens",
    "expected_tokens",
    "expected_tokens_from",
    "tokens_pmf",
    *_LAZY,
    "plots",
]
