"""``accel distill-hydra`` and the Hydra part of ``accel eval-draft`` (a heads directory as the draft)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from accel.drafts.hydra.open import is_heads_dir

__all__ = ["eval_heads", "is_heads_dir", "register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``distill-hydra`` subcommand."""
    p = subparsers.add_parser(
        "distill-hydra",
        help="train Hydra draft heads for a target by teacher distillation",
        description="Train Hydra heads (sequentially dependent draft heads on the target's hidden states; Hydra++ "
        "with --prefix) on target-written data with the target's top-k distributions and hidden states.",
    )
    p.add_argument("target", help="target checkpoint directory (config.json + weights + tokenizer.json)")
    p.add_argument("-o", "--out", required=True, help="heads directory to write")
    p.add_argument("--heads", type=int, default=4, help="number of heads (tree depth)")
    p.add_argument("--mlp-layers", type=int, default=1, help="residual blocks per head (Hydra++: 4)")
    p.add_argument("--prefix", action="store_true", help="Hydra++: a prefix attention layer over the target's states")
    p.add_argument("--head-vocab", type=int, default=8192, help="LM head tokens (most predicted; 0 = all)")
    p.add_argument("--self-generate", type=int, default=64, metavar="N", help="continuations the target writes")
    p.add_argument("--data", nargs="*", default=[], metavar="FILE", help="UTF-8 text files scored by the target")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-rows", type=int, default=8, help="sequences per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--minutes", type=float, default=None, help="wall-clock cap on training")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.set_defaults(func=_distill_hydra)


def _distill_hydra(args: argparse.Namespace) -> int:
    from accel.drafts import DEFAULT_PROMPTS, DistillConfig
    from accel.drafts.hydra.config import HydraSpec, HydraTrainConfig
    from accel.drafts.hydra.pipeline import distill_hydra
    from accel.errors import DraftError

    try:
        spec = HydraSpec(
            num_heads=args.heads, mlp_layers=args.mlp_layers, prefix=args.prefix, head_vocab=args.head_vocab
        )
        data = DistillConfig(
            data_files=[Path(f) for f in args.data],
            prompts=list(DEFAULT_PROMPTS),
            self_generate=args.self_generate,
            gen_tokens=args.gen_tokens,
            gen_batch_size=32,
            seed=args.seed,
        )
        train = HydraTrainConfig(
            max_steps=args.steps,
            batch_rows=args.batch_rows,
            lr=args.lr,
            warmup_steps=min(50, max(1, args.steps // 10)),
            minutes=args.minutes,
            eval_every=max(1, min(200, args.steps // 5)),
            checkpoint_every=max(1, min(100, args.steps // 10)),
            seed=args.seed,
            threads=args.threads,
            resume=args.resume,
        )
    except ValueError as exc:
        raise DraftError(f"bad distill-hydra options: {exc}") from exc
    if not data.data_files and not data.self_generate:
        raise DraftError("no data: give --data FILES and/or --self-generate N")
    r = distill_hydra(args.target, args.out, spec, data, train)
    best = f"{r.best_score:.3f}" if r.best_score is not None else "n/a"
    print(
        f"heads written to {r.out_dir}: {r.num_parameters / 1e6:.2f} M parameters\n"
        f"  {r.steps} steps, {r.positions_seen} positions seen (data {r.data_time_s:.0f} s, training "
        f"{r.train_time_s:.0f} s, stopped by {r.stopped_by})\n  best held-out score {best} at step {r.best_step}"
    )
    return 0


def eval_heads(target_dir: str, heads_dir: str, texts: list[str], as_json: bool, max_len: int) -> int:
    """``accel eval-draft TARGET HEADS``: per-head acceptance and tokens per target call (chain and tree) on the
    texts (or, without texts, on the target's greedy continuations of the held-out prompts: exact for greedy SpD)."""
    import torch

    from accel.drafts.checkpoint import load_model, load_text_tokenizer
    from accel.drafts.feature import target_features
    from accel.drafts.hydra.evaluate import evaluate_heads, held_out_sequences
    from accel.drafts.hydra.model import load_hydra
    from accel.errors import DraftError

    target = load_model(target_dir, "target")
    heads = load_hydra(heads_dir, target)
    if texts:
        tok = load_text_tokenizer(target_dir)
        seqs = [torch.tensor(tok.encode(t).ids[:max_len]) for t in texts]
        if any(len(s) < 3 for s in seqs):
            raise DraftError("every text needs at least 3 tokens")
        plens = [2] * len(seqs)
        hidden = [target_features(target, s[None], dtype=torch.float32)[0] for s in seqs]
    else:
        seqs, plens, hidden = held_out_sequences(target, target_dir)
    ev = evaluate_heads(heads, seqs, plens, hidden)
    if as_json:
        print(json.dumps(ev.model_dump(), indent=2))
        return 0
    print(f"{ev.positions} rounds in {ev.sequences} sequences ({'texts' if texts else 'held-out prompts, greedy'})")
    print(f"head  top-1  top-{ev.top_k}  chain accepted  chain tokens/call")
    for i in range(len(ev.top1)):
        print(
            f"{i + 1:<4}  {ev.top1[i]:.3f}  {ev.topk_coverage[i]:.3f}  {ev.chain_accept_by_position[i]:>14.3f}  "
            f"{ev.chain_tokens_per_call[i]:>17.2f}"
        )
    print(f"tree {ev.tree}: {ev.tree_tokens_per_call:.2f} tokens per target call, {ev.tree_nodes:.1f} nodes")
    return 0
