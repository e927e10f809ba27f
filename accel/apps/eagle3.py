"""``accel distill-eagle3``: train an EAGLE-3 head for a target and write it in the speculators format."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``distill-eagle3`` subcommand."""
    p = subparsers.add_parser(
        "distill-eagle3",
        help="train an EAGLE-3 head for a target; write it in the speculators format (vLLM's eagle3)",
        description="Let the target continue the prompts greedily, then train an EAGLE-3 head (one decoder layer over "
        "the target's residual streams at three layers, the target's vocabulary) on its next-token distributions, "
        "teacher-forced with speculators' training-time test (--ttt-steps drafting steps a row). The output folder is "
        "a speculators 0.9.0 checkpoint: accel generate --eagle3 runs it, and so do the speculators package and "
        "vLLM's speculative_config method eagle3 (docs/serving.md).",
    )
    p.add_argument("target", help="target checkpoint directory (config.json + weights + tokenizer.json) or .gguf file")
    p.add_argument("-o", "--out", required=True, metavar="OUT_DIR", help="output directory (must not exist)")
    p.add_argument(
        "--layer-ids",
        default=None,
        metavar="A,B,C",
        help="target layers whose entering residual streams the head reads (default: 2, the middle, 3 before the end)",
    )
    p.add_argument("--prompts", default=None, metavar="FILE", help="one prompt per line (default: the built-in set)")
    p.add_argument("--chat", action="store_true", help="wrap --prompts lines in the ChatML chat template")
    p.add_argument("--gen-tokens", type=int, default=96, help="tokens the target adds to each prompt (default 96)")
    p.add_argument("--steps", type=int, default=300, help="optimiser steps (default 300)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--frozen-head", action="store_true", help="keep the target's LM head as it is (default: train it)")
    p.add_argument("--ttt-steps", type=int, default=3, help="drafting steps trained per row (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speculative-tokens", type=int, default=3, help="drafts per round the config proposes")
    p.set_defaults(func=_distill_eagle3)


def _layer_ids(text: str | None) -> tuple[int, ...] | None:
    from accel.errors import DraftError

    if text is None:
        return None
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise DraftError(f"--layer-ids takes comma-separated layer numbers, got {text!r}") from None


def _distill_eagle3(args: argparse.Namespace) -> int:
    import torch

    from accel.apps.drafts import _read_prompts
    from accel.drafts import DEFAULT_PROMPTS
    from accel.drafts.data import self_generate
    from accel.drafts.eagle3 import Eagle3TrainConfig, distill_eagle3
    from accel.errors import DraftError
    from accel.models import load_checkpoint
    from accel.models.gguf_convert import checkpoint_dir
    from accel.models.smollm2 import load_tokenizer
    from accel.serving.speculators_format import vllm_speculative_config
    from accel.serving.speculators_write import write_speculators

    out = Path(args.out)
    if out.exists():
        raise DraftError(f"{out} exists: give a new output directory")
    if args.gen_tokens < 1:
        raise DraftError(f"--gen-tokens must be >= 1, got {args.gen_tokens}")
    vllm_speculative_config(out, args.speculative_tokens)  # refuses a bad --speculative-tokens before any work
    cfg = Eagle3TrainConfig(layer_ids=_layer_ids(args.layer_ids), steps=args.steps, lr=args.lr, batch=args.batch,
                            seed=args.seed, train_head=not args.frozen_head, ttt_steps=args.ttt_steps)  # fmt: skip
    src = checkpoint_dir(args.target, say=print)
    target = load_checkpoint(src).eval()
    cfg.resolved_layers(target.config.num_layers)  # refuse bad options before the target generates
    tokenizer = load_tokenizer(src)
    prompts = _read_prompts(args.prompts, args.chat) if args.prompts else list(DEFAULT_PROMPTS)
    ids = [tokenizer.encode(p).ids for p in prompts]
    print(f"the target continues {len(ids)} prompts by {args.gen_tokens} tokens ...", flush=True)
    with torch.no_grad():
        data = self_generate(target, ids, [0.0] * len(ids), args.gen_tokens, 1, args.seed)
    lengths = (data.mask.sum(dim=1) + 1).clamp(max=data.tokens.shape[1]).tolist()
    sequences = [row[:n] for row, n in zip(data.tokens.tolist(), lengths, strict=True)]
    head, losses = distill_eagle3(target, sequences, cfg)
    write_speculators(head.speculators_tensors(), head.config, head.layer_ids, out, verifier=src.resolve(),
                      speculative_tokens=args.speculative_tokens)  # fmt: skip
    first, last = sum(losses[:10]) / len(losses[:10]), sum(losses[-10:]) / len(losses[-10:])
    print(
        f"EAGLE-3 head written to {out} (speculators format; target layers {list(head.layer_ids)})\n"
        f"  {len(losses)} steps on {sum(lengths)} tokens: loss {first:.3f} -> {last:.3f} nats\n"
        f"  vLLM: speculative_config = {vllm_speculative_config(out, args.speculative_tokens)}"
    )
    return 0
