"""The demo's stage 3: the measured acceptance and loop shapes priced on accelerators by ``accel.sim``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from accel.apps.demo.results import RunFigures
from accel.apps.demo.settings import HARDWARE
from accel.errors import DraftError

__all__ = ["mx_summary", "predict"]


def predict(
    target_dir: Path,
    draft_dir: Path,
    runs: list[RunFigures],
    k: int,
    results: Path,
    quick: bool,
    say: Callable[[str], None],
    feat_dir: Path | None = None,
) -> tuple[dict[str, dict[str, float]], list[Path]]:
    """Stage 3: speedups predicted on ``HARDWARE`` for the measured acceptance (and the feature draft's measured
    loops), with plots; returns ``{hardware: {configuration: speedup}}`` and the figure paths."""
    try:
        from accel.sim import plots
    except ImportError as exc:
        raise DraftError(f"stage 3 needs accel.sim.predict_speedup and accel.sim.plots: {exc}") from exc
    t_cfg, d_cfg = target_dir / "config.json", draft_dir / "config.json"
    fig_dir = results / "figures"
    predictions, figures = _predict_standalone(t_cfg, d_cfg, runs, k, fig_dir, say)
    feat = [
        r
        for r in runs
        if r.mode.startswith("feature SpD T=") and r.drafts_per_loop is not None and r.mean_tokens_per_loop is not None
    ]
    if feat_dir is not None and feat:
        _predict_feature(t_cfg, feat_dir / "config.json", feat[0], k, predictions, say)
    if not quick:
        figures.append(plots.speedup_heatmap(t_cfg, d_cfg, "cloud-ai-100-pro", fig_dir / "spd-heatmap-ai100-pro.png"))
        roof = fig_dir / "roofline-ai100-pro.png"
        points = plots.RooflinePoints(k=k)
        figures.append(plots.roofline(t_cfg, "cloud-ai-100-pro", roof, points, weight_format="mxfp6"))
    say("\nfigures (predicted): " + ", ".join(str(f) for f in figures))
    return predictions, figures


def _predict_standalone(
    t_cfg: Path, d_cfg: Path, runs: list[RunFigures], k: int, fig_dir: Path, say: Callable[[str], None]
) -> tuple[dict[str, dict[str, float]], list[Path]]:
    """The four configurations (fp16/mxfp6, AR/SpD) per device at the standalone draft's measured acceptance."""
    from accel.sim import plots, predict_speedup

    sampled = next(r for r in runs if r.mode.startswith("SpD sampled"))
    greedy = next(r for r in runs if r.mode == "SpD greedy")
    # the per-token acceptance to simulate: measured with sampling (the harder case); fall back to greedy
    alpha = sampled.acceptance if sampled.acceptance is not None else greedy.acceptance
    alpha = min(max(float(alpha if alpha is not None else 0.0), 0.0), 1.0)
    say(
        f"alpha = {alpha:.3f} (measured, {sampled.mode}), K = {k}, prompt 128 / generation 512, batch 1, "
        "target MXFP6, draft FP16"
    )
    predictions: dict[str, dict[str, float]] = {}
    figures: list[Path] = []
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
    return predictions, figures


def _predict_feature(
    t_cfg: Path,
    f_cfg: Path,
    f: RunFigures,
    k: int,
    predictions: dict[str, dict[str, float]],
    say: Callable[[str], None],
) -> None:
    """The feature draft's measured loops (sampled, like alpha above) as LoopStats; it re-feeds each loop."""
    from accel.sim import LoopStats, predict_speedup

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
            f_cfg,
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


def mx_summary(
    fp32_s: float,
    mx_s: float,
    predictions: dict[str, dict[str, float]],
    kernel_s: float | None = None,
    kernel_q8_s: float | None = None,
) -> str:
    """One line: MXFP6 weights alone, the decode-step speedup measured here (seconds per step of the float32 and the
    ``mxfp6-nbits`` target, and of the ``mxfp6-kernel`` / ``mxfp6-kernel-q8`` ones when given) next to the predicted
    ``mxfp6 AR`` speedup over ``fp16 AR`` on each device."""
    predicted = ", ".join(f"{hw} {c['mxfp6 AR']:.2f}x" for hw, c in predictions.items() if "mxfp6 AR" in c)
    kernel = f"; {fp32_s / kernel_s:.2f}x on accel's fused kernel, float32 activations" if kernel_s else ""
    kernel += f", {fp32_s / kernel_q8_s:.2f}x with int8 activations" if kernel_s and kernel_q8_s else ""
    return (
        f"MXFP6 weights alone, one decode step: measured here {fp32_s / mx_s:.2f}x float32 (CPU, onnxruntime, "
        f"exact MXFP6 on 8-bit MatMulNBits{kernel}); predicted over fp16: {predicted}"
    )
