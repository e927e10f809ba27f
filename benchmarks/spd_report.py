"""The printed report of benchmarks/spd.py: header (pair, per-call latency), the table of runs, and the summary
of the best settings against AR and transformers. Imported by the script (same folder)."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

__all__ = ["print_header", "print_summary", "print_table", "print_tree_goal", "summarise"]


def print_header(setup: Any, calls: list[dict], quality: Any, one_row: Any, runs: list[dict], args) -> None:
    """The pair, the per-call latency and S-curve, the quantized target's quality, the one-row AR."""
    print(
        f"\ntarget {setup.target_dir} ({setup.target.num_parameters / 1e6:.0f}M), draft {setup.draft_name} "
        f"({setup.draft.num_parameters / 1e6:.0f}M); onnxruntime, {len(setup.prompts_ids)} prompts x "
        f"{setup.max_new} new tokens"
    )
    t1 = {c["seq_len"]: c["seconds"] for c in calls if c["model"] == "target"}
    d1 = {c["seq_len"]: c["seconds"] for c in calls if c["model"] == "draft"}
    f1 = {c["seq_len"]: c["seconds"] for c in calls if c["model"] == "feature_draft"}
    print(
        f"per-call latency at past {args.past_len}: S=1 target {t1[1] * 1e3:.1f} ms, draft {d1[1] * 1e3:.1f} ms"
        + (f", feature draft {f1[1] * 1e3:.1f} ms" if f1 else "")
        + "; target S/S=1: "
        + " ".join(f"{s}:{t1[s] / t1[1]:.2f}" for s in range(2, 10))
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
        rows = setup.tb.min_rows
        print(
            f"target min_rows {rows}: one-token steps padded to {rows} rows (same numerics as SpD's "
            f"verification); unpadded one-row greedy AR {one_row['tokens_per_s']:.2f} tok/s "
            f"({one_row['tokens_per_s'] / ar['tokens_per_s']:.2f}x the padded AR), its tokens identical to the "
            f"padded AR's in {one_row['greedy_rows_equal_ar'][0]}/{one_row['greedy_rows_equal_ar'][1]} rows"
        )


def _samplings(runs: list[dict]) -> list[str]:
    """The sampling modes of the run, greedy first (``--greedy-only`` leaves out the multinomial runs)."""
    return [s for s in ("greedy", "multinomial") if any(r["sampling"] == s for r in runs)]


def _lookup(mode: str) -> bool:
    """Whether a run used n-gram lookup (after the draft: +ngram; merged into its tree: +merge)."""
    return mode.endswith(("+ngram", "+merge"))


def _mode_label(r: dict) -> str:
    base = r["mode"].removesuffix("+ngram").removesuffix("+merge")
    mode = {"spd_feat": "feat", "spd_feat_dyn": "feat", "spd_feat_tree": "feat tree"}.get(base, base)
    if base == "spd_feat_tree" and (r["min_draft_prob"] is not None or r.get("expand_prob")):  # a dynamic tree
        mode = f"tree p<{r['min_draft_prob'] or 0:g}" + (f" e<{r['expand_prob']:g}" if r.get("expand_prob") else "")
    elif r["min_draft_prob"] is not None:
        mode = f"{'feat ' if mode == 'feat' else ''}dyn p<{r['min_draft_prob']:g}"
    return mode + {"+ngram": " +ng", "+merge": " +mg"}.get(r["mode"][-6:], "")


def print_table(runs: list[dict]) -> None:
    """Speedups of every run against the AR run of its sampling mode (added to the rows), as a table."""
    print(
        f"\n{'sampling':12} {'mode':12} {'K':>2} {'tok/s':>8} {'vs AR':>6} {'decode':>7} {'vs AR':>6} {'alpha':>6} "
        f"{'tok/loop':>8} {'draft s':>8} {'target s':>8} {'host s':>7}   (decode: prefill excluded)"
    )
    for sampling in _samplings(runs):
        ar = next(r for r in runs if r["mode"] == "ar" and r["sampling"] == sampling)
        for r in (r for r in runs if r["sampling"] == sampling):
            r["speedup_vs_ar"] = r["tokens_per_s"] / ar["tokens_per_s"]
            r["decode_speedup_vs_ar"] = r["decode_tokens_per_s"] / ar["decode_tokens_per_s"]
            by_pass = zip(r["tokens_per_s_by_pass"], ar["tokens_per_s_by_pass"], strict=True)
            r["speedup_by_pass"] = [x / a for x, a in by_pass]
            alpha = f"{r['alpha']:.3f}" if r["alpha"] is not None else "-"
            extra = f"{r['draft_s']:8.2f} {r['target_s']:8.2f} {r['host_s']:7.2f}" if r["mode"] != "ar" else ""
            print(
                f"{sampling:12} {_mode_label(r):12} {r['k']:2d} {r['tokens_per_s']:8.2f} {r['speedup_vs_ar']:6.2f} "
                f"{r['decode_tokens_per_s']:7.2f} {r['decode_speedup_vs_ar']:6.2f} "
                f"{alpha:>6} {r['mean_tokens_per_loop']:8.2f} {extra}"
            )


def summarise(runs: list[dict], hf: Any, one_row: Any) -> dict[str, dict]:
    """The best SpD setting per sampling mode, against AR, transformers and the same run without lookup."""
    summary: dict[str, dict] = {}
    for sampling in _samplings(runs):
        ar = next(r for r in runs if r["mode"] == "ar" and r["sampling"] == sampling)
        spd = [r for r in runs if r["mode"] != "ar" and r["sampling"] == sampling]
        best = max(spd, key=lambda r: r["tokens_per_s"])
        s = summary[sampling] = {
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
        plain = [r for r in spd if not r["mode"].endswith(("+ngram", "+merge"))]
        if best["mode"].endswith(("+ngram", "+merge")) and plain:  # what the draft model alone gives, for comparison
            p = max(plain, key=lambda r: r["tokens_per_s"])
            s["without_lookup"] = {key: p[key] for key in ("mode", "k", "min_draft_prob", "tokens_per_s")}
            s["without_lookup"]["speedup_vs_ar"] = p["speedup_vs_ar"]
        if hf is not None:
            s["hf_assisted_tokens_per_s"] = hf[f"assisted_{sampling}_tokens_per_s"]
            s["ours_over_hf_assisted"] = best["tokens_per_s"] / hf[f"assisted_{sampling}_tokens_per_s"]
            if f"lookup_{sampling}_tokens_per_s" in hf:
                s["ours_over_hf_lookup"] = best["tokens_per_s"] / hf[f"lookup_{sampling}_tokens_per_s"]
        if sampling == "greedy" and one_row is not None:
            s["speedup_vs_one_row_ar"] = s["best_tokens_per_s"] / one_row["tokens_per_s"]
    return summary


def print_summary(summary: dict[str, dict], hf: Any, args: argparse.Namespace) -> None:
    """One paragraph per sampling mode: the best setting, its speedups and the goals."""
    if hf is not None:
        rates = ", ".join(
            f"{k.replace('_tokens_per_s', '')} {v:.2f} tok/s" for k, v in hf.items() if k.endswith("tokens_per_s")
        )
        print(
            f"\ntransformers (eager torch, same prompts/tokens): {rates} "
            f"({hf['prompts']} prompt(s), {hf['threads']} threads)"
        )
    print()
    for sampling, s in summary.items():
        tree = s["best_mode"].startswith("spd_feat_tree")
        how = (
            ("feature draft, " if s["best_mode"].startswith("spd_feat") else "")
            + (f"tree of <= {s['best_k']} nodes" if tree else f"K={s['best_k']}")
            + (f", min_prob {s['best_min_draft_prob']:g}" if tree and s["best_min_draft_prob"] is not None else "")
            + (
                f" (cap), min_draft_prob {s['best_min_draft_prob']:g}"
                if s["best_min_draft_prob"] is not None and not tree
                else ""
            )
            + (f", n-gram lookup (n {args.ngram}, {args.ngram_k} tokens)" if _lookup(s["best_mode"]) else "")
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
        if "speedup_vs_one_row_ar" in s:
            line += f"; {s['speedup_vs_one_row_ar']:.2f}x the unpadded one-row AR (a different model's numerics)"
        if len(s["speedup_by_pass"]) > 1:
            by = sorted(s["speedup_by_pass"])
            line += (
                f"\n  per pass ({len(by)} passes over the prompts): min {by[0]:.2f}x, median "
                f"{statistics.median(by):.2f}x, max {by[-1]:.2f}x"
            )
        print(line)


TREE_GOAL_TOKENS, TREE_GOAL_SPEEDUP = 2.5, 1.8  # issue 16: one greedy tree setting (<= 16 nodes) meets both


def print_tree_goal(runs: list[dict]) -> None:
    """The greedy tree settings (``spd_feat_tree``, alone, after lookup, merged with it) against issue 16's goal:
    tokens per target call and the speedup over AR, both in one setting; the closest setting is the one whose worse
    ratio to its goal is highest. Call after ``print_table`` (it adds the speedups)."""
    trees = [r for r in runs if r["sampling"] == "greedy" and r["mode"].startswith("spd_feat_tree") and r["k"] <= 16]
    if not trees:
        return
    print(f"\ntree goal (one greedy setting: >= {TREE_GOAL_TOKENS} tok/call and >= {TREE_GOAL_SPEEDUP}x AR):")
    for r in trees:
        print(
            f"  {_mode_label(r):22} {r['k']:2d} nodes: {r['mean_tokens_per_loop']:.2f} tok/call, "
            f"{r['speedup_vs_ar']:.2f}x AR, {r['mean_tree_nodes']:.1f} nodes and "
            f"{r['draft_calls_per_loop']:.2f} draft calls per round"
        )
    best = max(trees, key=_goal_ratio)
    met = _goal_ratio(best) >= 1.0
    print(
        f"  {'met' if met else 'closest'}: {_mode_label(best)} {best['k']} nodes "
        f"({best['mean_tokens_per_loop']:.2f} tok/call, {best['speedup_vs_ar']:.2f}x AR)"
    )


def _goal_ratio(r: dict) -> float:
    return min(r["mean_tokens_per_loop"] / TREE_GOAL_TOKENS, r["speedup_vs_ar"] / TREE_GOAL_SPEEDUP)
