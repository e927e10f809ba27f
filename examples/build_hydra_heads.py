"""Build the shipped Hydra++ heads for SmolLM2-135M-Instruct: ``accel/demo_data/smollm2-hydra``.

    python examples/build_hydra_heads.py --work results/hydra --data-only      # stages 1-3 (resumable)
    python examples/build_hydra_heads.py --work results/hydra --resume         # stages 1-6 (resumable)

Recipe (every seed fixed; one torch thread, so the run can share a 2-core machine):

1. prompts (cached in ``<work>/prompts.json``): ``--chat-prompts`` user questions the target writes itself after a bare
   ChatML user header (T = 0.7, up to 64 tokens), the built-in ``DEFAULT_PROMPTS`` and the Python openings of
   ``code_signatures``, shuffled, none of ``HELD_OUT_PROMPTS``;
2. data (``accel.drafts.distill_data.build_data``, shards in ``<work>/data``): ``--sequences`` continuations of up to
   ``--gen-tokens`` new tokens by a bfloat16 copy of the target (first pass over the prompts greedy, later passes at
   T = 0.7), 64 rows per shard, with the target's top-32 next-token log-probs at every position;
3. the target's bfloat16 final-norm hidden states of every shard (``accel.drafts.hydra.feature_shards``) in
   ``<work>/features``;
4. training (``accel.drafts.hydra.train_hydra``, checkpointed in ``<work>/heads/.hydra``);
5. evaluation on greedy target continuations of ``HELD_OUT_PROMPTS`` (never trained on);
6. shipping: the heads' weights in MXFP6 to ``--ship-dir`` with ``hydra_card.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHIP_DIR = REPO / "accel" / "demo_data" / "smollm2-hydra"
HEAD_FROM = REPO / "accel" / "demo_data" / "smollm2-draft"  # its restricted head's 8192 token ids
CHAT_HEADER = "<|im_start|>user\n"
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"


def build_prompts(work: Path, target, tokenizer, n_chat: int) -> list[str]:
    """Stage 1: target-written chat questions + built-in prompts + code openings (cached)."""
    from accel.drafts import DEFAULT_PROMPTS
    from accel.drafts.data import sample_prompts
    from accel.drafts.prompts import HELD_OUT_PROMPTS, code_signatures

    path = work / "prompts.json"
    if path.is_file():
        return json.loads(path.read_text())
    questions = sample_prompts(
        target,
        tokenizer,
        [CHAT_HEADER],
        n_chat,
        stop="<|im_end|>",
        max_tokens=64,
        temperature=0.7,
        batch_size=64,
        seed=3,
        exclude=HELD_OUT_PROMPTS,
        wrap=lambda s: s + ASSISTANT,
        partial=True,
    )
    prompts = [
        p for p in dict.fromkeys([*questions, *DEFAULT_PROMPTS, *code_signatures()]) if p not in HELD_OUT_PROMPTS
    ]
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(0)).tolist()
    prompts = [prompts[i] for i in order]
    work.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(prompts, indent=0))
    tmp.replace(path)
    return prompts


def build_dataset(args: argparse.Namespace, target_dir: Path, target) -> list[tuple[Path, Path]]:
    """Stages 1-3: prompts, target-written data shards, the target's hidden states of them."""
    from accel.drafts import DistillConfig
    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.drafts.distill_data import build_data
    from accel.drafts.hydra.data import feature_shards

    work = Path(args.work)
    fast = copy.deepcopy(target).to(torch.bfloat16)  # ~1.5x faster generation on this CPU; the teacher is bf16
    prompts = build_prompts(work, fast, load_text_tokenizer(target_dir), args.chat_prompts)
    print(f"{len(prompts)} prompts", flush=True)
    cfg = DistillConfig(
        prompts=prompts,
        self_generate=args.sequences,
        gen_tokens=args.gen_tokens,
        gen_batch_size=64,
        temperatures=[0.0, 0.7],
        teacher_top_k=32,
        seed=0,
    )
    t0 = time.perf_counter()
    build_data(fast, cfg, work / "data", target_dir)
    print(f"data: {time.perf_counter() - t0:.0f} s", flush=True)
    del fast
    t0 = time.perf_counter()
    pairs = feature_shards(target, work / "data", work / "features")
    print(f"hidden states: {time.perf_counter() - t0:.0f} s", flush=True)
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "results" / "hydra"))
    ap.add_argument("--chat-prompts", type=int, default=600, help="user questions the target writes (0 = none)")
    ap.add_argument("--sequences", type=int, default=1792, help="self-generated sequences (passes over the prompts)")
    ap.add_argument("--gen-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--data-only", action="store_true", help="only build the prompts, data and hidden states")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from accel.models import load_checkpoint, smollm2_checkpoint

    target_dir = Path(smollm2_checkpoint())
    target = load_checkpoint(target_dir).eval()
    build_dataset(args, target_dir, target)
    if args.data_only:
        return 0
    raise SystemExit("training stages: not yet")


if __name__ == "__main__":
    sys.exit(main())
