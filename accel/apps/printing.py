"""The text output of ``accel generate`` (``accel.apps.generate``): the stream printer and the statistics summary.

The text is streamed as rounds complete; tokens that were accepted from the draft are shown in green on a terminal,
in ``[brackets]`` otherwise. The summary prints the statistics of ``accel.spd.GenerationStats`` in the forms
``accel predict`` takes (tokens and drafts per loop, acceptance by sibling rank, lookup fractions).
"""

from __future__ import annotations

import math
import sys
from collections import Counter

import numpy as np

__all__ = ["StreamPrinter", "summary", "tuned_summary"]

_GREEN, _RESET = "\x1b[32m", "\x1b[0m"


class StreamPrinter:
    """Streams decoded text; draft-accepted tokens in green (TTY) or [brackets] (pipe)."""

    def __init__(self, tokenizer, out=None) -> None:
        self.tok, self.out = tokenizer, out if out is not None else sys.stdout
        self.color = self.out.isatty()
        self.ids: list[int] = []
        self.text = ""

    def _piece(self, token: int) -> str:
        if self.tok is None:
            return f" {token}"
        self.ids.append(token)
        text = self.tok.decode(self.ids)
        piece = text[len(self.text) :] if text.startswith(self.text) else text
        self.text = text
        return piece

    def __call__(self, row: int, tokens: list[int], from_draft: list[bool]) -> None:
        for t, d in zip(tokens, from_draft, strict=True):
            piece = self._piece(int(t))
            if d:
                piece = f"{_GREEN}{piece}{_RESET}" if self.color else f"[{piece}]"
            self.out.write(piece)
        self.out.flush()


def summary(stats, messages: list[str]) -> str:
    """The statistics of a ``GenerationResult`` (``stats``, ``messages``) as the lines ``accel generate`` prints."""
    s = stats
    lines = [
        f"mode {s.mode}  k {s.k}  new tokens {s.new_tokens}  rounds {s.rounds}  "
        f"tokens/target call {s.tokens_per_target_call:.2f}",
        f"tokens/s {s.tokens_per_s:.1f} (decode {s.decode_tokens_per_s:.1f})  wall {s.wall_s:.3f} s = "
        f"draft {s.draft_s:.3f} + target {s.target_s:.3f} + host {s.host_s:.3f}  (prefill {s.prefill_s:.3f})",
    ]
    if s.mode == "spd":
        lines.insert(0, f"proposer {s.proposer}")
        per_pos = " ".join(f"{a:.2f}" for a in s.acceptance_per_position)
        lines.append(
            f"alpha {s.alpha_counts:.3f} (counts), {s.alpha_overlap:.3f} (sum min(p,q))  "
            f"accepted histogram {s.accepted_histogram}  per position [{per_pos}]  "
            f"calls: draft {s.draft_calls}, target {s.target_calls}"
        )
        lines.append(
            f"loops: {s.mean_tokens_per_loop:.3f} tokens and {s.mean_drafts_per_loop:.3f} drafts per loop, "
            f"{s.all_accepted_rounds}/{s.row_calls} all accepted (accel predict --tokens-per-loop / "
            "--drafts-per-loop take these)"
        )
        if s.tree_rounds:
            ranks = _rank_rates(s)
            lines.append(
                f"trees: {s.tree_rounds}/{s.row_calls} rounds branched; {s.mean_drafts_per_loop:.2f} nodes and "
                f"{s.mean_target_call_tokens:.2f} target tokens per call; {s.draft_calls_per_loop:.2f} draft calls "
                f"of {s.mean_draft_tokens_per_call:.2f} tokens per loop; acceptance by sibling rank "
                f"[{' '.join(f'{a:.2f}' for a in ranks)}]"
            )
            lines.append(
                f"(the tree round's shape for accel.sim: nodes {round(s.mean_drafts_per_loop)}, acceptance by rank "
                f"{','.join(f'{a:.3f}' for a in ranks)}, draft calls per loop {s.draft_calls_per_loop:.3f}, "
                f"draft tokens per call {s.mean_draft_tokens_per_call:.3f})"
            )
        if s.lookup_rounds:
            lines.append(
                f"n-gram lookup: {s.lookup_rounds}/{s.row_calls} loops drafted by lookup, "
                f"{s.lookup_accepted} of their drafts accepted; {s.draft_calls_per_loop:.3f} draft calls per "
                f"loop (accel predict --draft-calls-per-loop {s.draft_calls_per_loop:.3f} --lookup-fraction "
                f"{s.lookup_rounds / s.row_calls:.3f})"
            )
        if s.tuned_rounds:
            lines.append(tuned_summary(s.tuned_rounds))
    lines += [f"note: {m}" for m in messages]
    return "\n".join(lines)


def tuned_summary(rounds) -> str:
    """One line on a controller's rounds (``GenerationStats.tuned_rounds``): the shapes it chose, most frequent first
    (``shape: nodes x rounds``), and its predicted against observed tokens per call and call milliseconds over the
    rounds it predicted."""
    chosen = Counter("no speculation" if r.nodes == 0 else f"{r.shape or 'proposer'} {r.nodes} nodes" for r in rounds)
    shapes = ", ".join(f"{name} x{n}" for name, n in chosen.most_common(4))
    more = f", {len(chosen) - 4} more" if len(chosen) > 4 else ""
    told = [r for r in rounds if math.isfinite(r.predicted_tokens_per_call) and math.isfinite(r.predicted_call_s)]
    line = f"autotune rounds ({len(rounds)}): {shapes}{more}"
    if told:
        pt, ot = np.mean([r.predicted_tokens_per_call for r in told]), np.mean([r.tokens_per_call for r in told])
        pc, oc = np.mean([r.predicted_call_s for r in told]), np.mean([r.call_s for r in told])
        line += f"; tokens/call predicted {pt:.2f}, observed {ot:.2f}; call ms predicted {1e3 * pc:.1f}, "
        line += f"observed {1e3 * oc:.1f}"
    return line


def _rank_rates(stats) -> list[float]:
    """Per sibling rank, pooled over depths: the probability that the rank-r candidate is the target's token at a
    reached node (``accel.sim``'s per-rank acceptance). The counts give the rate conditional on every earlier rank
    having missed (verification tries ranks in order); ``accel.sim.rank_acceptance_from_counts`` converts it."""
    from accel.sim import rank_acceptance_from_counts

    avail = np.asarray(stats.rank_available, dtype=float).sum(axis=0)
    acc = np.asarray(stats.rank_accepted, dtype=float).sum(axis=0)
    if avail.size == 0 or not avail.any():
        return []
    return [float(x) for x in rank_acceptance_from_counts([avail], [acc])[0]]
