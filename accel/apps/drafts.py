"""``accel distill``, ``accel distill-hydra`` (``accel.apps.hydra``), ``accel distill-eagle3`` (``accel.apps.eagle3``),
``accel eval-draft`` and ``accel export-draft``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``distill``, ``distill-hydra`` and ``eval-draft`` subcommands."""
    p = subparsers.add_parser(
        "distill",
        help="train a draft model for a target by distillation",
        description="Train a small draft (target vocabulary, Llama-family) on the target's top-k next-token "
        "distributions over text files and/or continuations the target generates itself.",
    )
    p.add_argument("target", help="target checkpoint directory (config.json + weights + tokenizer.json) or .gguf file")
    p.add_argument("-o", "--out", required=True, help="draft checkpoint directory to write")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=None, help="SwiGLU width (default 4 * d_model)")
    p.add_argument("--data", nargs="*", default=[], metavar="FILE", help="UTF-8 text files to distill on")
    p.add_argument(
        "--self-generate",
        type=int,
        default=0,
        metavar="N",
        help="N continuations the target generates from the prompts (default prompt set: chat + code)",
    )
    p.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help="one prompt per line (\\n escapes allowed) instead of the built-in set",
    )
    p.add_argument("--chat", action="store_true", help="wrap --prompts lines in the ChatML chat template")
    p.add_argument("--gen-tokens", type=int, default=96)
    p.add_argument("--steps", type=int, default=1000, help="optimiser steps (and cosine schedule length)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--minutes", type=float, default=None, help="wall-clock cap on training")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument("--init-from", default=None, metavar="DIR", help="warm start from a draft with this architecture")
    p.set_defaults(func=_distill)

    from accel.apps.eagle3 import register as register_eagle3
    from accel.apps.hydra import register as register_hydra

    register_hydra(subparsers)
    register_eagle3(subparsers)

    e = subparsers.add_parser(
        "eval-draft",
        help="measure a draft's agreement with its target",
        description="Teacher-forced greedy agreement, greedy SpD acceptance per draft position (K <= 8) and alpha; "
        "for Hydra heads, per-head acceptance and tokens per target call (chain and tree).",
    )
    e.add_argument("target", help="target checkpoint directory or .gguf file")
    e.add_argument("draft", help="draft checkpoint directory or .gguf file, or a Hydra heads directory")
    e.add_argument(
        "--data",
        nargs="+",
        metavar="FILE",
        help="UTF-8 text files (one sequence each); Hydra heads without --data: the target's greedy continuations of "
        "the built-in held-out prompts",
    )
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--max-k", type=int, default=8)
    e.add_argument("--max-len", type=int, default=512, help="tokens per file evaluated")
    e.add_argument("--json", action="store_true", help="print the DraftEval as JSON")
    e.set_defaults(func=_eval)

    x = subparsers.add_parser(
        "export-draft",
        help="write a draft for a serving engine (a plain Hugging Face checkpoint)",
        description="Write a standalone draft (accel distill; plain or MX-compressed) as a float32 Hugging Face "
        "checkpoint that transformers.AutoModelForCausalLM loads with the same logits, for engines that take a "
        "draft model by path (vLLM's draft_model method, vllm-qaic). A restricted head is widened to the full "
        "vocabulary (zero rows outside it); feature drafts and Hydra heads have no plain-LM form and are refused. "
        "--format speculators says why no accel draft has a speculators (EAGLE-3) form (docs/serving.md).",
    )
    x.add_argument("draft", help="draft checkpoint directory (accel distill's output, plain or MX-compressed)")
    x.add_argument("-o", "--out", required=True, metavar="OUT_DIR", help="output directory (must not exist)")
    x.add_argument(
        "--format",
        choices=("hf", "speculators"),
        default="hf",
        help="output format (hf: a plain HF checkpoint; speculators: refused with the reason)",
    )
    x.set_defaults(func=_export_draft)


def _export_draft(args: argparse.Namespace) -> int:
    from accel.drafts.export_hf import export_hf_draft
    from accel.drafts.hydra.open import is_heads_dir
    from accel.errors import DraftError

    out = Path(args.out)
    if out.exists():
        raise DraftError(f"{out} exists: give a new output directory")
    if args.format == "speculators":
        from accel.serving.speculators_format import SPECULATORS_EXPORT_REFUSALS

        raise DraftError(f"{args.draft}: {SPECULATORS_EXPORT_REFUSALS[_draft_kind(args.draft)]}")
    if is_heads_dir(args.draft):
        raise DraftError(
            f"{args.draft} holds Hydra heads, which read the target's hidden states and have no plain Hugging Face "
            "causal-LM form; --format hf takes a standalone draft (accel distill)"
        )
    if not Path(args.draft).is_dir():
        raise DraftError(f"no draft checkpoint directory at {args.draft}")
    export_hf_draft(args.draft, out)
    print(f"wrote {out} (Hugging Face checkpoint: AutoModelForCausalLM.from_pretrained loads it)")
    return 0


def _draft_kind(draft: str) -> str:
    """``hydra``, ``speculators``, ``feature`` or ``standalone``: what the folder ``draft`` holds (DraftError if it
    is no draft folder)."""
    from accel.drafts.hydra.open import is_heads_dir
    from accel.errors import DraftError
    from accel.models.config_json import FEATURE_SIZE_KEY
    from accel.serving.speculators_format import read_json_object

    if is_heads_dir(draft):
        return "hydra"
    config = Path(draft) / "config.json"
    if not config.is_file():
        raise DraftError(f"no draft checkpoint directory at {draft}")
    fields = read_json_object(config)
    if "speculators_model_type" in fields:
        return "speculators"
    return "feature" if fields.get(FEATURE_SIZE_KEY) else "standalone"


def _read_prompts(path: str, chat: bool) -> list[str]:
    from accel.drafts.data import chat_prompt
    from accel.errors import DraftError

    f = Path(path)
    if not f.is_file():
        raise DraftError(f"prompt file {f} does not exist")
    lines = [ln.replace("\\n", "\n") for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise DraftError(f"prompt file {f} has no prompts")
    return [chat_prompt(ln) if chat else ln for ln in lines]


def _distill(args: argparse.Namespace) -> int:
    from accel.drafts import DEFAULT_PROMPTS, DistillConfig, distill
    from accel.errors import DraftError

    prompts = _read_prompts(args.prompts, args.chat) if args.prompts else list(DEFAULT_PROMPTS)
    try:
        cfg = DistillConfig(
            layers=args.layers,
            d_model=args.d_model,
            heads=args.heads,
            ffn=args.ffn,
            data_files=[Path(f) for f in args.data],
            prompts=prompts,
            self_generate=args.self_generate,
            gen_tokens=args.gen_tokens,
            max_steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            minutes=args.minutes,
            seed=args.seed,
            threads=args.threads,
            resume=args.resume,
            init_from=Path(args.init_from) if args.init_from else None,
            eval_every=max(1, min(100, args.steps // 10)),
            checkpoint_every=max(1, min(100, args.steps // 10)),
        )
    except ValueError as exc:
        raise DraftError(f"bad distill options: {exc}") from exc
    if not cfg.data_files and not cfg.self_generate:
        raise DraftError("no data: give --data FILES and/or --self-generate N")
    from accel.models.gguf_convert import checkpoint_dir

    r = distill(checkpoint_dir(args.target, say=print), args.out, cfg)
    agree = f"{r.greedy_agreement:.3f}" if r.greedy_agreement is not None else "n/a"
    print(
        f"draft written to {r.out_dir}: {r.num_parameters / 1e6:.2f} M parameters, {r.weights_bytes / 2**20:.1f} MiB\n"
        f"  {r.steps} steps on {r.train_tokens} tokens (data {r.data_time_s:.0f} s, training {r.train_time_s:.0f} s, "
        f"stopped by {r.stopped_by})\n  final loss {r.final_loss:.3f} nats, held-out greedy agreement {agree} "
        f"(best at step {r.best_step})"
    )
    return 0


def _eval(args: argparse.Namespace) -> int:
    from accel.apps.hydra import eval_heads, is_heads_dir
    from accel.drafts import evaluate_draft
    from accel.errors import DraftError

    if not args.data and not is_heads_dir(args.draft):
        raise DraftError("eval-draft needs --data FILES (only Hydra heads have a built-in held-out set)")
    texts = []
    for f in args.data or []:
        p = Path(f)
        if not p.is_file():
            raise DraftError(f"data file {p} does not exist")
        texts.append(p.read_text(encoding="utf-8"))
    from accel.models.gguf_convert import checkpoint_dir

    say = None if args.json else print
    if is_heads_dir(args.draft):
        return eval_heads(str(checkpoint_dir(args.target, say=say)), args.draft, texts, args.json, args.max_len)
    ev = evaluate_draft(
        checkpoint_dir(args.target, say=say),
        checkpoint_dir(args.draft, say=say),
        texts,
        temperature=args.temperature,
        max_k=args.max_k,
        max_len=args.max_len,
    )
    if args.json:
        print(json.dumps(ev.model_dump(), indent=2))
        return 0
    print(f"{ev.positions} positions in {ev.sequences} sequences")
    print(f"greedy agreement          {ev.greedy_agreement:.3f}")
    print(f"alpha at T={ev.temperature:g}            {ev.alpha:.3f}")
    print(f"NLL target / draft        {ev.target_nll:.3f} / {ev.draft_nll:.3f} nats/token")
    print("K  P(draft token K accepted, greedy)  E[tokens/step]")
    for k, (p, e) in enumerate(zip(ev.accept_rate_by_position, ev.expected_tokens_per_step, strict=True), start=1):
        print(f"{k:<2} {p:>33.3f}  {e:>14.2f}")
    return 0
