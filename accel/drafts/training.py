"""``distill``: train a small draft for a target on its own next-token distributions.

Steps: load the target; build (or, with ``resume``, restore) the draft data — text windows and self-generated
continuations with the target's top-k distributions, cached as shards in ``<out_dir>/.distill/data`` so an interrupted
run never regenerates them; build the draft (``architecture.build_draft``); train with AdamW on ``loss.topk_kl`` with
linear warm-up and cosine decay over ``max_steps``; every ``eval_every`` steps measure the held-out greedy agreement
(draft argmax == target argmax, from the stored teacher top-1: no target pass needed) and keep the best draft as the
output checkpoint; every ``checkpoint_every`` steps save model + optimizer + step + data-order RNG atomically.
A resumed run continues from the saved step with the same batches as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from accel.drafts.architecture import build_draft, causal_hidden
from accel.drafts.checkpoint import (
    copy_tokenizer,
    describe,
    load_model,
    load_text_tokenizer,
    load_torch_state,
    save_model,
    save_torch_state,
)
from accel.drafts.config import DistillConfig, DistillReport, HistoryPoint
from accel.drafts.data import TeacherData, self_generate, split_rows, teacher_topk, text_windows
from accel.drafts.loss import sampled_topk_kl, topk_kl
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["build_data", "distill"]

_WORK = ".distill"


def distill(
    target: Decoder | str | Path,
    out_dir: str | Path,
    config: DistillConfig | None = None,
    *,
    tokenizer_dir: str | Path | None = None,
) -> DistillReport:
    """Distill a draft for ``target`` into the checkpoint directory ``out_dir``; returns a ``DistillReport``.

    Args:
        target: a checkpoint directory (its tokenizer files are copied to the draft) or a ``Decoder``.
        out_dir: where the draft checkpoint goes (config.json, model.safetensors, tokenizer files, distill.json).
        config: architecture, data and training budget (``DistillConfig``).
        tokenizer_dir: where the target's tokenizer lives when ``target`` is a ``Decoder`` (needed for text data
            and prompts; default: the target directory).

    Raises ``DraftError`` for a missing/corrupted target, no data, unreadable data files, or a ``resume`` whose saved
    state does not match ``config``.
    """
    cfg = config or DistillConfig()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(out_dir)
    work = out / _WORK
    tok_dir = Path(tokenizer_dir) if tokenizer_dir else (None if isinstance(target, Decoder) else Path(target))
    target_model = load_model(target, "target")
    if not cfg.resume and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    data = build_data(target_model, cfg, work / "data", tok_dir)
    data_time_s = time.perf_counter() - t0
    train_rows, held_rows = split_rows(len(data), cfg.held_out_fraction, cfg.seed)
    if len(train_rows) == 0:
        raise DraftError(f"no training rows left after holding out {cfg.held_out_fraction:.0%} of {len(data)}")
    train, held = data.subset(train_rows), data.subset(held_rows)

    torch.manual_seed(cfg.seed)
    draft = build_draft(target_model, cfg)
    if cfg.init_from is not None:
        _warm_start(draft, cfg.init_from)
    del target_model
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    batch_gen = torch.Generator().manual_seed(cfg.seed + 1)
    state: dict[str, Any] = {"step": 0, "order": torch.randperm(len(train), generator=batch_gen), "cursor": 0}
    history: list[HistoryPoint] = []
    best = {"step": 0, "agreement": -1.0}
    elapsed_before = 0.0
    state_path = work / "state.pt"
    if cfg.resume and state_path.is_file():
        saved = load_torch_state(state_path)
        if saved.get("config") != _fingerprint(cfg):
            raise DraftError(
                f"cannot resume from {state_path}: it was written with a different architecture/data config; "
                "rerun without --resume to start over (or delete that file to train afresh on the cached data)"
            )
        draft.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        batch_gen.set_state(saved["rng"])
        state = {"step": int(saved["step"]), "order": saved["order"], "cursor": int(saved["cursor"])}
        history = [HistoryPoint(**h) for h in json.loads(saved["history"])]
        best = json.loads(saved["best"])
        elapsed_before = float(saved["elapsed_s"])

    def save_state() -> None:
        save_torch_state(
            {
                "model": draft.state_dict(),
                "optimizer": opt.state_dict(),
                "rng": batch_gen.get_state(),
                "step": state["step"],
                "order": state["order"],
                "cursor": state["cursor"],
                "history": json.dumps([h.model_dump() for h in history]),
                "best": json.dumps(best),
                "elapsed_s": elapsed_before + time.perf_counter() - t_train,
                "config": _fingerprint(cfg),
            },
            state_path,
        )

    def next_rows() -> torch.Tensor:
        rows: list[int] = []
        while len(rows) < cfg.batch_size:
            if state["cursor"] >= len(train):
                state["order"] = torch.randperm(len(train), generator=batch_gen)
                state["cursor"] = 0
            take = min(cfg.batch_size - len(rows), len(train) - state["cursor"])
            rows.extend(state["order"][state["cursor"] : state["cursor"] + take].tolist())
            state["cursor"] += take
        return torch.tensor(rows)

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, (cfg.schedule_steps or cfg.max_steps) - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    t_train = time.perf_counter()
    stopped_by = "max_steps"
    losses: list[float] = []
    tokens_seen = 0
    bar = tqdm(total=cfg.max_steps, initial=state["step"], desc="distill", disable=not cfg.progress, unit="step")
    draft.train()
    while state["step"] < cfg.max_steps:
        if cfg.minutes and elapsed_before + time.perf_counter() - t_train > 60 * cfg.minutes:
            stopped_by = "minutes"
            break
        batch = train.subset(next_rows())
        width = int(batch.mask.sum(dim=1).max()) + 1
        width = min(width, batch.tokens.shape[1])
        for group in opt.param_groups:
            group["lr"] = lr_at(state["step"])
        loss = _batch_loss(draft, batch, width, cfg.softmax_negatives, batch_gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        losses.append(loss.item())
        tokens_seen += int(batch.mask.sum())
        bar.update(1)
        last = state["step"] == cfg.max_steps
        if state["step"] % cfg.eval_every == 0 or last:
            agreement = greedy_agreement(draft, held) if len(held) else None
            history.append(
                HistoryPoint(
                    step=state["step"],
                    loss=sum(losses) / len(losses),
                    greedy_agreement=agreement,
                    elapsed_s=elapsed_before + time.perf_counter() - t_train,
                )
            )
            losses = []
            bar.set_postfix(loss=f"{history[-1].loss:.3f}", agree=f"{agreement:.3f}" if agreement is not None else "-")
            score = agreement if agreement is not None else -history[-1].loss
            if score > best["agreement"]:
                best = {"step": state["step"], "agreement": score}
                _write_output(draft, out, tok_dir)
            draft.train()
        if state["step"] % cfg.checkpoint_every == 0 or last:
            save_state()
    bar.close()
    if losses:  # stopped between evaluations: evaluate the current draft too
        agreement = greedy_agreement(draft, held) if len(held) else None
        history.append(
            HistoryPoint(
                step=state["step"],
                loss=sum(losses) / len(losses),
                greedy_agreement=agreement,
                elapsed_s=elapsed_before + time.perf_counter() - t_train,
            )
        )
        score = agreement if agreement is not None else -history[-1].loss
        if score > best["agreement"]:
            best = {"step": state["step"], "agreement": score}
            _write_output(draft, out, tok_dir)
        save_state()
    if not (out / "model.safetensors").is_file():
        _write_output(draft, out, tok_dir)
    train_time_s = elapsed_before + time.perf_counter() - t_train
    best_point = next((h for h in history if h.step == best["step"]), history[-1] if history else None)
    report = DistillReport(
        out_dir=out,
        target=describe(target),
        num_parameters=draft.num_parameters,
        weights_bytes=(out / "model.safetensors").stat().st_size,
        steps=state["step"],
        train_tokens=train.num_positions,
        held_out_tokens=held.num_positions,
        tokens_seen=tokens_seen,
        final_loss=history[-1].loss if history else float("nan"),
        greedy_agreement=best_point.greedy_agreement if best_point else None,
        best_step=best["step"],
        data_time_s=data_time_s,
        train_time_s=train_time_s,
        stopped_by=stopped_by,
        history=history,
        config=cfg,
    )
    tmp = out / ".distill.json.tmp"
    tmp.write_text(report.model_dump_json(indent=2))
    os.replace(tmp, out / "distill.json")
    return report


def _batch_loss(draft: Decoder, batch: TeacherData, width: int, negatives: int, gen: torch.Generator) -> torch.Tensor:
    mask = batch.mask[:, :width]
    hidden = causal_hidden(draft, batch.tokens[:, :width])[mask]  # only positions with a teacher: [M, d]
    if negatives:
        ids, logp = batch.topk_ids[:, :width][mask], batch.topk_logp[:, :width][mask]
        return sampled_topk_kl(hidden, draft.lm_head.weight, ids, logp, negatives, gen)
    logits = draft.lm_head(hidden)[None]
    return topk_kl(
        logits, batch.topk_ids[:, :width][mask][None], batch.topk_logp[:, :width][mask][None], mask[mask][None]
    )


@torch.no_grad()
def greedy_agreement(draft: Decoder, data: TeacherData, batch_size: int = 16) -> float:
    """Fraction of masked positions where the draft's argmax equals the target's (its stored top-1)."""
    draft.eval()
    agree, total = 0, 0
    for start in range(0, len(data), batch_size):
        part = data.subset(torch.arange(start, min(start + batch_size, len(data))))
        width = min(int(part.mask.sum(dim=1).max()) + 1, part.tokens.shape[1])
        mask = part.mask[:, :width]
        pred = draft.lm_head(causal_hidden(draft, part.tokens[:, :width])[mask]).argmax(-1)
        agree += int((pred == part.topk_ids[:, :width, 0][mask]).sum())
        total += int(mask.sum())
    return agree / max(total, 1)


def _warm_start(draft: Decoder, source: Path) -> None:
    """Copy the weights of the draft checkpoint ``source`` into ``draft`` (same architecture, else DraftError)."""
    init = load_model(source, "init_from draft")
    if init.config.to_hf() != draft.config.to_hf():
        raise DraftError(
            f"init_from checkpoint {source} has a different architecture ({init.config.num_layers} layers x "
            f"{init.config.hidden_size}, vocab {init.config.vocab_size}) than the configured draft "
            f"({draft.config.num_layers} x {draft.config.hidden_size}, vocab {draft.config.vocab_size})"
        )
    draft.load_state_dict(init.state_dict())


def _write_output(draft: Decoder, out: Path, tok_dir: Path | None) -> None:
    save_model(draft, out)
    copy_tokenizer(tok_dir, out)


def _fingerprint(cfg: DistillConfig) -> str:
    """The config fields a resume must agree on (architecture, data, optimisation; not the budget)."""
    keep = cfg.model_dump(
        mode="json",
        exclude={
            "max_steps",
            "schedule_steps",
            "minutes",
            "resume",
            "progress",
            "threads",
            "eval_every",
            "checkpoint_every",
        },
    )
    return json.dumps(keep, sort_keys=True)


def build_data(target: Decoder, cfg: DistillConfig, data_dir: Path, tokenizer_dir: Path | None) -> TeacherData:
    """Build (or reload from ``data_dir`` shards) the distillation data described by ``cfg``."""
    from safetensors.torch import load_file, save_file

    data_dir.mkdir(parents=True, exist_ok=True)
    # cached shards are reused only for the data settings they were built with (more self_generate rows only
    # append batches: row i always uses the same prompt, temperature and seed)
    settings = cfg.model_dump(
        mode="json",
        include={
            "data_files",
            "max_windows_per_file",
            "prompts",
            "gen_tokens",
            "gen_batch_size",
            "temperatures",
            "seq_len",
            "teacher_top_k",
            "seed",
        },
    )
    stamp = data_dir / "settings.json"
    if stamp.is_file() and json.loads(stamp.read_text()) != settings:
        raise DraftError(
            f"the data cache {data_dir} was built with other data settings (prompts, files, generation or top-k); "
            "rerun without --resume to rebuild it"
        )
    tmp_stamp = data_dir / ".settings.json.tmp"
    tmp_stamp.write_text(json.dumps(settings, sort_keys=True))
    os.replace(tmp_stamp, stamp)
    parts: list[TeacherData] = []

    def cached(name: str, make) -> TeacherData:
        path = data_dir / f"{name}.safetensors"
        if path.is_file():
            try:
                return TeacherData.from_tensors(load_file(path), str(path))
            except DraftError:
                raise
            except Exception:  # a torn shard (killed mid-write cannot happen: rename) or foreign file: rebuild
                path.unlink()
        part = make()
        tmp = data_dir / f".{name}.tmp"
        save_file(part.tensors(), str(tmp))
        os.replace(tmp, path)
        return part

    tokenizer: Any = None
    if cfg.data_files or cfg.self_generate:
        if tokenizer_dir is None:
            raise DraftError("text data and prompts need the target's tokenizer: pass tokenizer_dir or a target dir")
        tokenizer = load_text_tokenizer(tokenizer_dir)
    if cfg.data_files:
        windows = text_windows(cfg.data_files, tokenizer, cfg.seq_len, cfg.max_windows_per_file)
        if not windows:
            raise DraftError(f"data files {[str(f) for f in cfg.data_files]} hold no text windows of >= 8 tokens")

        def score() -> TeacherData:
            with tqdm(total=len(windows), desc="teacher scores text", disable=not cfg.progress, unit="seq") as bar:
                return teacher_topk(target, windows, cfg.teacher_top_k, batch_size=cfg.gen_batch_size, progress=bar)

        parts.append(cached("files", score))
    if cfg.self_generate:
        prompt_ids = [tokenizer.encode(p).ids[-cfg.seq_len :] for p in cfg.prompts]
        n_prompts = len(prompt_ids)
        eos = target.config.eos_token_ids
        rows = list(range(cfg.self_generate))
        batches = [rows[i : i + cfg.gen_batch_size] for i in range(0, len(rows), cfg.gen_batch_size)]
        bar = tqdm(total=len(rows), desc="target generates", disable=not cfg.progress, unit="seq")
        for b, batch_rows in enumerate(batches):
            # row i: prompt i mod P; the first pass over the prompts uses temperatures[0], pass j temperatures[j]
            # (the last one repeats), so greedy rows are not duplicated
            temps = [cfg.temperatures[min(i // n_prompts, len(cfg.temperatures) - 1)] for i in batch_rows]
            prompts = [prompt_ids[i % n_prompts] for i in batch_rows]
            parts.append(
                cached(
                    f"gen-{b:05d}",
                    lambda prompts=prompts, temps=temps, b=b: self_generate(
                        target, prompts, temps, cfg.gen_tokens, cfg.teacher_top_k, cfg.seed * 1_000_003 + b, eos
                    ),
                )
            )
            bar.update(len(batch_rows))
        bar.close()
    return TeacherData.concat(parts)
