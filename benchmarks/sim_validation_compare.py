"""Reading and analysis for ``benchmarks/sim_validation.py``: validate a measurement file (the schema in that script's
docstring), calibrate the target and each draft on their own per-call times, then predict every measured SpD
configuration's speedup over AR and compare. Nothing is fitted to the SpD runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from accel import sim
from accel.errors import SimError
from accel.sim.roofline import CallShape

GEN_LEN = 16  # generation length of a run that states none (the stand-in's)


@dataclass(frozen=True)
class Setting:
    """What every comparison of one measurement file shares: formats, lengths, the calibrated models."""

    fmt: str
    kv: str
    prompt_len: int
    default_gen: int
    tspec: sim.ModelSpec
    hw_t: sim.Hardware
    hw_t_flat: sim.Hardware


@dataclass(frozen=True)
class Group:
    """One group of SpD runs (same mode, K and min_draft_prob) and the AR rate it is compared with."""

    runs: list[dict]
    mode: str
    k: int
    ar_tps: float
    rate: str


def load_measurements(data: dict) -> dict:
    """Validate the fields this script reads (module docstring); SimError naming the bad field otherwise."""
    if not isinstance(data, dict):
        raise SimError("measurement file must hold a JSON object")
    for key in ("target", "draft", "calls", "runs"):
        if key not in data:
            raise SimError(f"measurement file lacks {key!r}")
    # tree calls and tree runs (benchmarks/spd.py --tree-nodes) are priced by accel.sim's tree model, not compared
    # here: they are set aside before the checks
    data = {
        **data,
        "calls": [c for c in data["calls"] if not (isinstance(c, dict) and c.get("model") == "target_tree")],
        "runs": [r for r in data["runs"] if not (isinstance(r, dict) and "_tree" in str(r.get("mode", "")))],
    }
    for i, c in enumerate(data["calls"]):
        if (
            c.get("model") not in ("target", "draft", "feature_draft")
            or not all(isinstance(c.get(f), (int, float)) for f in ("seq_len", "past_len", "seconds"))
            or c["seconds"] <= 0
        ):
            raise SimError(
                f"calls[{i}] must have model target|draft|feature_draft, seq_len, past_len, seconds > 0: {c}"
            )
    if not any(c["model"] == m and c["seq_len"] == 1 for m in ("target", "draft") for c in data["calls"]):
        raise SimError("calls need S = 1 points of the target and the draft")
    for i, r in enumerate(data["runs"]):
        # spd_dyn / spd_feat_dyn: dynamic draft length (compared through accel.sim.LoopStats); spd_feat*: the
        # feature draft, with its own calls and config; *+ngram: with n-gram lookup drafts (LoopStats too)
        modes = ("ar", "spd", "spd_dyn", "spd_feat", "spd_feat_dyn")
        if (
            str(r.get("mode", "")).removesuffix("+ngram") not in modes
            or r.get("mode") == "ar+ngram"
            or not isinstance(r.get("tokens_per_s"), (int, float))
        ):
            raise SimError(f"runs[{i}] must have mode {'|'.join(modes)} and tokens_per_s: {r}")
        if r["mode"] != "ar" and not isinstance(r.get("k"), int):
            raise SimError(f"runs[{i}] ({r['mode']}) needs an integer k")
        if r["mode"] in ("spd", "spd_feat") and not any(
            r.get(f) is not None
            for f in ("loops", "mean_tokens_per_loop", "mean_accepted_per_loop", "acceptance_by_position", "alpha")
        ):
            raise SimError(f"runs[{i}] ({r['mode']}) has no acceptance field")
    if not any(r["mode"] == "ar" for r in data["runs"]):
        raise SimError("measurement file has no autoregressive run to compare speedups against")
    return data


def _loops(run: dict) -> float | None:
    if run.get("loops"):
        return float(run["loops"])
    if run.get("mean_tokens_per_loop") and run.get("new_tokens"):
        return run["new_tokens"] / run["mean_tokens_per_loop"]
    return None


def _acceptance(runs: list[dict], k: int) -> float | list[float]:
    """Acceptance of a group of SpD runs with the same K, pooled (priority: realized tokens per loop)."""
    if all(r.get("tokens") and r.get("loops") for r in runs):
        return sim.alpha_for_expected_tokens(sum(r["tokens"] for r in runs) / sum(r["loops"] for r in runs), k)
    if all(r.get("mean_tokens_per_loop") for r in runs):
        return sim.alpha_for_expected_tokens(float(np.mean([r["mean_tokens_per_loop"] for r in runs])), k)
    if all(r.get("mean_accepted_per_loop") is not None for r in runs):
        return sim.alpha_for_expected_tokens(float(np.mean([r["mean_accepted_per_loop"] for r in runs])) + 1.0, k)
    if all(r.get("acceptance_by_position") for r in runs):
        return [float(x) for x in np.mean([np.asarray(r["acceptance_by_position"][:k], float) for r in runs], 0)]
    return float(np.mean([r["alpha"] for r in runs]))


def _pooled(rs: list[dict], field: str) -> float:
    """A per-loop mean pooled over runs (weighted by their loops)."""
    loops = [_loops(r) or 1.0 for r in rs]
    return sum(r[field] * n for r, n in zip(rs, loops, strict=True)) / sum(loops)


def _loop_stats(g: Group) -> sim.LoopStats | str | None:
    """The measured loop shape of a dynamic-length or lookup group (None for a fixed-K group); a string says why the
    group cannot be compared (a file written before the field existed)."""
    rs, mode = g.runs, g.mode
    lookup = mode.endswith("+ngram")
    if lookup and not all(
        r.get("draft_calls_per_loop") is not None and r.get("lookup_fraction") is not None for r in rs
    ):
        return "no draft_calls_per_loop / lookup_fraction (benchmarks/spd.py since session 14)"
    if not (mode.removesuffix("+ngram").endswith("_dyn") or lookup):
        return None
    if not all(r.get("drafts_per_loop") and r.get("mean_tokens_per_loop") for r in rs):
        return "no drafts_per_loop (written by benchmarks/spd.py since 2026-11-22)"
    return sim.LoopStats(
        tokens_per_loop=_pooled(rs, "mean_tokens_per_loop"),
        drafts_per_loop=_pooled(rs, "drafts_per_loop"),
        all_accepted_fraction=_pooled(rs, "all_accepted_fraction")
        if all(r.get("all_accepted_fraction") is not None for r in rs)
        else None,
        draft_calls_per_loop=_pooled(rs, "draft_calls_per_loop") if lookup else None,
        lookup_fraction=_pooled(rs, "lookup_fraction") if lookup else 0.0,
    )


def _measured(g: Group) -> tuple[float, float]:
    """(SpD tokens/s, speedup over AR) of a group. Runs paired with the AR runs around them (drift cancels) give a
    ratio of sums: each run's time in units of the AR time of the moment, so every token weighs alike."""
    rs = g.runs
    meas = float(np.median([r[g.rate] for r in rs]))
    if all(r.get("ar_reference_tokens_per_s") and r.get("time_s") and r.get("tokens") for r in rs):
        meas = sum(r["tokens"] for r in rs) / sum(r["time_s"] for r in rs)
        speedup = sum(r["tokens"] for r in rs) / sum(r["time_s"] * r["ar_reference_tokens_per_s"] for r in rs)
        return meas, speedup
    if all(r.get("ar_reference_tokens_per_s") for r in rs):
        return meas, float(np.median([r["tokens_per_s"] / r["ar_reference_tokens_per_s"] for r in rs]))
    return meas, meas / g.ar_tps


def _predicted(
    st: Setting, g: Group, draft: tuple[sim.Hardware, sim.ModelSpec], acc: Any, stats: sim.LoopStats | None
) -> tuple[dict, float]:
    """Predicted AR and SpD rates (tokens/s) and speedups: calibrated, pure roofline, and calibrated plus the AR
    run's per-token cost beyond the predicted call (runtime/host cost per target call inside a generation loop,
    amortised prefill) as a per-target-call host term added to every AR step and SpD loop. Also the host seconds per
    loop (each run's measured host time spread over its loops)."""
    rs = g.runs
    loops = [_loops(r) for r in rs]
    host_loop = 0.0
    if all(r.get("host_s") is not None for r in rs) and all(loops):
        host_loop = sum(r["host_s"] for r in rs) / sum(x for x in loops if x)
    gen = int(rs[0].get("gen_len", st.default_gen))
    hw_d, dspec = draft

    def predict(hw: sim.Hardware, host_s: float) -> tuple[sim.ConfigResult, sim.ConfigResult]:
        dep = sim.Deployment(
            target=st.tspec,
            draft=dspec,
            hardware=hw,
            draft_hardware=hw_d,
            target_format=st.fmt,
            draft_format=st.fmt,
            kv_format=st.kv,
            prompt_len=st.prompt_len,
            gen_len=max(gen, 2),
            host_s=host_s,
        )
        p = sim.predict_speedup(dep, k=g.k, acceptance=acc, loop_stats=stats)
        return p.config(f"{st.fmt} AR"), p.config(f"{st.fmt} + SpD")

    preds = {}
    for label, hw in (("calibrated", st.hw_t), ("pure_roofline", st.hw_t_flat)):
        ar, spd = predict(hw, host_loop)
        preds[label] = {
            "ar_tokens_per_s": ar.decode_tokens_per_s,
            "spd_tokens_per_s": spd.decode_tokens_per_s,
            "speedup": spd.decode_tokens_per_s / ar.decode_tokens_per_s,
            "expected_tokens_per_loop": spd.expected_tokens_per_loop,
        }
    cal = preds["calibrated"]
    extra = max(0.0, 1.0 / g.ar_tps - 1.0 / cal["ar_tokens_per_s"])
    spd_tps = predict(st.hw_t, host_loop + extra)[1].decode_tokens_per_s
    ar_adj = 1.0 / (1.0 / cal["ar_tokens_per_s"] + extra)
    preds["calibrated_ar_run"] = {
        "ar_tokens_per_s": ar_adj,
        "spd_tokens_per_s": spd_tps,
        "speedup": spd_tps / ar_adj,
        "host_s_per_target_call": extra,
        "expected_tokens_per_loop": cal["expected_tokens_per_loop"],
    }
    return preds, host_loop


def compare(st: Setting, g: Group, draft: tuple[sim.Hardware | None, sim.ModelSpec | None]) -> dict | None:
    """Predicted vs measured speedup of one group of SpD runs; None (with a line saying why) when the file lacks
    what the mode needs (a feature draft's calls, or a dynamic run's drafts_per_loop)."""
    hw_d, dspec = draft
    if hw_d is None or dspec is None:
        print(f"{g.mode} K={g.k}: no feature-draft calls or config in the file, skipped")
        return None
    stats = _loop_stats(g)
    if isinstance(stats, str):
        print(f"{g.mode} K={g.k}: {stats}, skipped")
        return None
    meas, meas_speedup = _measured(g)
    acc = None if stats is not None else _acceptance(g.runs, g.k)
    preds, host_loop = _predicted(st, g, (hw_d, dspec), acc, stats)
    return {
        "k": g.k,
        "acceptance": acc,
        "loop_stats": stats.model_dump() if stats is not None else None,
        "host_s_per_loop": host_loop,
        "measured_rate": g.rate,
        "measured_spd_tokens_per_s": meas,
        "measured_ar_tokens_per_s": g.ar_tps,
        "measured_speedup": meas_speedup,
        "predicted": preds,
        "speedup_error": preds["calibrated"]["speedup"] / meas_speedup - 1,
        "speedup_error_ar_run": preds["calibrated_ar_run"]["speedup"] / meas_speedup - 1,
        "speedup_error_pure_roofline": preds["pure_roofline"]["speedup"] / meas_speedup - 1,
    }


def _observations(data: dict, which: str, spec, fmt: str, kv: str, only_s1: bool = False) -> list:
    out = []
    for c in data["calls"]:
        if c["model"] != which or (only_s1 and c["seq_len"] != 1):
            continue
        S = int(c["seq_len"])
        out.append(
            sim.Observation(
                model=spec,
                weight_format=fmt,
                kv_format=kv,
                new_tokens=S,
                context_len=int(c["past_len"]),
                num_logits=int(c.get("num_logits", S)),
                seconds_per_call=float(c["seconds"]),
            )
        )
    return out


def _calibrate(host: sim.Hardware, obs: list):
    """Bandwidth efficiency + call overhead, + the S-curve terms when >= 2 row counts > 1; no more terms than points."""
    fit = ["bandwidth_efficiency", "call_overhead_s"]
    if len({o.new_tokens for o in obs if o.new_tokens > 1}) >= 2:
        fit += ["multi_token_penalty", "multi_token_exponent"]
    return sim.calibrate(host, obs, fit=fit[: len(obs)])


Models = dict[str, tuple[sim.Hardware | None, sim.ModelSpec | None]]


def _calibrated_models(data: dict, host: sim.Hardware, fmt: str, kv: str) -> tuple[Models, sim.Hardware]:
    """Target (S = 1 points + the S-curve), draft and feature draft each calibrated on their own calls; and the
    target's pure roofline (S = 1 points only, no S-curve term)."""
    tspec = sim.from_hf_config(data["target"], name="target")
    dspec = sim.from_hf_config(data["draft"], name="draft")
    hw_t = _calibrate(host, _observations(data, "target", tspec, fmt, kv)).with_(name="host-target")
    hw_t_flat = _calibrate(
        host.with_(multi_token_penalty=0.0), _observations(data, "target", tspec, fmt, kv, only_s1=True)
    ).with_(name="host-target-flat")
    hw_d = _calibrate(host, _observations(data, "draft", dspec, fmt, kv)).with_(name="host-draft")
    models: Models = {"target": (hw_t, tspec), "draft": (hw_d, dspec), "feature_draft": (None, None)}
    if data.get("feature_draft") and any(c["model"] == "feature_draft" for c in data["calls"]):
        fspec = sim.from_hf_config(data["feature_draft"], name="feature_draft")
        hw_f = _calibrate(host, _observations(data, "feature_draft", fspec, fmt, kv)).with_(name="host-feature-draft")
        models["feature_draft"] = (hw_f, fspec)
    return models, hw_t_flat


def _call_errors(data: dict, models: Models, fmt: str, kv: str) -> list[dict]:
    """Every measured call next to its predicted seconds."""
    calls = []
    for c in data["calls"]:
        hw, spec = models[c["model"]]
        if hw is None or spec is None:
            continue
        S = int(c["seq_len"])
        call = CallShape(new_tokens=S, context_len=int(c["past_len"]), num_logits=int(c.get("num_logits", S)))
        p = sim.step_time(spec, hw, call, weight_format=fmt, kv_format=kv).time_s
        calls.append({**c, "predicted_s": p, "error": p / c["seconds"] - 1})
    return calls


def _groups(runs: list[dict]) -> list[tuple[str, float, Group]]:
    """(sampling, min_draft_prob, group) for every SpD configuration, compared within its sampling setting."""
    out = []
    for sampling in sorted({r.get("sampling") or "" for r in runs}):
        group = [r for r in runs if (r.get("sampling") or "") == sampling]
        ar_runs = [r for r in group if r["mode"] == "ar"]
        if not ar_runs:
            print(f"sampling {sampling!r}: no AR run, skipped")
            continue
        rate = "decode_tokens_per_s" if all(r.get("decode_tokens_per_s") for r in group) else "tokens_per_s"
        ar_tps = float(np.median([r[rate] for r in ar_runs]))

        def key(r: dict) -> tuple[str, int, float]:
            return r["mode"], int(r["k"]), r.get("min_draft_prob") or 0.0

        for mode, k, thr in sorted({key(r) for r in group if r["mode"] != "ar"}):
            rs = [r for r in group if r["mode"] != "ar" and key(r) == (mode, k, thr)]
            out.append((sampling, thr, Group(rs, mode, k, ar_tps, rate)))
    return out


def analyse(data: dict, host: sim.Hardware) -> dict:
    """Calibrate on the file's calls, compare every SpD configuration; the result dict is what the script prints."""
    data = load_measurements(data)
    fmt, kv = data.get("format", "fp32"), data.get("kv_format", "fp32")
    models, hw_t_flat = _calibrated_models(data, host, fmt, kv)
    (hw_t, tspec), (hw_d, _) = models["target"], models["draft"]
    assert hw_t is not None and tspec is not None and hw_d is not None
    st = Setting(
        fmt=fmt,
        kv=kv,
        prompt_len=int(data.get("prompt_len", np.median([c["past_len"] for c in data["calls"]]))),
        default_gen=int((data.get("settings") or {}).get("max_new_tokens", GEN_LEN)),
        tspec=tspec,
        hw_t=hw_t,
        hw_t_flat=hw_t_flat,
    )
    rows = []
    for sampling, thr, g in _groups(data["runs"]):
        row = compare(st, g, models["feature_draft" if g.mode.startswith("spd_feat") else "draft"])
        if row is not None:
            rows.append({"sampling": sampling, "mode": g.mode, "min_draft_prob": thr or None, **row})
    if not rows:
        raise SimError("no SpD run could be compared (need AR and SpD runs in the same sampling setting)")
    return {
        "source": data.get("source", "results/spd.json"),
        "host": host.model_dump(mode="json"),
        "target_hw": hw_t.model_dump(mode="json"),
        "draft_hw": hw_d.model_dump(mode="json"),
        "target_hw_pure_roofline": hw_t_flat.model_dump(mode="json"),
        "calls": _call_errors(data, models, fmt, kv),
        "spd": rows,
    }
