"""Benchmark of accel.spd on onnxruntime: AR vs speculative decoding for K = 1..8, and transformers' assisted
generation.

All numbers come from one run on one machine. Target: ``--target DIR`` or SmolLM2-135M (``smollm2_checkpoint()``);
draft: ``--draft DIR``, else the shipped demo draft (``accel/demo_data/smollm2-draft``) for the default target, else
(or with ``--layer-skip N``) a *layer-skip* stand-in: the target's first N layers with its own final norm and LM
head. Both are exported with ``export_onnx`` (batch 1) and run by
``OrtBackend``. Per prompt and setting we run ``generate_ar`` and ``generate`` (greedy, and multinomial at
``--temperature``) and report tokens/s = new tokens / wall seconds (prefill included, EOS ignored so every run makes
``--max-new-tokens`` tokens; also decode-only tokens/s, prefill excluded). Transformers: ``hf_target.generate(...,
assistant_model=hf_draft)`` in eager torch on the
same prompts, same token counts (``min_new_tokens``), its default assistant schedule. Also recorded: per-call latency of
both models for S = 1..9 new tokens at past length ``--past-len`` (median of repeats), for the simulator's calibration.

Feature draft (EAGLE-style, ``accel.drafts.feature``): ``--feature-draft DIR``, by default the shipped
``accel/demo_data/smollm2-feature-draft`` for the default target (``--no-feature-draft`` skips it). Its runs are modes
``spd_feat`` (K = 1..``--feature-k-max``) and ``spd_feat_dyn`` (dynamic length); it is exported with int8 matmuls
(``--feature-draft-weights``, ``export_onnx(weights="int8")``). The target graph is exported with
its ``hidden_states`` output for every run, AR included, so all modes run the same target graph.

    python benchmarks/spd.py [--target DIR] [--draft DIR] [--feature-draft DIR] [--quick] [--max-new-tokens N] [--no-hf]
                             [--repeats R]

Prints a table; saves results/spd.json (shape documented in docs/spd.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from accel.backends import OrtBackend, export_onnx
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.spd import generate, generate_ar

# Prompts the shipped draft was NOT trained on (accel.drafts.HELD_OUT_PROMPTS, already in chat/code form): the
# training prompts (DEFAULT_PROMPTS) would measure memorised continuations, not the draft's real acceptance.
PROMPTS = HELD_OUT_PROMPTS


def layer_skip_draft(target, num_layers: int):
    """The target's embeddings + first ``num_layers`` blocks + its final norm and LM head (shared weights copied)."""
    from accel.models import Decoder

    draft = Decoder(target.config.with_(num_layers=num_layers))
    state = {
        k: v for k, v in target.state_dict().items() if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers
    }
    draft.load_state_dict(state)
    return draft.eval()


def full_head_copy(draft):
    """``draft`` itself, or for a restricted LM head (``head_vocab``) the tied full-vocabulary model it was cut from
    by ``accel.drafts.restrict_head`` (its head rows are the embedding rows), for transformers' assisted generation.
    At the kept ids the logits are equal; elsewhere transformers' draft may propose tokens ours cannot."""
    import torch

    from accel.models import Decoder

    if not draft.config.head_vocab:
        return draft
    full = Decoder(draft.config.with_(head_vocab=0, tie_word_embeddings=True))
    state = {k: v for k, v in draft.state_dict().items() if not k.startswith("lm_head")}
    full.load_state_dict(state, strict=False)
    kept = draft.lm_head_token_ids
    if not torch.allclose(full.embed_tokens.weight[kept], draft.lm_head.weight, atol=1e-6):
        raise SystemExit("the draft's restricted head is not a subset of its embedding; cannot build a tied copy")
    return full.eval()


def call_latency_s(backend, seq_lens, past_len: int, repeats: int) -> dict[int, float]:
    """Median seconds of one forward with S new tokens at positions past_len .. past_len+S-1 (cache pre-filled).

    The S values are interleaved within each of the ``repeats`` passes, so a load change on a shared machine shifts
    every S alike instead of bending the S-curve the simulator is calibrated on. A feature draft gets random target
    features (prepared outside the timed call)."""
    rng = np.random.default_rng(0)
    vocab, width = backend.info.vocab_size, backend.info.feature_size

    def make(ids, start):
        feats = rng.standard_normal((*ids.shape, width)).astype(np.float32) if width else None
        return ids, np.arange(start, start + ids.shape[1])[None, :], {"features": feats} if width else {}

    backend.reset()
    prompt = rng.integers(0, vocab, size=(1, past_len))
    for s in range(0, past_len, backend.info.max_seq_len):
        ids, pos, kw = make(prompt[:, s : s + backend.info.max_seq_len], s)
        backend.forward(ids, pos, num_logits=1, **kw)
    inputs = {s: make(rng.integers(0, vocab, size=(1, s)), past_len) for s in seq_lens}
    times: dict[int, list[float]] = {s: [] for s in seq_lens}
    for ids, pos, kw in inputs.values():  # warm-up
        backend.forward(ids, pos, num_logits=ids.shape[1], **kw)
    for _ in range(repeats):
        for s, (ids, pos, kw) in inputs.items():
            t0 = time.perf_counter()
            backend.forward(ids, pos, num_logits=s, **kw)
            times[s].append(time.perf_counter() - t0)
    return {s: statistics.median(t) for s, t in times.items()}


def aggregate(results, mode: str, sampling: str, k: int, min_draft_prob: float | None = None) -> dict:
    new = sum(r.stats.new_tokens for r in results)
    wall = sum(r.stats.wall_s for r in results)
    prefill = sum(r.stats.prefill_s for r in results)
    row = {
        "mode": mode,
        "sampling": sampling,
        "k": k,
        "min_draft_prob": min_draft_prob,
        "tokens_per_s": new / wall,
        "new_tokens": new,
        "wall_s": wall,
        "prefill_s": prefill,
        "decode_tokens_per_s": new / (wall - prefill),
        "alpha": None,
        "mean_tokens_per_loop": 1.0,
    }
    if mode != "ar":
        acc = sum(r.stats.accepted_drafts for r in results)
        reached = sum(r.stats.proposed_drafts for r in results)
        rounds = sum(r.stats.row_calls for r in results)
        row["alpha"] = acc / reached if reached else None
        row["alpha_overlap"] = float(np.mean([r.stats.alpha_overlap for r in results]))
        row["mean_tokens_per_loop"] = (acc + rounds) / rounds
        # loop shape for accel.sim.LoopStats (dynamic draft lengths) and the pooled per-position acceptance
        row["loops"] = rounds
        row["drafts_per_loop"] = sum(r.stats.draft_tokens for r in results) / rounds
        row["all_accepted_fraction"] = sum(r.stats.all_accepted_rounds for r in results) / rounds
        reached_at = np.sum([r.stats.proposed_per_position for r in results], axis=0)
        accepted_at = np.sum(
            [
                np.nan_to_num(np.asarray(r.stats.acceptance_per_position) * r.stats.proposed_per_position)
                for r in results
            ],
            axis=0,
        )
        row["acceptance_by_position"] = [
            float(a / n) if n else None for a, n in zip(accepted_at, reached_at, strict=True)
        ]
        row["draft_calls_per_loop"] = sum(r.stats.draft_calls_per_loop * r.stats.rounds for r in results) / sum(
            r.stats.rounds for r in results
        )
        row["lookup_loops"] = sum(r.stats.lookup_rounds for r in results)
        row["lookup_fraction"] = row["lookup_loops"] / rounds
        row["lookup_accepted"] = sum(r.stats.lookup_accepted for r in results)
        row["draft_s"] = sum(r.stats.draft_s for r in results)
        row["target_s"] = sum(r.stats.target_s for r in results)
        row["host_s"] = sum(r.stats.host_s for r in results)
    return row


def hf_assisted(
    target_dir: Path, draft_dir: Path, prompts_ids, max_new: int, temperature: float, ngram: int = 0, ngram_k: int = 4
) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()

    tgt = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    dft = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    out: dict = {"threads": torch.get_num_threads()}
    settings = [("greedy", dict(do_sample=False)), ("multinomial", dict(do_sample=True, temperature=temperature))]
    for name, kw in settings:
        labels = [("ar", {}), ("assisted", {"assistant_model": dft})]
        if ngram:  # transformers' own n-gram lookup (prompt lookup decoding; it cannot combine it with a draft model)
            labels.append(("lookup", {"prompt_lookup_num_tokens": ngram_k, "max_matching_ngram_size": ngram}))
        for label, extra in labels:
            new = 0
            wall = 0.0
            torch.manual_seed(0)
            for ids in tqdm(prompts_ids, desc=f"transformers {label} {name}", leave=False):
                x = torch.tensor([ids])
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    y = tgt.generate(
                        x,
                        attention_mask=torch.ones_like(x),
                        max_new_tokens=max_new,
                        min_new_tokens=max_new,
                        pad_token_id=0,
                        **kw,
                        **extra,
                    )
                    wall += time.perf_counter() - t0
                new += y.shape[1] - x.shape[1]
            out[f"{label}_{name}_tokens_per_s"] = new / wall
    return out


def target_quality(quant, ref, prompts_ids, continuations) -> dict:
    """How far the quantized target ``quant`` is from the fp32 one ``ref`` (both OrtBackend), teacher-forced on the
    fp32 target's greedy ``continuations``: top-1 agreement and mean KL(fp32 || quantized) in nats per position, and
    how many greedy continuations of ``quant`` (from the benchmark's own AR run) equal the fp32 ones."""
    agree = kl = positions = 0.0
    for ids, cont in zip(prompts_ids, continuations, strict=True):
        seq = np.array([list(ids) + list(cont[:-1])])
        pos = np.arange(seq.shape[1])[None, :]
        ref.reset()
        quant.reset()
        a = ref.forward(seq, pos)[0, len(ids) - 1 :].astype(np.float64)
        b = quant.forward(seq, pos)[0, len(ids) - 1 :].astype(np.float64)
        la = a - a.max(-1, keepdims=True)
        la -= np.log(np.exp(la).sum(-1, keepdims=True))
        lb = b - b.max(-1, keepdims=True)
        lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
        agree += float((a.argmax(-1) == b.argmax(-1)).sum())
        kl += float((np.exp(la) * (la - lb)).sum())
        positions += len(a)
    return {"top1_agreement": agree / positions, "kl_nats": kl / positions, "positions": int(positions)}


def plot(runs: list[dict], hf: dict | None, path: Path) -> None:
    """tokens/s vs K for SpD (greedy, multinomial), AR and transformers' assisted generation as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for sampling, color in (("greedy", "tab:blue"), ("multinomial", "tab:orange")):
        spd = sorted((r for r in runs if r["mode"] == "spd" and r["sampling"] == sampling), key=lambda r: r["k"])
        ar = next(r for r in runs if r["mode"] == "ar" and r["sampling"] == sampling)
        ax.plot([r["k"] for r in spd], [r["tokens_per_s"] for r in spd], "o-", color=color, label=f"SpD {sampling}")
        feat = sorted((r for r in runs if r["mode"] == "spd_feat" and r["sampling"] == sampling), key=lambda r: r["k"])
        if feat:
            ax.plot(
                [r["k"] for r in feat],
                [r["tokens_per_s"] for r in feat],
                "s-",
                color=color,
                alpha=0.6,
                label=f"SpD {sampling}, feature draft",
            )
        ax.axhline(ar["tokens_per_s"], color=color, ls="--", label=f"AR {sampling}")
        if hf:
            ax.axhline(hf[f"assisted_{sampling}_tokens_per_s"], color=color, ls=":", label=f"HF assisted {sampling}")
    ax.set_xlabel("K (draft tokens per round)")
    ax.set_ylabel("tokens/s")
    ax.set_title("accel.spd on onnxruntime")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="target checkpoint dir (default: SmolLM2-135M)")
    ap.add_argument(
        "--draft",
        default=None,
        help="draft checkpoint dir (default: the shipped demo draft accel/demo_data/smollm2-draft for the "
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
        type=lambda v: [float(x) for x in v.split(",") if x],
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
        type=lambda v: [float(x) for x in v.split(",") if x],
        default=[0.3, 0.5],
        help="dynamic-length thresholds of the feature-draft runs (K cap --dyn-k)",
    )
    ap.add_argument("--no-standalone", action="store_true", help="skip the standalone-draft SpD runs")
    ap.add_argument(
        "--target-weights",
        choices=("fp32", "mxint8-nbits"),
        default="fp32",
        help="export of the target (AR and SpD alike): fp32 (default; the same model transformers runs) or "
        "mxint8-nbits (MXINT8 weights on onnxruntime's MatMulNBits, int8 activations per block: "
        "approximate, so its distance to the fp32 target is measured and reported)",
    )
    ap.add_argument(
        "--ngram",
        type=int,
        default=3,
        help="also run every SpD setting with n-gram lookup drafts (generate(ngram=N); 0: off)",
    )
    ap.add_argument("--ngram-k", type=int, default=4, help="tokens proposed from a lookup match")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="passes over the prompts (each interleaved as below); figures pool all passes, and every "
        "speedup is also reported per pass (min / median / max) to show the load noise",
    )
    ap.add_argument("--out", default="results/spd.json")
    args = ap.parse_args()

    import torch

    from accel.models import load_checkpoint, load_tokenizer, save_pretrained, smollm2_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    target_dir = Path(args.target) if args.target else smollm2_checkpoint()
    target = load_checkpoint(target_dir)
    tmp = Path(tempfile.mkdtemp(prefix="accel-spd-bench-"))
    demo_draft = Path(__file__).resolve().parents[1] / "accel" / "demo_data" / "smollm2-draft"
    if (
        args.draft is None
        and args.layer_skip is None
        and args.target is None
        and (demo_draft / "config.json").is_file()
    ):
        args.draft = str(demo_draft)
    if args.draft and args.layer_skip is None:
        draft, draft_name = load_checkpoint(args.draft), str(args.draft)
        # re-saved as plain float32 HF tensors: transformers cannot read accel-compressed (MX) checkpoints, nor a
        # restricted LM head (head_vocab), which becomes the full head it was cut from (see full_head_copy)
        draft_dir = save_pretrained(full_head_copy(draft), tmp / "draft_fp32")
    else:
        n = args.layer_skip or 4
        draft = layer_skip_draft(target, n)
        draft_dir, draft_name = save_pretrained(draft, tmp / "layer_skip_draft"), f"layer-skip ({n} layers)"
    prompts = PROMPTS[:2] if args.quick else PROMPTS
    max_new = min(args.max_new_tokens, 32) if args.quick else args.max_new_tokens
    ks = [1, 2, 4, 8] if args.quick else list(range(1, args.k_max + 1))
    try:
        tok = load_tokenizer(target_dir)
        prompts_ids = [tok.encode(p).ids for p in prompts]
    except Exception:
        rng = np.random.default_rng(0)
        prompts_ids = [rng.integers(0, target.config.vocab_size, 24).tolist() for _ in prompts]

    demo_feat = demo_draft.with_name("smollm2-feature-draft")
    if (
        args.feature_draft is None
        and not args.no_feature_draft
        and args.target is None
        and (demo_feat / "config.json").is_file()
    ):
        args.feature_draft = str(demo_feat)
    feat = load_checkpoint(args.feature_draft) if args.feature_draft and not args.no_feature_draft else None

    tb = OrtBackend(
        export_onnx(target, tmp / "target.onnx", ctx_len=args.ctx_len, hidden_output=True, weights=args.target_weights),
        threads=args.threads,
    )
    db = OrtBackend(export_onnx(draft, tmp / "draft.onnx", ctx_len=args.ctx_len), threads=args.draft_threads)
    fb = (
        OrtBackend(
            export_onnx(feat, tmp / "feature_draft.onnx", ctx_len=args.ctx_len, weights=args.feature_draft_weights),
            threads=args.feature_draft_threads,
        )
        if feat is not None
        else None
    )

    calls = []
    repeats = 5 if args.quick else 15
    models = [("target", tb), ("draft", db)] + ([("feature_draft", fb)] if fb is not None else [])
    for name, b in tqdm(models, desc="per-call latency", leave=False):
        for s, sec in call_latency_s(b, range(1, 10), args.past_len, repeats).items():
            calls.append({"model": name, "seq_len": s, "past_len": args.past_len, "seconds": sec})

    runs = []
    settings = [("greedy", dict(greedy=True)), ("multinomial", dict(temperature=args.temperature))]
    # fixed K = 1..k_max ("spd"), then the dynamic draft length: K is a cap, min_draft_prob stops early ("spd_dyn")
    jobs = [(s, "ar", 0, None) for s in settings]
    if not args.no_standalone:
        jobs += [(s, "spd", k, None) for s in settings for k in ks] + [
            (s, "spd_dyn", args.dyn_k, t) for s in settings for t in args.min_draft_prob
        ]
    if fb is not None:  # the feature draft: fixed K and dynamic length
        jobs += [(s, "spd_feat", k, None) for s in settings for k in range(1, args.feature_k_max + 1)] + [
            (s, "spd_feat_dyn", args.dyn_k, t) for s in settings for t in args.feature_min_draft_prob
        ]
    if args.ngram:  # the same SpD settings with n-gram lookup drafts where the text repeats ("+ngram")
        jobs += [(st, mode + "+ngram", k, thr) for st, mode, k, thr in jobs if mode != "ar"]
    tb1 = None
    if tb.min_rows > 1:  # also greedy AR without the one-row pad (see OrtBackend min_rows): what the pad costs
        tb1 = OrtBackend(tmp / "target.onnx", threads=args.threads, min_rows=1)
        jobs.append((settings[0], "ar_one_row", 0, None))
    # interleaved (prompt-major) so that load changes on a shared machine hit every setting alike
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    results: dict[int, list] = {j: [] for j in range(len(jobs))}
    per_pass: dict[int, list] = {j: [] for j in range(len(jobs))}  # tokens/s of each job in each pass
    bar = tqdm(total=len(jobs) * len(prompts_ids) * args.repeats, desc="runs")
    for _, (i, ids) in ((r, x) for r in range(args.repeats) for x in enumerate(prompts_ids)):
        for j, ((_, kw), mode, k, thr) in enumerate(jobs):
            if mode in ("ar", "ar_one_row"):
                results[j].append(
                    generate_ar(tb1 if mode == "ar_one_row" else tb, [ids], max_new_tokens=max_new, seed=i, **kw)
                )
            else:
                drafter = fb if mode.startswith("spd_feat") else db
                lookup = dict(ngram=args.ngram, ngram_k=args.ngram_k) if mode.endswith("+ngram") else {}
                results[j].append(
                    generate(
                        tb, drafter, [ids], k=k, max_new_tokens=max_new, seed=i, min_draft_prob=thr, **lookup, **kw
                    )
                )
            bar.update(1)
        if i == len(prompts_ids) - 1:  # a pass is complete: its tokens/s per job
            for j in results:
                done = results[j][-len(prompts_ids) :]
                per_pass[j].append(sum(r.stats.new_tokens for r in done) / sum(r.stats.wall_s for r in done))
    bar.close()
    ar_greedy = next(j for j, ((sampling, _), mode, _, _) in enumerate(jobs) if mode == "ar" and sampling == "greedy")
    one_row = None
    for j, ((sampling, _), mode, k, thr) in enumerate(jobs):
        if mode == "ar_one_row":  # kept out of runs: another model's numerics, not a setting of this target
            one_row = aggregate(results[j], "ar", sampling, 0, None)
            one_row["greedy_rows_equal_ar"] = [
                sum(r.tokens == a.tokens for r, a in zip(results[j], results[ar_greedy], strict=True)),
                len(results[j]),
            ]
            continue
        runs.append(aggregate(results[j], mode, sampling, k, thr))
        runs[-1]["tokens_per_s_by_pass"] = per_pass[j]
        if sampling == "greedy":  # exactness on the real pair: each greedy SpD row against the AR row of its prompt
            same = [r.tokens == a.tokens for r, a in zip(results[j], results[ar_greedy], strict=True)]
            runs[-1]["greedy_rows_equal_ar"] = [sum(same), len(same)]
    quality = None
    if args.target_weights != "fp32":
        ref = OrtBackend(export_onnx(target, tmp / "target_fp32.onnx", ctx_len=args.ctx_len), threads=args.threads)
        ar_fp32 = [
            generate_ar(ref, [ids], max_new_tokens=max_new, greedy=True).tokens[0]
            for ids in tqdm(prompts_ids, desc="fp32 target (quality reference)", leave=False)
        ]
        quality = target_quality(tb, ref, prompts_ids, ar_fp32)
        quality["greedy_continuations_equal"] = [
            sum(r.tokens[0] == c for r, c in zip(results[ar_greedy], ar_fp32, strict=True)),
            len(ar_fp32),
        ]
        del ref

    hf = None
    if not args.no_hf:
        hf_prompts = prompts_ids[: args.hf_prompts or (1 if args.quick else len(prompts_ids))]  # eager torch is slow
        hf = hf_assisted(target_dir, draft_dir, hf_prompts, max_new, args.temperature, args.ngram, args.ngram_k)
        hf["prompts"] = len(hf_prompts)

    # ---------------------------------------------------------------- report
    print(
        f"\ntarget {target_dir} ({target.num_parameters / 1e6:.0f}M), draft {draft_name} "
        f"({draft.num_parameters / 1e6:.0f}M); onnxruntime, {len(prompts_ids)} prompts x {max_new} new tokens"
    )
    t1 = {c["seq_len"]: c["seconds"] for c in calls if c["model"] == "target"}
    d1 = {c["seq_len"]: c["seconds"] for c in calls if c["model"] == "draft"}
    f1 = {c["seq_len"]: c["seconds"] for c in calls if c["model"] == "feature_draft"}
    print(
        f"per-call latency at past {args.past_len}: S=1 target {t1[1] * 1e3:.1f} ms, draft {d1[1] * 1e3:.1f} ms"
        + (f", feature draft {f1[1] * 1e3:.1f} ms" if f1 else "")
        + "; "
        "target S/S=1: " + " ".join(f"{s}:{t1[s] / t1[1]:.2f}" for s in range(2, 10))
    )
    if quality is not None:
        eq = quality["greedy_continuations_equal"]
        print(
            f"target weights {args.target_weights} vs the fp32 target (teacher-forced on its greedy continuations, "
            f"{quality['positions']} positions): top-1 agreement {quality['top1_agreement']:.4f}, KL "
            f"{quality['kl_nats']:.4f} nats/token; greedy continuations identical {eq[0]}/{eq[1]}"
        )
    if one_row is not None:
        ar = next(r for r in runs if r["mode"] == "ar" and r["sampling"] == "greedy")
        print(
            f"target min_rows {tb.min_rows}: one-token steps padded to {tb.min_rows} rows (same numerics as SpD's "
            f"verification); unpadded one-row greedy AR {one_row['tokens_per_s']:.2f} tok/s "
            f"({one_row['tokens_per_s'] / ar['tokens_per_s']:.2f}x the padded AR), its tokens identical to the "
            f"padded AR's in {one_row['greedy_rows_equal_ar'][0]}/{one_row['greedy_rows_equal_ar'][1]} rows"
        )
    print(
        f"\n{'sampling':12} {'mode':12} {'K':>2} {'tok/s':>8} {'vs AR':>6} {'decode':>7} {'vs AR':>6} {'alpha':>6} "
        f"{'tok/loop':>8} {'draft s':>8} {'target s':>8} {'host s':>7}   (decode: prefill excluded)"
    )
    summary = {}
    for sampling in ("greedy", "multinomial"):
        ar = next(r for r in runs if r["mode"] == "ar" and r["sampling"] == sampling)
        for r in (r for r in runs if r["sampling"] == sampling):
            r["speedup_vs_ar"] = r["tokens_per_s"] / ar["tokens_per_s"]
            r["decode_speedup_vs_ar"] = r["decode_tokens_per_s"] / ar["decode_tokens_per_s"]
            r["speedup_by_pass"] = [
                x / a for x, a in zip(r["tokens_per_s_by_pass"], ar["tokens_per_s_by_pass"], strict=True)
            ]
            alpha = f"{r['alpha']:.3f}" if r["alpha"] is not None else "-"
            extra = f"{r['draft_s']:8.2f} {r['target_s']:8.2f} {r['host_s']:7.2f}" if r["mode"] != "ar" else ""
            base = r["mode"].removesuffix("+ngram")
            mode = {"spd_feat": "feat", "spd_feat_dyn": "feat"}.get(base, base)
            if r["min_draft_prob"] is not None:
                mode = f"{'feat ' if mode == 'feat' else ''}dyn p<{r['min_draft_prob']:g}"
            mode += " +ng" if r["mode"].endswith("+ngram") else ""
            print(
                f"{sampling:12} {mode:12} {r['k']:2d} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f} "
                f"{r['decode_tokens_per_s']:7.2f} {r['decode_speedup_vs_ar']:6.2f} "
                f"{alpha:>6} {r['mean_tokens_per_loop']:8.2f} {extra}"
            )
        best = max(
            (r for r in runs if r["mode"] != "ar" and r["sampling"] == sampling), key=lambda r: r["tokens_per_s"]
        )
        summary[sampling] = {
            "best_mode": best["mode"],
            "best_k": best["k"],
            "best_min_draft_prob": best["min_draft_prob"],
            "best_tokens_per_s": best["tokens_per_s"],
            "ar_tokens_per_s": ar["tokens_per_s"],
            "speedup_vs_ar": best["speedup_vs_ar"],
            "decode_speedup_vs_ar": best["decode_speedup_vs_ar"],
            "speedup_by_pass": best["speedup_by_pass"],
            "greedy_rows_equal_ar": best.get("greedy_rows_equal_ar"),
        }
        plain = [
            r for r in runs if r["mode"] != "ar" and not r["mode"].endswith("+ngram") and r["sampling"] == sampling
        ]
        if best["mode"].endswith("+ngram") and plain:  # what the draft model alone gives, for comparison
            p = max(plain, key=lambda r: r["tokens_per_s"])
            summary[sampling]["without_lookup"] = {
                "mode": p["mode"],
                "k": p["k"],
                "min_draft_prob": p["min_draft_prob"],
                "tokens_per_s": p["tokens_per_s"],
                "speedup_vs_ar": p["speedup_vs_ar"],
            }
        if hf is not None:
            summary[sampling]["hf_assisted_tokens_per_s"] = hf[f"assisted_{sampling}_tokens_per_s"]
            summary[sampling]["ours_over_hf_assisted"] = best["tokens_per_s"] / hf[f"assisted_{sampling}_tokens_per_s"]
            if f"lookup_{sampling}_tokens_per_s" in hf:
                summary[sampling]["ours_over_hf_lookup"] = best["tokens_per_s"] / hf[f"lookup_{sampling}_tokens_per_s"]
    if hf is not None:
        print(
            "\ntransformers (eager torch, same prompts/tokens): "
            + ", ".join(
                f"{k.replace('_tokens_per_s', '')} {v:.2f} tok/s" for k, v in hf.items() if k.endswith("tokens_per_s")
            )
            + f" ({hf['prompts']} prompt(s), {hf['threads']} threads)"
        )
    print()
    for sampling, s in summary.items():
        how = (
            ("feature draft, " if s["best_mode"].startswith("spd_feat") else "")
            + f"K={s['best_k']}"
            + (f" (cap), min_draft_prob {s['best_min_draft_prob']:g}" if s["best_min_draft_prob"] is not None else "")
            + (f", n-gram lookup (n {args.ngram}, {args.ngram_k} tokens)" if s["best_mode"].endswith("+ngram") else "")
        )
        line = (
            f"{sampling}: best {how} SpD {s['best_tokens_per_s']:.2f} tok/s = {s['speedup_vs_ar']:.2f}x "
            f"AR end to end, {s['decode_speedup_vs_ar']:.2f}x in decode (goal >= 1.5x greedy)"
        )
        if "ours_over_hf_assisted" in s:
            line += f"; {s['ours_over_hf_assisted']:.2f}x transformers assisted (goal >= 3x)"
            if args.target_weights != "fp32":
                line += f" (our target {args.target_weights}, theirs fp32)"
            if "ours_over_hf_lookup" in s:
                line += f"; {s['ours_over_hf_lookup']:.2f}x transformers' prompt lookup"
        if "without_lookup" in s:
            w = s["without_lookup"]
            line += (
                f"\n  without lookup: best {w['mode']} K={w['k']}"
                + (f" min_draft_prob {w['min_draft_prob']:g}" if w["min_draft_prob"] is not None else "")
                + f" {w['tokens_per_s']:.2f} tok/s = {w['speedup_vs_ar']:.2f}x AR"
            )
        if s["greedy_rows_equal_ar"] is not None:
            same, rows = s["greedy_rows_equal_ar"]
            line += f"\n  greedy SpD rows token-identical to AR: {same}/{rows}"
        if sampling == "greedy" and one_row is not None:
            s["speedup_vs_one_row_ar"] = s["best_tokens_per_s"] / one_row["tokens_per_s"]
            line += f"; {s['speedup_vs_one_row_ar']:.2f}x the unpadded one-row AR (a different model's numerics)"
        if len(s["speedup_by_pass"]) > 1:
            by = sorted(s["speedup_by_pass"])
            line += (
                f"\n  per pass ({len(by)} passes over the prompts): min {by[0]:.2f}x, median "
                f"{statistics.median(by):.2f}x, max {by[-1]:.2f}x"
            )
        print(line)

    result = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "draft_threads": args.draft_threads,
            "feature_draft_threads": args.feature_draft_threads,
        },
        "settings": {
            "prompts": len(prompts_ids),
            "repeats": args.repeats,
            "max_new_tokens": max_new,
            "temperature": args.temperature,
            "ctx_len": args.ctx_len,
            "draft": draft_name,
            "feature_draft": args.feature_draft,
            "feature_draft_weights": args.feature_draft_weights,
            "target_weights": args.target_weights,
        },
        "target_quality": quality,
        # weight format for accel.sim (benchmarks/sim_validation.py): MatMulNBits streams 8-bit codes (MXINT8's
        # 0.25 bits of scales per weight are within the calibration's noise)
        "format": "int8" if args.target_weights == "mxint8-nbits" else "fp32",
        "target": target.config.to_dict(),
        "draft": draft.config.to_dict(),
        "feature_draft": feat.config.to_dict() if feat is not None else None,
        "calls": calls,
        "runs": runs,
        "summary": summary,
        "ar_one_row": one_row,  # only for a target with min_rows > 1 (MatMulNBits): greedy AR without the pad
        "hf_assisted": hf,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp_out, out)
    plot(runs, hf, out.with_suffix(".png"))
    shutil.rmtree(tmp, ignore_errors=True)  # the exported ONNX files (hundreds of MB)
    print(f"saved {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
