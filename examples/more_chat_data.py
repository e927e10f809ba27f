"""More target-written chat data for the SmolLM2 feature draft: new user questions, greedy continuations.

    python examples/more_chat_data.py [--work results/data_v5] [--questions 2000]

1. questions: ``--questions`` user questions the target writes itself after a bare ChatML user header
   (``accel.drafts.data.sample_prompts``, T = 0.8, seed 2, up to 64 tokens), minus every prompt of the standalone
   draft's recipe (``--exclude``, its ``prompts.json``) and ``HELD_OUT_PROMPTS``; cached in ``<work>/prompts.json``;
2. data: one greedy continuation of each (up to 160 new tokens, the target's top-32 next-token distribution at every
   position), as distillation shards in ``<work>/data`` (``accel.drafts.distill_data.build_data``; an interrupted run
   keeps its finished shards).

Why greedy chat: the benchmark (``benchmarks/spd.py``) drafts for the target's greedy continuations of
``HELD_OUT_PROMPTS``, and the shipped feature draft accepts least on its chat half (top-1 0.30-0.52 per prompt
against 0.63-0.76 on the code half). ``examples/build_feature_draft.py --data <old shards> <work>/data`` then trains on
both. About 8 min of questions and ~25 min of continuations on a 2-core machine (~0.3 M positions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CHAT_HEADER = "<|im_start|>user\n"
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "results" / "data_v5"))
    ap.add_argument("--questions", type=int, default=2000)
    ap.add_argument(
        "--exclude",
        default=str(REPO / "results" / "draft_v4" / "prompts.json"),
        help="JSON list of prompts already in the training data (skipped if missing)",
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from accel.drafts import DistillConfig
    from accel.drafts.checkpoint import load_model, load_text_tokenizer
    from accel.drafts.data import PromptSampling, sample_prompts
    from accel.drafts.distill_data import build_data
    from accel.drafts.prompts import HELD_OUT_PROMPTS
    from accel.models import smollm2_checkpoint

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    target_dir = Path(smollm2_checkpoint())
    target = load_model(target_dir, "target")
    old = set(json.loads(Path(args.exclude).read_text())) if Path(args.exclude).is_file() else set()
    cached = work / "prompts.json"
    if cached.is_file():
        prompts = json.loads(cached.read_text())
    else:
        t0 = time.perf_counter()
        questions = sample_prompts(
            target,
            load_text_tokenizer(target_dir),
            [CHAT_HEADER],
            args.questions,
            PromptSampling(
                stop="<|im_end|>",
                max_tokens=64,
                temperature=0.8,
                batch_size=64,
                seed=2,
                exclude=tuple(old) + HELD_OUT_PROMPTS,
                wrap=lambda q: q + ASSISTANT,
                partial=True,
            ),
        )
        prompts = [q for q in questions if q not in old]
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps(prompts, indent=0))
        tmp.replace(cached)
        print(f"{len(prompts)} questions in {time.perf_counter() - t0:.0f} s", flush=True)
    # only the data fields matter here (the architecture fields are required by the config, unused)
    cfg = DistillConfig(
        layers=1,
        d_model=128,
        heads=4,
        ffn=256,
        prompts=prompts,
        self_generate=len(prompts),
        gen_tokens=160,
        gen_batch_size=64,
        temperatures=[0.0, 0.7],
        seq_len=128,
        teacher_top_k=32,
        held_out_fraction=0.05,
        seed=5,
        threads=args.threads,
    )
    t0 = time.perf_counter()
    data = build_data(target, cfg, work / "data", target_dir)
    print(f"data: {data.num_positions} positions in {time.perf_counter() - t0:.0f} s -> {work / 'data'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
