"""Decode calls accel measured on a GPU itself (``benchmarks/gpu.py``), as ``Observation`` s for the simulator.

Unlike ``accel.sim.published`` (whole runs from other people's pages), these are single calls timed here: the CUDA
graph replay of one ``TorchBackend(device="cuda")`` call (compiled blocks, fused projections), batch 1, S tokens
scored per call with every logit returned, after 256 cached tokens, with a static cache of 1025 slots that every call
reads whole (``kv_slots``). Random weights of the named shapes; the median of 20 replays.

Source: accel ``benchmarks/gpu.py --compile`` on one NVIDIA H200 (141 GB HBM3e, driver 580.159.04), torch
2.11.0+cu130, 2026-11-28 (benchmarks/RESULTS.md, "GPU decode"). ``gpu_points()`` gives them; ``gpu_errors(hw)`` the
simulator's relative error on each.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from accel.sim.calibration import predict_observations
from accel.sim.hardware import Hardware, hardware
from accel.sim.observations import Observation
from accel.sim.presets import preset

__all__ = ["GPU_SOURCE", "GPU_TOKENS", "gpu_errors", "gpu_points"]

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


def gpu_points(dtype: Dtype | None = None) -> list[tuple[str, Observation]]:
    """``(device, observation)`` of every measured call (device: the catalog name, ``h200``), of one ``dtype`` or
    all; labels read ``"<model> <dtype> S=<tokens>"``."""
    out = []
    for (model, dt), ms in _H200_MS.items():
        if dtype is not None and dt != dtype:
            continue
        spec = preset(model)
        for s, t in zip(GPU_TOKENS, ms, strict=True):
            obs = Observation(
                model=spec,
                dtype=dt,
                new_tokens=s,
                num_logits=s,
                context_len=CONTEXT,
                kv_slots=SLOTS,
                seconds_per_call=t / 1e3,
                label=f"{model} {dt} S={s}",
            )
            out.append(("h200", obs))
    return out


def gpu_errors(hw: Hardware | str, points: list[tuple[str, Observation]] | None = None) -> dict[str, float]:
    """The simulator's relative error (predicted / measured - 1) on each point, by label."""
    pts = points if points is not None else gpu_points()
    obs = [o for _, o in pts]
    pred = predict_observations(hw if isinstance(hw, Hardware) else hardware(hw), obs)
    meas = np.array([o.measured_s for o in obs])
    return {o.label: float(e) for o, e in zip(obs, pred / meas - 1, strict=True)}
