"""Superposed drafts as an exact proposer (``accel.superposed.SuperposedProposer``) against the chain and tree drafts,
on onnxruntime, in one run (docs/superposed.md, "As a proposer").

Every row is a ``DecodeSpec`` (``superposed``: the ``SuperposedSpec`` kind) built on one target session
(``accel.decode.Opener``). Target: SmolLM2-135M (float32 ONNX with tree inputs and hidden states, batch 1). Proposers,
each on the held-out prompts (``accel.drafts.HELD_OUT_PROMPTS``), greedy, interleaved prompt by prompt: AR; the
shipped feature draft
(``accel/demo_data/smollm2-feature-draft``) as a chain (K = 2) and as a tree (8 nodes); the shipped standalone draft
(``smollm2-draft``) as a chain (K = 3) and as superposed drafts (k = 3 branches of depth 3, exported with mixed
inputs). Reports tokens per target call and tokens/s (end to end, prefill included); every greedy run is checked
against AR token for token.

    flock /work/helpers/bench.lock python benchmarks/superposed_spd.py --threads 2

Prints a table and writes results/superposed_spd.json. Timings on a shared machine are noisy: quote ratios.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from bench_support import json_out, save_results
from superposed_support import shard_store_file

from accel.decode import (
    ARSpec,
    ChainSpec,
    DecodeSpec,
    ProposerSpec,
    SamplingSpec,
    SuperposedSpec,
    TargetSpec,
    TreeSpec,
    build,
)
from accel.decode.opening import GraphNeeds, Opener
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.models import load_tokenizer, smollm2_checkpoint
from accel.models.smollm2 import cache_root

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
    t = args.threads
    store = args.store
    if args.data is not None:
        store = shard_store_file(args.data, tok, tok.get_vocab_size(), [], cache_root() / "ngrams")
    if store is not None:
        print(f"store: {store}", flush=True)
    draft, feat = DEMO_DATA / "smollm2-draft", DEMO_DATA / "smollm2-feature-draft"
    superposed = partial(SuperposedSpec, draft=draft, k=args.k, depth=args.depth, temperature=1.0)
    rows: dict[str, ProposerSpec] = {
        "AR": ARSpec(),
        "feature draft, chain K=2": ChainSpec(draft=feat, k=2, threads=t),  # int8: build's default for it
        "feature draft, tree 8 nodes": TreeSpec(draft=feat, nodes=8, threads=t),
        "standalone draft, chain K=3": ChainSpec(draft=draft, k=3),
        f"standalone draft, superposed k={args.k} depth={args.depth}": superposed(),
    }
    if store is not None:  # the tuned interpolation with the store's n-grams (SuperposedSpec.store)
        rows[f"standalone draft, superposed k={args.k} depth={args.depth}, n-grams"] = superposed(store=store)
    target = TargetSpec(path=ckpt, ctx_len=args.ctx_len, threads=t)
    opener = Opener(GraphNeeds(hidden_output=True, tree=True), target_spin=False)  # one target session for all
    setups = {
        name: build(
            DecodeSpec(
                target=target,
                proposer=p,
                sampling=SamplingSpec(greedy=True),
                max_new_tokens=args.max_new_tokens,
                autotune=False,
            ),
            tok,
            opener,
        )
        for name, p in rows.items()
    }
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    stats: dict[str, list] = {name: [] for name in setups}
    exact: dict[str, int] = {name: 0 for name in setups}
    setups["AR"].generate([prompts[0][:4]])  # warm-up
    for i, p in enumerate(prompts):
        ref = None
        for name, setup in setups.items():
            res = setup.generate([p])
            ref = res.tokens if ref is None else ref
            exact[name] += res.tokens == ref
            stats[name].append(res.stats)
        print(f"prompt {i} done", flush=True)
    table = []
    for name, ss in stats.items():
        new, calls, wall = (sum(getattr(s, f) for s in ss) for f in ("new_tokens", "target_calls", "wall_s"))
        table.append(
            {
                "proposer": name,
                "tokens_per_target_call": new / calls,
                "tokens_per_s": new / wall,
                "exact_rows": exact[name],
                "rows": len(ss),
            }
        )
    base = table[0]["tokens_per_s"]
    print(f"\n{len(prompts)} prompts x {args.max_new_tokens} new tokens, greedy, {t} threads\n")
    print("| proposer | tokens / target call | tok/s | x AR | = AR rows |")
    print("|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['proposer']} | {r['tokens_per_target_call']:.2f} | {r['tokens_per_s']:.1f} | "
            f"{r['tokens_per_s'] / base:.2f}x | {r['exact_rows']}/{r['rows']} |"
        )
    save_results(args.out, {"rows": table, "args": {k: str(v) for k, v in vars(args).items()}}, __file__)


if __name__ == "__main__":
    main()
