"""Host time of a greedy step: the loop's plain round against the general tree round, on the same target.

A round in which no row has a proposal (autoregressive decoding, a lookup that found no match, a controller round
without speculation) takes the loop's plain round (``_Loop._plain_round``, docs/spd.md "The loop"): each active
row feeds its last token and takes the target's next one, without building, laying out and walking root-only trees
(greedy here; sampled rounds take it too). This benchmark decodes the held-out prompts greedily with it (``plain``)
and with every round through the general tree round as before (``general``), interleaved prompt by prompt on one
target session, for each ``--targets`` weight mode (exported as ``accel.decode`` exports a target) and each proposer
(``ar``; ``lookup``: n-gram lookup n = 3, k = 4), and prints per cell the decode ms per token of each, their ratio
(general / plain, the median over prompts and passes, 10-90%), the target's ms per round (its calls, ``OrtBackend``'s
binding and output reads included), the host ms per round (``GenerationStats.host_s`` / rounds: everything else) and
whether every output was equal.

    python benchmarks/greedy_host.py                                   # fp32, gguf-kernel-q8; ~3 minutes
    python benchmarks/greedy_host.py --targets gguf-kernel-q8 --passes 4

Writes results/greedy_host.json. Timings on a shared machine are noisy: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from bench_support import cpu_model, json_out, save_results
from tqdm.auto import tqdm

import accel.spd.loop as spd_loop
from accel.backends import OrtBackend, export_cached
from accel.backends.cpu import cpu_flags
from accel.decode.spec import kernel_builds
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.models import load_tokenizer, smollm2_checkpoint
from accel.models.smollm2 import cache_root, smollm2_gguf_path
from accel.spd import GREEDY, NgramLookup, generate

ISA = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
MODES = ("plain", "general")


@contextlib.contextmanager
def general_rounds() -> Iterator[None]:
    """Every round through the loop's general tree round (root-only trees where nothing is proposed), as before
    ``_plain_round`` existed."""
    plain = spd_loop._Loop._plain_round
    spd_loop._Loop._plain_round = lambda self: self._tree_round(self._trees())  # type: ignore[method-assign]
    try:
        yield
    finally:
        spd_loop._Loop._plain_round = plain  # type: ignore[method-assign]


def open_target(weights: str, ctx_len: int, threads: int) -> OrtBackend:
    """The ``weights`` SmolLM2 target as ``accel.decode`` exports it for autoregressive decoding (cached)."""
    src = smollm2_gguf_path() if weights.startswith("gguf-kernel") else smollm2_checkpoint()
    path = export_cached(
        src, cache_root() / "onnx", ctx_len=ctx_len, weights=weights, logits_input=True, ort_ops=True,
        accel_attention=kernel_builds(),
    )  # fmt: skip
    return OrtBackend(Path(path), threads=threads, spin=True)


def run_cell(target: OrtBackend, proposer: str, prompts: list[list[int]], n: int, passes: int) -> dict:
    """Every prompt with both modes, alternating which goes first; per mode ms per token and host ms per round."""
    keys = ("ms_per_token", "target_ms_per_round", "host_ms_per_round")
    rows: dict[str, dict[str, list[float]]] = {m: {k: [] for k in keys} for m in MODES}
    equal = True
    for p in range(passes):
        for i, ids in enumerate(prompts):
            tokens = {}
            for mode in MODES if (p + i) % 2 == 0 else MODES[::-1]:
                prop = NgramLookup(3, 4) if proposer == "lookup" else None
                with general_rounds() if mode == "general" else contextlib.nullcontext():
                    res = generate(target, prop, [ids], max_new_tokens=n, eos_token_id=[], sampling=GREEDY)
                s = res.stats
                rows[mode]["ms_per_token"].append(1e3 * (s.wall_s - s.prefill_s) / s.new_tokens)
                rows[mode]["target_ms_per_round"].append(1e3 * (s.target_s - s.prefill_s) / s.rounds)
                rows[mode]["host_ms_per_round"].append(1e3 * s.host_s / s.rounds)
                tokens[mode] = res.tokens
            equal &= tokens["plain"] == tokens["general"]
    ratio = np.array(rows["general"]["ms_per_token"]) / np.array(rows["plain"]["ms_per_token"])
    return {
        **{m: {k: float(np.median(v)) for k, v in r.items()} for m, r in rows.items()},
        "ratio": float(np.median(ratio)),
        "ratio_10_90": [float(x) for x in np.percentile(ratio, [10, 90])],
        "equal": bool(equal),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--targets", default="fp32,gguf-kernel-q8", help="comma list of weight modes (default fp32,gguf-kernel-q8)"
    )
    ap.add_argument("--proposers", default="ar,lookup", help="comma list of ar, lookup (default both)")
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens per prompt (default 96)")
    ap.add_argument("--passes", type=int, default=2, help="passes over the prompts (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--ctx-len", type=int, default=512, help="KV cache length (default 512)")
    ap.add_argument("--out", type=json_out, default="results/greedy_host.json", help="JSON output path")
    args = ap.parse_args()
    proposers = [p for p in args.proposers.split(",") if p]
    if not set(proposers) <= {"ar", "lookup"} or not proposers:
        ap.error(f"--proposers takes ar and lookup; got {args.proposers!r}")
    if min(args.prompts, args.max_new_tokens, args.passes, args.threads) < 1:
        ap.error("--prompts, --max-new-tokens, --passes and --threads must be >= 1")
    tok = load_tokenizer(smollm2_checkpoint())
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    flags = " ".join(f for f in ISA if f in cpu_flags())
    print(f"CPU: {cpu_model()}; flags: {flags}; threads {args.threads} of {os.cpu_count()}")
    cells = {}
    for w in tqdm([t for t in args.targets.split(",") if t], desc="targets"):
        target = open_target(w, args.ctx_len, args.threads)
        for proposer in proposers:
            cells[f"{w} / {proposer}"] = run_cell(target, proposer, prompts, args.max_new_tokens, args.passes)
    print("| cell | ms/token plain | general | general / plain (10-90%) | target ms/round plain | general "
          "| host ms/round plain | general | equal |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name, c in cells.items():
        plain, general = c["plain"], c["general"]
        lo, hi = c["ratio_10_90"]
        print(
            f"| {name} | {plain['ms_per_token']:.2f} | {general['ms_per_token']:.2f} | {c['ratio']:.3f} "
            f"({lo:.2f}-{hi:.2f}) | {plain['target_ms_per_round']:.2f} | {general['target_ms_per_round']:.2f} | "
            f"{plain['host_ms_per_round']:.3f} | {general['host_ms_per_round']:.3f} | {'yes' if c['equal'] else 'NO'} |"
        )
    save_results(args.out, {"config": vars(args) | {"out": str(args.out)}, "cells": cells}, __file__)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
