"""AutoTune against a grid of fixed speculation settings, in one run, interleaved prompt by prompt.

    python benchmarks/autotune.py [--targets fp32,mxfp6-kernel] [--drafters feature,hydra] [--samplings greedy,t0.8]
                                  [--prompts N] [--max-new-tokens N] [--threads T] [--load | --no-load] [--quick]

Targets: SmolLM2-135M (``smollm2_checkpoint()``; ``gguf-kernel``: the shipped Q4_1 GGUF's own blocks;
``gguf-kernel-q8``: the same blocks with int8 activations, which score chains only: no tree settings) exported once
per ``--targets`` weight mode with its hidden states and tree inputs and the graph ``accel.decode`` runs
(``export_cached(..., hidden_output=True, tree=True, ort_ops=True, accel_attention=kernel_builds(),
logits_input=True)``), so one target graph serves AR, chains, trees and the controller. Drafters: ``feature`` (the
shipped feature draft ``accel/demo_data/smollm2-feature-draft``, int8 matmuls, tree inputs, the target's threads,
exported as ``accel.decode`` exports it: with ``ort_ops``, ``accel_attention`` and ``logits_input`` like the targets)
and ``hydra`` (the shipped Hydra++ heads ``accel/demo_data/smollm2-hydra``, int8 level graphs, 1 thread). Cells:
(target, drafter, sampling[, load]); samplings ``greedy`` and ``t0.8`` (``Sampling(temperature=0.8)``, seed = the
prompt's index for every setting).

Settings of a cell: AR; for ``feature`` the chains K = ``--chain-ks`` (default 1, 2, 4), the dynamic chain (cap
``--dyn-k`` 6, ``min_draft_prob`` ``--min-draft-prob`` 0.3) and the trees of ``--tree-nodes`` (4, 8, 16) nodes; for
``hydra`` the trees of ``--hydra-nodes`` (4, 12) nodes (``TreeShape.for_decoding``); each also with n-gram lookup
(``NgramLookup(--ngram 3, --ngram-k 4)``: ``FirstOf`` before a chain, ``Merge`` into a tree); the lookup alone; and
the controller, ``AutoTune`` over the drafter's shapes (feature: ``draft_arms``, lookup then a chain of up to
max(--chain-ks) (the lookup at its own length), the chain alone, lookup then the dynamic chain (on or off), the
largest tree merged with lookup, the lookup alone; Hydra: the largest tree merged with lookup and after lookup, the
lookup alone), probed (``.probe(target)``) before the pass, one
instance per cell kept across the prompts (it learns). Per prompt (the first ``--prompts`` of ``HELD_OUT_PROMPTS``),
every target, sampling and setting runs once, ``--max-new-tokens`` tokens (EOS ignored, so every run makes the same
tokens); AR runs once per (target, sampling) and serves both drafters' cells.

tok/s = a setting's new tokens over all prompts / its decode seconds (``wall_s - prefill_s`` of each run); the
median over prompts of the per-prompt tok/s is printed beside it and saved. Per cell: every setting's tok/s, the best
fixed setting (AR included), the controller's tok/s, controller / best fixed and controller / AR with the goals
(>= 0.95x and >= 1.0x: PASS/FAIL), controller / best fixed's 5-95% range over resampled prompts (the runs paired by
prompt: ``autotune_support.prompt_interval``; with 4 prompts about +-7-10% on the fp32 cells), and its choices
(``GenerationStats.tuned_rounds``: histogram of node budgets, share of rounds with 0 nodes, mean predicted vs observed
tokens per call and call ms over the rounds it predicted).
Greedy cells check every speculative output against AR token for token and print a mismatch loudly.

``--load`` (the default; ``--no-load`` skips it) runs the whole grid a second time, with new controllers, while a
background Python process spins on one core from the middle of the prompts on (the load changes mid-run); it is
stopped at exit.

The confirmation pass (``--confirm N``, default 3; 0 skips it): the best fixed setting of a grid pass is the largest
of some 15 noisy measurements, so it is biased upward by the machine's noise (the winner's curse: on a 2-core VM the
same setting's tok/s moves 5-15% between runs). After the unloaded grid pass every unloaded cell runs again, as
``<cell> / confirm``: AR, the ``N`` fastest fixed settings of the grid pass and a fresh controller (probed; it has
learned nothing yet), on the same prompts, interleaved prompt by prompt with the order rotated from prompt to prompt.
Its best fixed setting is measured independently of its selection; both passes are reported.

``--controller-b FIELD=VALUE,...`` (e.g. ``margin=0.05,explore_every=8``): every cell also runs a second
controller, with those ``TuneSettings`` fields changed, as one more setting interleaved with the rest (in the
confirmation pass too, fresh), never counted as a fixed setting; each cell then prints B / the controller and that
ratio's 5-95% range over resampled prompts: an A/B comparison of two controllers on one machine state, which separate
runs (whose cells move +-7-10% between runs) cannot give. ``--controller-b ''`` runs two default controllers: an A/A
pair, the spread of the comparison itself.

``--quick``: 2 prompts, 32 tokens, no load pass, no confirmation. Prints the CPU and its ISA flags, an estimate of
the run time (from the probed call time; exports not included), a markdown table for benchmarks/RESULTS.md, and
writes ``results/autotune.json`` (``--out``).

Run time: the default grid is the issue's less chain K = 3 (``--chain-ks 1,2,3,4`` restores it): per prompt, target
and pass 43 runs of 128 tokens, 1,376 runs in all with the load pass. On a quiet 2-core VM (one-token calls of about
28 ms fp32 and 13 ms ``mxfp6-kernel``) the estimate is about 55 minutes with ``--load`` and 25 without: over the
40 minutes aimed at; the full grid (K = 3 too) about 10% more. ``--chain-ks 1,2`` or ``--no-load`` shorten it.
The estimate printed at the start uses this machine's probed call time.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from autotune_support import (
    AR,
    CONTROLLER,
    CONTROLLER_B,
    TUNED_FIELDS,
    BusyCore,
    RunRecord,
    cell_lines,
    estimate_s,
    markdown_table,
    rates,
    summarise_cell,
    tuned_rounds,
)
from bench_support import cpu_model, json_out, save_results
from tqdm.auto import tqdm

from accel.errors import SpdError
from accel.spd import GREEDY, DraftChain, DraftTree, FirstOf, Merge, NgramLookup, Proposer, Sampling, generate
from accel.spd.autotune import AutoTune, TuneSettings, draft_arms

DEMO = Path(__file__).resolve().parents[1] / "accel" / "demo_data"
SAMPLINGS = {"greedy": GREEDY, "t0.8": Sampling(temperature=0.8)}
DRAFTERS = ("feature", "hydra")
TARGETS = ("fp32", "mxfp6-kernel", "gguf-kernel", "gguf-kernel-q8")
#: the run-time estimate (``estimate_s``), from the 2-core smoke runs: seconds per generated token over the grid's
#: runs in one-token target calls (AR = 1, winning settings less, losing ones more: 1.0-1.35 measured on a busy VM,
#: 0.65-0.9 expected where speculation wins), prefill and start per run, one controller's probe (21 sizes x 4
#: passes), and a busy core slowing the loaded half of the loaded pass about 1.5x
ESTIMATE = {"factor": 0.8, "overhead_calls": 3.0, "probe_calls": 130.0, "load_slowdown": 1.5}
Maker = Callable[[], Proposer | None]


def _csv(choices: tuple[str, ...] | None, conv: Callable[[str], Any] = str) -> Callable[[str], list]:
    """An argparse type: comma-separated values, each in ``choices`` when given."""

    def parse(text: str) -> list:
        items = [conv(x) for x in text.split(",") if x]
        bad = [x for x in items if choices is not None and x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated values of {choices or 'numbers'}")
        return items

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=_csv(TARGETS), default=list(TARGETS[:2]), help="target weights (comma-separated)")
    ap.add_argument("--drafters", type=_csv(DRAFTERS), default=list(DRAFTERS), help="feature, hydra")
    ap.add_argument("--samplings", type=_csv(tuple(SAMPLINGS)), default=list(SAMPLINGS), help="greedy, t0.8")
    ap.add_argument("--prompts", type=int, default=8, help="the first N held-out prompts (1..8)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per run (EOS ignored)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads of the target and feature draft")
    ap.add_argument("--load", action=argparse.BooleanOptionalAction, default=True, help="also the loaded pass")
    ap.add_argument(
        "--confirm",
        type=int,
        default=3,
        help="confirmation pass: AR, the N best fixed settings of the grid pass and a fresh controller (0: none)",
    )
    ap.add_argument("--quick", action="store_true", help="2 prompts, 32 tokens, no load pass")
    ap.add_argument(
        "--chain-ks", type=_csv(None, int), default=[1, 2, 4], help="feature chains' K (the full grid: 1,2,3,4)"
    )
    ap.add_argument("--dyn-k", type=int, default=6, help="K cap of the dynamic chain")
    ap.add_argument("--min-draft-prob", type=float, default=0.3, help="threshold of the dynamic chain")
    ap.add_argument("--tree-nodes", type=_csv(None, int), default=[4, 8, 16], help="feature trees' node budgets")
    ap.add_argument("--hydra-nodes", type=_csv(None, int), default=[4, 12], help="Hydra trees' node budgets")
    ap.add_argument("--ngram", type=int, default=3, help="n-gram lookup: longest suffix looked up")
    ap.add_argument("--ngram-k", type=int, default=4, help="n-gram lookup: tokens proposed from a match")
    ap.add_argument("--ctx-len", type=int, default=256, help="context of the exports (tokens)")
    ap.add_argument(
        "--controller-b",
        type=tune_settings,
        default=None,
        metavar="FIELD=VALUE,...",
        help="also run a second controller with these TuneSettings fields changed (an A/B pair in every cell), "
        "e.g. margin=0.05",
    )
    ap.add_argument("--out", type=json_out, default="results/autotune.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.load = min(args.prompts, 2), min(args.max_new_tokens, 32), False
        args.confirm = 0
    if not 1 <= args.prompts <= 8:
        ap.error("--prompts must be in 1..8 (the held-out prompts)")
    if args.max_new_tokens < 1 or args.threads < 1 or args.confirm < 0:
        ap.error("--max-new-tokens and --threads must be >= 1, --confirm >= 0")
    return args


@dataclass
class Bench:
    """What one run opens once: the targets by weight mode, the drafters' backends, the tokenized prompts."""

    targets: dict[str, Any]
    feature: Any
    hydra: Any
    prompts: list[list[int]]


def open_bench(args: argparse.Namespace) -> Bench:
    """Export (cached under ``$ACCEL_CACHE/onnx``) and open the targets and drafters; tokenize the prompts."""
    from accel.backends import OrtBackend, export_cached
    from accel.decode.spec import kernel_builds
    from accel.drafts.prompts import HELD_OUT_PROMPTS
    from accel.models import load_tokenizer, smollm2_checkpoint
    from accel.models.smollm2 import cache_root, smollm2_gguf_path

    target_dir, cache = Path(smollm2_checkpoint()), cache_root() / "onnx"
    targets = {}
    kernel = dict(ort_ops=True, accel_attention=kernel_builds(), logits_input=True)  # the graphs accel.decode runs
    for w in tqdm(args.targets, desc="targets (export once, cached)"):
        src = smollm2_gguf_path() if w.startswith("gguf-kernel") else target_dir  # the shipped Q4_1 file's blocks
        path = export_cached(src, cache, ctx_len=args.ctx_len, weights=w, hidden_output=True, tree=True, **kernel)
        packed = w.endswith("-kernel")  # keep the optimized graph of packed MX weights (as accel generate does)
        targets[w] = OrtBackend(path, threads=args.threads, optimized_dir=cache_root() / "ort" if packed else None)
    no_trees = [w for w, b in targets.items() if not scores_trees(b)]
    if "hydra" in args.drafters and no_trees:
        raise SystemExit(f"--drafters hydra proposes trees only, which the {', '.join(no_trees)} target does not score")
    feature = hydra = None
    if "feature" in args.drafters:  # as accel.decode exports a draft (cached_graph): 1.4 ms a call, not 1.7
        path = export_cached(
            DEMO / "smollm2-feature-draft", cache, ctx_len=args.ctx_len, weights="int8", tree=True, **kernel
        )
        feature = OrtBackend(path, threads=args.threads)
    if "hydra" in args.drafters:
        from accel.drafts.hydra import HydraRuntime, export_hydra_cached

        out = export_hydra_cached(DEMO / "smollm2-hydra", target_dir, cache, ctx_len=args.ctx_len, weights="int8")
        hydra = HydraRuntime(out, threads=1)
    tok = load_tokenizer(target_dir)
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    room = max(len(p) for p in prompts) + args.max_new_tokens + max(args.tree_nodes + args.hydra_nodes) + args.ngram_k
    if room > args.ctx_len:
        raise SystemExit(f"--ctx-len {args.ctx_len} is too short: a run may need {room} positions")
    return Bench(targets, feature, hydra, prompts)


def _lookup(args: argparse.Namespace) -> NgramLookup:
    return NgramLookup(args.ngram, args.ngram_k)


def _with_lookup(args: argparse.Namespace, join: type, make: Callable[[], Proposer]) -> Maker:
    """A factory of ``join(lookup, make())`` (``FirstOf`` for a chain, ``Merge`` for a tree)."""
    return lambda: join(_lookup(args), make())


def _hydra_tree(bench: Bench, nodes: int) -> Proposer:
    from accel.drafts.hydra import HydraProposer, TreeShape

    return HydraProposer(bench.hydra, TreeShape.for_decoding(bench.hydra.num_heads, nodes))


def scores_trees(target: Any) -> bool:
    """Whether ``target`` scores token trees (an int8-activation target, ``gguf-kernel-q8``, does not: chains only)."""
    return "tree" in target.info.capabilities


def fixed_settings(drafter: str, bench: Bench, args: argparse.Namespace, trees: bool = True) -> dict[str, Maker]:
    """name -> a factory of a fresh proposer, for every fixed setting of ``drafter`` (AR not included; ``trees``
    False: the chains only, for a target that scores no trees)."""
    chains: dict[str, Callable[[], Proposer]] = {}
    tree_makers: dict[str, Callable[[], Proposer]] = {}
    if drafter == "feature":
        for k in args.chain_ks:
            chains[f"chain K={k}"] = partial(DraftChain, bench.feature, k=k)
        p = args.min_draft_prob
        chains[f"dyn chain K<={args.dyn_k} p={p:g}"] = partial(DraftChain, bench.feature, args.dyn_k, p)
        for n in args.tree_nodes if trees else ():
            tree_makers[f"tree {n}"] = partial(DraftTree, bench.feature, nodes=n)
    else:
        for n in args.hydra_nodes:
            tree_makers[f"hydra tree {n}"] = partial(_hydra_tree, bench, n)
    out: dict[str, Maker] = {**chains, **tree_makers}
    out.update({f"{name} + lookup": _with_lookup(args, FirstOf, make) for name, make in chains.items()})
    out.update({f"{name} + lookup": _with_lookup(args, Merge, make) for name, make in tree_makers.items()})
    out["lookup"] = partial(_lookup, args)  # n-gram lookup alone: no draft call at all
    return out


def controller(
    drafter: str, bench: Bench, args: argparse.Namespace, target: Any, settings: TuneSettings | None = None
) -> AutoTune:
    """``AutoTune`` over the drafter's shapes, probed on ``target``: for the feature draft ``draft_arms`` (lookup
    first then a chain of up to max(--chain-ks), the chain alone, lookup first then the dynamic chain (--dyn-k,
    --min-draft-prob), the largest tree merged with lookup); for Hydra
    heads the largest tree merged with lookup and after lookup (``FirstOf``). ``settings``: the controller's
    (default ``TuneSettings()``)."""
    if drafter == "feature":
        lookup = (args.ngram, args.ngram_k)
        top, dynamic = max(args.tree_nodes), (args.dyn_k, args.min_draft_prob)
        arms = draft_arms(
            bench.feature, k=max(args.chain_ks), nodes=top, lookup=lookup, dynamic=dynamic, trees=scores_trees(target)
        )
    else:
        top = max(args.hydra_nodes)
        arms = [
            Merge(_lookup(args), _hydra_tree(bench, top)),
            FirstOf(_lookup(args), _hydra_tree(bench, top)),
            _lookup(args),
        ]
    tuner = AutoTune(arms, settings=settings)
    tuner.probe(target)
    return tuner


def run_one(target: Any, proposer: Proposer | None, ids: list[int], i: int, sampling: Sampling, n: int) -> RunRecord:
    """One ``generate`` on prompt ``i`` (seed ``i``, ``n`` tokens, EOS ignored)."""
    res = generate(target, proposer, [ids], max_new_tokens=n, sampling=sampling, seed=i, eos_token_id=None)
    s = res.stats
    tuned = [{f: getattr(t, f) for f in TUNED_FIELDS} for t in s.tuned_rounds]
    return RunRecord(i, res.tokens[0], s.new_tokens, s.wall_s - s.prefill_s, tuned)


def cell_name(target: str, drafter: str, sampling: str, load: bool) -> str:
    """``"fp32 / feature / greedy"`` (`` / load`` in the loaded pass)."""
    return f"{target} / {drafter} / {sampling}" + (" / load" if load else "")


Records = dict[str, dict[str, list[RunRecord]]]  # cell -> setting -> one record per prompt


def run_pass(bench: Bench, args: argparse.Namespace, load: bool, busy: BusyCore, bar: tqdm) -> tuple[Records, dict]:
    """One pass over the grid, prompt-major; with ``load`` the busy core starts before the middle prompt (and stops
    at the end of the pass). Returns the records and the pass's controllers by cell."""
    trees = {t: scores_trees(bench.targets[t]) for t in args.targets}
    settings = {(t, d): fixed_settings(d, bench, args, trees[t]) for t in args.targets for d in args.drafters}
    tuners: dict[str, AutoTune] = {}
    for t in args.targets:
        for d in args.drafters:
            for s in args.samplings:
                bar.set_postfix_str(f"probing {t} for {d}")
                name = cell_name(t, d, s, load)
                tuners[name] = controller(d, bench, args, bench.targets[t])
                if args.controller_b is not None:
                    tuners[name + B] = controller(d, bench, args, bench.targets[t], args.controller_b)
    records: Records = {c: {} for c in tuners if not c.endswith(B)}
    for i, ids in enumerate(bench.prompts):
        if load and i == len(bench.prompts) // 2:
            busy.start()
        for t in args.targets:
            for s in args.samplings:
                run = partial(run_one, bench.targets[t], ids=ids, i=i, sampling=SAMPLINGS[s], n=args.max_new_tokens)
                bar.set_postfix_str(f"prompt {i} {t} {s} AR")
                ar = run(None)
                bar.update()
                for d in args.drafters:
                    name = cell_name(t, d, s, load)
                    makers: dict[str, Maker] = {**settings[t, d], **controllers(tuners, name)}
                    records[name].setdefault(AR, []).append(ar)
                    reference = ar.tokens if s == "greedy" else None
                    run_settings(records[name], makers, run, bar, f"prompt {i} {t} {d} {s}", reference)
    busy.stop()
    return records, tuners


CONFIRM = " / confirm"  # the suffix of a cell's name in the confirmation pass


def fastest_settings(cell: dict[str, list[RunRecord]], known: Sequence[str], n: int) -> list[str]:
    """The ``n`` fixed settings of ``known`` with the most tok/s in ``cell`` (a grid pass's records), fastest first
    (settings without a finite rate last)."""
    speed = {name: rates(recs)["total"] for name, recs in cell.items() if name in known}
    return sorted(speed, key=lambda name: -speed[name] if math.isfinite(speed[name]) else math.inf)[:n]


def confirm_pass(bench: Bench, args: argparse.Namespace, grid: Records, bar: tqdm) -> tuple[Records, dict]:
    """The confirmation pass (module docstring): per unloaded cell, AR, the ``--confirm`` best fixed settings of the
    grid pass ``grid`` and a fresh controller (probed), prompt-major, the settings' order rotated prompt by prompt."""
    makers: dict[str, dict[str, Maker]] = {}
    tuners: dict[str, AutoTune] = {}
    for t in args.targets:
        for d in args.drafters:
            known = fixed_settings(d, bench, args, scores_trees(bench.targets[t]))
            for s in args.samplings:
                cell = cell_name(t, d, s, False)
                top = fastest_settings(grid[cell], known, args.confirm)
                bar.set_postfix_str(f"probing {t} for {d} (confirmation)")
                tuners[cell + CONFIRM] = controller(d, bench, args, bench.targets[t])
                if args.controller_b is not None:
                    tuners[cell + CONFIRM + B] = controller(d, bench, args, bench.targets[t], args.controller_b)
                makers[cell + CONFIRM] = {n: known[n] for n in top}
    records: Records = {c: {} for c in tuners if not c.endswith(B)}
    for i, ids in enumerate(bench.prompts):
        for t in args.targets:
            for s in args.samplings:
                run = partial(run_one, bench.targets[t], ids=ids, i=i, sampling=SAMPLINGS[s], n=args.max_new_tokens)
                ar = run(None)
                bar.update()
                for d in args.drafters:
                    name = cell_name(t, d, s, False) + CONFIRM
                    records[name].setdefault(AR, []).append(ar)
                    order = [*makers[name].items(), *controllers(tuners, name).items()]
                    order = order[i % len(order) :] + order[: i % len(order)]  # no setting always runs first
                    reference = ar.tokens if s == "greedy" else None
                    run_settings(records[name], dict(order), run, bar, f"confirm {i} {t} {d} {s}", reference)
    return records, tuners


B = " B"  # the key suffix of a cell's second controller (--controller-b) among a pass's controllers


def controllers(tuners: dict[str, AutoTune], cell: str) -> dict[str, Maker]:
    """The cell's controller as a setting (``CONTROLLER``), and its second one (``CONTROLLER_B``) where there is one."""
    out: dict[str, Maker] = {CONTROLLER: partial(_same, tuners[cell])}
    if cell + B in tuners:
        out[CONTROLLER_B] = partial(_same, tuners[cell + B])
    return out


def tune_settings(text: str) -> TuneSettings:
    """An argparse type: ``FIELD=VALUE,...`` of ``TuneSettings`` (true/false, ints, floats), checked."""
    names = sorted(f.name for f in fields(TuneSettings))
    values: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, raw = item.partition("=")
        if key not in names or not raw:
            raise argparse.ArgumentTypeError(f"{item!r}: give FIELD=VALUE with FIELD one of {names}")
        try:
            values[key] = _setting_value(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: the value is not true/false or a number") from None
    settings = TuneSettings(**values)
    try:
        settings.check()
    except SpdError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return settings


def _setting_value(raw: str) -> bool | int | float:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        return int(raw)
    except ValueError:
        return float(raw)


def _same(tuner: AutoTune) -> AutoTune:
    """The controller itself (one instance per cell, kept across prompts), as a setting's factory returns it."""
    return tuner


def run_settings(
    cell: dict[str, list[RunRecord]],
    makers: dict[str, Maker],
    run: Callable[[Proposer | None], RunRecord],
    bar: tqdm,
    tag: str,
    reference: list[int] | None,
) -> None:
    """Run every setting of ``makers`` once (``run(proposer)``) and append its record to ``cell``; with greedy
    ``reference`` tokens (AR's) say at once, loudly, when a setting's output differs."""
    for name, make in makers.items():
        bar.set_postfix_str(f"{tag} {name}")
        rec = run(make())
        cell.setdefault(name, []).append(rec)
        if reference is not None and rec.tokens != reference:
            tqdm.write(f"!!! MISMATCH: {tag} {name}: greedy output differs from AR (engine broken) !!!")
        bar.update()


def controllers_per_cell(args: argparse.Namespace) -> int:
    """Controllers run in every cell of a pass: the controller, and the second one of ``--controller-b``."""
    return 1 if args.controller_b is None else 2


def runs_per_prompt(bench: Bench, args: argparse.Namespace) -> int:
    """``generate`` runs per prompt and target in one pass: per sampling, AR and every drafter's settings and its
    controller(s)."""
    per = sum(len(fixed_settings(d, bench, args)) + controllers_per_cell(args) for d in args.drafters)
    return len(args.samplings) * (1 + per)


def print_estimate(bench: Bench, args: argparse.Namespace) -> None:
    """The estimated run time from a probe of each target's one-token call (``accel.spd.costs.probe_target``)."""
    from accel.spd.costs import probe_target

    step = {t: probe_target(bench.targets[t], [1], repeats=5).seconds(1) or math.nan for t in args.targets}
    passes = 2 if args.load else 1
    plan = {
        "runs": passes * args.prompts * runs_per_prompt(bench, args),
        "tokens": args.max_new_tokens,
        "probes": passes * len(args.drafters) * len(args.samplings),
        "load_factor": (passes + 0.5 * (ESTIMATE["load_slowdown"] - 1.0) * (passes - 1)) / passes,
        **ESTIMATE,
    }
    total = estimate_s(step, plan)
    calls = ", ".join(f"{t} {1e3 * s:.1f} ms" for t, s in step.items())
    print(
        f"one-token target call: {calls}; {plan['runs'] * len(step):.0f} runs; estimated run time "
        f"~{total / 60:.1f} min (exports excluded; the progress bar's ETA follows the real pace)",
        flush=True,
    )


def report(all_records: Records, tuners: dict, args: argparse.Namespace) -> dict:
    """Print every cell's block and the markdown table; return the JSON body."""
    summaries = {}
    for name, cell in all_records.items():
        greedy = name.split(" / ")[2] == "greedy"
        summaries[name] = summarise_cell(cell, greedy)
        print("\n".join(cell_lines(name, summaries[name])))
        print(f"  controller now: {tuners[name].describe()}", flush=True)
    print("\n" + markdown_table(summaries))
    bad = sum(len(s["mismatch"]) for s in summaries.values())
    if bad:
        print(f"\n!!! {bad} greedy setting(s) differ from AR: see MISMATCH above !!!", flush=True)
    runs = {
        c: {
            s: [{"prompt": r.prompt, "new_tokens": r.new_tokens, "decode_s": r.decode_s} for r in v]
            for s, v in x.items()
        }
        for c, x in all_records.items()
    }
    rounds = {c: tuned_rounds(x, CONTROLLER) for c, x in all_records.items()}
    config = {k: v for k, v in vars(args).items() if k not in ("out", "controller_b")}
    out = {"config": config, "cells": summaries, "runs": runs, "controller_rounds": rounds, "mismatches": bad}
    if args.controller_b is not None:
        config["controller_b"] = asdict(args.controller_b)
        out["controller_b_rounds"] = {c: tuned_rounds(x, CONTROLLER_B) for c, x in all_records.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from accel.backends.cpu import INT8_DOT_FLAGS, cpu_flags

    isa = " ".join(f for f in ("avx2", "avx512f", "avx512bw", "avx512vbmi", *INT8_DOT_FLAGS) if f in cpu_flags())
    print(f"CPU: {cpu_model()}; ISA flags: {isa or '(none read)'}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below stops the busy core
    busy = BusyCore()
    try:
        bench = open_bench(args)
        print_estimate(bench, args)
        passes = [False, True] if args.load else [False]
        total = len(passes) * args.prompts * len(args.targets) * runs_per_prompt(bench, args)
        per_cell = args.confirm + controllers_per_cell(args)
        confirm = len(args.samplings) * (1 + len(args.drafters) * per_cell) if args.confirm else 0
        total += args.prompts * len(args.targets) * confirm
        records: Records = {}
        tuners: dict = {}
        with tqdm(total=total, desc="runs", unit="run") as bar:
            for load in passes:
                got, tuned = run_pass(bench, args, load, busy, bar)
                records.update(got)
                tuners.update(tuned)
            if args.confirm:
                got, tuned = confirm_pass(bench, args, records, bar)
                records.update(got)
                tuners.update(tuned)
    finally:
        busy.stop()
    data = report(records, tuners, args)
    print(f"wrote {save_results(args.out, data, __file__)}")
    return 1 if data["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
