"""Superposed Decoding against k nucleus samples on onnxruntime (docs/superposed.md, "Evaluation").

Target: SmolLM2-135M exported once with mixed inputs (``export_cached(mix_inputs=True)``), batch 1, one graph for
both methods (without mix arguments it is the ordinary model). For each held-out prompt
(``accel.drafts.HELD_OUT_PROMPTS``): k superposed drafts of N tokens, then k separate nucleus generations (top-p 0.9,
T = 1) of the same N tokens, timed back to back (prefill included); then every draft's perplexity under the target.
Superposed runs with the n-gram store (built once from the stdlib's source and the target's own writing, cached) and
without one (alpha unused). Goals (issue 19, k = 3): time <= 0.45x nucleus, perplexity within 10% of nucleus.

    flock /work/helpers/bench.lock python benchmarks/superposed.py --threads 2

Prints a table and writes results/superposed.json. Timings on a shared machine are noisy: quote the ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from accel.backends import OrtBackend, export_cached
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.models.smollm2 import cache_root, load_tokenizer, smollm2_checkpoint
from accel.superposed import NgramStore, SuperposedConfig, build_store, superposed_generate
from accel.superposed.corpus import self_written_texts, stdlib_files, tokenize_texts, tokenizer_fingerprint
from accel.superposed.evaluate import Comparison, compare


def _store(path: Path | None, ckpt: Path, tok, rows: int) -> NgramStore:
    """The given store, or one built once from the stdlib (20 MB) and ``rows`` texts the target writes."""
    if path is not None:
        return NgramStore.load(path)
    path = cache_root() / "ngrams" / f"smollm2-stdlib-self{rows}.ngrams"
    if not path.is_file():
        texts, src1 = stdlib_files(20_000_000)
        own, src2 = self_written_texts(ckpt, tok, rows, cache_dir=cache_root() / "texts")
        meta = {"sources": [src1, src2], "tokenizer": tokenizer_fingerprint(tok)}
        build_store(tokenize_texts(own + texts, tok), tok.get_vocab_size(), path, meta=meta)
    return NgramStore.load(path)


def _row(name: str, runs: list[Comparison], side: str) -> dict:
    ms = [getattr(c, side) for c in runs]
    return {
        "method": name,
        "wall_s": float(sum(m.wall_s for m in ms)),
        "calls": int(sum(m.calls for m in ms)),
        "perplexity": float(np.mean([m.mean_perplexity for m in ms])),
        "best_perplexity": float(np.mean([m.best_perplexity for m in ms])),
        "distinct_2": float(np.mean([m.distinct_2 for m in ms])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=len(HELD_OUT_PROMPTS), help="first N held-out prompts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--store", type=Path, default=None, help="n-gram store (default: built once and cached)")
    ap.add_argument("--self-written", type=int, default=32, help="target texts in the default store")
    ap.add_argument("--out", type=Path, default=Path("results/superposed.json"))
    args = ap.parse_args()

    ckpt = smollm2_checkpoint()
    tok = load_tokenizer(ckpt)
    store = _store(args.store, ckpt, tok, args.self_written)
    backend = OrtBackend(
        export_cached(ckpt, cache_root() / "onnx", ctx_len=args.ctx_len, mix_inputs=True), threads=args.threads
    )
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    superposed_generate(backend, prompts[:1], 4, SuperposedConfig(k=args.k), store)  # warm-up
    results: dict[str, list[Comparison]] = {"with n-grams": [], "no n-grams": []}
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        for name, s in (("with n-grams", store), ("no n-grams", None)):
            results[name].append(compare(backend, p, args.max_new_tokens, SuperposedConfig(k=args.k), s, seed=i))
        c = results["with n-grams"][-1]
        print(f"prompt {i}: time ratio {c.time_ratio:.2f}x, perplexity ratio {c.perplexity_ratio:.2f}", flush=True)
    rows = [_row(f"superposed k={args.k}, {n}", r, "superposed") for n, r in results.items()]
    rows.append(_row(f"{args.k} x nucleus p=0.9", results["with n-grams"], "nucleus"))
    base = rows[-1]
    print(f"\n{len(prompts)} prompts x {args.max_new_tokens} new tokens, k = {args.k}, {args.threads} threads\n")
    print("| method | wall s | calls | x nucleus time | mean perplexity | x nucleus ppl | best-of-k ppl | distinct-2 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['wall_s']:.2f} | {r['calls']} | {r['wall_s'] / base['wall_s']:.2f}x | "
            f"{r['perplexity']:.2f} | {r['perplexity'] / base['perplexity']:.2f}x | {r['best_perplexity']:.2f} | "
            f"{r['distinct_2']:.2f} |"
        )
    example = results["with n-grams"][0]
    for side in ("superposed", "nucleus"):
        for d in getattr(example, side).drafts:
            print(f"  {side}: {tok.decode(d)!r}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.processor() or platform.machine(), "wall_s": time.perf_counter() - t0, **vars(args)}
    args.out.write_text(json.dumps({"rows": rows, "meta": {k: str(v) for k, v in meta.items()}}, indent=2))


if __name__ == "__main__":
    main()
