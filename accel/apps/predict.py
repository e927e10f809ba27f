"""``accel predict``: predicted speed of AR / compressed / speculative (chain or tree) decoding on a device (see
docs/sim.md). Without ``--draft`` the prediction is autoregressive only."""

from __future__ import annotations

import argparse
import json
from typing import Any

from accel.errors import SimError


def _numbers(text: str) -> float | list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or comma-separated numbers, got {text!r}") from None
    return vals[0] if len(vals) == 1 else vals


def _add_spd(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (with --draft)")
    g.add_argument("--k", type=int, default=7, help="draft tokens per chain round (default 7; at most 64)")
    g.add_argument(
        "--acceptance",
        type=_numbers,
        default=None,
        help="i.i.d. acceptance alpha, or comma-separated per-position rates (chains) / per-rank rates (trees); "
        "default 0.8",
    )
    g.add_argument(
        "--acceptance-range",
        type=float,
        nargs=2,
        default=None,
        metavar=("LO", "HI"),
        help="acceptance uncertain: alpha uniform on [LO, HI]; prints every configuration's speedup at its 10th, "
        "50th and 90th percentile (accel.sim.predict_band) after the table at --acceptance",
    )
    g.add_argument(
        "--tree-nodes",
        type=int,
        default=None,
        help="price a token tree of this many nodes (the best tree for --acceptance) and compare node budgets",
    )
    g.add_argument("--tokens-per-loop", type=float, default=None, help="measured tokens per target call")
    g.add_argument("--drafts-per-loop", type=float, default=None, help="measured draft tokens (tree nodes) per loop")
    g.add_argument("--all-accepted", type=float, default=None, help="measured fraction of all-accepted loops")
    g.add_argument("--draft-calls-per-loop", type=float, default=None, help="measured draft-model calls per loop")
    g.add_argument("--draft-tokens-per-call", type=float, default=None, help="measured tokens per draft call (trees)")
    g.add_argument("--lookup-fraction", type=float, default=None, help="measured fraction of n-gram lookup loops")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``predict`` subcommand."""
    p = subparsers.add_parser(
        "predict", help="predict tokens/s of AR, MX and speculative decoding on a device", description=__doc__
    )
    p.add_argument("--target", required=True, help="model preset name or config.json path")
    p.add_argument("--draft", default=None, help="draft preset name or config.json path (omit: AR only)")
    p.add_argument("--hardware", required=True, help="catalog device name or a YAML/JSON hardware file")
    _add_spd(p)
    p.add_argument("--target-format", default="mxfp6", help="compressed target weight format (default mxfp6)")
    p.add_argument("--baseline-format", default=None, help="baseline weight format (default: the model's dtype)")
    p.add_argument("--draft-format", default=None, help="draft weight format (default: its dtype)")
    p.add_argument("--kv-format", default="fp16")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=896)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--devices", type=int, default=None, help="devices for the target (default: per model size)")
    p.add_argument("--draft-devices", type=int, default=None, help="devices for the draft (default: per size)")
    p.add_argument("--cache", choices=("growing", "fixed"), default="growing", help="KV cache layout")
    p.add_argument("--ctx-len", type=int, default=None, help="slots of a fixed cache (default prompt + gen)")
    p.add_argument("--host-s", type=float, default=0.0, help="host seconds per speculative round")
    p.add_argument("--host-s-per-step", type=float, default=0.0, help="host seconds per target call")
    p.add_argument("--compress-lm-head", action="store_true", help="store the LM head in the target format too")
    p.add_argument("--strict", action="store_true", help="fail when a configuration does not fit in memory")
    p.add_argument("--plot", default=None, help="write a time-breakdown bar chart to this PNG")
    p.add_argument("--json", action="store_true", help="print the full prediction as JSON instead of the table")
    from accel.apps import predict_ppd

    predict_ppd.add_arguments(p)
    p.set_defaults(func=run)


def _loop_stats(args: argparse.Namespace) -> dict[str, Any] | None:
    extras = ("all_accepted", "draft_calls_per_loop", "draft_tokens_per_call", "lookup_fraction")
    if (args.tokens_per_loop is None) != (args.drafts_per_loop is None):
        raise SimError("--tokens-per-loop and --drafts-per-loop go together (measured loop statistics)")
    if args.tokens_per_loop is None:
        if any(getattr(args, e) is not None for e in extras):
            raise SimError(f"--{', --'.join(e.replace('_', '-') for e in extras)} need --tokens-per-loop and "
                           "--drafts-per-loop")  # fmt: skip
        return None
    stats = {"tokens_per_loop": args.tokens_per_loop, "drafts_per_loop": args.drafts_per_loop}
    stats.update(all_accepted_fraction=args.all_accepted, draft_calls_per_loop=args.draft_calls_per_loop)
    if args.lookup_fraction is not None:
        stats["lookup_fraction"] = args.lookup_fraction
    if args.draft_tokens_per_call is not None:
        stats["draft_tokens_per_call"] = args.draft_tokens_per_call
    return stats


def _tree_budgets(pred: Any, dep: Any, acceptance: Any) -> str:
    from accel.sim.planning import tree_speedups
    from accel.sim.predict import TREE_BUDGETS
    from accel.sim.tree import best_tree, tree_expected_tokens

    budgets = sorted({*TREE_BUDGETS, pred.k})
    sp = tree_speedups(dep, acceptance, budgets)
    lines = [f"tree size (best tree per budget)  E[tokens/round]  x over {dep.target_format} AR"]
    for n, s in zip(budgets, sp, strict=True):
        e = tree_expected_tokens(best_tree(acceptance, n), acceptance)
        lines.append(f"{n:>9} nodes{'':<22}{e:>10.3f}{s:>12.2f}x")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``accel predict``; returns the exit code."""
    from accel.sim.deployment import Deployment
    from accel.sim.predict import predict_speedup

    dep = Deployment(
        target=args.target,
        draft=args.draft,
        hardware=args.hardware,
        target_format=args.target_format,
        baseline_format=args.baseline_format,
        draft_format=args.draft_format,
        kv_format=args.kv_format,
        batch_size=args.batch,
        prompt_len=args.prompt_len,
        gen_len=args.gen_len,
        devices=args.devices,
        draft_devices=args.draft_devices,
        cache=args.cache,
        ctx_len=args.ctx_len,
        host_s=args.host_s,
        host_s_per_step=args.host_s_per_step,
        compress_lm_head=args.compress_lm_head,
    )
    stats = _loop_stats(args)
    if args.plot:  # checked before any work (plots.py needs matplotlib only when it draws)
        from accel.sim.plots import check_png_path

        check_png_path(args.plot)
    if args.draft is None and (
        stats is not None or args.tree_nodes is not None or args.acceptance is not None or args.acceptance_range
    ):
        raise SimError("--acceptance, --acceptance-range, --tree-nodes and the loop statistics need --draft")
    if args.acceptance_range and stats is not None:
        raise SimError("--acceptance-range prices i.i.d. acceptance: drop the measured loop statistics")
    spd: dict[str, Any] = {} if args.draft is None else {"k": args.k, "acceptance": args.acceptance}
    pred = predict_speedup(dep, loop_stats=stats, tree=args.tree_nodes, **spd)
    if args.strict:
        pred.require_fit()
    band = None
    if args.acceptance_range:
        from accel.sim.band import predict_band

        band = predict_band(dep, k=args.k, tree=args.tree_nodes, acceptance_range=args.acceptance_range)
    ppd = None
    if args.ppd is not None:
        from accel.apps.predict_ppd import ppd_section

        ppd = ppd_section(args)
    if args.json:
        doc = pred.model_dump(mode="json")
        doc = doc if band is None else {**doc, "band": band.model_dump(mode="json")}
        print(json.dumps(doc if ppd is None else {**doc, "ppd": ppd[1]}, indent=2))
    else:
        print(pred.table())
        if args.tree_nodes is not None:
            print(_tree_budgets(pred, dep, 0.8 if args.acceptance is None else args.acceptance))
        if band is not None:
            lo, hi = args.acceptance_range
            print(f"\nspeedup over the baseline AR with alpha uniform on [{lo:g}, {hi:g}] (percentiles):")
            print(band.table())
        if ppd is not None:
            print(ppd[0])
    if args.plot:
        from accel.sim.plots import breakdown_bars

        out = breakdown_bars(pred, args.plot)
        if not args.json:
            print(f"wrote {out}")
    return 0


__all__ = ["register", "run"]
