"""``accel predict``: predicted speed of AR / MX / SpD configurations on a device (see docs/sim.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from accel.errors import SimError


def _acceptance(text: str) -> float | list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"acceptance must be a number or comma-separated numbers, got {text!r}"
        ) from None
    return vals[0] if len(vals) == 1 else vals


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``predict`` subcommand."""
    p = subparsers.add_parser(
        "predict", help="predict tokens/s of AR, MX and speculative decoding on a device", description=__doc__
    )
    p.add_argument("--target", required=True, help="model preset name or config.json path")
    p.add_argument("--draft", required=True, help="draft preset name or config.json path")
    p.add_argument("--hardware", required=True, help="catalog device name or a YAML/JSON hardware file")
    p.add_argument("--k", type=int, default=7, help="draft tokens per loop (default 7)")
    p.add_argument(
        "--acceptance",
        type=_acceptance,
        default=None,
        help="i.i.d. acceptance alpha, or comma-separated per-position rates (default 0.8)",
    )
    p.add_argument(
        "--tokens-per-loop",
        type=float,
        default=None,
        help="measured tokens per target call (a dynamic draft length; with --drafts-per-loop)",
    )
    p.add_argument(
        "--drafts-per-loop",
        type=float,
        default=None,
        help="measured draft tokens per loop (a dynamic draft length; --k is then the cap)",
    )
    p.add_argument(
        "--all-accepted",
        type=float,
        default=None,
        help="measured fraction of loops with every draft accepted (optional, with --tokens-per-loop)",
    )
    p.add_argument(
        "--draft-calls-per-loop",
        type=float,
        default=None,
        help="measured draft-model calls per loop, with n-gram lookup drafts (optional; default: one per draft)",
    )
    p.add_argument(
        "--lookup-fraction",
        type=float,
        default=0.0,
        help="measured fraction of loops drafted by n-gram lookup (no draft call; default 0)",
    )
    p.add_argument("--target-format", default="mxfp6", help="compressed target weight format (default mxfp6)")
    p.add_argument("--draft-format", default="fp16")
    p.add_argument("--kv-format", default="fp16")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=896)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--devices", type=int, default=None, help="devices for the target (default: all of the card)")
    p.add_argument("--draft-devices", type=int, default=1)
    p.add_argument("--host-s", type=float, default=0.0, help="host seconds per SpD loop")
    p.add_argument("--compress-lm-head", action="store_true", help="store the LM head in the target format too")
    p.add_argument("--strict", action="store_true", help="fail when a configuration does not fit in memory")
    p.add_argument("--plot", default=None, help="write a time-breakdown bar chart to this PNG")
    p.add_argument("--json", action="store_true", help="print the full prediction as JSON instead of the table")
    p.set_defaults(func=run)


def _hardware_arg(text: str):
    from accel.sim.hardware import hardware, load_hardware

    if Path(text).suffix.lower() in (".yaml", ".yml", ".json"):
        return load_hardware(text)
    return hardware(text)


def run(args: argparse.Namespace) -> int:
    """Run ``accel predict``; returns the exit code."""
    from accel.sim.predict import predict_speedup

    stats = None
    if (args.tokens_per_loop is None) != (args.drafts_per_loop is None):
        raise SimError("--tokens-per-loop and --drafts-per-loop go together (measured loop statistics)")
    if (args.all_accepted is not None or args.draft_calls_per_loop is not None or args.lookup_fraction) and (
        args.tokens_per_loop is None
    ):
        raise SimError(
            "--all-accepted, --draft-calls-per-loop and --lookup-fraction need --tokens-per-loop and --drafts-per-loop"
        )
    if args.tokens_per_loop is not None:
        stats = {
            "tokens_per_loop": args.tokens_per_loop,
            "drafts_per_loop": args.drafts_per_loop,
            "all_accepted_fraction": args.all_accepted,
            "draft_calls_per_loop": args.draft_calls_per_loop,
            "lookup_fraction": args.lookup_fraction,
        }
    pred = predict_speedup(
        args.target,
        args.draft,
        _hardware_arg(args.hardware),
        target_format=args.target_format,
        draft_format=args.draft_format,
        k=args.k,
        acceptance=args.acceptance,
        prompt_len=args.prompt_len,
        gen_len=args.gen_len,
        batch_size=args.batch,
        devices=args.devices,
        draft_devices=args.draft_devices,
        kv_format=args.kv_format,
        host_s=args.host_s,
        compress_lm_head=args.compress_lm_head,
        strict=args.strict,
        loop_stats=stats,
    )
    if args.json:
        print(json.dumps(pred.model_dump(mode="json"), indent=2))
    else:
        print(pred.table())
    if args.plot:
        from accel.sim.plots import breakdown_bars

        out = breakdown_bars(pred, args.plot)
        if not args.json:
            print(f"wrote {out}")
    return 0


__all__ = ["register", "run"]
