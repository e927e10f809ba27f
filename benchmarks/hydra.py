"""Hydra heads against the other drafts on onnxruntime, measured in one run on the same held-out prompts.

    flock /work/helpers/bench.lock python benchmarks/hydra.py --hydra DIR [--hydra DIR2] [--temperature 0.8]

Rows (batch 1, one prompt at a time, the first --prompts of ``accel.drafts.HELD_OUT_PROMPTS``, --max-new tokens
each): autoregressive; the shipped standalone draft (chain of --k); the shipped feature draft (chain of --k, int8);
then for every ``--hydra DIR`` (Hydra++ or MLP-only heads, named by their config): a tree of each ``--nodes`` budget
(top --top-k children, --top-k nodes expanded per level, depth min(4, heads); int8 level graphs) and the heads' top-1
chain; for the first DIR also the largest tree with float32 level graphs (the int8 ablation). With ``--ngram N``
also n-gram lookup (``NgramLookup(N, --ngram-k)``, as ``accel generate --ngram N --ngram-k K``): lookup alone, the
feature draft's dynamic chain (cap 6, ``min_draft_prob`` 0.3) after lookup, and every Hydra tree after lookup
(``FirstOf``: lookup where it matches, the tree otherwise) and merged with it (``Merge``: lookup's chain joined into
the tree, one target call verifies both); ``--lookup`` picks which. A ``--nodes`` item ``N:MIN:EXPAND`` gives that
tree the probability thresholds ``TreeShape.min_prob`` / ``expand_prob`` (``accel generate``'s ``--tree-min-prob`` /
``--tree-expand-prob``). ``--skip`` drops rows. Per row: tokens per target call, draft ms per round, ms per round,
draft nodes per round, the share of rounds drafted by lookup alone, tokens/s and the speedup over AR's tokens/s in the
same run (prompt-major: every row decodes prompt 1, then prompt 2, ...); greedy rows are checked token for token
against AR.
``--costs`` first prints the target's cost of one call by its width (1..13 tokens), the curve that prices a tree.
``--target-weights`` exports the target with other weights (e.g. ``mxfp6-kernel``, MXFP6 on accel's fused kernel):
every row runs on it and the speedups stay over its AR; a row "autoregressive, fp32 target" (timed in the same
run, its own speedup over that AR) gives the figure against the float32 target. ``--predict HW ...`` then prices every
Hydra row's measured loops with ``accel.sim`` on those catalog devices (``predict_rows``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from functools import partial
from pathlib import Path

from bench_support import json_out, save_results

from accel.backends.weights import WEIGHT_MODES, WeightFormat
from accel.decode import (
    ARSpec,
    ChainSpec,
    DecodeSpec,
    FirstOfSpec,
    HydraTreeSpec,
    LookupSpec,
    MergeSpec,
    ProposerSpec,
    SamplingSpec,
    TargetSpec,
    build,
)
from accel.decode.opening import GraphNeeds, Opener

REPO = Path(__file__).resolve().parents[1]
SHIPPED_DRAFT = REPO / "accel" / "demo_data" / "smollm2-draft"
SHIPPED_FEATURE = REPO / "accel" / "demo_data" / "smollm2-feature-draft"
FP32_AR = "autoregressive, fp32 target"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hydra", required=True, action="append", metavar="DIR", help="Hydra heads directory (repeatable)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--prompts", type=int, default=8, help="the first N held-out prompts (1..8)")
    ap.add_argument("--k", type=int, default=3, help="chain length of the draft models")
    ap.add_argument(
        "--nodes",
        type=tree_spec,
        nargs="+",
        default=[(4, 0.0, 0.0), (12, 0.0, 0.0)],
        metavar="N[:MIN[:EXPAND]]",
        help="Hydra trees: N nodes below the root, optionally with TreeShape thresholds min_prob MIN and expand_prob "
        "EXPAND (accel generate's --tree-min-prob / --tree-expand-prob; EXPAND 0: MIN), e.g. 4 8:0.05:0.2",
    )
    ap.add_argument("--top-k", type=int, default=4, help="Hydra tree: children per expanded node")
    ap.add_argument("--ngram", type=int, default=0, help="n-gram lookup rows: the longest suffix looked up (0: off)")
    ap.add_argument("--ngram-k", type=int, default=4, help="tokens proposed from a lookup match")
    ap.add_argument(
        "--lookup", nargs="+", default=list(LOOKUP), choices=LOOKUP, help="with --ngram: which lookup rows to run"
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=SKIPPABLE, help="rows to leave out")
    ap.add_argument("--costs", action="store_true", help="first print the target's cost per call by width")
    ap.add_argument("--temperature", type=float, default=None, help="sampled rows at this temperature (default greedy)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads of the target")
    ap.add_argument(
        "--target-weights",
        default="fp32",
        choices=WEIGHT_MODES,
        help="the target's export weights (accel generate --weights, e.g. mxfp6-kernel); when not fp32 an fp32 "
        "target's AR row is timed too",
    )
    ap.add_argument(
        "--predict",
        nargs="+",
        type=device,
        default=[],
        metavar="HW",
        help="also price every Hydra row's measured loops on these accel.sim devices (e.g. cloud-ai-100-pro "
        "a100-80gb): predicted speedup over fp16 AR",
    )
    ap.add_argument("--ctx-len", type=int, default=512)
    ap.add_argument("--json", type=json_out, default=None, help="write {run, rows} here (bench_support)")
    return ap.parse_args()


def tree_spec(text: str) -> tuple[int, float, float]:
    """``N[:MIN[:EXPAND]]`` -> (nodes, min_prob, expand_prob); an argparse type."""
    try:
        parts = [float(x) for x in text.split(":")]
        nodes, keep, expand = int(parts[0]), *[*parts[1:], 0.0, 0.0][:2]
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"not N[:MIN[:EXPAND]]: {text!r}") from None
    if len(parts) > 3 or nodes < 1 or nodes != parts[0] or not (0 <= keep < 1 and 0 <= expand < 1):
        raise argparse.ArgumentTypeError(f"{text!r}: N >= 1 nodes, thresholds in [0, 1)")
    return nodes, keep, expand


def device(text: str) -> str:
    """A catalog device name for ``--predict``, checked before the run (an argparse type)."""
    from accel.errors import SimError
    from accel.sim.hardware import hardware

    try:
        hardware(text)
    except SimError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


SKIPPABLE = ("standalone", "feature", "fp32", "chain", "tree")  # tree: the Hydra trees without lookup
#: lookup rows (--ngram): lookup alone, the feature chain after lookup, Hydra trees after lookup / merged with it
LOOKUP = ("alone", "feature", "first", "merge")


def proposers(args: argparse.Namespace, heads_of: dict[str, str]) -> dict[str, ProposerSpec]:
    """row name -> the ``DecodeSpec`` proposer of that row (``ARSpec`` for AR); ``heads_of`` gets each Hydra row's
    heads dir."""
    rows: dict[str, ProposerSpec] = {"autoregressive": ARSpec()}
    lookup = LookupSpec(n=args.ngram, k=args.ngram_k) if args.ngram else None
    tag = f"lookup n={args.ngram} k={args.ngram_k}"
    if lookup and "alone" in args.lookup:
        rows[tag] = lookup
    if "standalone" not in args.skip:
        rows[f"standalone draft, chain k={args.k}"] = ChainSpec(draft=SHIPPED_DRAFT, k=args.k)
    feature = partial(ChainSpec, draft=SHIPPED_FEATURE, threads=args.threads)  # int8: build's default for it
    if "feature" not in args.skip:
        rows[f"feature draft, chain k={args.k} (int8)"] = feature(k=args.k)
    if lookup and "feature" in args.lookup:  # spd.py's best after lookup
        rows[f"feature dyn chain 6 t=0.3, after {tag}"] = FirstOfSpec(
            lookup=lookup, then=feature(k=6, min_draft_prob=0.3)
        )
    for n, heads_dir in enumerate(args.hydra):
        made = hydra_rows(args, heads_dir, first=n == 0, lookup=lookup, tag=tag)
        rows.update(made)
        heads_of.update(dict.fromkeys(made, heads_dir))
    return rows


def hydra_rows(
    args: argparse.Namespace, heads_dir: str, first: bool, lookup: LookupSpec | None, tag: str
) -> dict[str, ProposerSpec]:
    """The rows of one heads directory: its trees (plain, after lookup, merged), the fp32 ablation, its chain."""
    from accel.drafts.hydra.config import HydraConfig

    config = HydraConfig.model_validate_json((Path(heads_dir) / "config.json").read_text())
    num_heads, kind = config.num_heads, "Hydra++" if config.prefix else "Hydra (MLP)"
    heads = partial(HydraTreeSpec, heads=Path(heads_dir), top_k=args.top_k, weights="int8")
    rows: dict[str, ProposerSpec] = {}
    for budget, keep, expand in args.nodes:
        tree = heads(nodes=budget, min_prob=keep, expand_prob=expand or None)
        name = f"{kind}, tree {budget}" + (f" p {keep:g}/{expand or keep:g}" if keep or expand else "")
        if "tree" not in args.skip:
            rows[name] = tree
        if lookup and "first" in args.lookup:
            rows[f"{name}, after {tag}"] = FirstOfSpec(lookup=lookup, then=tree)
        if lookup and "merge" in args.lookup:
            rows[f"{name}, merged with {tag}"] = MergeSpec(lookup=lookup, tree=tree)
    if first and "fp32" not in args.skip:
        budget, keep, expand = max(args.nodes)
        rows[f"{kind}, tree {budget} fp32"] = heads(
            nodes=budget, min_prob=keep, expand_prob=expand or None, weights="fp32"
        )
    if "chain" not in args.skip:
        depth = min(4, num_heads)  # the heads' top-1 chain: a tree of one child per node
        rows[f"{kind}, chain k={depth}"] = HydraTreeSpec(heads=Path(heads_dir), nodes=depth, top_k=1, depth=depth)
    return rows


def target_costs(target, ctx: int = 120, reps: int = 5) -> None:
    """Median seconds of one target call by its width (tokens), at ``ctx`` tokens of context."""
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    target.reset()
    target.forward_hidden(rng.integers(0, 1000, (1, ctx)), np.arange(ctx)[None], num_logits=1)
    widths = list(range(1, 14))
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(reps):
        for w in widths:
            ids, pos = rng.integers(0, 1000, (1, w)), (ctx + np.arange(w))[None]
            t0 = time.perf_counter()
            target.forward_hidden(ids, pos, num_logits=w)
            times[w].append(time.perf_counter() - t0)
    base = float(np.median(times[1]))
    print("target call by width: " + "  ".join(f"{w}:{np.median(v) / base:.2f}" for w, v in times.items()))
    print(f"(x the 1-token call, {1e3 * base:.1f} ms; medians of {reps})", flush=True)
    target.reset()


#: a row's loop shape over its prompts (what accel.sim.LoopStats takes): sums weighted by (row, round) pairs
LOOP_ZERO = {"loop_tokens": 0.0, "all_accepted": 0, "draft_calls": 0.0, "draft_width": 0.0}


def add_loop_shape(t: dict, s) -> None:
    """Add one run's ``GenerationStats`` loop shape to the row's totals ``t``."""
    t["loop_tokens"] += s.mean_tokens_per_loop * s.row_calls
    t["all_accepted"] += s.all_accepted_rounds
    if math.isfinite(s.draft_calls_per_loop) and s.draft_calls_per_loop > 0:
        calls = s.draft_calls_per_loop * s.rounds
        t["draft_calls"] += calls
        t["draft_width"] += calls * s.mean_draft_tokens_per_call


def predict_rows(totals: dict, heads_of: dict[str, str], hardware: list[str], target_dir: Path) -> dict:
    """Price each Hydra row's measured loops (``accel.sim.LoopStats``) with the heads as ``hydra_draft`` on each
    device: fp16 target and heads, prompt 128 / generation 512, batch 1 (as ``accel demo``). Hydra++'s prefix feed
    (one draft call of ~E target states a round) is taken out of the measured calls, since ``hydra_draft`` spreads
    the prefix layer over the level calls. Prints one line per row and returns {row: {device: {"fp16": speedup,
    "mxfp6": speedup}}} (over fp16 AR; rows of more than ``MAX_K`` nodes per round are beyond the simulator's cap
    and left out)."""
    from accel.sim import LoopStats, hydra_draft, predict_speedup
    from accel.sim._base import MAX_K
    from accel.sim.hf_config import resolve_model

    target = resolve_model(target_dir / "config.json")
    print("predicted (accel.sim, measured loops; fp16 target and heads; speedup over fp16 AR; mxfp6 target in [])")
    out: dict = {}
    for name, heads_dir in heads_of.items():
        t = totals[name]
        rows = max(t["calls"], 1)
        cfg = json.loads((Path(heads_dir) / "config.json").read_text())
        keys = ("num_heads", "mlp_layers", "prefix", "head_vocab")
        draft = hydra_draft(target, **{k: cfg[k] for k in keys})
        tokens, rounds = max(1.0, t["loop_tokens"] / rows), max(t["rounds"], 1)
        calls, fed = t["draft_calls"], t["draft_width"]
        if cfg["prefix"]:  # hydra_draft prices the prefix layer inside each level call: count level calls only
            calls, fed = calls - rounds, fed - tokens * rounds  # one feed of ~E target states per round
        stats = LoopStats(
            tokens_per_loop=tokens,
            drafts_per_loop=max(t["nodes"] / rows, 1e-9),
            all_accepted_fraction=min(1.0, t["all_accepted"] / rows),
            draft_calls_per_loop=max(calls, 0.0) / rounds,
            lookup_fraction=min(1.0, t["lookup"] / rows),
            draft_tokens_per_call=max(1.0, fed / calls) if calls > 0 else 1.0,
        )
        k = max(1, math.ceil(max(stats.drafts_per_loop, stats.draft_calls()) - 1e-9))
        if k > MAX_K:
            print(f"{name:<58} {stats.drafts_per_loop:.0f} nodes per round: beyond the simulator's K cap ({MAX_K})")
            continue
        out[name] = {}
        for hw in hardware:
            p = predict_speedup(target, draft, hw, loop_stats=stats, k=k, prompt_len=128, gen_len=512, batch_size=1)
            base = p.configs[0].name.removesuffix(" AR")  # the model's own dtype (fp16 for SmolLM2's config)
            out[name][hw] = {"fp16": p.config(f"{base} + SpD").speedup, "mxfp6": p.config("mxfp6 + SpD").speedup}
        cells = "  ".join(f"{hw} {v['fp16']:.2f}x [{v['mxfp6']:.2f}x]" for hw, v in out[name].items())
        print(f"{name:<58} {cells}", flush=True)
    return out


def _specs(args: argparse.Namespace, rows: dict[str, ProposerSpec], target_dir: Path) -> dict[str, DecodeSpec]:
    """Every row as a ``DecodeSpec`` on the target (``--target-weights``; the fp32 AR row on float32 weights)."""
    target = TargetSpec(path=target_dir, weights=args.target_weights, ctx_len=args.ctx_len, threads=args.threads)
    sampling = SamplingSpec(greedy=True) if args.temperature is None else SamplingSpec(temperature=args.temperature)
    spec = partial(DecodeSpec, sampling=sampling, max_new_tokens=args.max_new, autotune=False)
    specs = {name: spec(target=target, proposer=p) for name, p in rows.items()}
    if args.target_weights != "fp32":  # right after AR: its own AR on float32 weights, timed in the same run
        fp32 = spec(target=target.model_copy(update={"weights": WeightFormat.FP32}))
        specs = {"autoregressive": specs.pop("autoregressive"), FP32_AR: fp32, **specs}
    return specs


def main() -> int:
    args = parse_args()
    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.drafts.prompts import HELD_OUT_PROMPTS
    from accel.models import smollm2_checkpoint

    target_dir = Path(smollm2_checkpoint())
    tok = load_text_tokenizer(target_dir)
    if not 1 <= args.prompts <= len(HELD_OUT_PROMPTS):
        raise SystemExit(f"--prompts must be in 1..{len(HELD_OUT_PROMPTS)}")
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    heads_of: dict[str, str] = {}
    specs = _specs(args, proposers(args, heads_of), target_dir)
    # one target session (hidden states and tree inputs) for every row; the fp32 AR row opens its own
    opener = Opener(GraphNeeds(hidden_output=True, tree=True), target_spin=False)
    setups = {name: build(spec, tok, opener) for name, spec in specs.items()}
    if args.costs:
        target_costs(setups["autoregressive"].target)
    zero = {"calls": 0, "new": 0, "draft_s": 0.0, "rounds": 0, "wall": 0.0, "nodes": 0, "lookup": 0, **LOOP_ZERO}
    totals = {name: {"tokens": [], **zero} for name in setups}
    for i, prompt in enumerate(prompts):  # prompt-major: load on a shared machine falls on every row alike
        for name, setup in setups.items():
            res = setup.generate([prompt], seed=i)
            s, t = res.stats, totals[name]
            t["tokens"].append(res.tokens[0])
            t["calls"] += s.row_calls
            t["new"] += s.new_tokens
            t["rounds"] += s.rounds
            t["draft_s"] += s.draft_s
            t["nodes"] += s.draft_tokens
            t["lookup"] += s.lookup_rounds
            t["wall"] += s.wall_s - s.prefill_s
            add_loop_shape(t, s)
    rows = _report(totals, args)
    if args.predict:
        predicted = predict_rows(totals, heads_of, args.predict, target_dir)
        for row in rows:
            row["predicted_speedup"] = predicted.get(row["proposer"])
    if args.json:
        save_results(args.json, {"rows": rows}, __file__)
    return 0


def _report(totals: dict, args: argparse.Namespace) -> list[dict]:
    """One printed and returned row per setting (speedups over the first row, AR)."""
    rows, reference = [], totals["autoregressive"]["tokens"]
    for name, t in totals.items():
        row = {
            "proposer": name,
            "tokens_per_call": t["new"] / t["calls"],
            "draft_ms_per_round": 1e3 * t["draft_s"] / max(t["rounds"], 1),
            "ms_per_round": 1e3 * t["wall"] / max(t["rounds"], 1),
            "nodes_per_round": t["nodes"] / max(t["rounds"], 1),
            "lookup_share": t["lookup"] / max(t["rounds"], 1),
            "tokens_per_s": t["new"] / t["wall"],
            "equals_ar": t["tokens"] == reference if args.temperature is None and name != FP32_AR else None,
        }
        row["speedup"] = row["tokens_per_s"] / rows[0]["tokens_per_s"] if rows else 1.0
        rows.append(row)
        print(
            f"{name:<58} {row['tokens_per_call']:5.2f} tok/call  {row['draft_ms_per_round']:6.2f} draft ms/round  "
            f"{row['ms_per_round']:6.1f} ms/round  {row['nodes_per_round']:4.1f} nodes  "
            f"{row['lookup_share']:4.2f} lookup  "
            f"{row['tokens_per_s']:6.1f} tok/s  {row['speedup']:5.2f}x  "
            f"== AR: {row['equals_ar']}",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
