"""``accel distill-hydra`` and the Hydra part of ``accel eval-draft`` (a heads directory as the draft)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel.drafts.hydra.tree import TreeShape

__all__ = ["eval_heads", "hydra_proposer", "hydra_tree_shape", "is_heads_dir", "register"]


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


def is_heads_dir(path: str | Path) -> bool:
    """Whether ``path`` is a Hydra heads directory (its config.json says so)."""
    from accel.drafts.hydra.config import KIND

    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and json.loads(cfg.read_text()).get("kind") == KIND
    except (ValueError, UnicodeDecodeError):
        return False


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


def hydra_tree_shape(args: argparse.Namespace) -> TreeShape:
    """The tree ``accel generate --hydra DIR`` grows (``hydra_proposer``), checked against the heads before anything
    is exported: ``--tree-depth`` beyond the heads or ``--tree-nodes`` beyond what they can grow at that depth and
    ``--tree-top-k`` is a ``DraftError`` naming the limit (never a silent clamp)."""
    from accel.backends.weights import WeightFormat
    from accel.drafts.hydra.tree import DECODE_BUDGET, KERNEL_DECODE_BUDGET, TreeShape
    from accel.errors import DraftError

    if not is_heads_dir(args.hydra):
        raise DraftError(f"{args.hydra} is not a Hydra heads directory (no config.json of kind accel-hydra-heads)")
    num_heads = int(json.loads((Path(args.hydra) / "config.json").read_text())["num_heads"])
    kernel = WeightFormat(getattr(args, "target_weights", "fp32")).is_kernel
    budget = args.tree_nodes or (KERNEL_DECODE_BUDGET if kernel else DECODE_BUDGET)
    shape = TreeShape.for_decoding(num_heads, budget, args.tree_top_k or 4)
    if args.tree_depth is not None:
        if args.tree_depth > num_heads:
            raise DraftError(
                f"--tree-depth {args.tree_depth} exceeds the {num_heads} Hydra heads in {args.hydra} (one head per "
                f"level): give --tree-depth 1..{num_heads}"
            )
        shape = TreeShape(depth=args.tree_depth, top_k=shape.top_k, beam=shape.beam, budget=shape.budget)
    grown = replace(shape, budget=sys.maxsize).max_nodes  # the nodes the heads can grow at this depth and top-k
    if args.tree_nodes is not None and args.tree_nodes > grown:
        raise DraftError(
            f"--tree-nodes {args.tree_nodes} exceeds the {grown} nodes a tree of depth {shape.depth} with "
            f"--tree-top-k {shape.top_k} can hold from these heads: give --tree-nodes 1..{grown}, or a larger "
            f"--tree-top-k or --tree-depth (at most {num_heads})"
        )
    return shape.with_thresholds(args.tree_min_prob or 0.0, args.tree_expand_prob)


def hydra_proposer(args: argparse.Namespace, target_dir: Path):
    """``accel generate --hydra DIR``: the heads exported for onnxruntime (cached under ``$ACCEL_CACHE/onnx``, per
    heads, target and settings; int8 unless ``--draft-weights fp32``) as a ``HydraProposer`` for batch 1
    (``--tree-nodes`` nodes, default ``DECODE_BUDGET`` = 4, or ``KERNEL_DECODE_BUDGET`` = 3 on a ``*-kernel``
    target, ``--tree-top-k`` children per node, depth ``--tree-depth`` or the number of heads, at most 4 by default;
    thresholds ``--tree-min-prob`` / ``--tree-expand-prob``; ``hydra_tree_shape``)."""
    from accel.drafts.hydra.export import export_hydra_cached
    from accel.drafts.hydra.proposer import HydraProposer
    from accel.drafts.hydra.runtime import HydraRuntime
    from accel.errors import DraftError
    from accel.models.smollm2 import cache_root

    shape = hydra_tree_shape(args)
    if not target_dir.is_dir():
        raise DraftError("--hydra needs the target as a checkpoint directory (the heads read its embeddings)")
    out = export_hydra_cached(
        args.hydra, target_dir, cache_root() / "onnx", ctx_len=args.ctx_len, weights=args.draft_weights or "int8"
    )
    runtime = HydraRuntime(out, threads=args.draft_threads or 1)
    return HydraProposer(runtime, shape)
