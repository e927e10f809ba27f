"""The PPD section of ``accel predict`` (``--ppd E --ppd-p P``): Predictive Pipelined Decoding priced for every
placement of its two stages (``accel.sim.ppd``, ``accel.sim.ppd_stages``; docs/ppd.md)."""

from __future__ import annotations

import argparse
from typing import Any

from accel.errors import SimError
from accel.sim.ppd_stages import PlacementKind

__all__ = ["add_arguments", "ppd_section"]

PLACEMENTS: tuple[PlacementKind, ...] = ("paper", "same-device", "per-stage")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--ppd*`` options of ``accel predict``."""
    g = p.add_argument_group("Predictive Pipelined Decoding (with --ppd)")
    g.add_argument(
        "--ppd", type=int, default=None, metavar="EXIT_LAYER", help="add a PPD section: exit after this layer"
    )
    g.add_argument("--ppd-k", type=int, default=3, help="PPD candidates per step (default 3)")
    g.add_argument("--ppd-p", type=float, default=None, help="PPD match rate p (the true token among the exit's top k)")
    g.add_argument(
        "--ppd-concurrency",
        type=float,
        default=None,
        help="measured concurrency s of two calls on one device (1..2) for the same-device row (default: roofline)",
    )


def ppd_section(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """``(table, rows)``: the PPD prediction of ``args`` (``accel predict``'s) for each placement; AR is the same
    deployment's (``--target-format`` weights, ``--devices`` per stage, ``--host-s-per-step`` per token)."""
    from accel.sim.ppd import PPDRun, predict_ppd
    from accel.sim.ppd_stages import PPDPlacement

    if args.ppd_p is None:
        raise SimError("--ppd needs --ppd-p, the match rate (measured: accel generate --ppd prints p_correct)")
    if args.batch != 1:
        raise SimError("--ppd prices batch 1 (PPD's candidates are the rows of one sequence); drop --batch")
    rows, lines = [], []
    context_len = args.prompt_len + args.gen_len // 2  # the steps priced at the generation's mean past length
    for kind in PLACEMENTS:
        conc = args.ppd_concurrency if kind == "same-device" else None
        place = PPDPlacement(kind=kind, concurrency=conc, host_s=args.host_s_per_step)
        dbar = args.ppd
        if kind == "paper":
            try:  # Theorem 4.1 needs dbar >= d/2: the head start is min(e, d - e) layers
                from accel.sim.hf_config import resolve_model

                layers = resolve_model(args.target).n_layers
                dbar = max(args.ppd, layers - args.ppd)
            except SimError:
                pass
        run = PPDRun(dbar=dbar, k=args.ppd_k, p=args.ppd_p, gen_len=args.gen_len, context_len=context_len)
        r = predict_ppd(
            args.target,
            args.hardware,
            run,
            weight_format=args.target_format,
            kv_format=args.kv_format,
            devices=args.devices,
            placement=place,
        )
        rows.append(r.model_dump(mode="json"))
        tp = "" if r.tensor_parallel_speedup is None else f"   (AR in TP over both: {r.tensor_parallel_speedup:.2f}x)"
        lines.append(
            f"{kind:<12}{r.per_token_s * 1e3:>11.3f}{1 / r.per_token_s:>11.1f}{r.speedup:>9.2f}x"
            f"{'' if r.parallel_s is None else f'{r.parallel_s * 1e3:>11.3f}':>11}{tp}"
        )
    r0 = rows[0]
    head = (
        f"PPD: {r0['model']} on {r0['hardware']}, exit layer {args.ppd} of {r0['d']}, k {args.ppd_k}, p {args.ppd_p}, "
        f"{args.target_format} weights, {r0['devices']} device(s) per stage; AR {r0['ar_per_token_s'] * 1e3:.3f} ms "
        f"per token\n{'placement':<12}{'ms/token':>11}{'tokens/s':>11}{'vs AR':>10}{'stages ms':>11}"
    )
    return "\n".join([head, *lines]), rows
