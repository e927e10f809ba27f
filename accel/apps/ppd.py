"""``accel generate --ppd E``: Predictive Pipelined Decoding from the command line (``accel.spd.ppd``).

The target checkpoint directory is split at layer ``E`` into the exit stage ``[0, E)`` (``--ppd-k`` rows, the exit
head of ``--exit-head`` or the plain exit) and the back stage ``[E, L)``, exported as onnxruntime stage graphs into a
temporary directory (``--backend ort``) or run as torch stages; the stages overlap on two threads. Prints the text,
then the match rate and where the time went.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accel.errors import SpdError

__all__ = ["add_arguments", "run_ppd"]

SHIPPED = "shipped"  # the value of a bare --exit-head
PPD_K = 3  # candidates per step when --ppd-k is not given
CTX_LEN = 512  # KV-cache tokens of the stages when --ctx-len is not given (DecodeSpec's default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The PPD options of ``accel generate``."""
    p.add_argument(
        "--ppd",
        type=int,
        default=None,
        metavar="EXIT_LAYER",
        help="Predictive Pipelined Decoding with the early exit after this layer (exact; needs a target checkpoint "
        "directory, no --draft; docs/ppd.md)",
    )
    p.add_argument("--ppd-k", type=int, default=None, help=f"PPD candidates per step (default {PPD_K})")
    p.add_argument(
        "--exit-head",
        nargs="?",
        const=SHIPPED,
        default=None,
        metavar="DIR",
        help="trained exit head directory; bare --exit-head: the head shipped for SmolLM2-135M at the --ppd layer "
        "(accel/demo_data/smollm2-exit-L15); default: the plain exit",
    )


def _stages(args: argparse.Namespace, target_path: Path, tmp: Path):
    from accel.backends import OrtBackend, TorchBackend, export_onnx
    from accel.backends.stages import split_layers
    from accel.drafts.early_exit import load_exit_head, shipped_exit_head
    from accel.models import load_checkpoint

    model = load_checkpoint(target_path).eval()
    layers = model.config.num_layers
    if not 1 <= args.ppd < layers:
        raise SpdError(f"--ppd exit layer must be in 1..{layers - 1} (the target has {layers} layers)")
    head_dir = shipped_exit_head(args.ppd) if args.exit_head == SHIPPED else args.exit_head
    head = load_exit_head(head_dir, model) if head_dir else None
    if head is not None and head.layer != args.ppd:
        raise SpdError(f"the exit head at {head_dir} is for layer {head.layer}, not --ppd {args.ppd}")
    specs = split_layers(layers, [args.ppd], exit_logits=True)
    if args.backend == "torch":
        kw = dict(ctx_len=args.ctx_len, threads=args.threads)
        return (
            TorchBackend(model, batch_size=args.ppd_k, stage=specs[0], exit_head=head, **kw),
            TorchBackend(model, batch_size=1, stage=specs[1], **kw),
        )
    front = export_onnx(
        model, tmp / "front.onnx", ctx_len=args.ctx_len, batch_size=args.ppd_k, stage=specs[0], exit_head=head
    )
    back = export_onnx(model, tmp / "back.onnx", ctx_len=args.ctx_len, batch_size=1, stage=specs[1])
    return OrtBackend(front, threads=args.threads or 1), OrtBackend(back, threads=args.threads or 1)


def run_ppd(args: argparse.Namespace, prompt: list[int], tokenizer, eos, tmp: Path) -> int:
    """Run ``accel generate --ppd``; returns the exit code."""
    from accel.spd import Sampling
    from accel.spd.ppd import generate_ppd

    target_path = Path(args.target)
    args = argparse.Namespace(**{**vars(args), "ppd_k": args.ppd_k or PPD_K, "ctx_len": args.ctx_len or CTX_LEN})
    if args.draft or args.ngram or args.tree_nodes or getattr(args, "hydra", None):
        raise SpdError("--ppd decodes with the target's own early exit: drop --draft, --hydra, --ngram, --tree-nodes")
    if not target_path.is_dir():
        raise SpdError(f"--ppd needs a target checkpoint directory (it exports the stages); got {target_path}")
    if isinstance(args.ppd_k, bool) or args.ppd_k < 1:
        raise SpdError(f"--ppd-k must be >= 1; got {args.ppd_k}")
    front, back = _stages(args, target_path, tmp)
    res = generate_ppd(
        front,
        back,
        prompt,
        max_new_tokens=args.max_new_tokens,
        sampling=Sampling(args.temperature, args.top_k, args.top_p, args.greedy),
        seed=args.seed,
        eos_token_id=eos,
    )
    if args.json:
        print(res.model_dump_json(indent=2))
        return 0
    text = tokenizer.decode(res.tokens) if tokenizer is not None else " ".join(map(str, res.tokens))
    s = res.stats
    sys.stdout.write(text + "\n")
    print(
        f"PPD exit layer {s.exit_layer}/{s.num_layers}, k {s.k}: {s.new_tokens} tokens, {s.hits}/{s.steps} steps "
        f"matched (p_correct for k' = 1..{s.k}: {' '.join(f'{p:.3f}' for p in s.p_correct)})\n"
        f"tokens/s {s.tokens_per_s:.1f} (decode {s.decode_tokens_per_s:.1f})  wall {s.wall_s:.3f} s, prefill "
        f"{s.prefill_s:.3f} s; in calls: back {s.main_s:.3f} s, speculation {s.spec_s:.3f} s (concurrent), front "
        f"after misses {s.miss_s:.3f} s"
    )
    return 0
