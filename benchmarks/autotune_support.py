"""Pure helpers of ``benchmarks/autotune.py``: per-run records, per-cell summaries and goals, the controller's choices,
the markdown table, the run-time estimate, and the background process that keeps one core busy.

Imported by its bare name (benchmarks/ is on ``sys.path`` when a benchmark script runs); numpy and the standard
library only, so ``tests/test_autotune_bench.py`` loads it from its file without the models.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the row name of autoregressive decoding and of the controller in every cell
AR = "AR"
CONTROLLER = "controller (AutoTune)"
CONTROLLER_B = "controller B (AutoTune, --controller-b)"  # a second controller, for an A/B pair in one run
#: the goals of the issue: controller tok/s >= this x the best fixed setting's, and >= this x AR's
GOAL_VS_BEST = 0.95
GOAL_VS_AR = 1.0
#: the TunedRound fields kept per controller round (``accel.spd.stats.TunedRound``)
TUNED_FIELDS = (
    "nodes",
    "shape",
    "phase",
    "call_tokens",
    "predicted_tokens_per_call",
    "tokens_per_call",
    "predicted_call_s",
    "call_s",
    "predicted_propose_s",
    "propose_s",
)


@dataclass
class RunRecord:
    """One ``generate`` run of one setting on one prompt: its tokens (for the greedy check), the new tokens and the
    decode seconds (wall minus prefill), and for the controller its per-round choices (``TUNED_FIELDS``)."""

    prompt: int
    tokens: list[int]
    new_tokens: int
    decode_s: float
    tuned: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second of this run (NaN without a positive duration)."""
        return self.new_tokens / self.decode_s if self.decode_s > 0 else math.nan


def rates(records: Sequence[RunRecord]) -> dict[str, float]:
    """Tokens per second over a setting's prompts: ``total`` = all new tokens / all decode seconds (the figure the
    table and the goals use), ``median`` = the median of the per-prompt tok/s."""
    seconds = sum(r.decode_s for r in records)
    total = sum(r.new_tokens for r in records) / seconds if seconds > 0 else math.nan
    per = [r.tokens_per_s for r in records if math.isfinite(r.tokens_per_s)]
    return {"total": total, "median": statistics.median(per) if per else math.nan}


def prompt_interval(
    records: Sequence[RunRecord], reference: Sequence[RunRecord], draws: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """How far the total tok/s ratio ``records / reference`` (``rates``' ``total`` of each) moves with the prompts:
    its 5th and 95th percentiles over ``draws`` resamplings of the prompts both ran, with replacement, the two
    settings' runs paired by prompt (fixed ``seed``: the same bounds for the same records). A cell's prompts differ
    more than runs of one prompt do (acceptance follows the text), so this is the spread a cell's ratio would show
    over other prompts of the same kind; it does not include the machine's drift between passes. ``(nan, nan)``
    without a common prompt of finite positive seconds."""
    ours = {r.prompt: r for r in records if r.decode_s > 0 and math.isfinite(r.decode_s)}
    theirs = {r.prompt: r for r in reference if r.decode_s > 0 and math.isfinite(r.decode_s)}
    common = sorted(ours.keys() & theirs.keys())
    if not common:
        return math.nan, math.nan
    cols = [[getattr(d[p], f) for p in common] for d in (ours, theirs) for f in ("new_tokens", "decode_s")]
    n_a, s_a, n_b, s_b = (np.asarray(c, dtype=float) for c in cols)
    pick = np.random.default_rng(seed).integers(0, len(common), size=(draws, len(common)))
    ratio = (n_a[pick].sum(1) / s_a[pick].sum(1)) / (n_b[pick].sum(1) / s_b[pick].sum(1))
    lo, hi = np.percentile(ratio, [5.0, 95.0])
    return float(lo), float(hi)


def tuned_rounds(cell: Mapping[str, Sequence[RunRecord]], setting: str) -> list[dict[str, Any]]:
    """Every round a controller ``setting`` of ``cell`` recorded (``TUNED_FIELDS`` dicts), over its runs in order."""
    return [t for r in cell.get(setting, ()) for t in r.tuned]


def _finite_mean(values: Iterable[float]) -> float:
    got = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(got) / len(got) if got else math.nan


def controller_choices(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the controller chose over its rounds (``TUNED_FIELDS`` dicts): the histogram of node budgets, the
    fraction of rounds with 0 nodes (no speculation), the rounds per phase, and the mean predicted vs observed tokens
    per call and call seconds over the rounds that had a prediction (the model's rounds and explorations)."""
    hist = Counter(int(r["nodes"]) for r in rounds)
    shapes = Counter(shape_label(str(r.get("shape", ""))) for r in rounds if int(r["nodes"]) > 0)
    predicted = [r for r in rounds if math.isfinite(r["predicted_tokens_per_call"])]
    return {
        "rounds": len(rounds),
        "nodes_histogram": {str(n): hist[n] for n in sorted(hist)},
        "shape_rounds": dict(shapes.most_common()),
        "zero_fraction": hist[0] / len(rounds) if rounds else math.nan,
        "phases": dict(Counter(str(r["phase"]) for r in rounds)),
        "predicted_tokens_per_call": _finite_mean(r["predicted_tokens_per_call"] for r in predicted),
        "observed_tokens_per_call": _finite_mean(r["tokens_per_call"] for r in predicted),
        "predicted_call_ms": 1e3 * _finite_mean(r["predicted_call_s"] for r in predicted),
        "observed_call_ms": 1e3 * _finite_mean(r["call_s"] for r in predicted),
    }


def mismatches(reference: Sequence[RunRecord], records: Sequence[RunRecord]) -> list[int]:
    """The prompts whose tokens differ from the reference run on the same prompt (greedy SpD vs AR)."""
    ref = {r.prompt: r.tokens for r in reference}
    return [r.prompt for r in records if ref.get(r.prompt) != r.tokens]


def summarise_cell(settings: Mapping[str, Sequence[RunRecord]], greedy: bool) -> dict[str, Any]:
    """A cell's summary: tok/s of every setting (``rates``), the best fixed setting (AR included), the controller's
    tok/s and its ratios to the best fixed and to AR with the goals' PASS/FAIL, its choices, and for greedy cells
    the settings whose output differs from AR (``mismatch``: name -> prompts); ``controller_vs_best_interval``: the
    ratio's 5-95% range over resampled prompts (``prompt_interval``)."""
    tps = {name: rates(recs) for name, recs in settings.items()}
    fixed = {n: v["total"] for n, v in tps.items() if n not in (CONTROLLER, CONTROLLER_B) and math.isfinite(v["total"])}
    best = max(fixed, key=fixed.__getitem__) if fixed else None
    ctrl = tps.get(CONTROLLER, {}).get("total", math.nan)
    ar = tps.get(AR, {}).get("total", math.nan)
    vs_best = ctrl / fixed[best] if best else math.nan
    vs_ar = ctrl / ar if ar > 0 else math.nan
    bad = {}
    if greedy and AR in settings:
        for name, recs in settings.items():
            wrong = mismatches(settings[AR], recs)
            if wrong:
                bad[name] = wrong
    rounds = tuned_rounds(settings, CONTROLLER)
    spread = prompt_interval(settings[CONTROLLER], settings[best]) if best and CONTROLLER in settings else None
    return {
        **_second_controller(settings, tps, ctrl),
        "tokens_per_s": tps,
        "best_fixed": best,
        "best_fixed_tokens_per_s": fixed[best] if best else math.nan,
        "controller_tokens_per_s": ctrl,
        "controller_vs_best": vs_best,
        "controller_vs_best_interval": spread or (math.nan, math.nan),
        "controller_vs_ar": vs_ar,
        "goal_vs_best": verdict(vs_best, GOAL_VS_BEST),
        "goal_vs_ar": verdict(vs_ar, GOAL_VS_AR),
        "choices": controller_choices(rounds),
        "mismatch": bad,
    }


def _second_controller(settings: Mapping[str, Sequence[RunRecord]], tps: Mapping, ctrl: float) -> dict[str, Any]:
    """With a ``CONTROLLER_B`` among the settings: its tok/s, B / A (the controller) and that ratio's 5-95% range over
    resampled prompts, and its choices; nothing otherwise."""
    if CONTROLLER_B not in settings or CONTROLLER not in settings:
        return {}
    b = tps[CONTROLLER_B]["total"]
    return {
        "controller_b_tokens_per_s": b,
        "controller_b_vs_a": b / ctrl if ctrl > 0 else math.nan,
        "controller_b_vs_a_interval": prompt_interval(settings[CONTROLLER_B], settings[CONTROLLER]),
        "choices_b": controller_choices(tuned_rounds(settings, CONTROLLER_B)),
    }


def verdict(ratio: float, goal: float) -> str:
    """``PASS`` when ``ratio >= goal``, ``FAIL`` below it, ``n/a`` when the ratio is not a number."""
    return "n/a" if not math.isfinite(ratio) else "PASS" if ratio >= goal else "FAIL"


def shape_label(shape: str) -> str:
    """A short name of a controller arm (``TunedRound.shape``, a proposer name): ``lookup|chain``, ``chain``,
    ``lookup+tree``, ``tree``, ``lookup|dyn chain``, ``lookup+hydra``, ``lookup|hydra``, ``hydra``, ``lookup``
    (``?`` when not recorded)."""
    kind = "hydra" if "hydra" in shape else "tree" if "tree(" in shape else "chain" if "chain(" in shape else ""
    kind = "dyn chain" if kind == "chain" and "min_draft_prob" in shape else kind
    if "lookup(" in shape and kind:
        return f"lookup|{kind}" if " | " in shape else f"lookup+{kind}"
    return kind or ("lookup" if "lookup(" in shape else "?")


def histogram_text(hist: Mapping[str, int]) -> str:
    """``"0:12 4:30 8:3"``: node budget, then rounds."""
    return " ".join(f"{n}:{c}" for n, c in hist.items()) or "-"


def cell_lines(name: str, summary: Mapping[str, Any]) -> list[str]:
    """The printed block of one cell: every setting's tok/s (total / median over prompts), the controller's figures
    and goals, its choices, and a loud line per greedy mismatch."""
    out = [f"== {name}"]
    for setting, v in summary["tokens_per_s"].items():
        mark = "  <- best fixed" if setting == summary["best_fixed"] else ""
        out.append(f"  {setting:<34} {v['total']:7.1f} tok/s (median {v['median']:7.1f}){mark}")
    c = summary["choices"]
    lo, hi = summary.get("controller_vs_best_interval", (math.nan, math.nan))
    out.append(
        f"  controller / best fixed {summary['controller_vs_best']:.2f}x [{summary['goal_vs_best']}: >= "
        f"{GOAL_VS_BEST}; {lo:.2f}-{hi:.2f}x over resampled prompts]  controller / AR "
        f"{summary['controller_vs_ar']:.2f}x [{summary['goal_vs_ar']}: >= {GOAL_VS_AR}]"
    )
    out.append(
        f"  choices over {c['rounds']} rounds: shapes {histogram_text(c.get('shape_rounds', {}))}; nodes "
        f"{histogram_text(c['nodes_histogram'])}; 0 nodes "
        f"{c['zero_fraction']:.0%}; phases {c['phases']}; tokens/call predicted {c['predicted_tokens_per_call']:.2f} "
        f"observed {c['observed_tokens_per_call']:.2f}; call ms predicted {c['predicted_call_ms']:.1f} observed "
        f"{c['observed_call_ms']:.1f}"
    )
    if "controller_b_vs_a" in summary:
        lo, hi = summary["controller_b_vs_a_interval"]
        cb = summary["choices_b"]
        out.append(
            f"  controller B / controller {summary['controller_b_vs_a']:.2f}x [{lo:.2f}-{hi:.2f}x over resampled "
            f"prompts]; B's shapes {histogram_text(cb.get('shape_rounds', {}))}, 0 nodes {cb['zero_fraction']:.0%}"
        )
    for setting, prompts in summary["mismatch"].items():
        out.append(f"  !!! MISMATCH: greedy {setting} differs from AR on prompts {prompts}: the engine is broken !!!")
    return out


def markdown_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per cell (benchmarks/RESULTS.md): AR, best fixed setting, controller, the ratios with the goals, the
    share of rounds without speculation and the shapes (arms) chosen."""
    lines = [
        "| cell | AR tok/s | best fixed | tok/s | controller tok/s | ctrl / best (5-95% over prompts) | ctrl / AR | "
        "0 nodes | shapes chosen (arm:rounds) | tok/call pred / obs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        c, ar = s["choices"], s["tokens_per_s"].get(AR, {}).get("total", math.nan)
        lo, hi = s.get("controller_vs_best_interval", (math.nan, math.nan))
        lines.append(
            f"| {name} | {ar:.1f} | {s['best_fixed']} | {s['best_fixed_tokens_per_s']:.1f} | "
            f"{s['controller_tokens_per_s']:.1f} | {s['controller_vs_best']:.2f}x {s['goal_vs_best']} "
            f"({lo:.2f}-{hi:.2f}) | "
            f"{s['controller_vs_ar']:.2f}x {s['goal_vs_ar']} | {c['zero_fraction']:.0%} | "
            f"{histogram_text(c.get('shape_rounds', {})).replace('|', chr(92) + '|')} | "
            f"{c['predicted_tokens_per_call']:.2f} / "
            f"{c['observed_tokens_per_call']:.2f} |"
        )
    return "\n".join(lines)


def estimate_s(step_s: Mapping[str, float], plan: Mapping[str, float]) -> float:
    """Seconds of the whole grid, from each target's one-token call ``step_s`` (seconds) and ``plan``: ``runs`` (per
    target, all passes), ``tokens`` per run, ``factor`` (mean seconds per token over the runs, in one-token calls),
    ``overhead_calls`` per run (prefill, start), ``probes`` per target (controllers) at ``probe_calls`` each, and
    ``load_factor`` (the mean slowdown over all passes from the busy core)."""
    per_run = plan["tokens"] * plan["factor"] + plan["overhead_calls"]
    calls = plan["runs"] * per_run * plan["load_factor"] + plan["probes"] * plan["probe_calls"]
    return sum(s * calls for s in step_s.values())


class BusyCore:
    """A background Python process spinning on one core (a ``while True`` loop: one thread, no BLAS pool), started
    by ``start`` and stopped by ``stop`` (idempotent; use ``with`` or try/finally so it never outlives the run)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        """Whether the busy process is alive."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the busy process (no-op when it runs)."""
        if not self.running:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "while True: pass"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def stop(self) -> None:
        """Stop the busy process: SIGTERM, then SIGKILL after 5 s (no-op when none runs)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def __enter__(self) -> BusyCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
