"""accel.sim: roofline simulator of memory-bound decode and speculative decoding, for capacity planning.

Specs (pydantic): ``Hardware`` (catalog: ``hardware(name)``, ``list_hardware()``, ``load_hardware(path)``),
``ModelSpec`` (``preset(name)``, ``list_presets()``, ``from_hf_config``) and ``Deployment`` (what runs where: models,
formats, batch, lengths, cache layout, devices). Time of one call: ``step_time`` -> ``StepTime``. Predictions:
``predict_speedup(deployment, k=..., acceptance=... | loop_stats=... | tree=...)`` -> ``Prediction``; planning:
``best_k``, ``break_even_alpha``, ``tree_speedups``; token trees: ``TokenTree``, ``best_tree``,
``tree_expected_tokens``; Hydra heads as a draft: ``hydra_draft``; chains: ``expected_tokens``, ``tokens_pmf``,
``LoopStats``; Predictive Pipelined Decoding: ``predict_ppd``. Fitting: ``calibrate`` (``Observation``,
``RunObservation``), ``measure_host``. Grids: ``sweep``. Figures: ``accel.sim.plots`` (imports matplotlib lazily).
See docs/sim.md. Nothing here imports torch or matplotlib.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.sim._base import SimWarning
from accel.sim.band import SpeedupBand, predict_band
from accel.sim.deployment import Deployment
from accel.sim.formats import KV_FORMATS, WEIGHT_FORMATS, bits_per_element, bytes_per_element
from accel.sim.hardware import CalibrationReport, Hardware, hardware, list_hardware, load_hardware
from accel.sim.hf_config import from_hf_config, resolve_model
from accel.sim.models import ModelSpec, weight_breakdown
from accel.sim.planning import best_k, break_even_alpha, tree_speedups
from accel.sim.predict import ConfigResult, Prediction, predict_speedup
from accel.sim.presets import list_presets, preset
from accel.sim.roofline import CallShape, StepTime, step_time
from accel.sim.spd import LoopStats, alpha_for_expected_tokens, expected_tokens, expected_tokens_from, tokens_pmf
from accel.sim.tree import (
    TokenTree,
    best_tree,
    rank_acceptance,
    rank_acceptance_from_counts,
    rank_acceptance_from_stats,
    tree_expected_tokens,
)

_LAZY = {
    "predict_ppd": "accel.sim.ppd",
    "PPDRun": "accel.sim.ppd",
    "PPDResult": "accel.sim.ppd",
    "ppd_expected_latency": "accel.sim.ppd",
    "ppd_expected_compute": "accel.sim.ppd",
    "calibrate": "accel.sim.calibration",
    "Observation": "accel.sim.observations",
    "RunObservation": "accel.sim.observations",
    "measure_host": "accel.sim.host",
    "HostProbe": "accel.sim.host",
    "sweep": "accel.sim.sweeps",
    "SweepAxes": "accel.sim.sweeps",
    "SweepResult": "accel.sim.sweeps",
    "hydra_draft": "accel.sim.hydra",
}


__getattr__ = lazy_getattr(__name__, _LAZY, {"plots": "accel.sim.plots"})


__all__ = [
    "KV_FORMATS",
    "WEIGHT_FORMATS",
    "bits_per_element",
    "bytes_per_element",
    "CalibrationReport",
    "Deployment",
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
    "SimWarning",
    "best_k",
    "break_even_alpha",
    "tree_speedups",
    "predict_speedup",
    "predict_band",
    "SpeedupBand",
    "CallShape",
    "StepTime",
    "step_time",
    "LoopStats",
    "TokenTree",
    "alpha_for_expected_tokens",
    "best_tree",
    "expected_tokens",
    "expected_tokens_from",
    "rank_acceptance",
    "rank_acceptance_from_counts",
    "rank_acceptance_from_stats",
    "tokens_pmf",
    "tree_expected_tokens",
    *_LAZY,
    "plots",
]
