"""``accel compress SRC_DIR -o OUT_DIR --fmt mxfp6``: stream-compress a Hugging Face safetensors checkpoint.

OUT_DIR appears only once complete. An interrupted run (Ctrl-C, SIGTERM, or killed) leaves OUT_DIR.accel-partial:
``--resume`` finishes it, ``--overwrite`` starts over. Weights holding NaN/Inf are an error unless
``--nonfinite keep`` (then they decode to NaN, with a warning and their count in the summary).

``--to quark`` / ``--to compressed-tensors`` writes the checkpoint in a serving engine's MX layout instead
(``accel.serving.export_mx_checkpoint``: AMD Quark's OCP-MX layout, MXFP4 / MXFP6; compressed-tensors, MXFP4 / MXFP6
E2M3 / MXFP8; blocks of 32 along the input features, the layouts' only geometry; vLLM loads both; docs/serving.md).
The options of accel's own layout (``--block-size``, ``--include``, ``--exclude``, ``--nonfinite keep``,
``--resume``) are refused there rather than ignored.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from accel.formats.constants import DEFAULT_BLOCK_SIZE
from accel.formats.elements import known_format_names
from accel.formats.report import NONFINITE_POLICIES

SERVING_LAYOUTS = ("quark", "compressed-tensors")  # accel.serving.LAYOUTS (not imported: formats is below serving)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compress`` subcommand."""
    p = subparsers.add_parser(
        "compress",
        help="compress a safetensors checkpoint directory to an MX format",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    p.add_argument(
        "--nonfinite",
        choices=NONFINITE_POLICIES,
        default="error",
        help="weights holding NaN/Inf: error (default), or keep them as NaN blocks with a warning",
    )
    p.add_argument(
        "--to",
        choices=("accel", *SERVING_LAYOUTS),
        default="accel",
        help="output layout: accel's own (default), or AMD Quark's / compressed-tensors' MX checkpoint that vLLM loads",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR checkpoint (or partial run)")
    p.add_argument("--resume", action="store_true", help="finish an interrupted run (OUT_DIR.accel-partial)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _to_serving(args: argparse.Namespace) -> int:
    """``--to quark|compressed-tensors``: the serving layout (module docstring); accel-layout options refused."""
    from accel.errors import FormatError
    from accel.models.gguf_convert import checkpoint_dir
    from accel.serving import export_mx_checkpoint

    given = [
        flag
        for flag, value, default in (
            ("--block-size", args.block_size, DEFAULT_BLOCK_SIZE),
            ("--include", args.include, None),
            ("--exclude", args.exclude, None),
            ("--nonfinite", args.nonfinite, "error"),
            ("--resume", args.resume, False),
        )
        if value != default
    ]
    if given:
        raise FormatError(
            f"{', '.join(given)} would be ignored by --to {args.to}: that layout fixes its blocks (32 along the input "
            "features), quantizes every Linear weight but the LM head, and refuses NaN/Inf weights"
        )
    summary = export_mx_checkpoint(
        checkpoint_dir(args.src_dir, say=print),
        args.out_dir,
        fmt=args.fmt,
        layout=args.to,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    print(
        f"{summary.layout} {summary.fmt}: {len(summary.quantized)} weights quantized "
        f"({len(summary.copied_mx)} MX weights copied exactly), {len(summary.excluded)} kept as they are; "
        f"{summary.weights_bytes / 2**20:.1f} MiB"
    )
    print(f"wrote {args.out_dir}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``compress``; returns the exit code (errors surface as FormatError, printed by accel.cli)."""
    if args.to != "accel":
        return _to_serving(args)
    from accel.formats.staging import partial_dir
    from accel.formats.stream import CompressSettings, compress_checkpoint
    from accel.models.gguf_convert import checkpoint_dir

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the summary's WARNING line says it once, for every weight
            report = compress_checkpoint(
                checkpoint_dir(args.src_dir, say=print),  # a .gguf is converted to a float32 directory once
                args.out_dir,
                CompressSettings(args.fmt, args.include, args.exclude, args.block_size, args.nonfinite),
                overwrite=args.overwrite,
                progress=not args.quiet,
                resume=args.resume,
            )
    except KeyboardInterrupt:
        staging = partial_dir(Path(args.out_dir))
        if staging.exists():
            print(
                f"accel compress: the unfinished run is kept in {staging}: rerun with --resume to finish it, "
                "or --overwrite to start over",
                file=sys.stderr,
            )
        raise
    print(report.summary())
    if report.nonfinite_layers:
        print(f"WARNING: {report.nonfinite_warning()}", file=sys.stderr)
    print(f"wrote {args.out_dir}")
    return 0
