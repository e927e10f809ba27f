"""Early-exit heads: next-token logits from the residual stream after layer ``d`` of a target (for Predictive
Pipelined Decoding, ``accel.spd.ppd``, and any other early-exit use).

``ExitHead(target, layer, width)`` computes ``lm_head(norm(h + mlp(norm_in(h))))`` from the target's residual state
``h`` after ``layer`` layers: the target's own LM head (not copied, not trained), a trainable copy of its final norm,
and, with ``width > 0``, a pre-norm MLP adapter of that width shaped like the target's MLP (SwiGLU for Llama-family
models) whose output projection starts at zero. Untrained (or ``width = 0``) it is the plain "logit lens" of the
target's own final norm and head, which matches the final token poorly in the middle of a network; the adapter is
trained by distillation on the target's top-k next-token distributions (``accel.drafts.data``), like the drafts:
``train_exit_head``. Its quality for PPD is ``topk_agreement``: how often the target's greedy next token is among the
head's top k (the paper's match rate p).

The ONNX exporter writes the head into an exit stage graph (``export_onnx(..., stage=StageSpec(0, d, L,
exit_logits=True), exit_head=head)``: weights ``exit.*``); ``TorchBackend(..., stage=..., exit_head=head)`` runs it
in torch. ``save_exit_head`` / ``load_exit_head``: a directory with ``exit_head.safetensors`` (adapter and norm only)
and ``exit_head.json`` (layer, width, the target's shape, figures).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel._io import output_folder
from accel.drafts.loss import sampled_topk_kl, topk_kl
from accel.errors import AccelError, DraftError
from accel.models.decoder import MLP, Decoder, _norm, new_cache
from accel.models.loading import _read_safetensors

__all__ = [
    "ExitHead",
    "ExitTrainConfig",
    "exit_hidden",
    "load_exit_head",
    "save_exit_head",
    "shipped_exit_head",
    "topk_agreement",
    "train_exit_head",
]

WEIGHTS, CARD = "exit_head.safetensors", "exit_head.json"
SHIPPED = Path(__file__).resolve().parents[1] / "demo_data"


def shipped_exit_head(layer: int) -> Path:
    """The exit head for SmolLM2-135M after ``layer`` layers shipped with the package
    (``accel/demo_data/smollm2-exit-L{layer}``, built by ``examples/build_exit_head.py``); ``DraftError`` listing the
    shipped layers when there is none for ``layer``."""
    path = SHIPPED / f"smollm2-exit-L{layer}"
    if not (path / CARD).is_file():
        have = sorted(int(p.name.rsplit("L", 1)[1]) for p in SHIPPED.glob("smollm2-exit-L*") if (p / CARD).is_file())
        raise DraftError(f"no shipped exit head for layer {layer} (shipped: {have or 'none'}); pass a directory")
    return path


class ExitHead(nn.Module):
    """Next-token logits of the residual state after ``layer`` layers of ``target`` (see the module docstring).

    ``forward(h [..., hidden]) -> logits [..., vocab]``. The state dict holds only the head's own weights (``norm.*``
    and, with ``width > 0``, ``input_layernorm.*`` and ``mlp.*``); the LM head is the target's.
    """

    _target_lm_head: torch.Tensor | None  # the target's, not a parameter of the head
    _target_logits: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, target: Decoder, layer: int, width: int = 0) -> None:
        super().__init__()
        c = target.config
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer < c.num_layers:
            raise DraftError(f"exit layer must be an int in 1..{c.num_layers - 1} (the target has {c.num_layers})")
        if isinstance(width, bool) or not isinstance(width, int) or width < 0:
            raise DraftError(f"adapter width must be an int >= 0; got {width!r}")
        self.layer, self.width = layer, width
        self.norm = _norm(c)
        self.norm.load_state_dict(target.norm.state_dict())
        if width:
            self.input_layernorm = _norm(c)
            self.mlp = MLP(c.with_(intermediate_size=width))
            gen = torch.Generator().manual_seed(layer * 7919 + width)
            with torch.no_grad():
                for name, p in self.mlp.named_parameters():
                    if name.endswith("bias") or name.startswith("down_proj"):
                        p.zero_()  # starts as the plain exit (norm + head)
                    else:
                        p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
        self._target_logits = target.logits  # the target's head: a bound method, so not registered or saved
        # the head's weight, kept out of this module's parameters (object.__setattr__ skips nn.Module's registration)
        object.__setattr__(self, "_target_lm_head", None if c.head_vocab else target.lm_head.weight)
        for p in self.parameters():
            p.requires_grad_(False)

    def head_weight(self) -> torch.Tensor:
        """The target's LM head weight ``[vocab, hidden]`` (DraftError for a restricted head)."""
        if self._target_lm_head is None:
            raise DraftError("sampled training needs a full-vocabulary LM head; this target's is restricted")
        return self._target_lm_head.detach()

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: ``norm(h + mlp(norm_in(h)))`` of residual states ``[..., hidden]``."""
        x = hidden.to(next(self.parameters()).dtype)
        if self.width:
            x = x + self.mlp(self.input_layernorm(x))
        return self.norm(x)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` of residual states ``[..., hidden]`` after layer ``self.layer``."""
        return self._target_logits(self.normed(hidden))


@torch.no_grad()
def exit_hidden(target: Decoder, tokens: torch.Tensor, layer: int, *, batch_size: int = 16) -> torch.Tensor:
    """The residual states ``[N, L, hidden]`` (float32) after ``layer`` layers of ``target`` over ``tokens [N, L]``
    (positions 0..L-1, causal): what an exit head reads. Computed with the cached stage path of inference
    (``Decoder.stage_forward``), so it matches what a PPD decoder sees."""
    if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.numel() == 0:
        raise DraftError(f"tokens must be a non-empty 2-D integer tensor; got {tuple(tokens.shape)} {tokens.dtype}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= target.config.vocab_size:
        raise DraftError(f"token ids must be in [0, {target.config.vocab_size})")
    c = target.config
    parts = []
    for s in range(0, tokens.shape[0], batch_size):
        ids = tokens[s : s + batch_size]
        pos = torch.arange(ids.shape[1]).expand(ids.shape)
        keys, values = new_cache(c.with_(num_layers=layer), ids.shape[0], ids.shape[1])
        x, _, _ = target.stage_forward(pos, keys, values, layers=(0, layer), input_ids=ids, inplace=True)
        parts.append(x.float())
    return torch.cat(parts)


@torch.no_grad()
def topk_agreement(
    head: ExitHead, hidden: torch.Tensor, next_tokens: torch.Tensor, mask: torch.Tensor, ks: Sequence[int] = (1, 2, 3)
) -> dict[int, float]:
    """``{k: fraction}``: over positions where ``mask [N, L]`` holds, how often ``next_tokens [N, L]`` (the target's
    greedy next token) is among the head's top ``k`` logits at that position (``hidden [N, L, H]``)."""
    if not ks or min(ks) < 1:
        raise DraftError(f"ks must be positive integers; got {list(ks)}")
    rows = mask.nonzero(as_tuple=True)
    if len(rows[0]) == 0:
        raise DraftError("no masked positions to measure")
    hits = {k: 0 for k in ks}
    h, nxt = hidden[rows], next_tokens[rows]
    for s in range(0, h.shape[0], 1024):
        top = head(h[s : s + 1024]).topk(max(ks), dim=-1).indices
        found = top == nxt[s : s + 1024, None]
        for k in ks:
            hits[k] += int(found[:, :k].any(-1).sum())
    return {k: hits[k] / h.shape[0] for k in ks}


@dataclass(frozen=True)
class ExitTrainConfig:
    """Training of an exit head's adapter: AdamW (linear warm-up, cosine decay to 10%) on batches of
    ``batch_positions`` positions; ``max_seconds`` stops early; every ``eval_every`` steps ``eval_fn(head)`` scores
    the head (higher is better) and the best weights are kept. ``negatives > 0`` estimates the softmax normaliser
    from the batch's teacher tokens plus that many uniformly drawn ones (``accel.drafts.loss.sampled_topk_kl``,
    several times cheaper on a large vocabulary); 0 uses the full softmax."""

    steps: int = 600
    lr: float = 1e-3
    warmup: int = 50
    batch_positions: int = 1024
    weight_decay: float = 0.0
    eval_every: int = 100
    negatives: int = 0
    max_seconds: float | None = None
    seed: int = 0


def train_exit_head(
    head: ExitHead,
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logp: torch.Tensor,
    config: ExitTrainConfig = ExitTrainConfig(),
    *,
    eval_fn: Callable[[ExitHead], float] | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, float]]:
    """Train ``head`` (its norm and adapter; the LM head stays the target's) in place on positions with residual
    states ``hidden [M, H]`` and the target's top-k next-token log-probs ``topk_ids``/``topk_logp [M, k]``, with the
    truncated KL of ``accel.drafts.loss.topk_kl``. Returns the history (``step``, ``loss``, ``score``, ``seconds``)."""
    if hidden.ndim != 2 or topk_ids.shape[0] != hidden.shape[0] or topk_ids.shape != topk_logp.shape:
        raise DraftError("hidden [M, H] and topk_ids/topk_logp [M, k] must describe the same M positions")
    if config.steps < 1 or config.batch_positions < 1:
        raise DraftError(f"steps and batch_positions must be >= 1; got {config.steps}, {config.batch_positions}")
    head_weight = head.head_weight() if config.negatives else torch.empty(0)
    params = [p for p in head.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    steps = config.steps
    sched = _warmup_cosine(opt, steps, config.warmup)
    gen = torch.Generator().manual_seed(config.seed)
    history: list[dict[str, float]] = []
    best, best_state, t0, run = -math.inf, None, time.perf_counter(), math.nan
    ones = torch.ones(1, config.batch_positions, dtype=torch.bool)
    for step in range(steps):
        loss = _exit_batch_loss(head, hidden, topk_ids, topk_logp, config, gen, head_weight, ones)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        value = float(loss.detach())
        run = value if math.isnan(run) else 0.95 * run + 0.05 * value
        done = config.max_seconds is not None and time.perf_counter() - t0 > config.max_seconds
        if (step + 1) % config.eval_every == 0 or step + 1 == steps or done:
            score = math.nan
            if eval_fn is not None:
                head.eval()
                score = eval_fn(head)
                if score > best:
                    best, best_state = score, {k: v.detach().clone() for k, v in head.state_dict().items()}
            history.append({"step": step + 1, "loss": run, "score": score, "seconds": time.perf_counter() - t0})
            log(f"step {step + 1}: loss {run:.4f} score {score:.4f} ({history[-1]['seconds']:.0f} s)")
        if done:
            break
    for p in params:
        p.requires_grad_(False)
    if best_state is not None:
        head.load_state_dict(best_state)
    return history


def _warmup_cosine(opt: torch.optim.Optimizer, steps: int, warm: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warm`` steps, then cosine decay to 10% at ``steps``."""

    def lr_at(s: int) -> float:
        return min(1.0, (s + 1) / max(warm, 1)) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))

    return torch.optim.lr_scheduler.LambdaLR(opt, lr_at)


def _exit_batch_loss(
    head: ExitHead,
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logp: torch.Tensor,
    config: ExitTrainConfig,
    gen: torch.Generator,
    head_weight: torch.Tensor,
    ones: torch.Tensor,
) -> torch.Tensor:
    """Distillation loss on ``config.batch_positions`` positions drawn with ``gen`` (sampled softmax with negatives)."""
    idx = torch.randint(0, hidden.shape[0], (config.batch_positions,), generator=gen)
    if config.negatives:
        normed = head.normed(hidden[idx].float())
        return sampled_topk_kl(normed, head_weight, topk_ids[idx], topk_logp[idx], config.negatives, gen)
    return topk_kl(head(hidden[idx].float())[None], topk_ids[idx][None], topk_logp[idx][None], ones)


def _shape(target: Decoder) -> dict[str, int]:
    c = target.config
    return {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "num_layers": c.num_layers}


def save_exit_head(head: ExitHead, target: Decoder, path: str | Path, card: dict[str, Any] | None = None) -> Path:
    """Write ``head`` to the directory ``path`` (``exit_head.safetensors`` in fp16 storage + ``exit_head.json``)."""
    from safetensors.torch import save_file

    meta = {"layer": head.layer, "width": head.width, "target": _shape(target)}
    if set(card or {}) & set(meta):
        raise DraftError(f"the card's keys {sorted(set(card or {}) & set(meta))} are the head's own; rename them")
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    text = json.dumps({**meta, **(card or {})}, indent=1, sort_keys=True) + "\n"
    with output_folder(path, "the exit head", DraftError, (WEIGHTS, CARD)) as out:
        for name, write in ((WEIGHTS, lambda p: save_file(state, str(p))), (CARD, lambda p: p.write_text(text))):
            tmp = out / f".{name}.tmp"
            try:
                write(tmp)
                os.replace(tmp, out / name)
            finally:
                tmp.unlink(missing_ok=True)
    return out


def _read_card(path: Path) -> tuple[int, int, Any]:
    """(layer, width, target shape) of an exit head card; ``DraftError`` unless it is a JSON object whose ``layer``
    and ``width`` are JSON integers (``1.7``, ``"1"`` or ``true`` were truncated or cast before: another layer)."""
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise DraftError(f"{path}: bad exit head card (not JSON: {exc})") from exc
    if not isinstance(meta, dict) or "target" not in meta:
        raise DraftError(f"{path}: bad exit head card (a JSON object with layer, width and target)")
    for key in ("layer", "width"):
        if type(meta.get(key)) is not int:
            raise DraftError(f"{path}: bad exit head card ({key} must be a JSON integer; got {meta.get(key)!r})")
    return meta["layer"], meta["width"], meta["target"]


def load_exit_head(path: str | Path, target: Decoder) -> ExitHead:
    """The exit head saved at ``path`` for ``target``; ``DraftError`` when files are missing, truncated or not
    safetensors (accel's checked reader, ``accel.models.loading``), the head was trained for a target of another
    shape, or its tensors do not match its card or are not finite."""
    src = Path(path)
    if not (src / CARD).is_file() or not (src / WEIGHTS).is_file():
        raise DraftError(f"{src} is not an exit head directory (needs {CARD} and {WEIGHTS})")
    layer, width, shape = _read_card(src / CARD)
    if shape != _shape(target):
        raise DraftError(f"{src}: the exit head was trained for a target {shape}, not {_shape(target)}")
    try:
        head = ExitHead(target, layer, width)
    except AccelError as exc:  # a layer or width the target cannot have
        raise DraftError(f"{src / CARD}: {exc}") from exc
    try:
        state = _read_safetensors(src / WEIGHTS)
    except AccelError as exc:
        raise DraftError(f"cannot read the exit head {src / WEIGHTS}: {exc}") from exc
    want = head.state_dict()
    if set(state) != set(want) or any(state[k].shape != want[k].shape for k in want):
        raise DraftError(f"{src / WEIGHTS}: tensors {sorted(state)} do not match an exit head of width {width}")
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise DraftError(f"{src / WEIGHTS}: {bad[0]} holds NaN or infinite weights: the exit head is damaged")
    head.load_state_dict({k: v.float() for k, v in state.items()})
    return head.eval()
