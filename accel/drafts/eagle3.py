"""An EAGLE-3 head distilled by accel from its target (torch): the architecture speculators 0.9.0 defines, so the
speculators format can carry it (``accel.serving.speculators_write``) and vLLM's ``eagle3`` method can load it.

The head (Li et al. 2025; ``accel.serving.speculators_format`` has the details) reads, with the token ``x_{p+1}`` at
position ``p + 1``, the target's residual streams ``a_p`` entering the layers ``layer_ids`` at position ``p``:
``g = fc(a_p)``; one decoder layer attends with ``concat(input_layernorm(embed(x)), hidden_norm(g))`` (q/k/v take
``2 H`` inputs), adds the residual ``g``, then the Llama MLP; the final ``norm`` and ``lm_head`` give the draft's
distribution of ``x_{p+2}``. Attention is causal over the positions 1 .. p + 1 (never slot 0: EAGLE-3 reads no
``x_0``). The embedding is the target's, frozen; ``lm_head`` starts from the target's head and is trained.

Training (``distill_eagle3``): teacher-forced on token sequences, as speculators trains (its training-time test,
``ttt_steps``): step 0 reads the target's states; step t >= 1 reads, at every row, the head's own output of step
t - 1 in place of ``fc(a)`` and the next ground-truth token one position later, attending to step 0's rows up to its
own and to its own row of each later step (``Eagle3Draft.steps``: what drafting t tokens from that row computes).
The loss is the mean over steps of the cross-entropy against the target's next-token distribution (KL up to a
constant). Exactness of SpD does not depend on the training (every proposer's drafts are verified).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from accel.errors import DraftError
from accel.models.config import ModelConfig
from accel.models.decoder import MLP, Attention, Decoder, RMSNorm, new_cache, rope_inv_freq, rotate_half

__all__ = ["Eagle3Draft", "Eagle3TrainConfig", "default_layer_ids", "distill_eagle3", "target_aux_states"]


def default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """speculators' default target layers for EAGLE-3's three states: 2, the middle, and 3 before the end."""
    return (2, num_layers // 2, num_layers - 3) if num_layers >= 6 else (0, num_layers // 2, num_layers)


@dataclass(frozen=True)
class Eagle3TrainConfig:
    """How ``distill_eagle3`` trains.

    Attributes:
        layer_ids: the target layers whose entering residual streams the head reads (``0 .. num_layers``; default
            ``default_layer_ids``).
        steps: optimizer steps (one sequence each, cycling over the given sequences).
        lr: AdamW learning rate (cosine decay to 10% of it).
        batch: sequences per step (their gradients summed).
        seed: initialisation seed of the head's new weights.
        std: their initial standard deviation.
        train_head: train the LM head (it starts as the target's; False keeps it frozen, as EAGLE-1's).
        ttt_steps: drafting steps trained per row (speculators' training-time test: step t >= 1 drafts from the
            head's own previous state; 1 = the first step only).
    """

    layer_ids: tuple[int, ...] | None = None
    steps: int = 200
    lr: float = 1e-3
    batch: int = 1
    seed: int = 0
    std: float = 0.02
    train_head: bool = True
    ttt_steps: int = 3

    def resolved_layers(self, num_layers: int) -> tuple[int, ...]:
        """The layer ids to read; DraftError for ids outside ``0 .. num_layers``, repeated ids or no ids."""
        ids = default_layer_ids(num_layers) if self.layer_ids is None else tuple(int(i) for i in self.layer_ids)
        if not ids or len(set(ids)) != len(ids) or not all(0 <= i <= num_layers for i in ids):
            raise DraftError(f"EAGLE-3 layer_ids must be distinct layers in 0..{num_layers}; got {self.layer_ids!r}")
        for name in ("steps", "batch", "ttt_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DraftError(f"EAGLE-3 training {name} must be an int >= 1; got {value!r}")
        if not (isinstance(self.lr, (int, float)) and 0.0 < self.lr < 1.0):
            raise DraftError(f"EAGLE-3 training lr must be in (0, 1); got {self.lr!r}")
        return ids


class Eagle3Draft(nn.Module):
    """An EAGLE-3 head of one decoder layer for a target of ``target_config`` (module docstring)."""

    def __init__(self, target_config: ModelConfig, layer_ids: Sequence[int]) -> None:
        super().__init__()
        c = target_config
        if c.norm != "rms" or c.mlp != "gated" or c.positions != "rope" or c.qkv_bias or c.head_vocab:
            raise DraftError("an EAGLE-3 head is built for Llama-family targets (RMS norm, gated MLP, RoPE, no qkv "
                             "bias, full-vocabulary head)")  # fmt: skip
        self.config = dataclasses.replace(c, num_layers=1)
        self.layer_ids = tuple(int(i) for i in layer_ids)
        h, eps = c.hidden_size, c.norm_eps
        self.embed_tokens = nn.Embedding(c.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(len(self.layer_ids) * h, h, bias=False)
        self.input_layernorm, self.hidden_norm, self.post_attention_layernorm = (RMSNorm(h, eps) for _ in range(3))
        self.self_attn = Attention(c)
        for name, heads in (("q_proj", c.num_heads), ("k_proj", c.num_kv_heads), ("v_proj", c.num_kv_heads)):
            setattr(self.self_attn, name, nn.Linear(2 * h, heads * c.head_dim, bias=False))  # 2 H inputs
        self.mlp = MLP(c)
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, c.vocab_size, bias=False)
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", rope_inv_freq(c), persistent=False)  # the target's, scaling included

    @classmethod
    def for_target(cls, target: Decoder, layer_ids: Sequence[int], *, seed: int = 0, std: float = 0.02) -> Eagle3Draft:
        """A head for ``target``: its embedding and LM head copied, the other weights ~ N(0, std), norm gains 1."""
        head = cls(target.config, layer_ids)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in head.parameters():
                if p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
            head.embed_tokens.weight.copy_(target.embed_tokens.weight.float())
            head.lm_head.weight.copy_(target.lm_head.weight.float())
        return head

    def forward(self, aux: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[B, T, vocab]`` of the first drafting step: row q reads ``tokens[:, q]`` at position
        ``q + 1`` with the target states ``aux[:, q]`` of position q (``steps(aux, tokens, 1)[0]``)."""
        return self.steps(aux, tokens, 1)[0]

    def steps(self, aux: torch.Tensor, tokens: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Logits ``[B, T, vocab]`` of ``n`` drafting steps, teacher-forced as speculators' training-time test: row q
        of step t reads token ``tokens[:, q + t]`` (0 past the end) at position ``q + 1 + t`` with, at step 0, the
        target states ``aux[:, q]`` and later the head's own previous output (pre-norm) in place of ``fc(aux)``;
        it attends to step 0's rows 0..q and to its own row of every later step (what drafting from row q sees)."""
        bsz, length = tokens.shape
        g = self.fc(aux)
        past: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = []
        for t in range(n):
            ids = torch.cat([tokens[:, t:], tokens.new_zeros(bsz, t)], dim=1)
            pos = torch.arange(1 + t, 1 + t + length, device=tokens.device).expand(bsz, length)
            x = torch.cat([self.input_layernorm(self.embed_tokens(ids)), self.hidden_norm(g)], dim=-1)
            attn, kv = self._ttt_attention(x, pos, past)
            past.append(kv)
            h = g + attn
            g = h + self.mlp(self.post_attention_layernorm(h))
            out.append(self.lm_head(self.norm(g)))
        return out

    def _ttt_attention(
        self, x: torch.Tensor, pos: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One step's attention: causal over step 0's rows, plus the diagonal of every later step (``steps``)."""
        a, c = self.self_attn, self.config
        bsz, length, _ = x.shape
        groups = c.num_heads // c.num_kv_heads
        q = a.q_proj(x).view(bsz, length, c.num_heads, c.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(bsz, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(bsz, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        freqs = pos.float()[:, :, None] * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = emb.cos(), emb.sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        k0, v0 = past[0] if past else (k, v)
        scale = 1.0 / math.sqrt(c.head_dim)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        scores = [torch.where(causal, torch.matmul(q, k0.transpose(-1, -2)) * scale, torch.finfo(q.dtype).min)]
        later = [*past[1:], (k, v)] if past else []
        scores += [(q * ks).sum(-1, keepdim=True) * scale for ks, _ in later]
        probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
        o = torch.matmul(probs[..., :length], v0)
        for i, (_, vs) in enumerate(later):
            o = o + probs[..., length + i : length + i + 1] * vs
        o = o.transpose(1, 2).reshape(bsz, length, c.num_heads * c.head_dim)
        return a.o_proj(o), (k, v)

    def speculators_tensors(self) -> dict[str, np.ndarray]:
        """Float32 weights under speculators 0.9.0's EAGLE-3 names (one decoder layer, ``layers.0.*``)."""
        out = {"embed_tokens.weight": self.embed_tokens.weight, "fc.weight": self.fc.weight,
               "norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight}  # fmt: skip
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            out[f"layers.0.{name}.weight"] = getattr(self, name).weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"layers.0.self_attn.{name}.weight"] = getattr(self.self_attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"layers.0.mlp.{name}.weight"] = getattr(self.mlp, name).weight
        return {k: v.detach().float().cpu().numpy().copy() for k, v in out.items()}


def _ttt_loss(step_logits: list[torch.Tensor], probs: torch.Tensor) -> torch.Tensor:
    """Mean over the drafting steps of the cross-entropy against the target: row q of step t predicts the target's
    distribution ``probs[q + t]``; the last t rows of step t have none."""
    losses = []
    for t, logits in enumerate(step_logits):
        rows = probs.shape[0] - t
        if rows <= 0:
            break
        logp = F.log_softmax(logits[0, :rows].float(), dim=-1)
        losses.append(-(probs[t:] * logp).sum(-1).mean())
    return torch.stack(losses).mean()


def target_aux_states(target: Decoder, input_ids: torch.Tensor, layer_ids: Sequence[int]) -> torch.Tensor:
    """``[B, S, n H]``: the residual stream entering each target layer of ``layer_ids`` (the embedding for 0, the
    last layer's output before the final norm for ``num_layers``) at every position, one causal pass."""
    bsz, seq = input_ids.shape
    pos = torch.arange(seq, device=input_ids.device).expand(bsz, seq)
    keys, values = new_cache(target.config, bsz, seq, dtype=target.embed_tokens.weight.dtype)
    slots = torch.arange(seq, device=input_ids.device)
    visible = (slots[None, None, :] <= pos[:, :, None])[:, None, None]
    rope = target.rope_tables(pos, target.embed_tokens.weight.dtype)
    with torch.no_grad():
        x = target.embed(input_ids, pos)
        states = {0: x}
        for i, (layer, k, v) in enumerate(zip(target.blocks, keys, values, strict=True)):
            x, _, _ = layer(x, rope, pos, k, v, visible, False)
            states[i + 1] = x
    return torch.cat([states[i] for i in layer_ids], dim=-1).float()


def distill_eagle3(
    target: Decoder,
    sequences: Sequence[Sequence[int]],
    config: Eagle3TrainConfig | None = None,
    *,
    progress: bool = True,
) -> tuple[Eagle3Draft, list[float]]:
    """Train an EAGLE-3 head for ``target`` on token ``sequences`` (each >= 3 tokens; teacher-forced: row q reads
    token ``q + 1`` with the target's states at ``q`` and learns the target's distribution at ``q + 1``). Returns
    the head (eval mode) and the loss of every step (nats, cross-entropy against the target)."""
    cfg = config or Eagle3TrainConfig()
    layer_ids = cfg.resolved_layers(target.config.num_layers)
    seqs = [list(map(int, s)) for s in sequences]
    vocab = target.config.vocab_size
    if not seqs or any(len(s) < 3 for s in seqs):
        raise DraftError("distill_eagle3 needs token sequences of at least 3 tokens each")
    if any(not 0 <= t < vocab for s in seqs for t in s):
        raise DraftError(f"distill_eagle3: token ids must be in 0..{vocab - 1}")
    target = target.eval()
    data = []
    for s in seqs:  # the target's states and distributions, once
        ids = torch.tensor([s])
        with torch.no_grad():
            probs = torch.softmax(target.causal_forward(ids)[0, 1:].float(), dim=-1)
        data.append((target_aux_states(target, ids, layer_ids)[:, :-1], ids[:, 1:], probs))
    head = Eagle3Draft.for_target(target, layer_ids, seed=cfg.seed, std=cfg.std).train()
    head.lm_head.weight.requires_grad_(cfg.train_head)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps, eta_min=cfg.lr * 0.1)
    losses = []
    for step in tqdm(range(cfg.steps), desc="EAGLE-3 head", disable=not progress):
        opt.zero_grad()
        total = 0.0
        for j in range(cfg.batch):
            aux, ids, probs = data[(step * cfg.batch + j) % len(data)]
            loss = _ttt_loss(head.steps(aux, ids, cfg.ttt_steps), probs) / cfg.batch
            loss.backward()
            total += float(loss.detach())
        opt.step()
        sched.step()
        losses.append(total)
    return head.eval(), losses
