"""Decode calls accel measured on a GPU itself (``benchmarks/gpu.py``), as ``Observation`` s for the simulator.

Unlike ``accel.sim.published`` (whole runs from other people's pages), these are single calls timed here: the CUDA
graph replay of one ``TorchBackend(device="cuda")`` call (compiled blocks, fused projections), batch 1, S tokens
scored per call with every logit returned, after 256 cached tokens, with a static cache of 1025 slots that every call
reads whole (``kv_slots``). Random weights of the named shapes; the median of 20 replays.

Source: accel ``benchmarks/gpu.py --compile`` on one NVIDIA H200 (141 GB HBM3e, driver 580.159.04), torch
2.11.0+cu130, 2026-11-28 (benchmarks/RESULTS.md, "GPU decode"). ``gpu_points()`` gives them; ``gpu_errors(hw)`` the
simulator's relative error on each. The catalog's ``h200`` entry is fitted on the float16 curves here
(``accel.sim.catalog.H200_MEASURED``); the bfloat16 and float32 curves are held out.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from accel.sim.calibration import predict_observations
from accel.sim.hardware import Hardware, hardware
from accel.sim.observations import Observation
from accel.sim.presets import preset

__all__ = [
    "FIT_BATCH_MODEL",
    "GPU_SOURCE",
    "GPU_TOKENS",
    "HELD_OUT_SOURCE",
    "batch_points",
    "fit_points",
    "gpu_errors",
    "gpu_points",
    "held_out_points",
]

GPU_SOURCE = "accel benchmarks/gpu.py --compile, NVIDIA H200, torch 2.11.0+cu130, 2026-11-28"

#: tokens per call of each measured curve
GPU_TOKENS = (1, 2, 4, 8, 16, 32, 64)

Dtype = Literal["fp16", "bf16", "fp32"]

#: (model preset, dtype) -> milliseconds per call at GPU_TOKENS
_H200_MS: dict[tuple[str, Dtype], tuple[float, ...]] = {
    ("llama-2-7b", "fp16"): (4.763, 5.084, 5.130, 5.202, 5.339, 5.597, 6.431),
    ("llama-2-7b", "bf16"): (4.831, 5.704, 5.876, 5.882, 5.594, 6.072, 6.545),
    ("tinyllama-1.1b", "fp16"): (1.660, 1.724, 1.753, 1.757, 1.848, 2.013, 2.333),
    ("tinyllama-1.1b", "bf16"): (2.076, 2.140, 2.041, 2.041, 2.131, 2.262, 2.573),
    ("tinyllama-1.1b", "fp32"): (2.597, 3.144, 3.613, 5.025, 5.380, 5.036, 6.133),
}

CONTEXT, SLOTS = 256, 1025  # cached tokens before each call; static cache slots read per call

#: Measured later the same day (same card and script, ``--compile --shapes llama-2-7b,llama-2-13b --dtypes float16
#: --batches 4,16,64``): the Llama-2-13B float16 curve at GPU_TOKENS, and AR steps (one token per sequence) at batch B
#: of both shapes, milliseconds per call. The 7B batched steps are in the ``h200`` entry's fit (they see the KV
#: cache's read rate: ``fit_points``); the 13B curve and batched steps are held out (``held_out_points``).
HELD_OUT_SOURCE = "accel benchmarks/gpu.py --compile --batches 4,16,64, NVIDIA H200, torch 2.11.0+cu130, 2026-11-28"
_H200_HELD_OUT_MS: dict[tuple[str, Dtype], tuple[float, ...]] = {
    ("llama-2-13b", "fp16"): (8.308, 8.923, 8.960, 9.131, 9.285, 9.641, 11.106),
}
_H200_BATCH_MS: dict[tuple[str, Dtype], dict[int, float]] = {
    ("llama-2-7b", "fp16"): {4: 5.822, 16: 8.342, 64: 19.251},
    ("llama-2-13b", "fp16"): {4: 10.169, 16: 13.980, 64: 31.063},
}


def gpu_points(dtype: Dtype | None = None) -> list[tuple[str, Observation]]:
    """``(device, observation)`` of every measured call (device: the catalog name, ``h200``), of one ``dtype`` or
    all; labels read ``"<model> <dtype> S=<tokens>"``."""
    out = []
    for (model, dt), ms in _H200_MS.items():
        if dtype is not None and dt != dtype:
            continue
        for s, t in zip(GPU_TOKENS, ms, strict=True):
            out.append(("h200", _call(model, dt, t, new_tokens=s, label=f"{model} {dt} S={s}")))
    return out


#: the model whose batched steps the ``h200`` entry is fitted on (the other's are held out)
FIT_BATCH_MODEL = "llama-2-7b"


def batch_points(model: str | None = None) -> list[tuple[str, Observation]]:
    """``(device, observation)`` of the batched AR steps (``_H200_BATCH_MS``) of ``model`` or of every model; labels
    read ``"<model> <dtype> B=<batch>"``."""
    out: list[tuple[str, Observation]] = []
    for (name, dt), by_batch in _H200_BATCH_MS.items():
        if model is None or name == model:
            out.extend(("h200", _call(name, dt, t, batch=b, label=f"{name} {dt} B={b}")) for b, t in by_batch.items())
    return out


def fit_points() -> list[tuple[str, Observation]]:
    """The calls the ``h200`` entry is fitted on (``accel.sim.catalog.H200_MEASURED``): the float16 curves and the
    ``FIT_BATCH_MODEL`` batched steps."""
    return gpu_points("fp16") + batch_points(FIT_BATCH_MODEL)


def held_out_points() -> list[tuple[str, Observation]]:
    """``(device, observation)`` of the later calls held out from the ``h200`` entry's fit: the Llama-2-13B float16
    curve (labels ``"<model> <dtype> S=<tokens>"``) and its batched steps (``"... B=<batch>"``)."""
    out = []
    for (model, dt), ms in _H200_HELD_OUT_MS.items():
        for s, t in zip(GPU_TOKENS, ms, strict=True):
            out.append(("h200", _call(model, dt, t, new_tokens=s, label=f"{model} {dt} S={s}")))
    held = sorted({model for model, _ in _H200_BATCH_MS} - {FIT_BATCH_MODEL})
    return out + [p for model in held for p in batch_points(model)]


def _call(model: str, dt: Dtype, ms: float, *, new_tokens: int = 1, batch: int = 1, label: str) -> Observation:
    """One measured call of ``ms`` milliseconds, in the setting every point here shares (CONTEXT, SLOTS)."""
    return Observation(
        model=preset(model),
        dtype=dt,
        batch_size=batch,
        new_tokens=new_tokens,
        num_logits=new_tokens,
        context_len=CONTEXT,
        kv_slots=SLOTS,
        seconds_per_call=ms / 1e3,
        label=label,
    )


def gpu_errors(hw: Hardware | str, points: list[tuple[str, Observation]] | None = None) -> dict[str, float]:
    """The simulator's relative error (predicted / measured - 1) on each point, by label."""
    pts = points if points is not None else gpu_points()
    obs = [o for _, o in pts]
    pred = predict_observations(hw if isinstance(hw, Hardware) else hardware(hw), obs)
    meas = np.array([o.measured_s for o in obs])
    return {o.label: float(e) for o, e in zip(obs, pred / meas - 1, strict=True)}
