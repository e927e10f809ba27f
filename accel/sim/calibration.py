"""Fit a device's efficiency terms to measured call times (nonlinear least squares, numpy only).

Minimizes sum_i (log t_pred_i - log t_meas_i)^2 — relative errors, so 1 ms and 100 ms calls weigh alike — with
Levenberg–Marquardt on a numerical Jacobian, from several starting exponents. Parameters live in an unconstrained
space: efficiencies through a logistic map into (0, 1), times and the multi-token penalty through exp, the
multi-token exponent through 2 * logistic into (0, 2). Fittable: ``bandwidth_efficiency``, ``compute_efficiency``,
``call_overhead_s``, ``multi_token_penalty``, ``multi_token_exponent``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import ConfigDict, field_validator, model_validator

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.formats import kv_bytes_per_element, normalize_format
from accel.sim.hardware import CalibrationReport, Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.models import ModelSpec, resolve_model
from accel.sim.roofline import format_arrays, resolve_devices, step_arrays

FITTABLE = (
    "bandwidth_efficiency",
    "compute_efficiency",
    "call_overhead_s",
    "multi_token_penalty",
    "multi_token_exponent",
)


class Observation(SimModel):
    """One measured model call: ``seconds_per_call``, or ``tokens_per_s`` of an AR run (= batch / seconds per call)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: ModelSpec
    weight_format: str = "fp16"
    kv_format: str = "fp16"
    batch_size: int = 1
    new_tokens: int = 1
    context_len: int = 0
    num_logits: int = 1
    devices: int | None = None
    seconds_per_call: float | None = None
    tokens_per_s: float | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> ModelSpec:
        return resolve_model(v)

    @model_validator(mode="after")
    def _check(self) -> Observation:
        normalize_format(self.weight_format)
        if (
            self.batch_size < 1
            or self.new_tokens < 1
            or self.context_len < 0
            or not 1 <= self.num_logits <= self.new_tokens
        ):
            raise ValueError("need batch_size >= 1, new_tokens >= 1, context_len >= 0, 1 <= num_logits <= new_tokens")
        if (self.seconds_per_call is None) == (self.tokens_per_s is None):
            raise ValueError("give exactly one of seconds_per_call, tokens_per_s")
        if not (self.seconds_per_call or self.tokens_per_s or 0) > 0:
            raise ValueError("the measurement must be > 0")
        if self.tokens_per_s is not None and self.new_tokens != 1:
            raise ValueError("tokens_per_s describes autoregressive runs (new_tokens = 1); give seconds_per_call")
        return self

    @property
    def seconds(self) -> float:
        return self.seconds_per_call if self.seconds_per_call is not None else self.batch_size / self.tokens_per_s


def _sigmoid(v: float) -> float:
    """1 / (1 + e^-v), kept inside [1e-6, 1]: an optimizer step far out (|v| in the hundreds) must not round a
    parameter that has to stay > 0 (an efficiency, the multi-token exponent) to exactly 0."""
    return float(np.clip(1.0 / (1.0 + np.exp(-np.clip(v, -60.0, 60.0))), 1e-6, 1.0))


def _to_hw(hw: Hardware, names: Sequence[str], x: np.ndarray) -> Hardware:
    vals = {}
    for name, v in zip(names, x, strict=True):
        if name in ("bandwidth_efficiency", "compute_efficiency"):
            vals[name] = _sigmoid(v)
        elif name == "multi_token_exponent":
            vals[name] = 2.0 * _sigmoid(v)
        else:
            vals[name] = float(np.exp(v))
    return hw.model_copy(update=vals)


def _from_hw(hw: Hardware, names: Sequence[str]) -> np.ndarray:
    out = []
    for name in names:
        v = float(getattr(hw, name))
        if name in ("bandwidth_efficiency", "compute_efficiency"):
            v = min(max(v, 1e-4), 1 - 1e-4)
            out.append(np.log(v / (1 - v)))
        elif name == "multi_token_exponent":
            v = min(max(v / 2, 1e-4), 1 - 1e-4)
            out.append(np.log(v / (1 - v)))
        else:
            out.append(np.log(max(v, 1e-7 if name == "call_overhead_s" else 1e-3)))
    return np.array(out)


def predict_observations(hw: Hardware, observations: Sequence[Observation]) -> np.ndarray:
    """Model seconds per call for each observation on ``hw``."""
    out = np.empty(len(observations))
    for i, o in enumerate(observations):
        bpe, mx, peak = format_arrays(hw, o.weight_format)
        out[i] = step_arrays(
            o.model,
            hw,
            weight_bpe=bpe,
            weight_mx=mx,
            peak_flops=peak,
            kv_bpe=kv_bytes_per_element(o.kv_format),
            batch=o.batch_size,
            new_tokens=o.new_tokens,
            context_len=o.context_len,
            num_logits=o.num_logits,
            devices=resolve_devices(hw, o.devices),
        )["time_s"]
    return out


def _lm(fun, x0: np.ndarray, iters: int = 100) -> tuple[np.ndarray, float]:
    x, lam = x0.copy(), 1e-3
    r = fun(x)
    cost = float(r @ r)
    for _ in range(iters):
        h = 1e-6
        J = np.stack([(fun(x + h * e) - r) / h for e in np.eye(len(x))], axis=1)
        A, g = J.T @ J, J.T @ r
        improved = False
        for _ in range(12):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            r_new = fun(x + step)
            c_new = float(r_new @ r_new)
            if np.isfinite(c_new) and c_new < cost:
                improved, rel = True, (cost - c_new) / max(cost, 1e-300)
                x, r, cost, lam = x + step, r_new, c_new, max(lam / 3, 1e-12)
                break
            lam *= 4
        if not improved or rel < 1e-14 or cost < 1e-28:
            break
    return x, cost


def calibrate(
    hardware: Hardware | str, observations: Sequence[Observation | dict], *, fit: Sequence[str] | None = None
) -> Hardware:
    """Fit efficiency terms of ``hardware`` to measured calls; returns a new ``Hardware`` whose ``calibration`` field
    holds the fitted values and relative residuals. Default ``fit``: bandwidth efficiency and call overhead, plus the
    multi-token penalty/exponent when the observations cover at least two distinct row counts B*S > 1."""
    hw = _hardware(hardware)
    obs = [o if isinstance(o, Observation) else Observation(**o) for o in observations]
    if not obs:
        raise SimError("calibrate needs at least one Observation")
    if fit is None:
        fit = ["bandwidth_efficiency", "call_overhead_s"]
        if len({o.batch_size * o.new_tokens for o in obs if o.batch_size * o.new_tokens > 1}) >= 2:
            fit += ["multi_token_penalty", "multi_token_exponent"]
    fit = list(fit)
    unknown = [f for f in fit if f not in FITTABLE]
    if unknown or not fit or len(set(fit)) != len(fit):
        raise SimError(f"fit must name distinct parameters among {', '.join(FITTABLE)}; got {fit}")
    if len(obs) < len(fit):
        raise SimError(f"{len(obs)} observations cannot determine {len(fit)} parameters {fit}")
    log_meas = np.log([o.seconds for o in obs])

    def residuals(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.log(predict_observations(_to_hw(hw, fit, x), obs)) - log_meas

    best: tuple[np.ndarray, float] | None = None
    # several starts: the logistic maps of the bounded terms go flat near their bounds, where a run can stall (seen:
    # bandwidth_efficiency pinned at 1.0 with a 25% misfit at S = 1 when the good fit had 0.67)
    starts = []
    for gamma in (0.4, 0.8, 1.3) if "multi_token_exponent" in fit else (None,):
        for eff in (None, 0.3, 0.6) if "bandwidth_efficiency" in fit else (None,):
            update = {k: v for k, v in (("multi_token_exponent", gamma), ("bandwidth_efficiency", eff)) if v}
            start = hw.model_copy(update=update)
            if "multi_token_penalty" in fit:
                start = start.model_copy(update={"multi_token_penalty": max(start.multi_token_penalty, 0.1)})
            starts.append(_from_hw(start, fit))
    for x0 in starts:
        x, cost = _lm(residuals, x0)
        if best is None or cost < best[1]:
            best = (x, cost)
    x, _ = best
    fitted = _to_hw(hw, fit, x)
    rel = np.exp(residuals(x)) - 1.0
    report = CalibrationReport(
        fitted={f: float(getattr(fitted, f)) for f in fit},
        residuals=[float(v) for v in rel],
        rms_relative_error=float(np.sqrt(np.mean(rel**2))),
        max_relative_error=float(np.max(np.abs(rel))),
        n_observations=len(obs),
    )
    return Hardware(
        **{
            **fitted.model_dump(),
            "calibration": report.model_dump(),
            "notes": (hw.notes + " " if hw.notes else "")
            + f"calibrated on {len(obs)} observations ("
            + ", ".join(f"{k}={v:.4g}" for k, v in report.fitted.items())
            + ")",
        }
    )
