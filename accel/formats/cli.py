"""``accel compress SRC_DIR -o OUT_DIR --fmt mxfp6``: stream-compress a Hugging Face safetensors checkpoint."""

from __future__ import annotations

import argparse

from accel.formats.constants import DEFAULT_BLOCK_SIZE
from accel.formats.elements import known_format_names


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compress`` subcommand."""
    p = subparsers.add_parser(
        "compress", help="compress a safetensors checkpoint directory to an MX format", description=__doc__
    )
    p.add_argument(
        "src_dir", metavar="SRC_DIR", help="checkpoint directory (config.json + *.safetensors) or .gguf file"
    )
    p.add_argument("-o", "--out", dest="out_dir", required=True, metavar="OUT_DIR", help="output directory")
    p.add_argument("--fmt", default="mxfp6", help=f"element format, one of {', '.join(known_format_names())}")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="elements per shared scale")
    p.add_argument("--include", action="append", default=None, metavar="GLOB", help="tensor names to compress")
    p.add_argument(
        "--exclude",
        action="append",
        default=None,
        metavar="GLOB",
        help="tensor names to keep (default: embeddings, lm_head, norms)",
    )
    p.add_argument("--overwrite", action="store_true", help="allow a non-empty OUT_DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``compress``; returns the exit code (errors surface as FormatError, printed by accel.cli)."""
    from accel.formats.stream import compress_checkpoint
    from accel.models.gguf_convert import checkpoint_dir

    report = compress_checkpoint(
        checkpoint_dir(args.src_dir, say=print),  # a .gguf is converted to a float32 directory once
        args.out_dir,
        fmt=args.fmt,
        include=args.include,
        exclude=args.exclude,
        block_size=args.block_size,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    print(report.summary())
    print(f"wrote {args.out_dir}")
    return 0
