"""Predictive Pipelined Decoding (PPD), Theorem 4.1 of the seed paper (docs/reference.md §4).

d layers; at layer dbar (d/2 <= dbar <= d) an early prediction proposes top-k candidates and k sub-processes start the
next token from layer 1 in parallel; with probability p one matches the final token and its head start saves
(d - dbar) layers. In time units of one layer (exact, Theorem 4.1):

    E[latency] = d l - (d - dbar)(l - 1) p          E[compute] = E[latency] + k (d - dbar) l

Approximations (dbar = d/2, l >> 1): latency per token ~ d (1 - p/2); average busy units ~ (k + 2 - p) / (2 - p).
General l >> 1 forms used here: latency per token ~ d - (d - dbar) p,
busy ~ (d + k(d-dbar) - (d-dbar) p) / (d - (d-dbar) p).

Mapping onto a device (``placement="paper"``, the default): one unit = one decoder layer of a decode step (S = 1)
from the roofline; per token the per-call costs (LM head, call overhead, all-reduces outside layers) are added once.
Assumption (the paper's): the k sub-processes run on otherwise idle compute units and do not slow the main one;
``busy_units`` says how many layer-pipelines that takes, i.e. whether the device actually has the parallel
resources.

Placements that price where the stages run (``accel.sim.ppd_stages``): ``"same-device"`` (both stages share one
device's memory and compute: the contention-aware term) and ``"per-stage"`` (one device, or tensor-parallel group,
per stage, with the hidden-state hand-off over the links); ``dbar`` is then the exit layer ``e`` (any of 1..d-1),
the stage calls come from the roofline, and the Theorem 4.1 fields keep the paper's figure for ``max(e, d - e)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, cast

import numpy as np

from accel._legacy import Replaced, legacy_keywords
from accel.errors import SimError
from accel.sim._base import MAX_K, MAX_TOKENS, SimModel
from accel.sim.hardware import Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.hf_config import resolve_model
from accel.sim.models import ModelSpec
from accel.sim.ppd_stages import PlacementKind, PPDPlacement, PPDStageTimes, ppd_step_time, stage_specs
from accel.sim.roofline import CallShape, StepTime, resolve_devices, step_time


@dataclass(frozen=True)
class PPDRun:
    """What PPD decodes (Theorem 4.1's inputs and the steps priced): ``gen_len`` tokens per sequence (the theorem's
    ``l``), early prediction at layer ``dbar`` (``[d/2, d]`` for the paper's placement; the exit layer ``e`` in
    ``1..d-1`` for a stage placement), ``k`` candidates, match probability ``p``; every decode step priced after
    ``context_len`` cached tokens (tokens) for ``batch_size`` sequences. Checked by :func:`predict_ppd`."""

    dbar: float
    k: int
    p: float
    gen_len: int
    context_len: int = 128
    batch_size: int = 1


_PPD_LEGACY = (Replaced("run", PPDRun, {f.name: f.name for f in fields(PPDRun)}),)


def _check(d: Any, dbar: Any, k: Any, p: Any, l: Any) -> None:  # noqa: E741
    if isinstance(d, bool) or not (isinstance(d, (int, np.integer)) and d >= 1):
        raise SimError(f"d (layers) must be an integer >= 1, got {d!r}")
    if isinstance(dbar, bool) or not (isinstance(dbar, (int, float, np.number)) and d / 2 <= dbar <= d):
        raise SimError(f"dbar must be in [d/2, d] = [{d / 2}, {d}] (Theorem 4.1 assumption), got {dbar!r}")
    if isinstance(k, bool) or not (isinstance(k, (int, np.integer)) and 1 <= k <= MAX_K):
        raise SimError(f"k (candidates) must be an integer in [1, {MAX_K}], got {k!r}")
    if isinstance(p, bool) or not (isinstance(p, (int, float, np.number)) and 0.0 <= p <= 1.0):
        raise SimError(f"p (match probability) must be in [0, 1], got {p!r}")
    if isinstance(l, bool) or not (isinstance(l, (int, np.integer)) and 1 <= l <= MAX_TOKENS):
        raise SimError(f"l (tokens) must be an integer in [1, {MAX_TOKENS}], got {l!r}")


def ppd_expected_latency(d: int, dbar: float, p: float, l: int) -> float:  # noqa: E741
    """Exact E[latency] in layer-time units (Theorem 4.1)."""
    _check(d, dbar, 1, p, l)
    return d * l - (d - dbar) * (l - 1) * p


def ppd_expected_compute(d: int, dbar: float, k: int, p: float, l: int) -> float:  # noqa: E741
    """Exact E[compute] in layer-time units (Theorem 4.1)."""
    _check(d, dbar, k, p, l)
    return ppd_expected_latency(d, dbar, p, l) + k * (d - dbar) * l


class PPDResult(SimModel):
    """PPD prediction. ``*_units`` are in layer times (Theorem 4.1); seconds come from the roofline on ``hardware``
    (``latency_s``, ``speedup`` and the per-token times follow ``placement``). Stage placements add the stage calls'
    times (``stage_times``), the two stages side by side (``parallel_s``) and, per-stage, how much faster AR gets in
    tensor parallel over both stages' devices (``tensor_parallel_speedup``: PPD's rival for the same devices)."""

    model: str
    hardware: str
    d: int
    dbar: float
    k: int
    p: float
    gen_len: int
    expected_latency_units: float
    expected_compute_units: float
    approx_latency_units_per_token: float
    approx_busy_units: float
    layer_s: float
    per_token_fixed_s: float
    latency_s: float
    ar_latency_s: float
    speedup: float
    tokens_per_s: float
    placement: str = "paper"
    devices: int = 1
    per_token_s: float = 0.0
    ar_per_token_s: float = 0.0
    stage_times: PPDStageTimes | None = None
    parallel_s: float | None = None
    tensor_parallel_speedup: float | None = None


def _check_placement(spec: ModelSpec, place: PPDPlacement, run: PPDRun) -> tuple[ModelSpec, ModelSpec] | None:
    """Check the arguments for ``place``; the (front, back) stage specs of a stage placement, None for the paper's."""
    d, dbar = spec.n_layers, run.dbar
    if place.kind != "paper":
        if run.batch_size != 1:
            raise SimError(f"stage placements price PPD at batch 1 (the candidates are the rows); got {run.batch_size}")
        front_spec, back_spec = stage_specs(spec, dbar)  # type: ignore[arg-type]  # checked there: an int
        _check(d, max(dbar, d - dbar), run.k, run.p, run.gen_len)
        return front_spec, back_spec
    _check(d, dbar, run.k, run.p, run.gen_len)
    return None


def _step_fn(
    hw: Hardware, weight_format: str | None, kv_format: str, context_len: int, batch_size: int, n: int
) -> Callable[..., StepTime]:
    """The roofline step time of a spec at ``rows`` rows on ``on`` devices (defaults: the batch and ``n``)."""

    def t(s: ModelSpec, rows: int = batch_size, on: int = n):
        call = CallShape(batch_size=rows, context_len=context_len)
        return step_time(s, hw, call, weight_format=weight_format, kv_format=kv_format, devices=on)

    return t


def _layer_costs(t: Callable[..., StepTime], spec: ModelSpec) -> tuple[float, float, float]:
    """(one layer's seconds, the per-call fixed seconds, the full call's seconds) of a decode step."""
    one = t(spec.model_copy(update={"n_layers": 1})).time_s
    two = t(spec.model_copy(update={"n_layers": 2})).time_s
    full = t(spec).time_s
    layer_s = two - one  # exact: every layer costs the same
    fixed = full - spec.n_layers * layer_s
    return layer_s, fixed, full


def _theorem_fields(d: int, run: PPDRun, theorem_dbar: float) -> dict[str, Any]:
    """The Theorem 4.1 fields of a ``PPDResult`` (layer-time units) for ``theorem_dbar``."""
    dbar, k, p, gen_len = run.dbar, run.k, run.p, run.gen_len
    lat_u = ppd_expected_latency(d, theorem_dbar, p, gen_len)
    comp_u = ppd_expected_compute(d, theorem_dbar, k, p, gen_len)
    saved = (d - theorem_dbar) * p
    return dict(
        d=d,
        dbar=float(dbar),
        k=k,
        p=float(p),
        gen_len=gen_len,
        expected_latency_units=lat_u,
        expected_compute_units=comp_u,
        approx_latency_units_per_token=d - saved,
        approx_busy_units=(d + k * (d - theorem_dbar) - saved) / (d - saved),
    )


def _stage_times(
    t: Callable[..., StepTime],
    stages: tuple[ModelSpec, ModelSpec],
    spec: ModelSpec,
    hw: Hardware,
    place: PPDPlacement,
    k: int,
) -> PPDStageTimes:
    """The stage calls' times from the roofline: the front stage at ``k`` rows, the back stage at one."""
    front_spec, back_spec = stages
    split = place.kind == "per-stage"
    return PPDStageTimes.from_roofline(
        t(front_spec, rows=k), t(back_spec, rows=1), split=split, hw=hw, hidden=spec.d_model, k=k
    )


def _stage_latency(
    t: Callable[..., StepTime],
    times: PPDStageTimes,
    spec: ModelSpec,
    place: PPDPlacement,
    p: float,
    gen_len: int,
    ar_tok: float,
    n: int,
) -> tuple[float, dict[str, Any]]:
    """Latency (s) of ``gen_len`` tokens on a stage placement and its extra ``PPDResult`` fields."""
    split = place.kind == "per-stage"
    par, per_tok = ppd_step_time(times, p, place)
    latency_s = gen_len * per_tok
    extra: dict[str, Any] = {"stage_times": times, "parallel_s": par}
    if split:  # AR in tensor parallel over both stages' devices
        extra["tensor_parallel_speedup"] = ar_tok / (t(spec, on=2 * n).time_s + place.host_s)
    return latency_s, extra


def predict_ppd(
    model: ModelSpec | str | dict,
    hardware: Hardware | str,
    run: PPDRun | None = None,
    *,
    weight_format: str | None = None,
    kv_format: str = "fp16",
    devices: int | None = None,
    placement: PPDPlacement | str = "paper",
    **legacy: Any,
) -> PPDResult:
    """Expected PPD latency (s) of ``run`` (a ``PPDRun``: ``gen_len`` tokens, ``dbar``, ``k``, ``p``) vs
    autoregressive decoding on ``hardware``. ``weight_format`` defaults to the model's dtype; ``devices``: tensor
    parallel devices (per stage for ``"per-stage"``; default: the card's). ``placement`` (a ``PPDPlacement`` or its
    kind): ``"paper"`` prices Theorem 4.1 with ``dbar`` in [d/2, d]; ``"same-device"`` / ``"per-stage"`` price the
    two-stage decoder with exit layer ``e = dbar`` (batch 1; module docstrings). Deprecated: ``dbar``, ``k``, ``p``,
    ``gen_len``, ``context_len``, ``batch_size`` as keywords (use ``run=PPDRun(...)``)."""
    run = legacy_keywords("predict_ppd", legacy, _PPD_LEGACY, {"run": run})[0]["run"]
    if run is None:
        raise TypeError("predict_ppd() needs run=PPDRun(dbar=..., k=..., p=..., gen_len=...)")
    spec, hw = resolve_model(model), _hardware(hardware)
    place = placement if isinstance(placement, PPDPlacement) else PPDPlacement(kind=cast(PlacementKind, placement))
    d, gen_len = spec.n_layers, run.gen_len
    n = resolve_devices(hw, devices)
    stages = _check_placement(spec, place, run)
    t = _step_fn(hw, weight_format, kv_format, run.context_len, run.batch_size, n)
    layer_s, fixed, full = _layer_costs(t, spec)
    theorem = _theorem_fields(d, run, run.dbar if place.kind == "paper" else max(run.dbar, d - run.dbar))
    ar_tok = full + place.host_s
    extra: dict[str, Any] = {}
    if stages is None:  # place.kind == "paper"
        latency_s = theorem["expected_latency_units"] * layer_s + gen_len * (fixed + place.host_s)
    else:
        times = _stage_times(t, stages, spec, hw, place, run.k)
        latency_s, extra = _stage_latency(t, times, spec, place, run.p, gen_len, ar_tok, n)
    ar_s = gen_len * ar_tok
    return PPDResult(
        model=spec.name,
        hardware=hw.name,
        **theorem,
        layer_s=layer_s,
        per_token_fixed_s=fixed,
        latency_s=latency_s,
        ar_latency_s=ar_s,
        speedup=ar_s / latency_s,
        tokens_per_s=run.batch_size * gen_len / latency_s,
        placement=place.kind,
        devices=n,
        per_token_s=latency_s / gen_len,
        ar_per_token_s=ar_tok,
        **extra,
    )
