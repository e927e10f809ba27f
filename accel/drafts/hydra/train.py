"""Training Hydra heads by teacher distillation (the paper's best objective): for every head, cross-entropy from the
target's next-token distribution (its stored top-k, renormalised, restricted to the LM head's tokens) to the head's,
on target-written sequences with the target's hidden states (``accel.drafts.hydra.data``).

``train_hydra`` runs AdamW with warm-up and cosine decay in bfloat16 autocast, evaluates a held-out score every
``eval_every`` steps (the best heads are written to the output directory) and saves the whole state every
``checkpoint_every`` steps (``<out>/.hydra/state.pt``, atomically); ``resume`` continues it with the same batches.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from accel._io import check_output_path, writing
from accel.drafts.checkpoint import load_torch_state, restoring, save_torch_state
from accel.drafts.hydra.config import HydraHistoryPoint, HydraReport, HydraTrainConfig
from accel.drafts.hydra.data import ShardBatches
from accel.drafts.hydra.model import HydraHeads, save_hydra
from accel.errors import DraftError

__all__ = ["head_lookup", "hydra_loss", "train_hydra"]

STATE_DIR = ".hydra"


def head_lookup(heads: HydraHeads) -> torch.Tensor:
    """``[vocab]`` int64: a token's column in the heads' LM head, -1 where the head does not score it."""
    lookup = torch.full((heads.config.vocab_size,), -1, dtype=torch.int64)
    lookup[heads.token_ids] = torch.arange(len(heads.token_ids))
    return lookup


def hydra_loss(
    heads: HydraHeads, batch: dict[str, torch.Tensor], lookup: torch.Tensor
) -> tuple[torch.Tensor, list[float], list[float]]:
    """``(loss, ce per head, top-1 per head)`` on one batch (``ShardBatches`` dicts: tokens, mask, topk_ids,
    topk_logp, hidden). Head i at base position t is scored against the teacher at position t + i (the target's
    distribution of token t + i + 1); ``top1``: fraction of those positions where the head's argmax is the
    teacher's top-1 token. The loss is the sum of the heads' mean cross-entropies (nats)."""
    states = heads.teacher_forced(batch["hidden"], batch["tokens"])
    total = states[0].new_zeros((), dtype=torch.float32)
    ces, top1s = [], []
    for i, out in enumerate(states, start=1):
        sel = batch["mask"][:, i:]
        if not sel.any():
            continue
        col = lookup[batch["topk_ids"][:, i:][sel]]  # [M, k]
        p = torch.softmax(batch["topk_logp"][:, i:][sel], dim=-1) * (col >= 0)
        logp = torch.log_softmax((out[sel] @ heads.lm_weight.T.to(out.dtype)).float(), dim=-1)
        ce = -(p * logp.gather(-1, col.clamp(min=0))).sum(-1).mean()
        total = total + ce
        ces.append(float(ce.detach()))
        top1s.append(float((logp.argmax(-1) == col[:, 0]).float().mean()))
    return total, ces, top1s


class _HydraTraining:
    """One training run's state (module docstring)."""

    def __init__(self, heads: HydraHeads, batches: ShardBatches, cfg: HydraTrainConfig, out: Path, eval_fn) -> None:
        self.heads, self.batches, self.cfg, self.out, self.eval_fn = heads, batches, cfg, out, eval_fn
        self.state_path = out / STATE_DIR / "state.pt"
        params = [p for p in heads.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        self.lookup = head_lookup(heads)
        self.step = 0
        self.history: list[HydraHistoryPoint] = []
        self.best: dict[str, Any] = {"step": 0, "score": None}
        self.elapsed_before = 0.0
        self.t_start = time.perf_counter()
        self.losses: list[float] = []
        self.top1: list[list[float]] = []
        self.positions = 0

    def elapsed_s(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t_start

    def fingerprint(self) -> str:
        keep = self.cfg.model_dump(
            mode="json",
            exclude={"max_steps", "minutes", "resume", "progress", "threads", "eval_every", "checkpoint_every"},
        )
        return json.dumps({"heads": self.heads.config.model_dump(mode="json"), "train": keep}, sort_keys=True)

    def restore(self) -> None:
        saved = load_torch_state(self.state_path)
        if saved.get("config") != self.fingerprint():
            raise DraftError(
                f"cannot resume from {self.state_path}: it was written for other heads or training settings; "
                "start without resume (or delete that file)"
            )
        with restoring(self.state_path):
            self.heads.load_state_dict(saved["model"])
            self.opt.load_state_dict(saved["optimizer"])
            self.batches.load_state(saved["batches"])
            self.step = int(saved["step"])
            self.history = [HydraHistoryPoint(**h) for h in json.loads(saved["history"])]
            self.best = json.loads(saved["best"])
            self.elapsed_before = float(saved["elapsed_s"])
            self.positions = int(saved["positions"])

    def save(self) -> None:
        save_torch_state(
            {
                "model": self.heads.state_dict(),
                "optimizer": self.opt.state_dict(),
                "batches": self.batches.state(),
                "step": self.step,
                "history": json.dumps([h.model_dump() for h in self.history]),
                "best": json.dumps(self.best),
                "elapsed_s": self.elapsed_s(),
                "positions": self.positions,
                "config": self.fingerprint(),
            },
            self.state_path,
        )

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    def train_step(self) -> None:
        batch = self.batches.next()
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(self.step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, top1 = hydra_loss(self.heads, batch, self.lookup)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.heads.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.losses.append(float(loss.detach()))
        self.top1.append(top1)
        self.positions += int(batch["mask"].sum())

    def evaluate(self) -> HydraHistoryPoint:
        score = None
        if self.eval_fn is not None:
            self.heads.eval()
            with torch.no_grad():
                score = float(self.eval_fn(self.heads))
            self.heads.train()
        n = max(len(t) for t in self.top1) if self.top1 else 0
        top1 = [
            sum(t[i] for t in self.top1 if len(t) > i) / max(1, sum(len(t) > i for t in self.top1)) for i in range(n)
        ]
        point = HydraHistoryPoint(
            step=self.step,
            loss=sum(self.losses) / max(1, len(self.losses)),
            train_top1=top1,
            score=score,
            elapsed_s=self.elapsed_s(),
        )
        self.history.append(point)
        self.losses, self.top1 = [], []
        value = score if score is not None else -point.loss
        if self.best["score"] is None or value > self.best["score"]:
            self.best = {"step": self.step, "score": value}
            save_hydra(self.heads, self.out)
        return point

    def run(self) -> str:
        cfg = self.cfg
        self.t_start = time.perf_counter()
        stopped_by = "max_steps"
        bar = tqdm(total=cfg.max_steps, initial=self.step, desc="hydra heads", disable=not cfg.progress, unit="step")
        self.heads.train()
        while self.step < cfg.max_steps:
            if cfg.minutes and self.elapsed_s() > 60 * cfg.minutes:
                stopped_by = "minutes"
                break
            self.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{self.losses[-1]:.3f}", top1=",".join(f"{t:.2f}" for t in self.top1[-1]))
            if self.step % cfg.eval_every == 0 or self.step == cfg.max_steps:
                point = self.evaluate()
                bar.write(
                    f"step {point.step}: loss {point.loss:.3f}, train top-1 "
                    f"{[round(t, 3) for t in point.train_top1]}, held-out score {point.score}"
                )
            if self.step % cfg.checkpoint_every == 0 or self.step == cfg.max_steps:
                self.save()
        bar.close()
        if self.losses:
            self.evaluate()
            self.save()
        return stopped_by


def train_hydra(
    heads: HydraHeads,
    batches: ShardBatches,
    out_dir: str | Path,
    config: HydraTrainConfig | None = None,
    eval_fn: Callable[[HydraHeads], float] | None = None,
) -> HydraReport:
    """Train ``heads`` (attached to their target) on ``batches``; the best heads by ``eval_fn(heads)`` (higher is
    better; default: the lowest training loss) are written to ``out_dir`` (``save_hydra``). Returns a
    ``HydraReport``; the heads object ends with the last (not the best) weights."""
    cfg = config or HydraTrainConfig()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = check_output_path(out_dir, "the Hydra heads", DraftError, folder=True)
    with writing(out, "the Hydra heads", DraftError):
        out.mkdir(parents=True, exist_ok=True)
    for p in (heads.embed, heads.lm_weight):
        p.requires_grad_(False)
    run = _HydraTraining(heads, batches, cfg, out, eval_fn)
    if cfg.resume and run.state_path.is_file():
        run.restore()
    stopped_by = run.run()
    return HydraReport(
        out_dir=out,
        num_parameters=heads.num_parameters,
        steps=run.step,
        positions_seen=run.positions,
        best_step=run.best["step"],
        best_score=run.best["score"],
        train_time_s=run.elapsed_s(),
        stopped_by=stopped_by,
        history=run.history,
        config=cfg,
    )
