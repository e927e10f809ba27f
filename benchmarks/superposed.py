"""Superposed Decoding against k nucleus samples on onnxruntime (docs/superposed.md, "Evaluation").

Target: SmolLM2-135M exported once with mixed inputs (``export_cached(mix_inputs=True)``), batch 1, one graph for
every method (without mix arguments it is the ordinary model). For each held-out prompt
(``accel.drafts.HELD_OUT_PROMPTS``, never in a store or in tuning): k nucleus generations (top-p 0.9, T = 1) of N
tokens, then k superposed drafts of N tokens for each setting: with the n-gram store at the tuned settings, with it
at the paper's settings, and without n-grams; each timed (prefill included), then every draft's perplexity under the
target. The store: ``--store FILE``, or built from target-written distill-data shards (``--data WORK``, the rows of
held-out prompts left out; ``benchmarks/superposed_support.py``). Goals (issue 19, k = 3): time <= 0.45x nucleus,
perplexity within 10% of nucleus.

    flock /work/helpers/bench.lock python benchmarks/superposed.py --data WORK --threads 2

Prints a table and writes results/superposed.json. Timings on a shared machine are noisy: quote the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from bench_support import json_out, save_results
from superposed_support import completions, row, shard_store

from accel.backends import OrtBackend, export_cached
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.models.smollm2 import cache_root, load_tokenizer, smollm2_checkpoint
from accel.superposed import NgramStore, SuperposedConfig, superposed_generate
from accel.superposed.evaluate import Completions, nucleus_samples
from accel.superposed.scoring import TUNED


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=len(HELD_OUT_PROMPTS), help="first N held-out prompts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-len", type=int, default=256)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", type=Path, help="n-gram store file")
    src.add_argument("--data", type=Path, help="target-written shards: WORK/data/*.safetensors, WORK/prompts.json")
    ap.add_argument("--out", type=json_out, default="results/superposed.json")
    args = ap.parse_args()

    ckpt = smollm2_checkpoint()
    tok = load_tokenizer(ckpt)
    if args.data is not None:
        store, desc = shard_store(args.data, tok, tok.get_vocab_size(), [], cache_root() / "ngrams")
    else:
        store = NgramStore.load(args.store)
        desc = "; ".join(store.meta.get("sources", [str(args.store)]))
    print(f"store: {store.positions} tokens ({desc})", flush=True)
    backend = OrtBackend(
        export_cached(ckpt, cache_root() / "onnx", ctx_len=args.ctx_len, mix_inputs=True), threads=args.threads
    )
    k = args.k
    settings = {
        f"superposed k={k}, n-grams, tuned": (dataclasses.replace(TUNED, k=k), store),
        f"superposed k={k}, n-grams, paper's settings": (SuperposedConfig(k=k), store),
        f"superposed k={k}, no n-grams": (SuperposedConfig(k=k), None),
    }
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    superposed_generate(backend, prompts[:1], 4, SuperposedConfig(k=k), store)  # warm-up
    results: dict[str, list[Completions]] = {name: [] for name in [*settings, f"{k} x nucleus p=0.9"]}
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        drafts, wall, calls = nucleus_samples(backend, p, k, args.max_new_tokens, seed=i)
        results[f"{k} x nucleus p=0.9"].append(completions("nucleus", backend, p, drafts, wall, calls))
        for name, (cfg, s) in settings.items():
            t1 = time.perf_counter()
            res = superposed_generate(backend, [p], args.max_new_tokens, cfg, s)
            wall = time.perf_counter() - t1
            drafts = [d.tokens for d in res.drafts[0]]
            results[name].append(completions(name, backend, p, drafts, wall, res.calls + res.prefill_calls))
        line = ", ".join(f"{r[-1].mean_perplexity:.2f}" for r in results.values())
        print(f"prompt {i}: mean perplexities {line} ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = [row(name, ms) for name, ms in results.items()]
    base = rows[-1]
    print(f"\n{len(prompts)} held-out prompts x {args.max_new_tokens} new tokens, k = {k}, {args.threads} threads")
    print(f"store: {desc}\n")
    print(
        "| method | wall s | calls | x nucleus time | per-token ppl | x nucleus | mean of draft ppl | x nucleus "
        "| best-of-k ppl | distinct-2 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['wall_s']:.2f} | {r['calls']} | {r['wall_s'] / base['wall_s']:.2f}x | "
            f"{r['token_perplexity']:.2f} | {r['token_perplexity'] / base['token_perplexity']:.2f}x | "
            f"{r['perplexity']:.2f} | {r['perplexity'] / base['perplexity']:.2f}x | {r['best_perplexity']:.2f} | "
            f"{r['distinct_2']:.2f} |"
        )
    for name, ms in results.items():
        for d in ms[0].drafts:
            print(f"  {name}: {tok.decode(d)!r}")
    meta = {"wall_s": time.perf_counter() - t0, **vars(args), "store": desc}
    save_results(args.out, {"rows": rows, "meta": {k: str(v) for k, v in meta.items()}}, __file__)


if __name__ == "__main__":
    main()
