"""Tuning Superposed Decoding's n-gram settings on training prompts (docs/superposed.md, "Tuning").

The store: target-written distill-data shards (``--data WORK``: ``WORK/data/*.safetensors`` and
``WORK/prompts.json``, as ``examples/build_hydra_heads.py --data-only`` writes them) without the rows of the tuning
prompts and of the held-out prompts, so no draft can copy its own prompt's continuation. The tuning prompts: built-in
training prompts (``accel.drafts.DEFAULT_PROMPTS``) that the shards were written from, never the evaluation prompts
(``accel.drafts.HELD_OUT_PROMPTS``). For each prompt: k nucleus samples (top-p 0.9, T = 1) once, then k superposed
drafts for every setting of the grid (alpha x no-match log-probability x renormalised weights, and no n-grams), all
of the same length; perplexity of every draft under the target. Not a speed benchmark: one thread, ``nice``.

    nice -n 5 timeout 1800 python benchmarks/superposed_tune.py --data WORK --threads 1 > tune.log

Prints one line per prompt (progress), then a table, and writes results/superposed_tune.json.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from bench_support import json_out, save_results
from superposed_support import completions, row, shard_store, tuning_prompts

from accel.backends import OrtBackend, export_cached
from accel.models.smollm2 import cache_root, load_tokenizer, smollm2_checkpoint
from accel.superposed import SuperposedConfig, superposed_generate
from accel.superposed.evaluate import Completions, nucleus_samples


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="folder with data/*.safetensors and prompts.json")
    ap.add_argument("--prompts", type=int, default=8, help="tuning prompts")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--alphas", type=_floats, default=[0.54, 0.3, 0.15, 0.05])
    ap.add_argument("--no-match", type=_floats, default=[-100.0, -10.0], help="no_match_logprob values, nats")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--out", type=json_out, default="results/superposed_tune.json")
    args = ap.parse_args()

    ckpt = smollm2_checkpoint()
    tok = load_tokenizer(ckpt)
    texts = tuning_prompts(args.data, args.prompts)
    store, desc = shard_store(args.data, tok, tok.get_vocab_size(), texts, cache_root() / "ngrams")
    print(f"store: {store.positions} tokens ({desc})", flush=True)
    backend = OrtBackend(
        export_cached(ckpt, cache_root() / "onnx", ctx_len=args.ctx_len, mix_inputs=True), threads=args.threads
    )
    grid: dict[str, SuperposedConfig | None] = {"nucleus": None}
    grid["no n-grams"] = SuperposedConfig(k=args.k)
    for a, nm, rn in itertools.product(args.alphas, args.no_match, (False, True)):
        cfg = SuperposedConfig(k=args.k, alpha=a, no_match_logprob=nm, renormalize=rn)
        grid[f"alpha {a:g}, no-match {nm:g}, {'renormalised' if rn else 'paper weights'}"] = cfg
    results: dict[str, list[Completions]] = {name: [] for name in grid}
    t0 = time.perf_counter()
    for i, text in enumerate(texts):
        prompt = tok.encode(text).ids
        for name, cfg in grid.items():
            if cfg is None:
                drafts, _, _ = nucleus_samples(backend, prompt, args.k, args.max_new_tokens, seed=i)
            else:
                s = store if name != "no n-grams" else None
                res = superposed_generate(backend, [prompt], args.max_new_tokens, cfg, s)
                drafts = [d.tokens for d in res.drafts[0]]
            results[name].append(completions(name, backend, prompt, drafts, 0.0, 0))
        line = ", ".join(f"{n.split(',')[0]}={results[n][-1].token_perplexity:.2f}" for n in list(grid)[:3])
        print(f"prompt {i + 1}/{len(texts)} ({time.perf_counter() - t0:.0f} s): per-token ppl {line} ...", flush=True)
    rows = [row(name, ms) for name, ms in results.items()]
    base = rows[0]
    print(f"\n{len(texts)} training prompts x {args.max_new_tokens} new tokens, k = {args.k}; store: {desc}\n")
    print("| setting | per-token ppl | x nucleus | mean of draft ppl | x nucleus | best-of-k ppl | distinct-2 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['token_perplexity']:.2f} | {r['token_perplexity'] / base['token_perplexity']:.2f}x"
            f" | {r['perplexity']:.2f} | {r['perplexity'] / base['perplexity']:.2f}x | {r['best_perplexity']:.2f} | "
            f"{r['distinct_2']:.2f} |"
        )
    per_prompt = {n: [c.token_perplexity for c in ms] for n, ms in results.items()}
    meta = {"prompts": texts, "store": desc, "per_prompt": per_prompt, **{k: str(v) for k, v in vars(args).items()}}
    save_results(args.out, {"rows": rows, "meta": meta}, __file__)


if __name__ == "__main__":
    main()
