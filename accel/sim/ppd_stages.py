"""PPD with its two stages placed on hardware: the time per token of the decoder in ``accel.spd.ppd`` (docs/ppd.md).

The target is split at the exit layer ``e``: the *front* stage (layers ``[0, e)`` and the exit logits, ``k`` rows:
one per candidate) and the *back* stage (layers ``[e, L)``, the final norm and LM head, one row). A step produces
one token: the back stage finishes token ``t`` while the front stage runs the ``k`` candidates for ``t + 1``; on a
hit (probability ``p``) the next step starts at once, on a miss the front stage first runs the true token (a call of
the same shape, ``miss_s``). Per token, with the stage calls' times alone ``f`` (front), ``b`` (back), ``m`` (miss):

- ``same-device``: both stages on one device (or one tensor-parallel group) and its memory. Side by side they take
  ``P = max(b, f, (b + f) / s)`` where ``s`` (the *concurrency*, 1..2) is how many calls' worth of work two
  concurrent calls get done in the time of one: 1 when they saturate a shared resource (the memory bus of a
  memory-bound device), 2 on independent units. Without a measured ``s`` the roofline's: ``P = max(b, f, b' + f')``
  with ``x'`` the call's time less its fixed overheads (``StepTime.overhead_s``: launches, per-layer tails), which
  two concurrent calls can hide behind each other's work while the memory and compute they use add up.
  ``E[t] = host + P + (1 - p) m``.
- ``per-stage``: each stage on its own device(s) with its own memory; the front's ``k`` hidden rows go to the back's
  device during the step (``x_k``: link latency + bytes / link bandwidth) and the back's token returns to the front
  (one link latency ``l``): ``P = max(b, f + x_k) + l`` and ``E[t] = host + P + (1 - p) (m + x_1)``.
- ``paper``: Theorem 4.1 (``accel.sim.ppd``): the candidates on otherwise idle units, ``L - (L - dbar) p`` layer
  times per token.

Exact: the formulas given the stage times. Approximate: the stage times (the roofline), the overlap (``max`` and the
concurrency), the exit head's adapter (not priced: a few MB at most) and the steady state (every token is a step).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.hardware import Hardware
from accel.sim.models import ModelSpec
from accel.sim.roofline import ACT_BYTES, StepTime

__all__ = ["PPDPlacement", "PPDStageTimes", "ppd_step_time", "transfer_s"]

PlacementKind = Literal["paper", "same-device", "per-stage"]


class PPDPlacement(SimModel):
    """Where PPD's stages run. ``kind``: ``"paper"`` (Theorem 4.1, idle units), ``"same-device"`` (both stages on
    the ``devices`` of the deployment) or ``"per-stage"`` (each stage on its own ``devices``, so twice as many in
    all). ``concurrency``: the measured ``s`` of two concurrent calls on one device (1..2; ``None``: the roofline's,
    see the module docstring; same-device only). ``host_s``: host seconds per token outside the model calls (the
    same for AR and PPD)."""

    kind: PlacementKind = "paper"
    concurrency: float | None = Field(default=None, ge=1.0, le=2.0)
    host_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class PPDStageTimes(SimModel):
    """Seconds of PPD's calls, each alone on its device(s): the front stage's speculation call (``k`` rows) and the
    call after a miss, the back stage's call; ``*_busy_s`` the part of a call that uses the shared device (its time
    less fixed overheads; ``None``: all of it); ``transfer_k_s`` / ``transfer_1_s`` the hand-off of ``k`` / one
    hidden rows between devices and ``link_latency_s`` the token's way back (per-stage placements; 0 otherwise)."""

    front_s: float = Field(ge=0.0, allow_inf_nan=False)
    back_s: float = Field(ge=0.0, allow_inf_nan=False)
    miss_s: float = Field(ge=0.0, allow_inf_nan=False)
    front_busy_s: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    back_busy_s: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    transfer_k_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    transfer_1_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    link_latency_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    @classmethod
    def from_roofline(cls, front: StepTime, back: StepTime, *, split: bool, hw: Hardware, hidden: int, k: int):
        """Stage times from the roofline's calls ``front`` (k rows) and ``back`` (one row); ``split``: per-stage
        placement (transfers over ``hw``'s links of ``hidden``-wide fp16 rows)."""
        return cls(
            front_s=front.time_s,
            back_s=back.time_s,
            miss_s=front.time_s,  # the decoder runs the true token on every row: the speculation call's shape
            front_busy_s=front.time_s - front.overhead_s,
            back_busy_s=back.time_s - back.overhead_s,
            transfer_k_s=transfer_s(hw, k, hidden) if split else 0.0,
            transfer_1_s=transfer_s(hw, 1, hidden) if split else 0.0,
            link_latency_s=hw.link_latency_s if split else 0.0,
        )


def transfer_s(hw: Hardware, rows: int, hidden: int) -> float:
    """Seconds to send ``rows`` hidden states of ``hidden`` fp16 values to another device: one link latency plus the
    bytes over ``hw.link_bandwidth_bytes_per_s``."""
    return hw.link_latency_s + rows * hidden * ACT_BYTES / hw.link_bandwidth_bytes_per_s


def ppd_step_time(times: PPDStageTimes, p: float, placement: PPDPlacement) -> tuple[float, float]:
    """``(P, E[t])``: seconds of the two stages side by side, and the expected seconds per token (host included)
    at match rate ``p`` for a ``same-device`` or ``per-stage`` placement (module docstring)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise SimError(f"p (match rate) must be a number in [0, 1], got {p!r}")
    b, f, t = times.back_s, times.front_s, times
    if placement.kind == "same-device":
        if placement.concurrency is not None:
            par = max(b, f, (b + f) / placement.concurrency)
        else:
            busy = (b if t.back_busy_s is None else t.back_busy_s) + (f if t.front_busy_s is None else t.front_busy_s)
            par = max(b, f, busy)
        return par, placement.host_s + par + (1.0 - p) * t.miss_s
    if placement.kind == "per-stage":
        if placement.concurrency is not None:
            raise SimError("concurrency is a same-device term: per-stage placements do not share a device")
        par = max(b, f + t.transfer_k_s) + t.link_latency_s
        return par, placement.host_s + par + (1.0 - p) * (t.miss_s + t.transfer_1_s)
    raise SimError(f"ppd_step_time prices same-device and per-stage placements, not {placement.kind!r}")


def stage_specs(spec: ModelSpec, exit_layer: int) -> tuple[ModelSpec, ModelSpec]:
    """The front ``[0, e)`` and back ``[e, L)`` stages of ``spec`` as models of ``e`` and ``L - e`` layers (each
    with the LM head: the exit logits and the final logits)."""
    d = spec.n_layers
    if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer < d:
        raise SimError(f"the exit layer must be an integer in [1, {d - 1}] (the model has {d}), got {exit_layer!r}")
    return spec.model_copy(update={"n_layers": exit_layer}), spec.model_copy(update={"n_layers": d - exit_layer})
