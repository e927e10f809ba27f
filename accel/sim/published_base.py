"""The record of one published decode measurement (``PublishedPoint``), shared by ``published.py`` (the points and
the validation protocol) and ``published_added.py`` (the points added for issue 35)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from accel.sim._base import SimModel
from accel.sim.observations import RunObservation


class PublishedPoint(SimModel):
    """One published run: where it ran, what it measured, and where it was published."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str  # catalog name (its profile is calibrated per device)
    run: RunObservation
    where: str  # table / figure of the source
    source: str


def point(device: str, label: str, tokens_per_s: float, where: str, source: str, **run: Any) -> PublishedPoint:
    """A published run on ``device``: ``run`` are the ``RunObservation`` fields (model, formats, lengths, devices,
    cache layout, rate) that map the source's settings onto the simulator."""
    obs = RunObservation(tokens_per_s=tokens_per_s, label=label, **run)
    return PublishedPoint(device=device, run=obs, where=where, source=source)
