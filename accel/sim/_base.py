"""Shared pydantic base, the simulator's warning class, and strict checks of numbers that size memory or time.

Validation failures surface as ``SimError`` naming the field, not as pydantic's error. Every number that sizes an
array or a loop (K, tree nodes, batch, context, devices, sweep grids) has an upper bound checked *before* anything is
allocated; the message states the limit. Booleans are not integers here (``k=True`` is an error, not K = 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from accel.errors import SimError

# upper bounds (inclusive) of the numbers that size arrays or loops; generous for planning, small enough to be safe
MAX_K = 64  # draft tokens per chain round
MAX_TREE_NODES = 1024  # draft tokens in one token tree
MAX_BATCH = 1 << 20  # sequences per call
MAX_TOKENS = 1 << 24  # prompt + generation (and any context length), tokens
MAX_DEVICES = 4096  # tensor-parallel devices
MAX_SWEEP_POINTS = 5_000_000  # configurations in one sweep grid (each result array holds this many float64)
MAX_OBSERVATIONS = 10_000  # observations in one calibration


class SimWarning(UserWarning):
    """Warnings of ``accel.sim``: a calibration term at its bound, large residuals, an assumption the input forced."""


def _message(cls_name: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "(model)"
        parts.append(f"{loc}: {err.get('msg', '')} (got {err.get('input')!r})"[:300])
    return f"invalid {cls_name}: " + "; ".join(parts)


class SimModel(BaseModel):
    """``BaseModel`` whose constructor raises ``SimError`` on bad input. Strict types: a bool field takes only
    ``True``/``False`` (never ``"false"`` or ``1``), an int field no bool or float, a float field no string; numpy
    scalars are accepted as the Python scalars they stand for."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _numpy_scalars(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v.item() if isinstance(v, np.generic) else v for k, v in data.items()}
        return data

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            for err in exc.errors():  # a check of ours raised SimError inside a validator: its message says it all
                inner = (err.get("ctx") or {}).get("error")
                if isinstance(inner, SimError):
                    raise SimError(str(inner)) from None
            raise SimError(_message(type(self).__name__, exc)) from None


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an ``int`` in [lo, hi]; ``SimError`` naming ``name`` and the range otherwise (bools rejected)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise SimError(f"{name} must be an integer in [{lo}, {hi}], got {value!r} ({type(value).__name__})")
    if not lo <= int(value) <= hi:
        raise SimError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def check_seconds(name: str, value: Any) -> float:
    """A finite number of seconds >= 0 (``inf``/``nan``/negative/bool rejected)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SimError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if not math.isfinite(float(value)) or value < 0:
        raise SimError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def check_int_array(name: str, value: Any, lo: int, hi: int) -> np.ndarray:
    """A non-empty 1-d integer array with every element in [lo, hi] (bools rejected), as int64."""
    a = np.atleast_1d(np.asarray(value))
    if a.dtype == bool or not np.issubdtype(a.dtype, np.number) or a.ndim != 1 or a.size == 0:
        raise SimError(f"{name} must be integers in [{lo}, {hi}], got {value!r}")
    if np.any(~np.isfinite(a)) or np.any(a != np.round(a)) or np.any(a < lo) or np.any(a > hi):
        raise SimError(f"{name} must be integers in [{lo}, {hi}], got {value!r}")
    return a.astype(np.int64)
