"""Validate accel.sim: (1) against published decode measurements of Cloud AI 100, GPUs and TPU v4
(accel/sim/published.py: calibrate one point per device, predict the rest; and with the catalog's stock defaults; and
each device calibrated on another source's point, leave one source out), (2) against measurements
on this machine: calibrate on S = 1 calls + the multi-token S-curve, then predict autoregressive and speculative
decoding tokens/s and compare with measured runs.

    python benchmarks/sim_validation.py [--published-only] [--spd results/spd.json | --standin] [--wall]
        [--results-dir results]

Modules: this one (the published table, the printed report), ``sim_validation_compare.py`` (reading a measurement
file, calibrating, comparing), ``sim_validation_standin.py`` (the numpy stand-in).

Data source:
- ``results/spd.json`` when benchmarks/spd.py has written it (onnxruntime, SmolLM2 + draft). Fields read (anything
  else is ignored; docs/spd.md documents the file):
    {"target": {config}, "draft": {config}     HF config.json fields or accel.models ModelConfig.to_dict()
     "format": "fp32", "kv_format": "fp32"     optional (default fp32: exported ONNX graphs run in fp32)
     "prompt_len": P                            optional (default: the past length of the calls)
     "settings": {"max_new_tokens": G}          optional
     "calls": [{"model": "target"|"draft"|"feature_draft" (not compared), "seq_len": S, "past_len": L, "seconds": t,
                "num_logits": n (optional, default S)}, ...]   (feature_draft calls calibrate the feature draft)
     "feature_draft": {config}                  optional: a feature draft's config (calls model "feature_draft")
     "runs": [{"mode": "ar"|"spd"|"spd_dyn"|"spd_feat"|"spd_feat_dyn", "k": K (the cap for *_dyn), "tokens_per_s": x,
               "sampling": "greedy"|... (optional: runs are compared within one sampling setting),
               "decode_tokens_per_s": x (optional, preferred: prefill excluded), "min_draft_prob": p (*_dyn),
               *_dyn runs: "mean_tokens_per_loop", "drafts_per_loop", optional "all_accepted_fraction" and
               "loops" (accel.sim.LoopStats; older files without drafts_per_loop: skipped), else
               acceptance: "tokens"+"loops" (realized totals) or "mean_tokens_per_loop" (E) or
               "mean_accepted_per_loop" (E - 1) or "acceptance_by_position" or "alpha",
               "host_s" (optional: total host seconds, spread over the run's loops as host_s per loop),
               "ar_reference_tokens_per_s" (optional: AR measured right around this run; with "tokens" and
               "time_s" the measured speedup is sum(tokens) / sum(time_s * ar_reference), else the median of the
               paired ratios)}, ...]}
- otherwise a self-contained stand-in: a numpy Llama-like decoder step (fp32 weights stored (out, in), W @ x.T,
  attention over a preallocated KV cache, LM head on the last ``num_logits`` rows, argmax), a target and a small
  draft; per-call times at S = 1..8 and AR / SpD runs with i.i.d. synthetic acceptance (numpy RNG, fixed seed).
  The measured data is written in the schema above (results/sim_validation_measurements.json) and analysed by the
  same code path as results/spd.json (``--standin`` forces it even when results/spd.json exists; ``--spd FILE``
  reads another benchmarks/spd.py output instead).

The draft is calibrated separately from the target (its weights are small enough to stay in cache: a different
effective bandwidth). Output: results/sim_validation.json (results/sim_validation_published.json with
``--published-only``), each with the ``run`` block of ``bench_support``. Goal: SpD speedup within 10 % of measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# one BLAS thread: the 2 cores are shared with other jobs, and a spinning second thread makes timings erratic
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sim_validation_standin as standin  # noqa: E402
from bench_support import save_results  # noqa: E402
from sim_validation_compare import analyse, load_measurements  # noqa: E402

from accel import sim  # noqa: E402
from accel.errors import SimError  # noqa: E402

RESULTS = ROOT / "results"
GOAL = 0.10  # SpD speedup within 10 % of the measured one


def sweep_rate() -> float:
    t0 = time.perf_counter()
    r = sim.sweep(
        "llama-2-7b",
        "qualcomm-llama2-draft-115m",
        "cloud-ai-100-ultra",
        k=range(1, 17),
        alpha=np.linspace(0, 1, 101),
        target_format=["fp16", "mxfp6", "mxfp4", "int8"],
        batch_size=[1, 2, 4, 8, 16, 32],
        context_len=[128, 512, 1024, 2048, 4096],
    )
    return r.size / (time.perf_counter() - t0)


def published_table() -> dict:
    """Print the one-point protocol on the published points (and the stock-default errors); return the summary."""
    from accel.sim.published import FIRST_SET, PUBLISHED, summary, validate, validate_leave_one_source_out

    cal, stock = validate(calibrate_first=True), validate(calibrate_first=False)
    print(f"\n{'device':<22}{'run':<30}{'measured':>9}{'one-point':>10}{'error':>8}{'stock':>9}{'error':>8}  source")
    for r, s in zip(cal, stock, strict=True):
        tag = " (calibration point)" if r.calibration_point else ""
        print(
            f"{r.device:<22}{r.label:<30}{r.measured_tokens_per_s:>9.2f}{r.predicted_tokens_per_s:>10.2f}"
            f"{r.error * 100:>7.1f}%{s.predicted_tokens_per_s:>9.2f}{s.error * 100:>7.1f}%  {r.where}{tag}"
        )
    sc, ss = summary(cal), summary(stock)
    devices = [d for d in sc if d not in ("mean_abs_error", "points")]
    multi = sum((p.run.devices or 1) > 1 for p in PUBLISHED)
    n = {d: sum(p.device == d for p in PUBLISHED) for d in devices}
    print(
        f"\n{len(PUBLISHED)} points ({len(FIRST_SET)} of the first set) over {len(devices)} device types, {multi} "
        f"of them tensor parallel over 2-16 devices, from {len({p.source for p in PUBLISHED})} sources"
    )
    print(
        f"mean |error| after one point per device: {sc['mean_abs_error'] * 100:.1f}% over {sc['points']} points "
        f"(goal <= 10%); stock defaults: {ss['mean_abs_error'] * 100:.1f}% over {ss['points']} (goal <= 20%)"
    )
    print(
        "per device (points: one point / stock): "
        + ", ".join(f"{d} ({n[d]}: {sc[d] * 100:.1f}% / {ss[d] * 100:.1f}%)" for d in devices)
    )
    loso = summary(validate_leave_one_source_out())
    held = [d for d in loso if d not in ("mean_abs_error", "points")]
    print(
        f"leave one source out (each device calibrated on a point of another source): "
        f"{loso['mean_abs_error'] * 100:.1f}% over {loso['points']} points (goal <= 10%, no device above 15%): "
        + ", ".join(f"{d} {loso[d] * 100:.1f}%" for d in held)
    )
    lo_rows = validate_leave_one_source_out()
    print("per source (points: stock / leave one source out; '-': its device has no other source):")
    for src in dict.fromkeys(p.source for p in PUBLISHED):
        st = [abs(r.error) for r in stock if r.source == src]
        lo = [abs(r.error) for r in lo_rows if r.source == src]
        lo_txt = f"{np.mean(lo) * 100:5.1f}%" if lo else "    -"
        print(f"  {len(st):>3}  {np.mean(st) * 100:5.1f}% / {lo_txt}  {src.split(' http')[0][:100]}")
    first = {
        "one_point": summary(validate(FIRST_SET)),
        "stock": summary(validate(FIRST_SET, calibrate_first=False)),
        "leave_one_source_out": summary(validate_leave_one_source_out(FIRST_SET)),
    }
    print(
        "first set alone (issue 20's goals): "
        + ", ".join(f"{k.replace('_', ' ')} {v['mean_abs_error'] * 100:.1f}%" for k, v in first.items())
    )
    sources = sorted({r.source for r in cal})
    print("sources:\n  " + "\n  ".join(sources))
    return {
        "leave_one_source_out": loso,
        "one_point": sc,
        "stock": ss,
        "first_set": first,
        "points": len(PUBLISHED),
        "device_types": len(devices),
        "multi_device_points": multi,
        "rows": [r.model_dump() for r in cal],
        "stock_rows": [r.model_dump() for r in stock],
    }


def spd_table() -> dict:
    """Print the published SpD points as bands over the acceptance range (accel/sim/published_spd.py)."""
    from accel.sim.published_spd import QUANTILES, SPD_PRIOR, validate_spd

    rows = validate_spd()
    lo, hi = SPD_PRIOR
    print(
        f"\npublished SpD points: MXFP6 + SpD over FP16 AR, priced at per-token acceptance uniform on [{lo}, {hi}] "
        f"(band: p{round(QUANTILES[0] * 100)} / p50 / p{round(QUANTILES[-1] * 100)})"
    )
    print(f"{'run':<68}{'published':>12}{'band':>22}{'p50 error':>11}{'in band':>9}{'implied alpha':>16}")
    for r in rows:
        pub = f"{r.measured[0]:.2f}x" if r.measured[0] == r.measured[1] else f"{r.measured[0]:.2f}-{r.measured[1]:.2f}x"
        band = " / ".join(f"{v:.2f}" for v in r.band)
        alpha = "-".join("none" if a is None else f"{a:.2f}" for a in dict.fromkeys(r.implied_acceptance))
        mark = "yes" if r.inside else "no"
        print(f"{r.label:<68}{pub:>12}{band:>22}{r.median_error * 100:>10.1f}%{mark:>9}{alpha:>16}")
    mean = float(np.mean([abs(r.median_error) for r in rows]))
    inside = sum(r.inside for r in rows)
    print(f"SpD points: {inside}/{len(rows)} inside the band; mean |error| of the band's median {mean * 100:.1f}%")
    return {"acceptance_range": list(SPD_PRIOR), "rows": [r.model_dump() for r in rows], "median_mean_abs_error": mean}


def gpu_table() -> dict:
    """Print the simulator's error on accel's own GPU calls (``accel.sim.measured``): stock, and calibrated on the
    float16 curves with the other dtypes held out; return both."""
    import warnings

    from accel.sim.catalog import H200_DATASHEET
    from accel.sim.measured import GPU_SOURCE, gpu_errors, gpu_points

    stock = gpu_errors("h200")
    fp16 = [o for _, o in gpu_points("fp16")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sim.SimWarning)
        fitted = sim.calibrate("h200", fp16)
        from_sheet = sim.calibrate(H200_DATASHEET, fp16)
    cal, sheet = gpu_errors(fitted), gpu_errors(from_sheet)
    measured = {o.label: o.measured_s for _, o in gpu_points()}
    print(
        f"\nmeasured GPU calls ({GPU_SOURCE}); stock: the h200 entry (fitted on the fp16 curves and the 7B batched"
        " steps, bf16 and fp32 held out); calibrated: sim.calibrate on the fp16 calls from the stock entry, and from"
        " the datasheet entry with the GPU family's assumed terms:"
    )
    print(f"{'call':<30}{'measured ms':>12}{'stock ms':>10}{'stock':>8}{'calibrated':>12}{'from sheet':>12}")
    for label, err in stock.items():
        held = "" if " fp16 " in label else " (held out)"
        ms = measured[label] * 1e3
        print(
            f"{label:<30}{ms:>12.3f}{ms * (1 + err):>10.3f}{err * 100:>7.1f}%{cal[label] * 100:>11.1f}%"
            f"{sheet[label] * 100:>11.1f}%{held}"
        )
    held_out = [abs(e) for k, e in cal.items() if " fp16 " not in k]
    worst_stock, worst_cal = max(map(abs, stock.values())), max(map(abs, cal.values()))
    print(
        f"max |error|: stock {worst_stock * 100:.1f}%, calibrated {worst_cal * 100:.1f}%"
        f" (held out {max(held_out) * 100:.1f}%); fitted: "
        + ", ".join(f"{k} {v:.4g}" for k, v in fitted.calibration.fitted.items())
    )
    print(
        f"from the datasheet entry: max |error| {max(map(abs, sheet.values())) * 100:.1f}%; fitted: "
        + ", ".join(f"{k} {v:.4g}" for k, v in from_sheet.calibration.fitted.items())
    )
    held = held_out_table()
    return {
        "stock": stock,
        "held_out_later": held,
        "calibrated_on_fp16": cal,
        "fitted": fitted.calibration.fitted,
        "calibrated_from_datasheet": sheet,
        "fitted_from_datasheet": from_sheet.calibration.fitted,
    }


def held_out_table() -> dict[str, float]:
    """Print the stock ``h200`` entry's error on the calls measured after its first fit: the 13B curve and batched AR
    steps (``held_out_points``) and the 7B batched steps it is fitted on (marked); return them by label."""
    from accel.sim.measured import FIT_BATCH_MODEL, HELD_OUT_SOURCE, batch_points, gpu_errors, held_out_points

    points = held_out_points() + batch_points(FIT_BATCH_MODEL)
    errors = gpu_errors("h200", points)
    measured = {o.label: o.measured_s for _, o in points}
    print(f"\nmeasured after the first fit ({HELD_OUT_SOURCE}); held out unless marked:")
    print(f"{'call':<30}{'measured ms':>12}{'stock ms':>10}{'stock':>8}")
    for label, err in errors.items():
        ms = measured[label] * 1e3
        mark = " (fitted: the KV-cache read rate)" if label.startswith(FIT_BATCH_MODEL + " ") else ""
        print(f"{label:<30}{ms:>12.3f}{ms * (1 + err):>10.3f}{err * 100:>7.1f}%{mark}")
    return errors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--published-only", action="store_true", help="only the published points (seconds)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--spd", type=Path, help="a results JSON written by benchmarks/spd.py (default results/spd.json)")
    src.add_argument(
        "--standin", action="store_true", help="measure the numpy stand-in even when results/spd.json exists"
    )
    ap.add_argument("--wall", action="store_true", help="time the stand-in in wall-clock seconds, not CPU seconds")
    ap.add_argument(
        "--results-dir", type=Path, default=RESULTS, help="where the JSON files go and spd.json is looked for"
    )
    args = ap.parse_args(argv)
    if args.results_dir.exists() and not args.results_dir.is_dir():
        ap.error(f"--results-dir {args.results_dir} is a file, not a directory")
    return args


def load_data(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """The measurements to validate against: --spd FILE, results/spd.json when present, else the stand-in."""
    if args.spd is not None and not args.spd.is_file():
        raise SystemExit(f"--spd {args.spd}: no such file (give a results JSON written by benchmarks/spd.py)")
    spd_json = args.spd or args.results_dir / "spd.json"
    if spd_json.exists() and not args.standin:
        try:
            data = load_measurements(json.loads(spd_json.read_text()))
            print(f"using measurements from {spd_json}")
            return data
        except (SimError, json.JSONDecodeError) as exc:
            if args.spd is not None:
                raise SystemExit(f"--spd {spd_json}: {exc}") from None
            print(f"ignoring {spd_json}: {exc}; measuring the numpy stand-in instead")
    if args.wall:
        standin.use_wall_clock()
    print(f"timing the stand-in with {'wall' if args.wall else 'process CPU'} time")
    data = standin.measure_standin()
    save_results(args.results_dir / "sim_validation_measurements.json", data, __file__, argv)
    return data


def print_report(res: dict) -> tuple[float, float]:
    """Print the calibration, every call and every SpD configuration; return the worst speedup errors (calibrated on
    per-call times; plus the AR run's host term)."""
    ht, hd = res["target_hw"]["calibration"]["fitted"], res["draft_hw"]["calibration"]["fitted"]
    print("calibrated target:", {k: round(v, 6) for k, v in ht.items()})
    print("calibrated draft: ", {k: round(v, 6) for k, v in hd.items()})
    print(f"\n{'model':<14}{'S':>3}{'L':>5}{'measured ms':>13}{'predicted ms':>14}{'error':>8}")
    for c in res["calls"]:
        print(
            f"{c['model']:<14}{c['seq_len']:>3}{c['past_len']:>5}{c['seconds'] * 1e3:>13.3f}"
            f"{c['predicted_s'] * 1e3:>14.3f}{c['error'] * 100:>7.1f}%"
        )
    print(
        f"\n{'sampling':<12}{'mode':<18}{'K':>3}{'E[tok]':>8}{'AR tok/s':>10}{'SpD meas':>10}{'SpD pred':>10}"
        f"{'x meas':>8}{'x pred':>8}{'error':>8}{'x +AR run':>11}{'error':>8}{'x roofline':>12}{'error':>8}"
    )
    for r in res["spd"]:
        pc, pr = r["predicted"]["calibrated"], r["predicted"]["pure_roofline"]
        mode = r["mode"] + (f" p<{r['min_draft_prob']:g}" if r.get("min_draft_prob") else "")
        print(
            f"{r['sampling'] or '-':<12}{mode:<18}{r['k']:>3}{pc['expected_tokens_per_loop']:>8.2f}"
            f"{r['measured_ar_tokens_per_s']:>10.2f}{r['measured_spd_tokens_per_s']:>10.2f}"
            f"{pc['spd_tokens_per_s']:>10.2f}{r['measured_speedup']:>8.2f}"
            f"{pc['speedup']:>8.2f}{r['speedup_error'] * 100:>7.1f}%"
            f"{r['predicted']['calibrated_ar_run']['speedup']:>11.2f}{r['speedup_error_ar_run'] * 100:>7.1f}%"
            f"{pr['speedup']:>12.2f}{r['speedup_error_pure_roofline'] * 100:>7.1f}%"
        )
    worst = max(abs(r["speedup_error"]) for r in res["spd"])
    worst_ar = max(abs(r["speedup_error_ar_run"]) for r in res["spd"])
    flat = max(abs(r["speedup_error_pure_roofline"]) for r in res["spd"])
    print(
        f"\nworst SpD speedup error: calibrated on per-call times {worst * 100:.1f}%; plus the AR run's per-call "
        f"host term {worst_ar * 100:.1f}% (goal <= {GOAL:.0%}); pure roofline: {flat * 100:.1f}%"
    )
    return worst, worst_ar


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rate = sweep_rate()
    print(f"sweep: {rate:,.0f} configurations/s (goal >= 100,000)")
    published = published_table()
    published["spd_points"] = spd_table()
    published["gpu_calls"] = gpu_table()
    if args.published_only:
        path = save_results(args.results_dir / "sim_validation_published.json", published, __file__, argv)
        print(f"wrote {path}")
        return 0
    print("measuring host ...")
    host = sim.measure_host()
    print(f"host: {host.notes}")
    res = analyse(load_data(args, argv), host)
    worst, worst_ar = print_report(res)
    res.update(
        published=published,
        sweep_configs_per_s=rate,
        worst_speedup_error=worst,
        worst_speedup_error_ar_run=worst_ar,
        goal_met=bool(min(worst, worst_ar) <= GOAL),
    )
    print(f"wrote {save_results(args.results_dir / 'sim_validation.json', res, __file__, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
