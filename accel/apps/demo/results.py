"""What the demo measured and predicted: per-mode figures (``RunFigures``) and the whole ``DemoResult``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["DemoResult", "RunFigures", "print_runs", "summarise_runs"]


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
    # the generated token ids of each prompt (row 0), in the demo's prompt order
    tokens: list[list[int]] = Field(default_factory=list)


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
    # exact MXFP6 weights on onnxruntime's 8-bit MatMulNBits (weights="mxfp6-nbits"): one S = 1 step, timed beside
    # the float32 target (target_call_s's graph): as OrtBackend and the SpD engine run it (min_rows) and one row
    mx_nbits_call_s: float | None = None
    mx_nbits_one_row_call_s: float | None = None
    # the same weights packed, on accel's fused kernel in onnxruntime (weights="mxfp6-kernel"; None: no kernel here)
    mx_kernel_call_s: float | None = None
    # ... with int8 activations (weights="mxfp6-kernel-q8": activations rounded per block of 32, integer dot products)
    mx_kernel_q8_call_s: float | None = None
    fp32_paired_call_s: float | None = None
    runs: list[RunFigures]
    greedy_spd_matches_ar: bool
    # each mode's DecodeSpec (mode -> JSON file): accel generate --spec FILE runs the same decode
    specs: dict[str, Path] = Field(default_factory=dict)
    predictions: dict[str, dict[str, float]] = Field(default_factory=dict)
    figures: list[Path] = Field(default_factory=list)
    wall_s: float


def summarise_runs(runs: dict[str, list[Any]]) -> list[RunFigures]:
    """One ``RunFigures`` per decoding mode, summed over the prompts (speedups against the first mode, AR)."""
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
                tokens=[[int(t) for t in r.tokens[0]] for r in results],
            )
        )
    return out


def print_runs(figures: list[RunFigures], say: Callable[[str], None]) -> None:
    """The stage-2 table."""
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
