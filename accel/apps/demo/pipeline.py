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

from accel.apps.demo.hydra import default_hydra_dir
from accel.apps.demo.modes import AR_MODE, ModeSettings, demo_modes, open_modes, write_specs
from accel.apps.demo.predict import mx_summary, predict
from accel.apps.demo.results import DemoResult, print_runs, summarise_runs
from accel.apps.demo.settings import DEMO_PROMPTS, default_draft_dir, default_feature_draft_dir
from accel.apps.demo.timing import call_times, feature_call_time, mx_step_times
from accel.apps.printing import StreamPrinter
from accel.backends.weights import WeightFormat
from accel.decode import DecodeSetup
from accel.decode.opening import GraphNeeds, cached_graph
from accel.errors import DraftError
from accel.spd.autotune import AutoTune

__all__ = ["run_demo"]


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
    del comp["mx_model"]  # stage 2 exports its MXFP6 graphs from the checkpoint (accel.apps.demo.modes)
    dec = _decoding_stage(pair, run)
    run.say("\n== 3. predicted on accelerators (accel.sim roofline model; acceptance measured above)")
    predictions, plot_paths = predict(
        pair.target_dir, pair.draft_dir, dec["runs"], k, run.results, quick, run.say, pair.feat_dir
    )
    run.say(
        "\n"
        + mx_summary(
            dec["fp32_paired_call_s"],
            dec["mx_nbits_call_s"],
            predictions,
            dec["mx_kernel_call_s"],
            dec["mx_kernel_q8_call_s"],
        )
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
    run.say(f"\nresults: {run.results.resolve()} (demo.json, specs/, figures/); total {result.wall_s:.0f} s")
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


def _mode_settings(pair: _Pair, run: _Run) -> ModeSettings:
    """What every decoding mode shares (``accel.apps.demo.modes``)."""
    hydra = (
        pair.f_model is not None
        and pair.target_dir == _smollm2_dir()
        and (default_hydra_dir() / "config.json").is_file()
    )
    return ModeSettings(
        target=pair.target_dir,
        draft=pair.draft_dir,
        feature_draft=pair.feat_dir,
        hydra=hydra,
        k=run.k,
        max_new_tokens=run.max_new,
        temperature=run.temperature,
        threads=run.threads,
        ctx_len=_round_up(max(len(p) for p in pair.prompt_ids) + run.max_new + run.k + 2, 64),
        eos=pair.eos,
        tokenizer=pair.target_dir if (pair.target_dir / "tokenizer.json").is_file() else pair.draft_dir,
    )


def _timing_graphs(pair: _Pair, ctx_len: int) -> tuple[Path, Path | None, Path | None]:
    """The target's ``mxfp6-nbits`` graph (exact MXFP6 weights on 8-bit MatMulNBits) and ``mxfp6-kernel`` and
    ``mxfp6-kernel-q8`` graphs (the same weights on accel's fused kernel, float32 and int8 activations; None where the
    kernel cannot be built), exported like the decoding target (``accel.decode.opening.cached_graph``) to be timed
    beside it."""
    from accel.formats.mxkernel_build import kernel_status

    wide = GraphNeeds(pair.f_model is not None, pair.f_model is not None)  # the decoding target's graph, but weights
    nbits = cached_graph(pair.target_dir, ctx_len, WeightFormat.MXFP6_NBITS, wide)
    if not kernel_status().available:
        return nbits, None, None
    kernel = cached_graph(pair.target_dir, ctx_len, WeightFormat.MXFP6_KERNEL, wide)
    return nbits, kernel, cached_graph(pair.target_dir, ctx_len, WeightFormat.MXFP6_KERNEL_Q8, wide)


def _decoding_stage(pair: _Pair, run: _Run) -> dict[str, Any]:
    """Stage 2: AR and SpD runs on onnxruntime (each mode a ``DecodeSpec``, written under ``specs/``), streamed;
    returns ``DemoResult`` fields."""
    settings = _mode_settings(pair, run)
    modes = demo_modes(settings)
    spec_files = write_specs(modes, run.results / "specs")
    setups = open_modes(modes, pair.tok, wide=pair.f_model is not None)
    tb, db = setups[AR_MODE].target, setups["SpD greedy"].drafts[0]
    t_call, t_score, d_call = call_times(tb, db, run.k, reps=3 if run.quick else 8)
    run.say(
        f"one call on onnxruntime: target {t_call * 1e3:.1f} ms (S=1), {t_score * 1e3:.1f} ms (S={run.k + 1}); "
        f"draft {d_call * 1e3:.2f} ms (S=1) = {d_call / t_call:.1%} of a target call"
    )
    mx_onnx, kernel_onnx, q8_onnx = _timing_graphs(pair, settings.ctx_len)
    mx = mx_step_times(
        tb, mx_onnx, run.threads, reps=3 if run.quick else 20, kernel_onnx=kernel_onnx, kernel_q8_onnx=q8_onnx
    )
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
    if mx["mx_kernel_q8_call_s"]:
        q8 = mx["mx_kernel_q8_call_s"]
        run.say(
            f"... with int8 activations (rounded per block of 32, integer dot products, mxfp6-kernel-q8): "
            f"{q8 * 1e3:.1f} ms per step: {fp32 / q8:.2f}x float32"
        )
    f_call = None
    if pair.f_model is not None:
        f_call = feature_call_time(setups["feature SpD greedy"].drafts[0], reps=3 if run.quick else 8)
        run.say(f"feature draft {f_call * 1e3:.2f} ms (S=1) = {f_call / t_call:.1%} of a target call")
    runs, matches = _decode_prompts(pair, setups, run)
    run.say(
        f"\n(draft tokens shown {'in green' if run.color else 'in [brackets]'}; greedy SpD == AR output: "
        f"{'yes' if matches else 'NO'})"
    )
    folder = spec_files[AR_MODE].parent
    run.say(f"each mode's recipe: {folder}/*.json (accel generate --spec FILE --prompt TEXT runs the same decode)")
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
        "specs": {name: str(path) for name, path in spec_files.items()},
    }


def _decode_prompts(pair: _Pair, setups: dict[str, DecodeSetup], run: _Run) -> tuple[dict[str, list[Any]], bool]:
    """Every decoding mode on every prompt, streamed; the results by mode and whether greedy SpD equalled AR. The
    modes' setups are reused from prompt to prompt (the controller learns this machine's costs as it goes)."""
    runs: dict[str, list[Any]] = {name: [] for name in setups}
    matches = True
    for (kind, text), ids in zip(pair.prompts, pair.prompt_ids, strict=True):
        run.say(f"\n--- {kind} prompt: {text.strip()[:90]!r}")
        ar = setups[AR_MODE].generate([ids])
        runs[AR_MODE].append(ar)
        run.say(f"[{AR_MODE}] {pair.tok.decode(ar.tokens[0])}")
        for name, setup in setups.items():
            if name == AR_MODE:
                continue
            run.out.write(f"[{name}] ")
            res = setup.generate([ids], stream=StreamPrinter(pair.tok, run.out))
            run.out.write("\n")
            runs[name].append(res)
            s = res.stats
            run.say(
                f"    {s.decode_tokens_per_s:.1f} tok/s, accepted {s.accepted_drafts}/{s.proposed_drafts} draft "
                f"tokens, {s.tokens_per_target_call:.2f} tokens per target call"
            )
            if isinstance(setup.proposer, AutoTune):  # what the controller chose and why
                run.say(f"    autotune: {setup.proposer.describe()}")
            if setup.sampling.greedy and res.tokens[0] != ar.tokens[0]:
                matches = False
                run.say("    WARNING: greedy SpD output differs from AR greedy output")
    return runs, matches


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
