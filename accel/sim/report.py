"""Text report of a ``Prediction`` (``Prediction.table()``, ``accel predict``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel.sim.predict import Prediction


def _acceptance(p: Prediction) -> str:
    if p.loop_stats is not None:
        s = p.loop_stats
        calls = (
            f", {s.draft_calls():.2f} draft calls of {s.draft_tokens_per_call:.2f} tokens"
            if (s.draft_calls_per_loop is not None or s.draft_tokens_per_call > 1)
            else ""
        )
        return (
            f"measured {s.tokens_per_loop:.3f} tokens and {s.drafts_per_loop:.3f} drafts per loop{calls} (K cap {p.k})"
        )
    acc = p.acceptance
    if isinstance(acc, float):
        return f"{acc:g}" + (" (geometric over ranks)" if p.tree is not None else "")
    if acc and isinstance(acc[0], list):
        return "per depth x rank " + "; ".join("[" + ", ".join(f"{a:.2f}" for a in row) + "]" for row in acc[:3])
    return "[" + ", ".join(f"{a:.2f}" for a in acc or []) + "]"


def _header(p: Prediction) -> str:
    cache = f"fixed cache of {p.ctx_len}" if p.cache == "fixed" else "growing cache"
    common = f"batch={p.batch_size}, prompt={p.prompt_len}, gen={p.gen_len}, {cache}"
    if p.draft is None:
        return f"{p.target} on {p.hardware} ({p.devices} device(s)); autoregressive only; {common}"
    where = "" if p.draft_hardware == p.hardware else f" of {p.draft_hardware}"
    kind = "feature draft" if p.feature_draft else "draft"
    shape = (
        f"tree of {p.tree.n_nodes} nodes, depth {p.tree.depth}, draft calls {p.tree.draft_call_widths()}"
        if p.tree is not None
        else f"K={p.k}"
    )
    return (
        f"{p.target} + {kind} {p.draft} on {p.hardware} (target on {p.devices} device(s), draft on "
        f"{p.draft_devices}{where}); {shape}, acceptance={_acceptance(p)}, {common}"
    )


def _planning_line(p: Prediction) -> str | None:
    spd = [c for c in p.configs if c.speculative]
    if not spd:
        return None
    last = spd[-1]
    head = f"E[tokens/loop] = {last.expected_tokens_per_loop:.3f}; "
    if p.best_tree_nodes is not None:
        return (
            head + f"best tree size for {last.name} = {p.best_tree_nodes} nodes "
            f"({p.best_tree_speedup:.2f}x over {last.target_format} AR)"
        )
    be = "never (SpD loses even at alpha=1)" if p.break_even_alpha is None else f"{p.break_even_alpha:.3f}"
    return (
        head + f"best K for {last.name} = {p.best_k} ({p.best_k_speedup:.2f}x over {last.target_format} AR); "
        f"break-even alpha at K={p.k}: {be}"
    )


def prediction_table(p: Prediction) -> str:
    """The configurations as aligned text, with the planning line and the memory fit."""
    lines = [
        _header(p),
        f"{'configuration':<22}{'TTFT ms':>9}{'TPOT ms':>9}{'tok/s':>9}{'total s':>9}{'speedup':>9}"
        f"{'decode x':>9}  {'bound':<14}{'memory GB':>10}  fits{'max B':>7}",
    ]
    for c in p.configs:
        lines.append(
            f"{c.name:<22}{c.ttft_s * 1e3:>9.2f}{c.tpot_s * 1e3:>9.3f}{c.tokens_per_s:>9.1f}"
            f"{c.total_s:>9.3f}{c.speedup:>8.2f}x{c.decode_speedup:>8.2f}x  {c.bound:<14}"
            f"{c.memory_bytes / 1e9:>10.2f}  {'yes' if c.fits else 'NO ':<4}{c.max_batch_size:>7}"
        )
    plan = _planning_line(p)
    if plan:
        lines.append(plan)
    lines.append(p.fit_message)
    return "\n".join(lines)
