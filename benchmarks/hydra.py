"""Hydra heads against the other drafts on onnxruntime, measured in one run on the same held-out prompts.

    flock /work/helpers/bench.lock python benchmarks/hydra.py --hydra DIR [--temperature 0.8]

Rows (batch 1, one prompt at a time, ``accel.drafts.HELD_OUT_PROMPTS``, --max-new tokens each): autoregressive; the
shipped standalone draft (chain of --k); the shipped feature draft (chain of --k, int8); the Hydra heads as a tree
(--nodes, --top-k, depth = heads) with int8 level graphs, the same with float32 level graphs (the int8 ablation)
and as their top-1 chain; ``--hydra-mlp DIR`` adds a tree row for heads without the prefix layer. Per row: tokens
per target call, draft ms per round, tokens/s and the speedup over AR's tokens/s in the same run; greedy rows are
checked token for token against AR.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED_DRAFT = REPO / "accel" / "demo_data" / "smollm2-draft"
SHIPPED_FEATURE = REPO / "accel" / "demo_data" / "smollm2-feature-draft"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hydra", required=True, metavar="DIR", help="Hydra heads directory (accel distill-hydra)")
    ap.add_argument("--hydra-mlp", default=None, metavar="DIR", help="heads without the prefix layer (a tree row)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--k", type=int, default=3, help="chain length of the draft models")
    ap.add_argument("--nodes", type=int, default=12, help="Hydra tree budget (nodes below the root)")
    ap.add_argument("--top-k", type=int, default=4, help="Hydra tree: children per expanded node")
    ap.add_argument("--temperature", type=float, default=None, help="sampled rows at this temperature (default greedy)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads of the target")
    ap.add_argument("--ctx-len", type=int, default=512)
    ap.add_argument("--json", default=None, help="write the rows here")
    return ap.parse_args()


def proposers(args: argparse.Namespace, cache: Path, target_dir: Path) -> dict:
    """name -> a function making a fresh proposer (or None for AR)."""
    from accel.backends import OrtBackend, export_cached
    from accel.drafts.hydra import HydraProposer, HydraRuntime, TreeShape
    from accel.drafts.hydra.export import export_hydra_cached
    from accel.spd import DraftChain

    draft = OrtBackend(export_cached(SHIPPED_DRAFT, cache, ctx_len=args.ctx_len), threads=1)
    feature = OrtBackend(
        export_cached(SHIPPED_FEATURE, cache, ctx_len=args.ctx_len, weights="int8"), threads=args.threads
    )

    def runtime(heads_dir: str, weights: str) -> HydraRuntime:
        path = export_hydra_cached(heads_dir, target_dir, cache, ctx_len=args.ctx_len, weights=weights)
        return HydraRuntime(path, threads=1)

    heads, heads_fp32 = runtime(args.hydra, "int8"), runtime(args.hydra, "fp32")
    depth = heads.num_heads
    tree = TreeShape(depth=depth, top_k=args.top_k, beam=args.top_k, budget=args.nodes)
    kind = "Hydra++" if heads.prefix else "Hydra"
    rows = {
        "autoregressive": lambda: None,
        f"standalone draft, chain k={args.k}": lambda: DraftChain(draft, k=args.k),
        f"feature draft, chain k={args.k}": lambda: DraftChain(feature, k=args.k),
    }
    if args.hydra_mlp:
        mlp = runtime(args.hydra_mlp, "int8")
        mlp_tree = TreeShape(depth=mlp.num_heads, top_k=args.top_k, beam=args.top_k, budget=args.nodes)
        rows[f"Hydra (MLP), tree {args.nodes} int8"] = lambda: HydraProposer(mlp, mlp_tree)
    rows[f"{kind}, tree {args.nodes} top-{args.top_k} int8"] = lambda: HydraProposer(heads, tree)
    rows[f"{kind}, tree {args.nodes} top-{args.top_k} fp32"] = lambda: HydraProposer(heads_fp32, tree)
    rows[f"{kind}, chain k={depth} int8"] = lambda: HydraProposer(heads, TreeShape.chain(depth))
    return rows


def main() -> int:
    args = parse_args()
    from accel.backends import OrtBackend, export_cached
    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.drafts.prompts import HELD_OUT_PROMPTS
    from accel.models import smollm2_checkpoint
    from accel.models.smollm2 import cache_root
    from accel.spd import GREEDY, Sampling, generate

    target_dir = Path(smollm2_checkpoint())
    cache = cache_root() / "onnx"
    path = export_cached(target_dir, cache, ctx_len=args.ctx_len, hidden_output=True, tree=True)
    target = OrtBackend(path, threads=args.threads)
    tok = load_text_tokenizer(target_dir)
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS]
    sampling = GREEDY if args.temperature is None else Sampling(temperature=args.temperature)
    eos = target_dir / "config.json"
    eos_id = json.loads(eos.read_text()).get("eos_token_id")
    rows, reference = [], None
    for name, make in proposers(args, cache, target_dir).items():
        tokens, calls, new, draft_s, rounds, wall = [], 0, 0, 0.0, 0, 0.0
        for i, prompt in enumerate(prompts):
            res = generate(
                target, make(), [prompt], max_new_tokens=args.max_new, sampling=sampling, seed=i, eos_token_id=eos_id
            )
            s = res.stats
            tokens.append(res.tokens[0])
            calls, new, rounds = calls + s.row_calls, new + s.new_tokens, rounds + s.rounds
            draft_s, wall = draft_s + s.draft_s, wall + s.wall_s - s.prefill_s
        if reference is None:
            reference = tokens
        row = {
            "proposer": name,
            "tokens_per_call": new / calls,
            "draft_ms_per_round": 1e3 * draft_s / max(rounds, 1),
            "tokens_per_s": new / wall,
            "equals_ar": tokens == reference if args.temperature is None else None,
        }
        row["speedup"] = row["tokens_per_s"] / rows[0]["tokens_per_s"] if rows else 1.0
        rows.append(row)
        print(
            f"{name:<40} {row['tokens_per_call']:5.2f} tok/call  {row['draft_ms_per_round']:6.2f} draft ms/round  "
            f"{row['tokens_per_s']:6.1f} tok/s  {row['speedup']:5.2f}x  == AR: {row['equals_ar']}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
