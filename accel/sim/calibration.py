"""Fit a device's efficiency terms to measurements (nonlinear least squares, numpy only).

Minimizes sum_i (log t_pred_i - log t_meas_i)^2 - relative errors, so 1 ms and 100 ms weigh alike - with
Levenberg-Marquardt on a numerical Jacobian, from several starts. Parameters live in an unconstrained space:
efficiencies through a logistic map into (0, 1), the multi-token exponent through 2 * logistic into (0, 2), fixed
times as scale * x with x >= 0 (steps are projected onto that bound, so 0 - no such cost - is reached exactly),
rates, link bandwidth and the multi-token penalty through exp.

Which terms: ``fit=None`` chooses the terms the observations can determine - in the order of ``PRIORITY`` (the
bandwidth efficiency first, then each observed compressed format's decompression rate, the link latencies of
multi-device observations, the per-layer and per-call costs, the multi-token curve, compute efficiency), a term is
taken when its column of the Jacobian raises the rank of the chosen set, and never more terms than observations:
one observation fits one term. The result's ``calibration`` report holds the fitted values, the residual of every
observation, the terms left at their prior values, and warnings - also raised as ``SimWarning`` - when a term ends
at its bound or residuals stay above 10 %.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from accel.errors import SimError
from accel.sim._base import MAX_OBSERVATIONS, SimWarning
from accel.sim.formats import decompress_key
from accel.sim.hardware import CalibrationReport, Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.observations import AnyObservation, Observation, RunObservation, calls_s

SCALAR_TERMS = (
    "bandwidth_efficiency",
    "compute_efficiency",
    "call_overhead_s",
    "layer_overhead_s",
    "multi_token_penalty",
    "multi_token_exponent",
    "link_latency_s",
    "allreduce_latency_s",
    "link_bandwidth_bytes_per_s",
)
FITTABLE = (*SCALAR_TERMS, "decompress_elements_per_s:<format>")
PRIORITY = (
    "bandwidth_efficiency",
    "decompress",  # one term per compressed format observed
    "link_latency_s",
    "call_overhead_s",
    "layer_overhead_s",
    "multi_token_penalty",
    "multi_token_exponent",
    "compute_efficiency",
    "allreduce_latency_s",
)
RESIDUAL_WARN = 0.10
_TIME_SCALE = {"call_overhead_s": 1e-4, "layer_overhead_s": 1e-5, "link_latency_s": 1e-6, "allreduce_latency_s": 1e-6}
# where the Jacobian that decides identifiability is taken: a term at 0 in the prior still shows its effect there
_NOMINAL = {"call_overhead_s": 1e-4, "layer_overhead_s": 1e-5, "link_latency_s": 1e-6, "allreduce_latency_s": 1e-6,
            "multi_token_penalty": 0.1}  # fmt: skip


def _sigmoid(v: float) -> float:
    """1 / (1 + e^-v), kept inside [1e-6, 1]: a far optimizer step must not round a positive term to exactly 0."""
    return float(np.clip(1.0 / (1.0 + np.exp(-np.clip(v, -60.0, 60.0))), 1e-6, 1.0))


def _get(hw: Hardware, name: str) -> float:
    if name.startswith("decompress_elements_per_s:"):
        return hw.decompress_elements_per_s.get(name.split(":", 1)[1], 1e12)
    return float(getattr(hw, name))


def _to_hw(hw: Hardware, names: Sequence[str], x: np.ndarray) -> Hardware:
    vals: dict[str, Any] = {}
    rates = dict(hw.decompress_elements_per_s)
    for name, v in zip(names, x, strict=True):
        if name in ("bandwidth_efficiency", "compute_efficiency"):
            vals[name] = _sigmoid(v)
        elif name == "multi_token_exponent":
            vals[name] = 2.0 * _sigmoid(v)
        elif name in _TIME_SCALE:
            vals[name] = _TIME_SCALE[name] * max(float(v), 0.0)
        elif name.startswith("decompress_elements_per_s:"):
            rates[name.split(":", 1)[1]] = float(np.exp(np.clip(v, -200, 200)))
        else:
            vals[name] = float(np.exp(np.clip(v, -200, 200)))
    vals["decompress_elements_per_s"] = rates
    return hw.model_copy(update=vals)


def _from_hw(hw: Hardware, names: Sequence[str]) -> np.ndarray:
    out = []
    for name in names:
        v = _get(hw, name)
        if name in ("bandwidth_efficiency", "compute_efficiency"):
            v = min(max(v, 1e-4), 1 - 1e-4)
            out.append(np.log(v / (1 - v)))
        elif name == "multi_token_exponent":
            v = min(max(v / 2, 1e-4), 1 - 1e-4)
            out.append(np.log(v / (1 - v)))
        elif name in _TIME_SCALE:
            out.append(v / _TIME_SCALE[name])
        else:
            out.append(np.log(max(v, 1e-3)))
    return np.array(out)


class _Problem:
    """Observations with their measured seconds and a prediction function on any ``Hardware``."""

    def __init__(self, hw: Hardware, observations: Sequence[AnyObservation | dict[str, Any]]) -> None:
        if not observations:
            raise SimError("calibrate needs at least one observation")
        if len(observations) > MAX_OBSERVATIONS:
            raise SimError(f"calibrate takes at most {MAX_OBSERVATIONS} observations, got {len(observations)}")
        self.obs: list[AnyObservation] = [_as_observation(o) for o in observations]
        self.deps = [o.deployment(hw) if isinstance(o, RunObservation) else None for o in self.obs]
        self.log_meas = np.log([o.measured_s for o in self.obs])
        groups: dict[tuple[Any, ...], list[int]] = {}  # calls of one model and setting: one vectorized evaluation
        for i, o in enumerate(self.obs):
            if isinstance(o, Observation):
                key = (id(o.model), o.weight_format or o.model.dtype, o.kv_format, o.devices, o.kv_slots is None)
                groups.setdefault(key, []).append(i)
        self.groups = list(groups.values())

    def predict(self, hw: Hardware) -> np.ndarray:
        out = np.empty(len(self.obs))
        for idx in self.groups:
            out[idx] = calls_s(hw, [self.obs[i] for i in idx])  # type: ignore[misc]
        for i, (o, d) in enumerate(zip(self.obs, self.deps, strict=True)):
            if isinstance(o, RunObservation):
                out[i] = o.predicted_s(hw, d)
        return out

    def residuals(self, hw: Hardware, names: Sequence[str], x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return np.log(self.predict(_to_hw(hw, names, x))) - self.log_meas


def _as_observation(o: Any) -> AnyObservation:
    if isinstance(o, (Observation, RunObservation)):
        return o
    if isinstance(o, dict):
        return RunObservation(**o) if "prompt_len" in o or "gen_len" in o else Observation(**o)
    raise SimError(f"observations must be Observation, RunObservation or dicts, got {type(o).__name__}")


def candidate_terms(hw: Hardware, obs: Sequence[AnyObservation]) -> list[str]:
    """Terms in ``PRIORITY`` order that could matter for these observations."""
    keys = {decompress_key(o.weight_format or o.model.dtype) for o in obs}
    fmts = sorted(k for k in keys if k is not None)
    out = []
    for term in PRIORITY:
        if term == "decompress":
            out += [f"decompress_elements_per_s:{f}" for f in fmts]
        else:
            out.append(term)
    return out


def choose_terms(hw: Hardware, problem: _Problem) -> list[str]:
    """The terms the observations determine: greedy in priority order, each raising the Jacobian's rank."""
    cands = candidate_terms(hw, problem.obs)
    hw = hw.model_copy(update={k: max(float(getattr(hw, k)), v) for k, v in _NOMINAL.items()})
    x0 = _from_hw(hw, cands)
    r0 = problem.residuals(hw, cands, x0)
    cols = []
    for i in range(len(cands)):
        step = np.zeros_like(x0)
        step[i] = 1e-3
        cols.append((problem.residuals(hw, cands, x0 + step) - r0) / 1e-3)
    J = np.stack(cols, axis=1)
    chosen: list[int] = []
    for i in range(len(cands)):
        if len(chosen) >= len(problem.obs):
            break
        if not np.all(np.isfinite(J[:, i])) or np.linalg.norm(J[:, i]) < 1e-4:
            continue  # the observations do not depend on this term
        sub = J[:, [*chosen, i]]
        sub = sub / np.linalg.norm(sub, axis=0)
        s = np.linalg.svd(sub, compute_uv=False)
        if s[-1] > 1e-3 * s[0]:
            chosen.append(i)
    if not chosen:
        raise SimError("no term of the hardware profile changes the predictions of these observations")
    return [cands[i] for i in chosen]


def _lm(fun: Any, x0: np.ndarray, lo: np.ndarray, iters: int = 100) -> tuple[np.ndarray, float]:
    """Levenberg-Marquardt with steps projected onto ``x >= lo``."""
    x, lam = np.maximum(x0, lo), 1e-3
    r = fun(x)
    cost = float(r @ r)
    for _ in range(iters):
        h = 1e-6
        J = np.stack([(fun(x + h * e) - r) / h for e in np.eye(len(x))], axis=1)
        A, g = J.T @ J, J.T @ r
        free = ~((x <= lo) & (g > 0))  # terms held at their bound by the gradient stay out of the step
        A, g = A[np.ix_(free, free)], g[free]
        improved, rel = False, 0.0
        for _ in range(12):
            step = np.zeros_like(x)
            step[free] = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            step = np.maximum(x + step, lo) - x
            r_new = fun(x + step)
            c_new = float(r_new @ r_new)
            if np.isfinite(c_new) and c_new < cost:
                improved, rel = True, (cost - c_new) / max(cost, 1e-300)
                x, r, cost, lam = x + step, r_new, c_new, max(lam / 3, 1e-12)
                break
            lam *= 4
        if not improved or rel < 1e-10 or cost < 1e-28:
            break
    return x, cost


def _starts(hw: Hardware, fit: list[str]) -> list[np.ndarray]:
    # several starts: the logistic maps of the bounded terms go flat near their bounds, where a run can stall
    starts = []
    for gamma in (0.4, 0.8, 1.3) if "multi_token_exponent" in fit else (None,):
        for eff in (None, 0.3, 0.6) if "bandwidth_efficiency" in fit else (None,):
            update = {k: v for k, v in (("multi_token_exponent", gamma), ("bandwidth_efficiency", eff)) if v}
            start = hw.model_copy(update=update)
            if "multi_token_penalty" in fit:
                start = start.model_copy(update={"multi_token_penalty": max(start.multi_token_penalty, 0.1)})
            starts.append(_from_hw(start, fit))
    return starts


def _bound_warnings(fitted: Hardware, fit: list[str], x: np.ndarray, rel: np.ndarray) -> list[str]:
    out = []
    for name, v in zip(fit, x, strict=True):
        val = _get(fitted, name)
        if name in ("bandwidth_efficiency", "compute_efficiency"):
            at_bound = val >= 0.999 or val <= 1e-3
        elif name == "multi_token_exponent":
            at_bound = val >= 1.998 or val <= 2e-3
        elif name in _TIME_SCALE:
            at_bound = val > 10.0  # a fixed cost of many seconds (one at 0 is a fine answer: no such cost)
        else:  # rates, link bandwidth, the multi-token penalty
            at_bound = abs(v) > 60 or (name == "multi_token_penalty" and val < 1e-6)
        if at_bound:
            out.append(f"{name} ended at its bound ({val:.4g}): the observations ask for more than this term can give")
    worst = float(np.max(np.abs(rel)))
    if worst > RESIDUAL_WARN:
        i = int(np.argmax(np.abs(rel)))
        out.append(
            f"calibration leaves a residual of {rel[i] * 100:+.1f}% (observation {i}); the fitted terms "
            f"{fit} cannot explain all observations"
        )
    return out


def calibrate(
    hardware: Hardware | str,
    observations: Sequence[AnyObservation | dict[str, Any]],
    *,
    fit: Sequence[str] | None = None,
) -> Hardware:
    """Fit terms of ``hardware`` to measured calls and runs; returns a new ``Hardware`` whose ``calibration`` report
    holds the fitted values, the relative residual of each observation, the terms not fitted and any warning
    (module docstring for which terms ``fit=None`` chooses). ``fit`` names terms explicitly (``FITTABLE``; a
    decompression rate is ``"decompress_elements_per_s:<format>"``)."""
    hw = _hardware(hardware)
    problem = _Problem(hw, observations)
    if fit is None:
        fit = choose_terms(hw, problem)
    fit = list(fit)
    bad = [f for f in fit if f not in SCALAR_TERMS and not f.startswith("decompress_elements_per_s:")]
    if bad or not fit or len(set(fit)) != len(fit):
        raise SimError(f"fit must name distinct terms among {', '.join(FITTABLE)}; got {fit}")
    for f in fit:
        if f.startswith("decompress_elements_per_s:") and decompress_key(f.split(":", 1)[1]) is None:
            raise SimError(f"{f}: a format computed as stored has no decompression rate")
    fit = [f if not f.startswith("decompress") else f"decompress_elements_per_s:{decompress_key(f.split(':', 1)[1])}"
           for f in fit]  # fmt: skip
    if len(problem.obs) < len(fit):
        raise SimError(f"{len(problem.obs)} observations cannot determine {len(fit)} terms {fit}")
    lo = np.array([0.0 if f in _TIME_SCALE else -np.inf for f in fit])
    best: tuple[np.ndarray, float] | None = None
    for x0 in _starts(hw, fit):
        x, cost = _lm(lambda v: problem.residuals(hw, fit, v), x0, lo)
        if best is None or cost < best[1]:
            best = (x, cost)
    assert best is not None
    x = best[0]
    fitted = _to_hw(hw, fit, x)
    rel = np.exp(problem.residuals(hw, fit, x)) - 1.0
    notes = _bound_warnings(fitted, fit, x, rel)
    for msg in notes:
        warnings.warn(msg, SimWarning, stacklevel=2)
    report = CalibrationReport(
        fitted={f: _get(fitted, f) for f in fit},
        residuals=[float(v) for v in rel],
        rms_relative_error=float(np.sqrt(np.mean(rel**2))),
        max_relative_error=float(np.max(np.abs(rel))),
        n_observations=len(problem.obs),
        not_fitted=[t for t in candidate_terms(hw, problem.obs) if t not in fit],
        warnings=notes,
    )
    summary = ", ".join(f"{k}={v:.4g}" for k, v in report.fitted.items())
    return Hardware(
        **{
            **fitted.model_dump(),
            "calibration": report.model_dump(),
            "notes": (hw.notes + " " if hw.notes else "")
            + f"calibrated on {len(problem.obs)} observations ({summary})",
        }
    )


def predict_observations(hw: Hardware, observations: Sequence[AnyObservation | dict[str, Any]]) -> np.ndarray:
    """Model seconds (``measured_s`` units) of each observation on ``hw``."""
    return _Problem(hw, observations).predict(hw)
