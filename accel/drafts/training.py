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

from accel._io import check_output_path, writing
from accel.drafts.architecture import build_draft, causal_hidden, draft_config
from accel.drafts.checkpoint import (
    copy_tokenizer,
    describe,
    load_model,
    load_torch_state,
    restoring,
    save_model,
    save_torch_state,
)
from accel.drafts.config import DistillConfig, DistillReport, HistoryPoint
from accel.drafts.data import TeacherData, split_rows
from accel.drafts.distill_data import build_data
from accel.drafts.loss import sampled_topk_kl, topk_kl
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["build_data", "distill"]  # build_data: accel.drafts.distill_data

_WORK = ".distill"
_WHAT = "the draft"  # what distill's output errors say it was writing


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
    out = check_output_path(out_dir, _WHAT, DraftError, folder=True)  # before anything is read or trained
    work = out / _WORK
    tok_dir = Path(tokenizer_dir) if tokenizer_dir else (None if isinstance(target, Decoder) else Path(target))
    target_model = load_model(target, "target")
    draft_config(target_model.config, cfg)  # the draft's sizes are checked before anything is written
    if not cfg.resume and work.exists():
        shutil.rmtree(work)
    new_out = not out.exists()
    with writing(out, _WHAT, DraftError):
        work.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    try:
        data = build_data(target_model, cfg, work / "data", tok_dir)
    except DraftError:  # bad data (none, unreadable, too short): leave no folder behind (an interrupt keeps it)
        if new_out or not cfg.resume:  # a refused --resume keeps the cached data and training state it refused
            shutil.rmtree(out if new_out else work, ignore_errors=True)
        raise
    data_time_s = time.perf_counter() - t0
    train_rows, held_rows = split_rows(len(data), cfg.held_out_fraction, cfg.seed)
    if len(train_rows) == 0:
        raise DraftError(f"no training rows left after holding out {cfg.held_out_fraction:.0%} of {len(data)}")

    torch.manual_seed(cfg.seed)
    draft = build_draft(target_model, cfg)
    if cfg.init_from is not None:
        _warm_start(draft, cfg.init_from)
    del target_model
    run = _Training(draft, data.subset(train_rows), data.subset(held_rows), cfg, work / "state.pt", out, tok_dir)
    if cfg.resume and run.state_path.is_file():
        run.restore()
    stopped_by = run.run()
    if not (out / "model.safetensors").is_file():
        _write_output(draft, out, tok_dir)
    report = run.report(describe(target), data_time_s, stopped_by)
    _write_report(out, report)
    return report


def _write_report(out: Path, report: DistillReport) -> None:
    """``out/distill.json``, through a temp file and a rename (``DraftError`` when it cannot be written)."""
    tmp = out / ".distill.json.tmp"
    with writing(out, "the distill report", DraftError):
        try:
            tmp.write_text(report.model_dump_json(indent=2))
            os.replace(tmp, out / "distill.json")
        finally:
            tmp.unlink(missing_ok=True)


class _Training:
    """One distill training run: the optimizer, the data order, the history and the best draft so far.

    ``run`` trains until ``max_steps`` or the ``minutes`` budget, evaluating every ``eval_every`` steps (the best
    draft by held-out greedy agreement is written to ``out``) and saving the whole state every ``checkpoint_every``
    steps; ``restore`` continues a saved run with the same batches as an uninterrupted one.
    """

    def __init__(
        self,
        draft: Decoder,
        train: TeacherData,
        held: TeacherData,
        cfg: DistillConfig,
        state_path: Path,
        out: Path,
        tok_dir: Path | None,
    ) -> None:
        self.draft, self.train, self.held, self.cfg = draft, train, held, cfg
        self.state_path, self.out, self.tok_dir = state_path, out, tok_dir
        self.opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
        self.batch_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.step, self.cursor = 0, 0
        self.order = torch.randperm(len(train), generator=self.batch_gen)
        self.history: list[HistoryPoint] = []
        self.best: dict[str, Any] = {"step": 0, "agreement": -1.0}
        self.elapsed_before = 0.0
        self.t_start = time.perf_counter()
        self.losses: list[float] = []
        self.tokens_seen = 0

    def elapsed_s(self) -> float:
        """Training seconds so far, earlier (resumed) runs included."""
        return self.elapsed_before + time.perf_counter() - self.t_start

    def restore(self) -> None:
        """Continue from the saved state (DraftError when it was written with another configuration)."""
        saved = load_torch_state(self.state_path)
        if saved.get("config") != _fingerprint(self.cfg):
            raise DraftError(
                f"cannot resume from {self.state_path}: it was written with a different architecture/data config; "
                "rerun without --resume to start over (or delete that file to train afresh on the cached data)"
            )
        with restoring(self.state_path):
            self.draft.load_state_dict(saved["model"])
            self.opt.load_state_dict(saved["optimizer"])
            self.batch_gen.set_state(saved["rng"])
            self.step, self.order, self.cursor = int(saved["step"]), saved["order"], int(saved["cursor"])
            self.history = [HistoryPoint(**h) for h in json.loads(saved["history"])]
            self.best = json.loads(saved["best"])
            self.elapsed_before = float(saved["elapsed_s"])

    def save(self) -> None:
        """Save model, optimizer, data order and history atomically."""
        state = {
            "model": self.draft.state_dict(),
            "optimizer": self.opt.state_dict(),
            "rng": self.batch_gen.get_state(),
            "step": self.step,
            "order": self.order,
            "cursor": self.cursor,
            "history": json.dumps([h.model_dump() for h in self.history]),
            "best": json.dumps(self.best),
            "elapsed_s": self.elapsed_s(),
            "config": _fingerprint(self.cfg),
        }
        save_torch_state(state, self.state_path)

    def next_rows(self) -> torch.Tensor:
        """The next batch's training rows: the shuffled order, reshuffled at the end of each epoch."""
        rows: list[int] = []
        while len(rows) < self.cfg.batch_size:
            if self.cursor >= len(self.train):
                self.order = torch.randperm(len(self.train), generator=self.batch_gen)
                self.cursor = 0
            take = min(self.cfg.batch_size - len(rows), len(self.train) - self.cursor)
            rows.extend(self.order[self.cursor : self.cursor + take].tolist())
            self.cursor += take
        return torch.tensor(rows)

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 10% over ``schedule_steps`` (default ``max_steps``)."""
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, (cfg.schedule_steps or cfg.max_steps) - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    def train_step(self) -> None:
        """One optimizer step on the next batch."""
        batch = self.train.subset(self.next_rows())
        width = min(int(batch.mask.sum(dim=1).max()) + 1, batch.tokens.shape[1])
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(self.step)
        loss = _batch_loss(self.draft, batch, width, self.cfg.softmax_negatives, self.batch_gen)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.losses.append(loss.item())
        self.tokens_seen += int(batch.mask.sum())

    def evaluate(self) -> HistoryPoint:
        """Record a history point (mean loss since the last one, held-out agreement); keep the best draft."""
        agreement = greedy_agreement(self.draft, self.held) if len(self.held) else None
        point = HistoryPoint(
            step=self.step,
            loss=sum(self.losses) / len(self.losses),
            greedy_agreement=agreement,
            elapsed_s=self.elapsed_s(),
        )
        self.history.append(point)
        self.losses = []
        score = agreement if agreement is not None else -point.loss
        if score > self.best["agreement"]:
            self.best = {"step": self.step, "agreement": score}
            _write_output(self.draft, self.out, self.tok_dir)
        self.draft.train()
        return point

    def run(self) -> str:
        """Train until ``max_steps`` or the time budget; returns what stopped it (``max_steps`` or ``minutes``)."""
        cfg = self.cfg
        self.t_start = time.perf_counter()
        stopped_by = "max_steps"
        bar = tqdm(total=cfg.max_steps, initial=self.step, desc="distill", disable=not cfg.progress, unit="step")
        self.draft.train()
        while self.step < cfg.max_steps:
            if cfg.minutes and self.elapsed_s() > 60 * cfg.minutes:
                stopped_by = "minutes"
                break
            self.train_step()
            bar.update(1)
            last = self.step == cfg.max_steps
            if self.step % cfg.eval_every == 0 or last:
                point = self.evaluate()
                agree = f"{point.greedy_agreement:.3f}" if point.greedy_agreement is not None else "-"
                bar.set_postfix(loss=f"{point.loss:.3f}", agree=agree)
            if self.step % cfg.checkpoint_every == 0 or last:
                self.save()
        bar.close()
        if self.losses:  # stopped between evaluations: evaluate the current draft too
            self.evaluate()
            self.save()
        return stopped_by

    def report(self, target: str, data_time_s: float, stopped_by: str) -> DistillReport:
        """The run's ``DistillReport`` (after ``run``)."""
        best_point = next((h for h in self.history if h.step == self.best["step"]), None)
        best_point = best_point or (self.history[-1] if self.history else None)
        return DistillReport(
            out_dir=self.out,
            target=target,
            num_parameters=self.draft.num_parameters,
            weights_bytes=(self.out / "model.safetensors").stat().st_size,
            steps=self.step,
            train_tokens=self.train.num_positions,
            held_out_tokens=self.held.num_positions,
            tokens_seen=self.tokens_seen,
            final_loss=self.history[-1].loss if self.history else float("nan"),
            greedy_agreement=best_point.greedy_agreement if best_point else None,
            best_step=self.best["step"],
            data_time_s=data_time_s,
            train_time_s=self.elapsed_s(),
            stopped_by=stopped_by,
            history=self.history,
            config=self.cfg,
        )


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
