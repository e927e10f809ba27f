"""Superposed drafts as an exact proposer (``accel.superposed.SuperposedProposer``) against the chain and tree drafts,
on onnxruntime, in one run (docs/superposed.md, "As a proposer").

Target: SmolLM2-135M (float32 ONNX with tree inputs and hidden states, batch 1). Proposers, each on the held-out
prompts (``accel.drafts.HELD_OUT_PROMPTS``), greedy, interleaved prompt by prompt: AR; the shipped feature draft
(``accel/demo_data/smollm2-feature-draft``) as a chain (K = 2) and as a tree (8 nodes); the shipped standalone draft
(``smollm2-draft``) as a chain (K = 3) and as superposed drafts (k = 3 branches of depth 3, exported with mixed
inputs). Reports tokens per target call and tokens/s (end to end, prefill included); every greedy run is checked
against AR token for token.

    flock /work/helpers/bench.lock python benchmarks/superposed_spd.py --threads 2

Prints a table and writes results/superposed_spd.json. Timings on a shared machine are noisy: quote ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path

from bench_support import json_out, save_results
from superposed_support import shard_store

from accel.backends import OrtBackend, export_onnx
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.models import load_checkpoint, load_tokenizer, smollm2_checkpoint
from accel.models.smollm2 import cache_root
from accel.spd import DraftChain, DraftTree, Sampling, generate, generate_ar
from accel.superposed import NgramStore, SuperposedConfig
from accel.superposed.proposer import SuperposedProposer
from accel.superposed.scoring import TUNED

DEMO_DATA = Path(__file__).resolve().parents[1] / "accel" / "demo_data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=len(HELD_OUT_PROMPTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--k", type=int, default=3, help="superposed branches")
    ap.add_argument("--depth", type=int, default=3, help="superposed depth (tokens per branch)")
    ap.add_argument("--store", type=Path, default=None, help="n-gram store for the superposed drafts' scores")
    ap.add_argument("--data", type=Path, default=None, help="or build it from target-written shards in WORK/data")
    ap.add_argument("--out", type=json_out, default="results/superposed_spd.json")
    args = ap.parse_args()

    ckpt = smollm2_checkpoint()
    tok = load_tokenizer(ckpt)
    tmp = Path(tempfile.mkdtemp(prefix="accel-superposed-spd-"))
    t = args.threads
    target = OrtBackend(
        export_onnx(
            load_checkpoint(ckpt), tmp / "t.onnx", ctx_len=args.ctx_len, hidden_output=True, tree=True, progress=False
        ),
        threads=t,
    )
    draft_model = load_checkpoint(DEMO_DATA / "smollm2-draft")
    draft = OrtBackend(export_onnx(draft_model, tmp / "d.onnx", ctx_len=args.ctx_len, progress=False), threads=1)
    mixed = OrtBackend(
        export_onnx(draft_model, tmp / "dm.onnx", ctx_len=args.ctx_len, progress=False, mix_inputs=True), threads=1
    )
    feat = OrtBackend(
        export_onnx(
            load_checkpoint(DEMO_DATA / "smollm2-feature-draft"),
            tmp / "f.onnx",
            ctx_len=args.ctx_len,
            weights="int8",
            progress=False,
            tree=True,
        ),
        threads=t,
    )
    cfg = SuperposedConfig(k=args.k, temperature=1.0)
    ngram_cfg = dataclasses.replace(TUNED, k=args.k, temperature=1.0)
    store = NgramStore.load(args.store) if args.store else None
    if args.data is not None:
        store, desc = shard_store(args.data, tok, tok.get_vocab_size(), [], cache_root() / "ngrams")
        print(f"store: {store.positions} tokens ({desc})", flush=True)
    proposers = {
        "AR": lambda: None,
        "feature draft, chain K=2": lambda: DraftChain(feat, k=2),
        "feature draft, tree 8 nodes": lambda: DraftTree(feat, nodes=8),
        "standalone draft, chain K=3": lambda: DraftChain(draft, k=3),
        f"standalone draft, superposed k={args.k} depth={args.depth}": lambda: SuperposedProposer(
            mixed, args.depth, cfg
        ),
    }
    if store is not None:
        proposers[f"standalone draft, superposed k={args.k} depth={args.depth}, n-grams"] = lambda: SuperposedProposer(
            mixed, args.depth, ngram_cfg, store
        )
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    greedy = Sampling(greedy=True)
    stats: dict[str, list] = {name: [] for name in proposers}
    exact: dict[str, int] = {name: 0 for name in proposers}
    generate_ar(target, prompts[:1], max_new_tokens=4, sampling=greedy)  # warm-up
    for i, p in enumerate(prompts):
        ref = None
        for name, make in proposers.items():
            res = generate(target, make(), [p], max_new_tokens=args.max_new_tokens, sampling=greedy)
            ref = res.tokens if ref is None else ref
            exact[name] += res.tokens == ref
            stats[name].append(res.stats)
        print(f"prompt {i} done", flush=True)
    rows = []
    for name, ss in stats.items():
        new, calls, wall = (sum(getattr(s, f) for s in ss) for f in ("new_tokens", "target_calls", "wall_s"))
        rows.append(
            {
                "proposer": name,
                "tokens_per_target_call": new / calls,
                "tokens_per_s": new / wall,
                "exact_rows": exact[name],
                "rows": len(ss),
            }
        )
    base = rows[0]["tokens_per_s"]
    print(f"\n{len(prompts)} prompts x {args.max_new_tokens} new tokens, greedy, {t} threads\n")
    print("| proposer | tokens / target call | tok/s | x AR | = AR rows |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['proposer']} | {r['tokens_per_target_call']:.2f} | {r['tokens_per_s']:.1f} | "
            f"{r['tokens_per_s'] / base:.2f}x | {r['exact_rows']}/{r['rows']} |"
        )
    save_results(args.out, {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}}, __file__)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
