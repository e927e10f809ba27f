"""``accel demo``: the subcommand (arguments -> ``run_demo``)."""

from __future__ import annotations

import argparse

from accel.apps.demo.pipeline import run_demo

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="MXFP6 compression + speculative decoding on onnxruntime + simulator predictions, end to end",
        description="accel demo: the whole story on one target/draft pair, in a few minutes on a CPU",
    )
    p.add_argument("--target", default=None, help="target checkpoint dir or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="draft checkpoint dir or .gguf (default: the shipped SmolLM2 draft)")
    p.add_argument(
        "--feature-draft",
        default=None,
        help="feature draft dir for extra runs (default: the shipped one with the default target; 'none' skips them)",
    )
    p.add_argument("--k", type=int, default=2, help="draft tokens per SpD round")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8, help="for sampled SpD")
    p.add_argument("--out", default="results/demo", help="results folder (ONNX cache, figures, demo.json)")
    p.add_argument("--threads", type=int, default=None, help="onnxruntime / torch threads (default: all cores)")
    p.add_argument("--quick", action="store_true", help="reduced run of the same path: one prompt, few tokens")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from accel.models.gguf_convert import checkpoint_dir

    run_demo(  # a .gguf target or draft is converted to a checkpoint directory once
        checkpoint_dir(args.target, say=print) if args.target else None,
        checkpoint_dir(args.draft, say=print) if args.draft else None,
        k=args.k,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        out_dir=args.out,
        threads=args.threads,
        quick=args.quick,
        feature_draft=args.feature_draft,
    )
    return 0
