"""Benchmark of accel.spd on onnxruntime: AR vs speculative decoding for K = 1..8, and transformers' assisted
generation.

All numbers come from one run on one machine. Target: ``--target DIR`` or SmolLM2-135M (``smollm2_checkpoint()``);
draft: ``--draft DIR``, else the shipped demo draft (``accel/demo_data/smollm2-draft``) for the default target, else
(or with ``--layer-skip N``) a *layer-skip* stand-in: the target's first N layers with its own final norm and LM
head. Every setting is a ``DecodeSpec`` (``job_spec``: the recipe ``accel generate --spec`` runs), built through one
``accel.decode.Opener`` (graphs exported once into ``$ACCEL_CACHE/onnx``, one target session for every mode, batch 1,
no controller). Per prompt and setting we run it (greedy, and multinomial at ``--temperature``; seed = the prompt's
index) and report tokens/s = new tokens / wall seconds (prefill included, EOS ignored so every run makes
``--max-new-tokens`` tokens; also decode-only tokens/s, prefill excluded). Transformers: ``hf_target.generate(...,
assistant_model=hf_draft)`` in eager torch on the
same prompts, same token counts (``min_new_tokens``), its default assistant schedule. Also recorded: per-call latency of
both models for S = 1..9 new tokens at past length ``--past-len`` (median of repeats), for the simulator's calibration.

Feature draft (EAGLE-style, ``accel.drafts.feature``): ``--feature-draft DIR``, by default the shipped
``accel/demo_data/smollm2-feature-draft`` for the default target (``--no-feature-draft`` skips it). Its runs are modes
``spd_feat`` (K = 1..``--feature-k-max``) and ``spd_feat_dyn`` (dynamic length); it is exported with int8 matmuls
(``--feature-draft-weights``). The target graph is exported with its ``hidden_states`` output (and tree inputs with
``--tree-nodes``) for every run, AR included, so all modes run the same target session.

    python benchmarks/spd.py [--target DIR] [--draft DIR] [--feature-draft DIR] [--quick] [--max-new-tokens N] [--no-hf]
                             [--repeats R]

Prints a table; saves results/spd.json (shape documented in docs/spd.md).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bench_support import json_out, save_results
from spd_report import print_header, print_summary, print_table, print_tree_goal, summarise
from spd_support import aggregate, call_latency_s, full_head_copy, hf_assisted, layer_skip_draft, plot, target_quality
from tqdm.auto import tqdm

from accel.backends import Backend, OrtBackend
from accel.backends.weights import WeightFormat
from accel.decode import (
    ARSpec,
    ChainSpec,
    DecodeSetup,
    DecodeSpec,
    FirstOfSpec,
    LookupSpec,
    MergeSpec,
    SamplingSpec,
    TargetSpec,
    TreeSpec,
    build,
)
from accel.decode.opening import GraphNeeds, Opener, cached_graph
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.spd import GREEDY, Sampling, generate_ar

# Prompts the shipped draft was NOT trained on (accel.drafts.HELD_OUT_PROMPTS, already in chat/code form): the
# training prompts (DEFAULT_PROMPTS) would measure memorised continuations, not the draft's real acceptance.
PROMPTS = HELD_OUT_PROMPTS
DEMO_DATA = Path(__file__).resolve().parents[1] / "accel" / "demo_data"


def _csv(conv):
    """An argparse type: a comma-separated list of ``conv`` values (empty items skipped; '' = none)."""

    def parse(text: str) -> list:
        return [conv(x) for x in text.split(",") if x]

    parse.__name__ = f"comma-separated {conv.__name__}"  # what argparse names in its error
    return parse


def parse_args() -> argparse.Namespace:
    """The benchmark's options (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _model_args(ap)
    _run_args(ap)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.prompts is not None and not 1 <= args.prompts <= len(PROMPTS):
        ap.error(f"--prompts must be in 1..{len(PROMPTS)}")
    bases = ("spd", "spd_dyn", "spd_feat", "spd_feat_dyn", "spd_feat_tree")
    known = {b + tail for b in bases for tail in ("", "+ngram")} | {"spd_feat_tree+merge"}
    if args.modes is not None and not set(args.modes) <= known:
        ap.error(f"--modes: unknown {sorted(set(args.modes) - known)}; known: {', '.join(sorted(known))}")
    if any(not 0.0 <= t < 1.0 for t in args.tree_min_prob + args.tree_expand_prob):
        ap.error("--tree-min-prob and --tree-expand-prob values must be in [0, 1)")
    return args


def _model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target", default=None, help="target checkpoint dir or .gguf (default: SmolLM2-135M)")
    ap.add_argument(
        "--draft",
        default=None,
        help="draft checkpoint dir or .gguf (default: the shipped demo draft accel/demo_data/smollm2-draft for the "
        "default SmolLM2 target, else a layer-skip stand-in)",
    )
    ap.add_argument(
        "--layer-skip",
        type=int,
        default=None,
        metavar="N",
        help="use the layer-skip stand-in draft with the target's first N layers",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7, help="multinomial runs (ours and transformers')")
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--past-len", type=int, default=128, help="past length for the per-call latency table")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="onnxruntime intra-op threads of the target, and torch threads (transformers' run)",
    )
    ap.add_argument("--dyn-k", type=int, default=6, help="K cap of the dynamic-draft-length runs")
    ap.add_argument(
        "--min-draft-prob",
        type=_csv(float),
        default=[0.3, 0.5, 0.7],
        help="comma-separated min_draft_prob values for the dynamic runs ('' = none)",
    )
    ap.add_argument(
        "--draft-threads",
        type=int,
        default=1,
        help="onnxruntime intra-op threads of the draft session (default 1: its calls are too short to "
        "split across cores; the target gets --threads)",
    )
    ap.add_argument(
        "--hf-prompts", type=int, default=None, help="prompts for transformers (default: all; 1 if --quick)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="2 prompts (1 for transformers), 32 tokens, K in {1,2,4,8}, fewer repeats"
    )
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    ap.add_argument("--prompts", type=int, default=None, help="use the first N held-out prompts (default: all 8)")
    ap.add_argument("--greedy-only", action="store_true", help="skip the multinomial runs")
    ap.add_argument(
        "--no-cost-curve",
        action="store_true",
        help="skip the tree-call cost curve (T = 1..32) and time S = 1..9 with 3 repeats only (short runs)",
    )
    ap.add_argument(
        "--modes",
        type=_csv(str),
        default=None,
        help="run only these modes besides AR (comma-separated, as in the table's JSON 'mode': e.g. "
        "spd_feat_dyn+ngram,spd_feat_tree+merge); for short runs",
    )


def _run_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--feature-draft",
        default=None,
        help="feature draft dir (default: the shipped smollm2-feature-draft for the default target)",
    )
    ap.add_argument("--no-feature-draft", action="store_true", help="skip the feature-draft runs")
    ap.add_argument("--feature-k-max", type=int, default=6, help="largest fixed K of the feature-draft runs")
    ap.add_argument(
        "--feature-draft-threads",
        type=int,
        default=2,
        help="onnxruntime threads of the feature draft (default 2: its calls are a few wide matmuls, "
        "1.8 -> 1.2 ms per call with 2 threads here, unlike the narrow standalone draft's)",
    )
    ap.add_argument(
        "--feature-draft-weights",
        choices=("fp32", "int8"),
        default="int8",
        help="export of the feature draft: int8 matmuls (default; ~40%% cheaper calls, an approximate "
        "draft, the same exact SpD) or fp32",
    )
    ap.add_argument(
        "--feature-min-draft-prob",
        type=_csv(float),
        default=[0.3, 0.5],
        help="dynamic-length thresholds of the feature-draft runs (K cap --dyn-k)",
    )
    ap.add_argument("--no-standalone", action="store_true", help="skip the standalone-draft SpD runs")
    ap.add_argument(
        "--target-weights",
        choices=("fp32", "mxint8-nbits", "mxfp6-nbits", "mxfp4-nbits", "mxint8-kernel", "mxfp6-kernel", "mxfp4-kernel"),
        default="fp32",
        help="export of the target (AR and SpD alike): fp32 (default; the same model transformers runs), "
        "mxint8-nbits / mxfp6-nbits / mxfp4-nbits (exact MX weights on onnxruntime's 8-bit MatMulNBits, int8 "
        "activations per block) or mxint8-kernel / mxfp6-kernel / mxfp4-kernel (the same weights packed, on accel's "
        "fused kernel, float32 activations); an MX target is another model, so its distance to the fp32 target is "
        "measured and reported",
    )
    ap.add_argument(
        "--ngram",
        type=int,
        default=3,
        help="also run every SpD setting with n-gram lookup drafts first (NgramLookup(N) | the model; 0: off)",
    )
    ap.add_argument("--ngram-k", type=int, default=4, help="tokens proposed from a lookup match")
    ap.add_argument(
        "--tree-nodes",
        type=_csv(int),
        default=[4, 8, 12, 16],
        help="node budgets of the feature draft's dynamic-tree runs (DraftTree; '' = none)",
    )
    ap.add_argument(
        "--tree-min-prob",
        type=_csv(float),
        default=[0.0],
        help="comma-separated DraftTree min_prob values of the tree runs: candidates below this cumulative draft "
        "probability are neither proposed nor expanded (0: EAGLE-2's fixed node budget)",
    )
    ap.add_argument(
        "--tree-expand-prob",
        type=_csv(float),
        default=[0.0],
        help="comma-separated DraftTree expand_prob values of the tree runs: only candidates scored at least this are "
        "expanded (0: the run's min_prob)",
    )
    ap.add_argument("--tree-top-k", type=int, default=4, help="candidates per expanded node of the tree runs")
    ap.add_argument("--tree-depth", type=int, default=None, help="most levels of the tree runs (default: DraftTree's)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="passes over the prompts (each interleaved as below); figures pool all passes, and every "
        "speedup is also reported per pass (min / median / max) to show the load noise",
    )
    ap.add_argument("--out", type=json_out, default="results/spd.json")


@dataclass
class Setup:
    """The models of one benchmark run (loaded for their configs, transformers and the quality reference), the
    recipe parts every job shares, the sessions they open (one ``Opener``: one target session for every mode) and the
    tokenized prompts."""

    target_dir: Path
    target: Any
    draft: Any
    draft_dir: Path
    draft_name: str
    feat: Any
    prompts_ids: list[list[int]]
    max_new: int
    ks: list[int]
    tmp: Path
    target_spec: TargetSpec
    draft_path: Path
    feat_path: Path | None
    opener: Opener
    tb: Backend = field(init=False)  # the sessions every job shares, opened from the recipes (load_setup)
    db: Backend = field(init=False)
    fb: Backend | None = field(init=False, default=None)


def load_setup(args: argparse.Namespace) -> Setup:
    """Load the target and drafts (defaults: SmolLM2 and the shipped drafts), tokenize the prompts, and open the
    target, draft and feature-draft sessions every job shares (``accel.decode.build`` through one ``Opener``)."""
    import torch

    from accel.models import load_checkpoint, load_tokenizer, save_pretrained, smollm2_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    from accel.models.gguf_convert import checkpoint_dir

    target_dir = checkpoint_dir(args.target, say=print) if args.target else smollm2_checkpoint()
    target = load_checkpoint(target_dir)
    tmp = Path(tempfile.mkdtemp(prefix="accel-spd-bench-"))
    demo_draft = DEMO_DATA / "smollm2-draft"
    if (
        args.draft is None
        and args.layer_skip is None
        and args.target is None
        and (demo_draft / "config.json").is_file()
    ):
        args.draft = str(demo_draft)
    if args.draft and args.layer_skip is None:
        args.draft = str(checkpoint_dir(args.draft, say=print))  # a .gguf: its converted directory
        draft, draft_name, draft_path = load_checkpoint(args.draft), str(args.draft), Path(args.draft)
        # re-saved as plain float32 HF tensors: transformers cannot read accel-compressed (MX) checkpoints, nor a
        # restricted LM head (head_vocab), which becomes the full head it was cut from (see full_head_copy)
        draft_dir = save_pretrained(full_head_copy(draft), tmp / "draft_fp32")
    else:
        n = args.layer_skip or 4
        draft = layer_skip_draft(target, n)
        draft_dir, draft_name = save_pretrained(draft, tmp / "layer_skip_draft"), f"layer-skip ({n} layers)"
        draft_path = draft_dir
    prompts = PROMPTS[: args.prompts or (2 if args.quick else len(PROMPTS))]
    try:
        tok = load_tokenizer(target_dir)
        prompts_ids = [tok.encode(p).ids for p in prompts]
    except Exception:
        rng = np.random.default_rng(0)
        prompts_ids = [rng.integers(0, target.config.vocab_size, 24).tolist() for _ in prompts]
    demo_feat = DEMO_DATA / "smollm2-feature-draft"
    if (
        args.feature_draft is None
        and not args.no_feature_draft
        and args.target is None
        and (demo_feat / "config.json").is_file()
    ):
        args.feature_draft = str(demo_feat)
    feat = load_checkpoint(args.feature_draft) if args.feature_draft and not args.no_feature_draft else None
    tree = bool(args.tree_nodes) and feat is not None  # every mode runs the same target graph, with tree inputs
    setup = Setup(
        target_dir=target_dir,
        target=target,
        draft=draft,
        draft_dir=draft_dir,
        draft_name=draft_name,
        feat=feat,
        prompts_ids=prompts_ids,
        max_new=min(args.max_new_tokens, 32) if args.quick else args.max_new_tokens,
        ks=[1, 2, 4, 8] if args.quick else list(range(1, args.k_max + 1)),
        tmp=tmp,
        target_spec=TargetSpec(
            path=target_dir, weights=args.target_weights, ctx_len=args.ctx_len, threads=args.threads
        ),
        draft_path=draft_path,
        feat_path=Path(args.feature_draft) if feat is not None else None,
        # the target graph has hidden states for every mode (AR included), so all modes run one target session
        opener=Opener(GraphNeeds(hidden_output=True, tree=tree), target_spin=False),
    )
    greedy = (("greedy", GREEDY), "spd", 1, None)
    setup.tb = open_job(setup, (greedy[0], "ar", 0, None), args).target
    setup.db = open_job(setup, greedy, args).drafts[0]
    if feat is not None:
        setup.fb = open_job(setup, (greedy[0], "spd_feat", 1, None), args).drafts[0]
    return setup


def measure_calls(setup: Setup, args: argparse.Namespace) -> list[dict]:
    """Per-call latency of every model for S = 1..9 new tokens at ``--past-len`` (the simulator's calibration)."""
    calls = []
    repeats = 3 if args.no_cost_curve else 5 if args.quick else 15
    models = [("target", setup.tb), ("draft", setup.db)] + ([("feature_draft", setup.fb)] if setup.fb else [])
    for name, b in tqdm(models, desc="per-call latency", leave=False):
        for s, sec in call_latency_s(b, range(1, 10), args.past_len, repeats).items():
            calls.append({"model": name, "seq_len": s, "past_len": args.past_len, "seconds": sec})
    if (
        "tree" in setup.tb.info.capabilities and not args.no_cost_curve
    ):  # the cost curve of a tree call: T = 1..32 nodes (any shape costs alike)
        sizes = [1, 2, 4, 8, 12, 16, 24, 32] if args.quick else list(range(1, 33))
        for s, sec in call_latency_s(setup.tb, sizes, args.past_len, repeats, tree=True).items():
            calls.append({"model": "target_tree", "seq_len": s, "past_len": args.past_len, "seconds": sec})
    return calls


# ((sampling, warps), mode, K or nodes, min_draft_prob); for a tree: (min_prob, expand_prob or None) instead
Job = tuple[tuple[str, Sampling], str, int, Any]


def build_jobs(setup: Setup, args: argparse.Namespace) -> list[Job]:
    """Every (sampling, mode, K, min_draft_prob) setting of the run; AR first."""
    settings = [("greedy", GREEDY), ("multinomial", Sampling(temperature=args.temperature))]
    if args.greedy_only:
        settings = settings[:1]
    # fixed K = 1..k_max ("spd"), then the dynamic draft length: K is a cap, min_draft_prob stops early ("spd_dyn")
    jobs: list[Job] = [(s, "ar", 0, None) for s in settings]
    if not args.no_standalone:
        jobs += [(s, "spd", k, None) for s in settings for k in setup.ks]
        jobs += [(s, "spd_dyn", args.dyn_k, t) for s in settings for t in args.min_draft_prob]
    if setup.fb is not None:  # the feature draft: fixed K and dynamic length
        jobs += [(s, "spd_feat", k, None) for s in settings for k in range(1, args.feature_k_max + 1)]
        jobs += [(s, "spd_feat_dyn", args.dyn_k, t) for s in settings for t in args.feature_min_draft_prob]
        if "tree" in setup.tb.info.capabilities:  # the feature draft's dynamic tree (EAGLE-2), K = the node budget
            jobs += [
                (s, "spd_feat_tree", n, (t, e or None))
                for s in settings
                for n in args.tree_nodes
                for t in args.tree_min_prob
                for e in args.tree_expand_prob
            ]
    if args.ngram:  # the same SpD settings with n-gram lookup drafts where the text repeats ("+ngram")
        trees = [(st, mode + "+merge", k, thr) for st, mode, k, thr in jobs if mode == "spd_feat_tree"]
        jobs += [(st, mode + "+ngram", k, thr) for st, mode, k, thr in jobs if mode != "ar"]
        jobs += trees  # and the lookup chain merged into the tree ("+merge": one target call verifies both)
    if args.modes is not None:
        jobs = [j for j in jobs if j[1] == "ar" or j[1] in args.modes]
    if setup.tb.min_rows > 1:  # also greedy AR without the one-row pad (see OrtBackend min_rows): what the pad costs
        jobs.append((settings[0], "ar_one_row", 0, None))
    return jobs


def job_spec(setup: Setup, job: Job, args: argparse.Namespace) -> DecodeSpec:
    """One job as a ``DecodeSpec``: autoregressive, a draft chain (fixed or dynamic length) of the standalone or the
    feature draft, or the feature draft's dynamic tree, after lookup for +ngram (``first_of``), joined with lookup's
    chain for +merge (``merge``); the shape as given (no controller)."""
    (_, sampling), mode, k, thr = job
    base = mode.removesuffix("+ngram").removesuffix("+merge")
    proposer: Any = ARSpec()
    if base == "spd_feat_tree":
        t, e = thr
        proposer = TreeSpec(
            draft=setup.feat_path, nodes=k, top_k=args.tree_top_k, depth=args.tree_depth, min_prob=t, expand_prob=e,
            weights=args.feature_draft_weights, threads=args.feature_draft_threads,
        )  # fmt: skip
    elif base.startswith("spd_feat"):
        proposer = ChainSpec(
            draft=setup.feat_path, k=k, min_draft_prob=thr, weights=args.feature_draft_weights,
            threads=args.feature_draft_threads,
        )  # fmt: skip
    elif base.startswith("spd"):
        proposer = ChainSpec(draft=setup.draft_path, k=k, min_draft_prob=thr, threads=args.draft_threads)
    lookup = LookupSpec(n=args.ngram, k=args.ngram_k)
    if mode.endswith("+merge"):
        proposer = MergeSpec(lookup=lookup, tree=proposer)
    elif mode.endswith("+ngram"):
        proposer = FirstOfSpec(lookup=lookup, then=proposer)
    warps = SamplingSpec(greedy=True) if sampling.greedy else SamplingSpec(temperature=sampling.temperature)
    return DecodeSpec(
        target=setup.target_spec,
        proposer=proposer,
        sampling=warps,
        max_new_tokens=setup.max_new,
        eos_token_id=[],  # every run makes max_new tokens
        autotune=False,
    )


def open_job(setup: Setup, job: Job, args: argparse.Namespace) -> DecodeSetup:
    """``job_spec`` built on the run's shared sessions."""
    return build(job_spec(setup, job, args), tokenizer=None, opener=setup.opener)


def run_jobs(setup: Setup, jobs: list[Job], args: argparse.Namespace) -> tuple[dict[int, list], dict[int, list]]:
    """Every job on every prompt, interleaved (prompt-major) so that load changes on a shared machine hit every
    setting alike; returns the results per job and each job's tokens/s per pass over the prompts."""
    tb1 = None
    if any(mode == "ar_one_row" for _, mode, _, _ in jobs):
        t = setup.target_spec
        graph = cached_graph(t.path, t.ctx_len, t.weights, setup.opener.target_needs)
        tb1 = OrtBackend(graph, threads=args.threads, min_rows=1)
    opened = {j: open_job(setup, job, args) for j, job in enumerate(jobs) if job[1] != "ar_one_row"}
    prompts_ids, max_new = setup.prompts_ids, setup.max_new
    results: dict[int, list] = {j: [] for j in range(len(jobs))}
    per_pass: dict[int, list] = {j: [] for j in range(len(jobs))}  # tokens/s of each job in each pass
    bar = tqdm(total=len(jobs) * len(prompts_ids) * args.repeats, desc="runs")
    for _, (i, ids) in ((r, x) for r in range(args.repeats) for x in enumerate(prompts_ids)):
        for j, ((_, sampling), mode, _, _) in enumerate(jobs):
            if mode == "ar_one_row":
                results[j].append(generate_ar(tb1, [ids], max_new_tokens=max_new, seed=i, sampling=sampling))
            else:
                results[j].append(opened[j].generate([ids], seed=i))
            bar.update(1)
        if i == len(prompts_ids) - 1:  # a pass is complete: its tokens/s per job
            for j in results:
                done = results[j][-len(prompts_ids) :]
                per_pass[j].append(sum(r.stats.new_tokens for r in done) / sum(r.stats.wall_s for r in done))
    bar.close()
    return results, per_pass


def collect_runs(jobs: list[Job], results: dict[int, list], per_pass: dict[int, list]) -> tuple[list[dict], Any]:
    """One aggregated row per job (greedy rows checked against AR), and the unpadded one-row AR row (or None)."""
    ar_greedy = next(j for j, ((sampling, _), mode, _, _) in enumerate(jobs) if mode == "ar" and sampling == "greedy")
    runs, one_row = [], None
    for j, ((sampling, _), mode, k, thr) in enumerate(jobs):
        same = [r.tokens == a.tokens for r, a in zip(results[j], results[ar_greedy], strict=True)]
        if mode == "ar_one_row":  # kept out of runs: another model's numerics, not a setting of this target
            one_row = aggregate(results[j], "ar", sampling, 0, None)
            one_row["greedy_rows_equal_ar"] = [sum(same), len(same)]
            continue
        tree = mode.startswith("spd_feat_tree")
        runs.append(aggregate(results[j], mode, sampling, k, (thr[0] or None) if tree else thr))
        if tree:  # the tree's expansion threshold (None: its min_prob)
            runs[-1]["expand_prob"] = thr[1]
        runs[-1]["tokens_per_s_by_pass"] = per_pass[j]
        if sampling == "greedy":  # exactness on the real pair: each greedy SpD row against the AR row of its prompt
            runs[-1]["greedy_rows_equal_ar"] = [sum(same), len(same)]
    return runs, one_row


def measure_quality(setup: Setup, jobs: list[Job], results: dict[int, list], args: argparse.Namespace) -> Any:
    """For a quantized target: its distance to the fp32 target (None for fp32)."""
    if args.target_weights == "fp32":
        return None
    fp32 = setup.target_spec.model_copy(update={"weights": WeightFormat.FP32})
    ref = build(DecodeSpec(target=fp32, max_new_tokens=setup.max_new)).target  # the same graph kind, float32 weights
    ar_fp32 = [
        generate_ar(ref, [ids], max_new_tokens=setup.max_new, sampling=GREEDY).tokens[0]
        for ids in tqdm(setup.prompts_ids, desc="fp32 target (quality reference)", leave=False)
    ]
    quality = target_quality(setup.tb, ref, setup.prompts_ids, ar_fp32)
    ar_greedy = next(j for j, ((sampling, _), mode, _, _) in enumerate(jobs) if mode == "ar" and sampling == "greedy")
    same = [r.tokens[0] == c for r, c in zip(results[ar_greedy], ar_fp32, strict=True)]
    quality["greedy_continuations_equal"] = [sum(same), len(same)]
    return quality


def save(result: dict, runs: list[dict], hf: Any, args: argparse.Namespace) -> None:
    """``--out`` (JSON, written atomically) and its plot."""
    out = save_results(args.out, result, __file__, default=str)
    plot(runs, hf, out.with_suffix(".png"))
    print(f"saved {out} and {out.with_suffix('.png')}")


def _sim_format(target_weights: str) -> str:
    """accel.sim's weight format of a target export: int8 for MatMulNBits, the MX format for the fused kernel."""
    if target_weights.endswith("-nbits"):
        return "int8"
    return target_weights.split("-")[0] if target_weights.endswith("-kernel") else "fp32"


def main() -> None:
    args = parse_args()
    setup = load_setup(args)
    calls = measure_calls(setup, args)
    jobs = build_jobs(setup, args)
    results, per_pass = run_jobs(setup, jobs, args)
    runs, one_row = collect_runs(jobs, results, per_pass)
    quality = measure_quality(setup, jobs, results, args)
    hf = None
    if not args.no_hf:
        ids = setup.prompts_ids[: args.hf_prompts or (1 if args.quick else len(setup.prompts_ids))]  # eager is slow
        hf = hf_assisted(
            setup.target_dir, setup.draft_dir, ids, setup.max_new, args.temperature, args.ngram, args.ngram_k
        )
        hf["prompts"] = len(ids)
    print_header(setup, calls, quality, one_row, runs, args)
    print_table(runs)
    print_tree_goal(runs)
    summary = summarise(runs, hf, one_row)
    print_summary(summary, hf, args)
    result = {
        "settings": {
            "threads": args.threads,
            "draft_threads": args.draft_threads,
            "feature_draft_threads": args.feature_draft_threads,
            "prompts": len(setup.prompts_ids),
            "repeats": args.repeats,
            "max_new_tokens": setup.max_new,
            "temperature": args.temperature,
            "ctx_len": args.ctx_len,
            "draft": setup.draft_name,
            "feature_draft": args.feature_draft,
            "feature_draft_weights": args.feature_draft_weights,
            "target_weights": args.target_weights,
        },
        "target_quality": quality,
        # weight format for accel.sim (benchmarks/sim_validation.py): MatMulNBits streams 8-bit codes for every MX
        # format (the 0.25 bits of scales per weight are within the calibration's noise); the kernel the packed codes
        "format": _sim_format(args.target_weights),
        "target": setup.target.config.to_dict(),
        "draft": setup.draft.config.to_dict(),
        "feature_draft": setup.feat.config.to_dict() if setup.feat is not None else None,
        "calls": calls,
        "runs": runs,
        "summary": summary,
        "ar_one_row": one_row,  # only for a target with min_rows > 1 (MatMulNBits): greedy AR without the pad
        "hf_assisted": hf,
    }
    save(result, runs, hf, args)
    shutil.rmtree(setup.tmp, ignore_errors=True)  # the exported ONNX files (hundreds of MB)


if __name__ == "__main__":
    main()
