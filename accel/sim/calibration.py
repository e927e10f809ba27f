"""Fit a device's efficiency terms to measurements (nonlinear least squares, numpy only).

Minimizes sum_i (log t_pred_i - log t_meas_i)^2 - relative errors, so 1 ms and 100 ms weigh alike - with
Levenberg-Marquardt on a numerical Jacobian, from several starts. Parameters live in an unconstrained space:
efficiencies through a logistic map into (0, 1), the multi-token exponent through 2 * logistic into (0, 2), fixed
times as scale * x with x >= 0 (steps are projected onto that bound, so 0 - no such cost - is reached exactly),
rates, link bandwidth and the multi-token penalty through exp.

Which terms: ``fit=None`` chooses them by fit (``accel.sim.term_search``): the terms the observations can see (in
the order of ``PRIORITY``: the bandwidth efficiency first, then each observed compressed format's decompression rate,
the per-call and per-layer costs, the link latencies of multi-device observations, the multi-token curve, the
per-row cost, compute efficiency) are fitted alone, in pairs and in growing sets, and the set that explains the
observations best with the fewest terms wins (ties go to fewer terms at a bound, then to priority); never more
terms than observations, so one observation fits one term. The result's ``calibration`` report holds the fitted
values, the residual of every observation, the terms held fixed at their prior values (with those values), the RMS
of every set tried, and warnings - also raised as ``SimWarning`` - when a term ends at a bound (nothing is clamped
silently) or residuals stay above 10 %.
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
from accel.sim.term_search import EXACT_RMS, SetFit, search_terms

SCALAR_TERMS = (
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "compute_efficiency",
    "call_overhead_s",
    "layer_overhead_s",
    "row_overhead_s",
    "multi_token_penalty",
    "multi_token_exponent",
    "link_latency_s",
    "allreduce_latency_s",
    "link_bandwidth_bytes_per_s",
)
FITTABLE = (*SCALAR_TERMS, "decompress_elements_per_s:<format>")
#: terms that are fractions in (0, 1]: fitted through a logistic
EFFICIENCIES = ("bandwidth_efficiency", "kv_bandwidth_efficiency", "compute_efficiency")
PRIORITY = (
    "bandwidth_efficiency",
    "decompress",  # one term per compressed format observed
    "call_overhead_s",
    "layer_overhead_s",
    "link_latency_s",
    "multi_token_penalty",
    "multi_token_exponent",
    "row_overhead_s",
    "compute_efficiency",
    "allreduce_latency_s",
)
RESIDUAL_WARN = 0.10
_TIME_SCALE = {"call_overhead_s": 1e-4, "layer_overhead_s": 1e-5, "row_overhead_s": 1e-7, "link_latency_s": 1e-6,
               "allreduce_latency_s": 1e-6}  # fmt: skip
# where the Jacobian that decides identifiability is taken: a term at 0 in the prior still shows its effect there
_NOMINAL = {"call_overhead_s": 1e-4, "layer_overhead_s": 1e-5, "row_overhead_s": 1e-7, "link_latency_s": 1e-6,
            "allreduce_latency_s": 1e-6, "multi_token_penalty": 0.1}  # fmt: skip


def _sigmoid(v: float) -> float:
    """1 / (1 + e^-v), kept inside [1e-6, 1]: a far optimizer step must not round a positive term to exactly 0."""
    return float(np.clip(1.0 / (1.0 + np.exp(-np.clip(v, -60.0, 60.0))), 1e-6, 1.0))


def _get(hw: Hardware, name: str) -> float:
    if name.startswith("decompress_elements_per_s:"):
        return hw.decompress_elements_per_s.get(name.split(":", 1)[1], 1e12)
    if name == "kv_bandwidth_efficiency" and hw.kv_bandwidth_efficiency is None:
        return hw.bandwidth_efficiency  # the weights' rate until the cache has its own
    return float(getattr(hw, name))


def _to_hw(hw: Hardware, names: Sequence[str], x: np.ndarray) -> Hardware:
    vals: dict[str, Any] = {}
    rates = dict(hw.decompress_elements_per_s)
    for name, v in zip(names, x, strict=True):
        if name in EFFICIENCIES:
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
        if name in EFFICIENCIES:
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


def _jacobian(hw: Hardware, problem: _Problem, cands: list[str]) -> np.ndarray:
    """The residuals' Jacobian over ``cands`` at a nominal point (every fixed cost > 0, so each shows its effect)."""
    hw = hw.model_copy(update={k: max(float(getattr(hw, k)), v) for k, v in _NOMINAL.items()})
    x0 = _from_hw(hw, cands)
    r0 = problem.residuals(hw, cands, x0)
    cols = []
    for i in range(len(cands)):
        step = np.zeros_like(x0)
        step[i] = 1e-3
        cols.append((problem.residuals(hw, cands, x0 + step) - r0) / 1e-3)
    return np.stack(cols, axis=1)


def choose_terms(hw: Hardware, problem: _Problem) -> tuple[list[str], dict[str, float]]:
    """The terms that fit the observations best (module docstring) and the RMS of every set tried."""
    cands = candidate_terms(hw, problem.obs)
    try:
        chosen, tried = search_terms(cands, _jacobian(hw, problem, cands), len(problem.obs),
                                     lambda names: _fit_set(hw, problem, names))  # fmt: skip
    except ValueError:
        raise SimError("no term of the hardware profile changes the predictions of these observations") from None
    return list(chosen.terms), tried


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


def _at_bound(hw: Hardware, problem: _Problem, fit: list[str], x: np.ndarray) -> dict[str, str]:
    """Fitted terms that ended at a bound, each with what the observations asked of it. A fixed cost at 0 counts
    only when the fit is not exact and the observations pull it below 0 (a cost of 0 that explains them is an
    answer, not a clamp)."""
    fitted = _to_hw(hw, fit, x)
    r = problem.residuals(hw, fit, x)
    cost = float(r @ r)
    out = {}
    for i, (name, v) in enumerate(zip(fit, x, strict=True)):
        val = _get(fitted, name)
        if name in EFFICIENCIES:
            hit = "upper" if val >= 0.999 else "lower" if val <= 1e-3 else ""
        elif name == "multi_token_exponent":
            hit = "upper" if val >= 1.998 else "lower" if val <= 2e-3 else ""
        elif name in _TIME_SCALE:
            hit = "upper" if val > 10.0 else ""
            if not hit and v <= 1e-9 and cost > (EXACT_RMS**2) * len(r):
                step = np.zeros_like(x)
                step[i] = 1e-3
                r_up = problem.residuals(hw, fit, x + step)
                hit = "lower" if float(r_up @ r_up) > cost else ""
        else:  # rates, link bandwidth, the multi-token penalty
            hit = "upper" if v > 60 else "lower" if v < -60 or (name == "multi_token_penalty" and val < 1e-6) else ""
        if hit:
            want = "more" if hit == "upper" else "less"
            out[name] = (
                f"{name} ended at its bound ({hit}: {val:.4g}): the observations ask for {want} than this term can "
                "give (not clamped silently: the residuals show what is left)"
            )
    return out


def _residual_warning(fit: list[str], rel: np.ndarray, labels: list[str]) -> list[str]:
    worst = float(np.max(np.abs(rel)))
    if worst <= RESIDUAL_WARN:
        return []
    i = int(np.argmax(np.abs(rel)))
    name = f" {labels[i]!r}" if labels[i] else ""
    return [
        f"calibration leaves a residual of {rel[i] * 100:+.1f}% (observation {i}{name}); the fitted terms "
        f"{fit} cannot explain all observations"
    ]


def _fit_set(hw: Hardware, problem: _Problem, fit: list[str]) -> SetFit:
    """Least squares of the terms ``fit`` over every observation, from several starts (the best one)."""
    lo = np.array([0.0 if f in _TIME_SCALE else -np.inf for f in fit])
    best: tuple[np.ndarray, float] | None = None
    for x0 in _starts(hw, fit):
        x, cost = _lm(lambda v: problem.residuals(hw, fit, v), x0, lo)
        if best is None or cost < best[1]:
            best = (x, cost)
    assert best is not None
    x = best[0]
    rel = np.exp(problem.residuals(hw, fit, x)) - 1.0
    rms = float(np.sqrt(np.mean(rel**2))) if np.all(np.isfinite(rel)) else float("inf")
    return SetFit(terms=tuple(fit), x=x, rms=rms, at_bound=tuple(_at_bound(hw, problem, fit, x)))


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
    tried: dict[str, float] = {}
    if fit is None:
        fit, tried = choose_terms(hw, problem)
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
    x = _fit_set(hw, problem, fit).x
    fitted = _to_hw(hw, fit, x)
    rel = np.exp(problem.residuals(hw, fit, x)) - 1.0
    labels = [o.label for o in problem.obs]
    notes = [*_at_bound(hw, problem, fit, x).values(), *_residual_warning(fit, rel, labels)]
    for msg in notes:
        warnings.warn(msg, SimWarning, stacklevel=2)
    held = {t: _get(hw, t) for t in candidate_terms(hw, problem.obs) if t not in fit}
    report = CalibrationReport(
        fitted={f: _get(fitted, f) for f in fit},
        residuals=[float(v) for v in rel],
        labels=labels,
        rms_relative_error=float(np.sqrt(np.mean(rel**2))),
        max_relative_error=float(np.max(np.abs(rel))),
        n_observations=len(problem.obs),
        not_fitted=list(held),
        held_fixed=held,
        tried=tried,
        warnings=notes,
    )
    summary = ", ".join(f"{k}={v:.4g}" for k, v in report.fitted.items())
    return Hardware(
        **{
            **fitted.model_dump(),
            "calibration": report.model_dump(),
            "notes": (hw.notes + " " if hw.notes else "")
            + f"calibrated on {len(problem.obs)} observations ({summary}; held fixed: "
            + (", ".join(f"{k}={v:.4g}" for k, v in held.items()) or "nothing")
            + ")",
        }
    )


def predict_observations(hw: Hardware, observations: Sequence[AnyObservation | dict[str, Any]]) -> np.ndarray:
    """Model seconds (``measured_s`` units) of each observation on ``hw``."""
    return _Problem(hw, observations).predict(hw)
