"""The demo's stages 1 and 2: load the pair, compress the target to MXFP6, decode on onnxruntime (AR and SpD),
then hand over to stage 3 (``accel.apps.demo.predict``)."""

from __future__ import annotations

import copy
import functools
import operator
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from accel.apps.demo.hydra import hydra_drafters
from accel.apps.demo.predict import mx_summary, predict
from accel.apps.demo.results import DemoResult, print_runs, summarise_runs
from accel.apps.demo.settings import (
    AUTOTUNE_MODE,
    AUTOTUNE_NODES,
    DEMO_PROMPTS,
    LOOKUP_MODE,
    TREE_MODE,
    TREE_NODES,
    default_draft_dir,
    default_feature_draft_dir,
)
from accel.apps.demo.timing import call_times, feature_call_time, mx_step_times
from accel.errors import DraftError

__all__ = ["run_demo"]

_GREEN, _RESET = "\x1b[32m", "\x1b[0m"


def run_demo(
    target: str | Path | None = None,
    draft: str | Path | None = None,
    *,
    k: int = 2,
    max_new_tokens: int = 64,
    temperature: float = 0.8,
    out_dir: str | Path = "results/demo",
    threads: int | None = None,
    quick: bool = False,
    out: TextIO | None = None,
    feature_draft: str | Path | None = None,
) -> DemoResult:
    """Run the three demo stages and return (and save as ``<out_dir>/demo.json``) their figures.

    ``feature_draft``: a feature draft (``accel.drafts.feature``) for two more decoding runs with the same K; default
    the shipped one when the target is the default one, ``"none"`` to skip. The target graph then has its hidden-state
    output in every run (AR included), so all runs share one target graph.

    ``quick`` runs the same code path on one prompt with at most 12 new tokens and no plots of the sweep kind
    (for the test suite). Raises an ``AccelError`` subclass with a clear message when a stage cannot run.
    """
    import torch

    t_start = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    if k < 1:
        raise DraftError(f"--k must be >= 1; got {k}")
    if max_new_tokens < 1:
        raise DraftError(f"--max-new-tokens must be >= 1; got {max_new_tokens}")
    out = out or sys.stdout
    run = _Run(
        k=k,
        max_new=min(max_new_tokens, 12) if quick else max_new_tokens,
        temperature=temperature,
        threads=threads,
        quick=quick,
        results=Path(out_dir),
        out=out,
        color=out.isatty() if hasattr(out, "isatty") else False,
    )
    run.results.mkdir(parents=True, exist_ok=True)
    pair = _load_pair(target, draft, feature_draft, DEMO_PROMPTS[:1] if quick else DEMO_PROMPTS, run)
    run.say("\n== 1. MXFP6 weight compression of the target (measured here)")
    comp = _compression_stage(pair, run)
    run.say("\n== 2. onnxruntime: autoregressive vs speculative decoding (measured here)")
    dec = _decoding_stage(pair, comp.pop("mx_model"), run)
    run.say("\n== 3. predicted on accelerators (accel.sim roofline model; acceptance measured above)")
    predictions, plot_paths = predict(
        pair.target_dir, pair.draft_dir, dec["runs"], k, run.results, quick, run.say, pair.feat_dir
    )
    run.say("\n" + mx_summary(dec["fp32_paired_call_s"], dec["mx_nbits_call_s"], predictions, dec["mx_kernel_call_s"]))
    result = DemoResult(
        out_dir=run.results,
        target=str(pair.target_dir),
        draft=str(pair.draft_dir),
        k=k,
        feature_draft=str(pair.feat_dir) if pair.feat_dir is not None else None,
        predictions=predictions,
        figures=plot_paths,
        wall_s=time.perf_counter() - t_start,
        **comp,
        **dec,
    )
    tmp = run.results / ".demo.json.tmp"
    tmp.write_text(result.model_dump_json(indent=2))
    os.replace(tmp, run.results / "demo.json")
    run.say(f"\nresults: {run.results.resolve()} (demo.json, figures/, onnx/); total {result.wall_s:.0f} s")
    return result


@dataclass
class _Run:
    """Settings of one demo run and where it writes."""

    k: int
    max_new: int
    temperature: float
    threads: int | None
    quick: bool
    results: Path
    out: TextIO
    color: bool

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


@dataclass
class _Pair:
    """The loaded target, drafts and tokenized prompts."""

    target_dir: Path
    draft_dir: Path
    feat_dir: Path | None
    t_model: Any
    d_model: Any
    f_model: Any
    tok: Any
    prompts: tuple[tuple[str, str], ...]
    prompt_ids: list[list[int]]
    eos: list[int] | None


def _load_pair(
    target: str | Path | None,
    draft: str | Path | None,
    feature_draft: str | Path | None,
    prompts: tuple[tuple[str, str], ...],
    run: _Run,
) -> _Pair:
    """Load and check the target, the draft and (default: the shipped one with the default target) a feature draft."""
    from accel.drafts.checkpoint import check_pair, load_model

    target_dir = Path(target) if target else _smollm2_dir()
    draft_dir = Path(draft) if draft else default_draft_dir()
    run.say(f"== accel demo: target {target_dir}\n               draft  {draft_dir}")
    t_model = load_model(target_dir, "target")
    d_model = load_model(draft_dir, "draft")
    check_pair(t_model, d_model, str(target_dir), str(draft_dir))
    tok = _tokenizer(target_dir, draft_dir)
    run.say(
        f"target {t_model.num_parameters / 1e6:.1f} M parameters, draft {d_model.num_parameters / 1e6:.2f} M "
        f"({d_model.config.num_layers} layers x {d_model.config.hidden_size}), vocab {t_model.config.vocab_size}"
    )
    if feature_draft is None and target is None and (default_feature_draft_dir() / "config.json").is_file():
        feature_draft = default_feature_draft_dir()
    feat_dir = None if feature_draft in (None, "none") else Path(str(feature_draft))
    f_model = load_model(feat_dir, "feature draft") if feat_dir is not None else None
    if f_model is not None:
        if not f_model.config.feature_size:
            raise DraftError(f"{feat_dir} is not a feature draft (its config has no accel_feature_size)")
        check_pair(t_model, f_model, str(target_dir), str(feat_dir))
        run.say(
            f"feature draft {feat_dir}: {f_model.num_parameters / 1e6:.2f} M parameters, reads the target's "
            "hidden states (EAGLE-style)"
        )
    return _Pair(
        target_dir=target_dir,
        draft_dir=draft_dir,
        feat_dir=feat_dir,
        t_model=t_model,
        d_model=d_model,
        f_model=f_model,
        tok=tok,
        prompts=prompts,
        prompt_ids=[tok.encode(p).ids for _, p in prompts],
        eos=list(t_model.config.eos_token_ids) or None,
    )


def _compression_stage(pair: _Pair, run: _Run) -> dict[str, Any]:
    """Stage 1: compress the target to MXFP6; sizes and quality. Returns ``DemoResult`` fields and ``mx_model``."""
    import torch

    from accel.drafts.architecture import causal_logits
    from accel.formats.compress import compress

    mx_model, report = compress(copy.deepcopy(pair.t_model), "mxfp6")
    mx_numel = report.bytes_fp16 // 2  # elements of the compressed weights
    model_fp16 = 2 * pair.t_model.num_parameters
    model_mx = model_fp16 - 2 * mx_numel + report.bytes_after
    all_ids: list[int] = functools.reduce(operator.iadd, pair.prompt_ids, [])
    quality_ids = torch.tensor([all_ids[: 48 if run.quick else 192]])
    with torch.no_grad():
        ref = causal_logits(pair.t_model, quality_ids)[0]
        got = causal_logits(mx_model, quality_ids)[0]
    err = (got - ref).abs()
    agree = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
    ratio = report.bytes_after / report.bytes_fp16
    run.say(
        f"{len(report.layers)} Linear weights -> MXFP6 (block 32): {report.bytes_fp16 / 1e6:.1f} MB as FP16 -> "
        f"{report.bytes_after / 1e6:.1f} MB ({ratio:.3f} of FP16, saving {report.saving_vs_fp16:.1%}); "
        f"mean SQNR {report.mean_sqnr_db:.1f} dB"
    )
    run.say(
        f"whole model (embedding and norms kept FP16): {model_fp16 / 1e6:.1f} MB -> {model_mx / 1e6:.1f} MB "
        f"(saving {1 - model_mx / model_fp16:.1%})"
    )
    run.say(
        f"quality over {len(ref)} positions of the demo prompts: logits max |err| {float(err.max()):.3f}, mean "
        f"{float(err.mean()):.4f}; greedy agreement MXFP6 vs FP32 target {agree:.3f}"
    )
    return {
        "mx_model": mx_model,
        "mx_layers_bytes_fp16": report.bytes_fp16,
        "mx_layers_bytes_mxfp6": report.bytes_after,
        "mx_size_ratio_vs_fp16": ratio,
        "model_bytes_fp16": model_fp16,
        "model_bytes_mx": model_mx,
        "mean_sqnr_db": report.mean_sqnr_db,
        "logit_max_abs_error": float(err.max()),
        "logit_mean_abs_error": float(err.mean()),
        "compressed_greedy_agreement": agree,
        "quality_positions": len(ref),
    }


def _backends(pair: _Pair, mx_model: Any, run: _Run) -> tuple[Any, Any, Any, Path, Path | None]:
    """The target (MXFP6-rounded weights), draft and feature-draft (or None) ``OrtBackend``s, exported once; and the
    target's ``mxfp6-nbits`` graph (exact MXFP6 weights on 8-bit MatMulNBits) and ``mxfp6-kernel`` graph (the same
    weights on accel's fused kernel; None where the kernel cannot be built), timed beside the target."""
    from accel.backends import OrtBackend
    from accel.backends.export import export_cached
    from accel.formats.mxkernel_build import kernel_status

    ctx_len = _round_up(max(len(p) for p in pair.prompt_ids) + run.max_new + run.k + 2, 64)
    onnx_dir = run.results / "onnx"
    cached = functools.partial(export_cached, onnx_dir=onnx_dir, ctx_len=ctx_len, say=run.say)
    t_onnx = cached(
        pair.target_dir,
        name="target-mxfp6",
        weights="mx-rounded",
        model=mx_model,
        hidden_output=pair.f_model is not None,
        tree=pair.f_model is not None,  # the feature draft's token trees (every mode runs this one graph)
    )
    d_onnx = cached(pair.draft_dir, name="draft", model=pair.d_model)
    nbits = pair.f_model is not None  # the same graph as the target's, but for its weights
    mx_onnx = cached(pair.target_dir, name="target-mxfp6-nbits", weights="mxfp6-nbits", model=mx_model,
                     hidden_output=nbits, tree=nbits)  # fmt: skip
    kernel_onnx = None
    if kernel_status().available:
        kernel_onnx = cached(pair.target_dir, name="target-mxfp6-kernel", weights="mxfp6-kernel", model=mx_model,
                             hidden_output=nbits, tree=nbits)  # fmt: skip
    fb = None
    if pair.feat_dir is not None:
        # the target's threads, unlike the standalone draft: its calls are a few wide matmuls that do split
        # int8 matmuls (weights="int8"): ~40% cheaper calls, an approximate draft, the same exact SpD output
        f_onnx = cached(pair.feat_dir, name="feature-draft", model=pair.f_model, weights="int8", tree=True)
        fb = OrtBackend(f_onnx, threads=run.threads)
    tb = OrtBackend(t_onnx, threads=run.threads)
    # one thread for the tiny draft: its calls are too short to split, and an idle multi-thread pool keeps spinning
    # on the cores the target's next call needs
    db = OrtBackend(d_onnx, threads=1)
    return tb, db, fb, mx_onnx, kernel_onnx


def _decoding_stage(pair: _Pair, mx_model: Any, run: _Run) -> dict[str, Any]:
    """Stage 2: AR and SpD runs on onnxruntime, streamed; returns ``DemoResult`` fields."""
    tb, db, fb, mx_onnx, kernel_onnx = _backends(pair, mx_model, run)
    del mx_model
    t_call, t_score, d_call = call_times(tb, db, run.k, reps=3 if run.quick else 8)
    run.say(
        f"one call on onnxruntime: target {t_call * 1e3:.1f} ms (S=1), {t_score * 1e3:.1f} ms (S={run.k + 1}); "
        f"draft {d_call * 1e3:.2f} ms (S=1) = {d_call / t_call:.1%} of a target call"
    )
    mx = mx_step_times(tb, mx_onnx, run.threads, reps=3 if run.quick else 20, kernel_onnx=kernel_onnx)
    fp32, padded, one = mx["fp32_paired_call_s"], mx["mx_nbits_call_s"], mx["mx_nbits_one_row_call_s"]
    run.say(
        f"exact MXFP6 weights on 8-bit MatMulNBits (int8 activations): {padded * 1e3:.1f} ms per step (S=1 as "
        f"OrtBackend and SpD run it; 1 row {one * 1e3:.1f} ms) vs float32 {fp32 * 1e3:.1f} ms: {fp32 / padded:.2f}x "
        f"({fp32 / one:.2f}x)"
    )
    if mx["mx_kernel_call_s"]:
        kernel = mx["mx_kernel_call_s"]
        run.say(
            f"the same MXFP6 weights packed, on accel's fused kernel (float32 activations, mxfp6-kernel): "
            f"{kernel * 1e3:.1f} ms per step: {fp32 / kernel:.2f}x float32"
        )
    f_call = None
    if fb is not None:
        f_call = feature_call_time(fb, reps=3 if run.quick else 8)
        run.say(f"feature draft {f_call * 1e3:.2f} ms (S=1) = {f_call / t_call:.1%} of a target call")
    runs, matches = _decode_prompts(pair, tb, db, fb, run)
    run.say(
        f"\n(draft tokens shown {'in green' if run.color else 'in [brackets]'}; greedy SpD == AR output: "
        f"{'yes' if matches else 'NO'})"
    )
    figures = summarise_runs(runs)
    print_runs(figures, run.say)
    return {
        "draft_call_s": d_call,
        "feature_draft_call_s": f_call,
        "target_call_s": t_call,
        "target_score_call_s": t_score,
        **mx,
        "runs": figures,
        "greedy_spd_matches_ar": matches,
    }


def _drafters(pair: _Pair, tb: Any, db: Any, fb: Any, run: _Run) -> list[tuple[str, Any, Any]]:
    """The demo's speculative modes: (name, a function returning the proposer for one prompt, sampling)."""
    from accel.spd import GREEDY, DraftChain, DraftTree, NgramLookup, Sampling
    from accel.spd.autotune import AutoTune, draft_arms

    sampled = Sampling(temperature=run.temperature)
    drafters: list[tuple[str, Any, Sampling]] = [
        ("SpD greedy", lambda: DraftChain(db, k=run.k), GREEDY),
        (f"SpD sampled T={run.temperature:g}", lambda: DraftChain(db, k=run.k), sampled),
    ]
    if fb is None:
        return drafters
    # one controller for every prompt (it learns this machine's costs and the draft's acceptance as it goes)
    tuned = AutoTune(draft_arms(fb, k=run.k, nodes=AUTOTUNE_NODES, lookup=(3, run.k)))  # chains, lookup, a tree
    tuned.probe(tb)
    drafters += [
        ("feature SpD greedy", lambda: DraftChain(fb, k=run.k), GREEDY),
        (f"feature SpD T={run.temperature:g}", lambda: DraftChain(fb, k=run.k), sampled),
        (LOOKUP_MODE, lambda: [NgramLookup(3, run.k), DraftChain(fb, k=run.k)], GREEDY),
        (TREE_MODE, lambda: DraftTree(fb, nodes=TREE_NODES), GREEDY),
        (AUTOTUNE_MODE, lambda: tuned, GREEDY),
    ]  # + n-gram lookup drafts (accel.spd.lookup), the dynamic token tree (accel.spd.draft_tree), the controller
    if pair.target_dir == _smollm2_dir():  # + the shipped Hydra++ heads' trees (accel.apps.demo.hydra)
        drafters += hydra_drafters(pair.target_dir, run.results / "onnx", tb.info.ctx_len, run.temperature)
    return drafters


def _decode_prompts(pair: _Pair, tb: Any, db: Any, fb: Any, run: _Run) -> tuple[dict[str, list[Any]], bool]:
    """Every decoding mode on every prompt, streamed; the results by mode and whether greedy SpD equalled AR."""
    from accel.spd import GREEDY, generate, generate_ar
    from accel.spd.autotune import AutoTune

    drafters = _drafters(pair, tb, db, fb, run)
    runs: dict[str, list[Any]] = {"AR (greedy)": [], **{name: [] for name, _, _ in drafters}}
    matches = True
    for (kind, text), ids in zip(pair.prompts, pair.prompt_ids, strict=True):
        run.say(f"\n--- {kind} prompt: {text.strip()[:90]!r}")
        ar = generate_ar(tb, [ids], max_new_tokens=run.max_new, sampling=GREEDY, eos_token_id=pair.eos)
        runs["AR (greedy)"].append(ar)
        run.say(f"[AR greedy] {pair.tok.decode(ar.tokens[0])}")
        for name, make, sampling in drafters:
            printer = _StreamPrinter(pair.tok, run.out, run.color)
            run.out.write(f"[{name}] ")
            proposer = make()
            res = generate(
                tb,
                proposer,
                [ids],
                max_new_tokens=run.max_new,
                sampling=sampling,
                eos_token_id=pair.eos,
                stream=printer,
            )
            run.out.write("\n")
            runs[name].append(res)
            s = res.stats
            run.say(
                f"    {s.decode_tokens_per_s:.1f} tok/s, accepted {s.accepted_drafts}/{s.proposed_drafts} draft "
                f"tokens, {s.tokens_per_target_call:.2f} tokens per target call"
            )
            if isinstance(proposer, AutoTune):  # what the controller chose and why
                run.say(f"    autotune: {proposer.describe()}")
            if sampling.greedy and res.tokens[0] != ar.tokens[0]:
                matches = False
                run.say("    WARNING: greedy SpD output differs from AR greedy output")
    return runs, matches


class _StreamPrinter:
    """``stream`` callback: prints each row-0 chunk, accepted draft tokens in green (TTY) or in [brackets]."""

    def __init__(self, tok, out: TextIO, color: bool) -> None:
        self.tok, self.out, self.color = tok, out, color
        self.tokens: list[int] = []
        self.text = ""

    def _piece(self, toks: list[int]) -> str:
        self.tokens.extend(toks)
        full = self.tok.decode(self.tokens)
        piece, self.text = full[len(self.text) :], full
        return piece

    def __call__(self, row: int, tokens: list[int], from_draft: list[bool]) -> None:
        drafted = [t for t, f in zip(tokens, from_draft, strict=True) if f]
        rest = [t for t, f in zip(tokens, from_draft, strict=True) if not f]
        if drafted:
            piece = self._piece(drafted)
            self.out.write(f"{_GREEN}{piece}{_RESET}" if self.color else f"[{piece}]")
        if rest:
            self.out.write(self._piece(rest))
        self.out.flush()


def _smollm2_dir() -> Path:
    try:
        from accel.models import smollm2_checkpoint
    except ImportError as exc:
        raise DraftError(f"the default demo target needs accel.models.smollm2_checkpoint: {exc}") from exc
    return Path(smollm2_checkpoint())


def _tokenizer(target_dir: Path, draft_dir: Path):
    from accel.drafts.checkpoint import load_text_tokenizer

    if (target_dir / "tokenizer.json").is_file():
        return load_text_tokenizer(target_dir)
    return load_text_tokenizer(draft_dir)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m
