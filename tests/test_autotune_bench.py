"""benchmarks/autotune.py's pure helpers (benchmarks/autotune_support.py) and its options; no timed assertions."""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    """A benchmarks/ module loaded from its file (not by putting benchmarks/ on sys.path: its spd.py, formats.py, ...
    would shadow names)."""
    key = f"_benchmarks_{name}"  # registered under a private name: dataclasses look their module up while made
    spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


sup = _load("autotune_support")


def rec(prompt: int, tokens: list[int], seconds: float, tuned: list[dict] | None = None) -> object:
    return sup.RunRecord(prompt, tokens, len(tokens), seconds, tuned or [])


def tuned(nodes: int, phase: str = "model", predicted: float = 2.0, observed: float = 1.5) -> dict:
    return {
        "nodes": nodes,
        "phase": phase,
        "call_tokens": nodes + 1,
        "predicted_tokens_per_call": predicted,
        "tokens_per_call": observed,
        "predicted_call_s": 0.02,
        "call_s": 0.03,
        "predicted_propose_s": 0.001,
        "propose_s": 0.002,
    }


def test_rates_total_is_tokens_over_seconds_and_median_per_prompt():
    got = sup.rates([rec(0, [1] * 10, 1.0), rec(1, [1] * 10, 4.0), rec(2, [1] * 10, 5.0)])
    assert got["total"] == pytest.approx(30 / 10.0)
    assert got["median"] == pytest.approx(2.5)  # per prompt 10, 2.5, 2
    assert math.isnan(sup.rates([rec(0, [1], 0.0)])["total"])


def test_controller_choices_histogram_zero_share_and_predictions_of_predicted_rounds_only():
    rounds = [tuned(8, "probe", math.nan, 3.0), tuned(0, "probe", math.nan, 1.0), tuned(4), tuned(4), tuned(0, "model")]
    c = sup.controller_choices(rounds)
    assert c["rounds"] == 5
    assert c["nodes_histogram"] == {"0": 2, "4": 2, "8": 1}
    assert c["zero_fraction"] == pytest.approx(2 / 5)
    assert c["phases"] == {"probe": 2, "model": 3}
    assert c["predicted_tokens_per_call"] == pytest.approx(2.0)
    assert c["observed_tokens_per_call"] == pytest.approx(1.5)  # the probe rounds' 3.0 and 1.0 are left out
    empty = sup.controller_choices([])
    assert empty["rounds"] == 0 and math.isnan(empty["zero_fraction"])


@pytest.mark.parametrize(
    ("ctrl_s", "vs_best", "vs_ar"),
    [(2.0, "PASS", "PASS"), (2.2, "FAIL", "PASS"), (4.5, "FAIL", "FAIL")],
)
def test_summarise_cell_best_fixed_ratios_and_goals(ctrl_s, vs_best, vs_ar):
    toks = [5] * 40
    cell = {
        sup.AR: [rec(0, toks, 4.0)],  # 10 tok/s
        "chain K=1": [rec(0, toks, 2.0)],  # 20 tok/s: the best fixed
        "tree 4": [rec(0, toks, 2.5)],
        sup.CONTROLLER: [rec(0, toks, ctrl_s, [tuned(4)])],
    }
    s = sup.summarise_cell(cell, greedy=True)
    assert s["best_fixed"] == "chain K=1"
    assert s["controller_vs_best"] == pytest.approx(2.0 / ctrl_s)
    assert s["controller_vs_ar"] == pytest.approx(4.0 / ctrl_s)
    assert (s["goal_vs_best"], s["goal_vs_ar"]) == (vs_best, vs_ar)
    assert s["mismatch"] == {}


def test_prompt_interval_spans_the_ratio_over_resampled_prompts():
    """Every prompt at the same ratio: the interval is that ratio. Eight prompts at 0.8x and 1.2x (equal tokens and
    reference seconds): the interval lies strictly inside their range, around the pooled ratio, and
    the same for the same records; runs pair by prompt, unmatched or timeless ones are left out."""
    toks = [1] * 10
    same = [rec(p, toks, 1.25) for p in range(4)], [rec(p, toks, 1.0) for p in range(4)]
    assert sup.prompt_interval(*same) == pytest.approx((0.8, 0.8))
    ctrl = [rec(p, toks, 1 / (0.8 if p % 2 else 1.2)) for p in range(8)]
    best = [rec(p, toks, 1.0) for p in range(8)] + [rec(9, toks, 1.0)]
    lo, hi = sup.prompt_interval([*ctrl, rec(10, toks, 0.0)], best)
    pooled = sup.rates(ctrl)["total"] / sup.rates(best[:8])["total"]
    assert 0.8 < lo < pooled < hi < 1.2
    assert sup.prompt_interval(ctrl, best) == (lo, hi)
    assert all(math.isnan(v) for v in sup.prompt_interval(ctrl, [rec(42, toks, 1.0)]))
    cell = {sup.AR: best[:8], "chain K=1": [rec(p, toks, 0.9) for p in range(8)], sup.CONTROLLER: ctrl}
    s = sup.summarise_cell(cell, greedy=False)
    assert s["controller_vs_best_interval"] == sup.prompt_interval(ctrl, cell["chain K=1"])
    assert f"{s['controller_vs_best_interval'][0]:.2f}-" in sup.markdown_table({"c": s})


def test_summarise_cell_ar_can_be_the_best_fixed_and_mismatches_are_found_in_greedy_cells_only():
    cell = {
        sup.AR: [rec(0, [1, 2, 3], 1.0), rec(1, [4, 5, 6], 1.0)],
        "tree 16": [rec(0, [1, 2, 3], 2.0), rec(1, [4, 5, 7], 2.0)],
        sup.CONTROLLER: [rec(0, [1, 2, 3], 1.0), rec(1, [4, 5, 6], 1.0)],
    }
    s = sup.summarise_cell(cell, greedy=True)
    assert s["best_fixed"] == sup.AR
    assert s["mismatch"] == {"tree 16": [1]}
    assert any("MISMATCH" in line and "tree 16" in line for line in sup.cell_lines("x", s))
    assert sup.summarise_cell(cell, greedy=False)["mismatch"] == {}


def test_markdown_table_has_one_row_per_cell_and_the_goals():
    toks = [1] * 8
    cell = {sup.AR: [rec(0, toks, 1.0)], "tree 4": [rec(0, toks, 0.5)], sup.CONTROLLER: [rec(0, toks, 0.5)]}
    summaries = {"fp32 / feature / greedy": sup.summarise_cell(cell, True), "b": sup.summarise_cell(cell, False)}
    lines = sup.markdown_table(summaries).splitlines()
    assert len(lines) == 2 + 2
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "1.00x PASS" in lines[2] and "2.00x PASS" in lines[2]


def test_verdict_and_estimate():
    assert (sup.verdict(0.95, 0.95), sup.verdict(0.94, 0.95), sup.verdict(math.nan, 1.0)) == ("PASS", "FAIL", "n/a")
    plan = {"runs": 10, "tokens": 100, "factor": 0.5, "overhead_calls": 2, "probes": 3, "probe_calls": 100}
    got = sup.estimate_s({"a": 0.01, "b": 0.02}, {**plan, "load_factor": 1.0})
    assert got == pytest.approx((0.01 + 0.02) * (10 * 52 + 300))
    assert sup.estimate_s({"a": 0.01}, {**plan, "load_factor": 2.0}) > sup.estimate_s(
        {"a": 0.01}, {**plan, "load_factor": 1.0}
    )


def test_busy_core_starts_a_process_and_stops_it():
    with sup.BusyCore() as busy:
        busy.start()
        proc = busy.process
        assert proc is not None and busy.running
        busy.start()  # no second process
        assert busy.process is proc
    assert not busy.running and proc.poll() is not None
    busy.stop()  # idempotent


def test_busy_core_is_stopped_when_the_run_fails():
    busy = sup.BusyCore()
    with pytest.raises(RuntimeError), busy:
        busy.start()
        proc = busy.process
        raise RuntimeError("a failing run")
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is not None


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/autotune.py, its bare-name imports (autotune_support, bench_support) loaded from their files."""
    monkeypatch.setitem(sys.modules, "autotune_support", sup)
    monkeypatch.setitem(sys.modules, "bench_support", _load("bench_support"))
    return _load("autotune")


def test_options_defaults_quick_and_bad_values(bench):
    a = bench.parse_args([])
    assert (a.targets, a.drafters, a.samplings) == (["fp32", "mxfp6-kernel"], ["feature", "hydra"], ["greedy", "t0.8"])
    assert (a.prompts, a.max_new_tokens, a.load, a.chain_ks) == (8, 128, True, [1, 2, 4])
    q = bench.parse_args(["--quick", "--targets", "fp32"])
    assert (q.prompts, q.max_new_tokens, q.load, q.targets) == (2, 32, False, ["fp32"])
    assert bench.parse_args(["--no-load"]).load is False
    assert (a.confirm, q.confirm, bench.parse_args(["--confirm", "0"]).confirm) == (3, 0, 0)
    for bad in (
        ["--targets", "fp16"],
        ["--samplings", "t1"],
        ["--prompts", "9"],
        ["--drafters", ""],
        ["--confirm", "-1"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert bench.cell_name("fp32", "hydra", "t0.8", True) == "fp32 / hydra / t0.8 / load"
    assert a.controller_b is None
    b = bench.parse_args(["--controller-b", "margin=0.05,explore_every=8"]).controller_b
    assert (b.margin, b.explore_every, b.decay) == (0.05, 8, bench.TuneSettings().decay)  # the rest: the defaults
    assert bench.parse_args(["--controller-b", ""]).controller_b == bench.TuneSettings()  # an A/A pair
    for bad in ("margins=0.05", "margin=", "margin=lots", "margin=1.5", "decay=0", "explore_every=true"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--controller-b", bad])


def test_a_second_controller_is_compared_with_the_first_not_taken_for_a_fixed_setting():
    toks = [5] * 40
    cell = {
        sup.AR: [rec(p, toks, 4.0) for p in range(4)],
        "chain K=1": [rec(p, toks, 2.0) for p in range(4)],
        sup.CONTROLLER: [rec(p, toks, 2.5, [tuned(4)]) for p in range(4)],
        sup.CONTROLLER_B: [rec(p, toks, 1.0 + 0.5 * (p % 2), [tuned(0)]) for p in range(4)],  # the fastest run
    }
    s = sup.summarise_cell(cell, greedy=True)
    assert s["best_fixed"] == "chain K=1" and s["controller_vs_best"] == pytest.approx(0.8)
    assert s["controller_b_vs_a"] == pytest.approx((160 / 5.0) / (160 / 10.0))
    lo, hi = s["controller_b_vs_a_interval"]
    assert 2.5 / 1.5 <= lo < hi <= 2.5 and s["choices_b"]["zero_fraction"] == 1.0
    assert any("controller B / controller 2.00x" in line for line in sup.cell_lines("c", s))
    del cell[sup.CONTROLLER_B]
    assert "controller_b_vs_a" not in sup.summarise_cell(cell, greedy=True)


def test_the_confirmation_pass_reruns_the_fastest_fixed_settings(bench):
    """The settings the confirmation pass reruns: the fastest fixed ones of the grid cell (tokens over seconds), never
    AR or the controller, settings without time last."""
    rec = sup.RunRecord

    def runs(seconds: float) -> list:
        return [rec(0, [1] * 10, 10, seconds, []), rec(1, [1] * 10, 10, seconds, [])]

    cell = {"AR": runs(1.0), "chain K=1": runs(0.5), "tree 4": runs(0.4), "tree 8": runs(2.0), "none": runs(0.0),
            "controller": runs(0.1)}  # fmt: skip
    known = ["chain K=1", "tree 4", "tree 8", "none"]
    assert bench.fastest_settings(cell, known, 2) == ["tree 4", "chain K=1"]
    assert bench.fastest_settings(cell, known, 9) == ["tree 4", "chain K=1", "tree 8", "none"]
    assert bench.fastest_settings(cell, known, 0) == []


def test_shape_labels_name_the_arms_of_the_controller():
    """The arm names ``AutoTune`` records (proposer names) shorten to the labels the table counts."""
    from accel.spd import DraftChain, DraftTree, FirstOf, Merge, NgramLookup
    from tests.helpers.decoders import backend, random_model

    draft = backend(random_model(seed=1), 1, ctx_len=32)
    names = {
        FirstOf(NgramLookup(3, 4), DraftChain(draft, k=4)).info.name: "lookup|chain",
        DraftChain(draft, k=4).info.name: "chain",
        Merge(NgramLookup(3, 4), DraftTree(draft, nodes=8)).info.name: "lookup+tree",
        DraftTree(draft, nodes=8).info.name: "tree",
        "": "?",
    }
    assert {sup.shape_label(n) for n in names} == set(names.values())
    assert all(sup.shape_label(n) == label for n, label in names.items())
    first = next(iter(names))
    rounds = [
        {
            "nodes": n,
            "shape": s,
            "phase": "model",
            "predicted_tokens_per_call": 1.0,
            "tokens_per_call": 1.0,
            "predicted_call_s": 1.0,
            "call_s": 1.0,
        }
        for n, s in ((2, first), (2, first), (0, "none"))
    ]
    assert sup.controller_choices(rounds)["shape_rounds"] == {"lookup|chain": 2}


def test_a_target_without_trees_gets_the_chains_only(bench):
    """``gguf-kernel-q8`` scores no trees: its cells' fixed settings are the chains (with and without lookup)."""
    from tests.helpers.decoders import backend, random_model

    draft = backend(random_model(seed=1), 1, ctx_len=32)
    b = bench.Bench({}, draft, None, [])
    args = bench.parse_args(["--targets", "gguf-kernel-q8", "--drafters", "feature"])
    every, chains = bench.fixed_settings("feature", b, args), bench.fixed_settings("feature", b, args, trees=False)
    assert {n for n in every if "tree" in n} == {
        "tree 4",
        "tree 8",
        "tree 16",
        *(f"tree {n} + lookup" for n in (4, 8, 16)),
    }
    assert set(chains) == {n for n in every if "tree" not in n} and chains
    assert "lookup" in chains  # the lookup alone, with no draft call
