"""An EAGLE-3 head distilled by accel from its target (torch): the architecture speculators 0.9.0 defines, so the
speculators format can carry it (``accel.serving.speculators_write``) and vLLM's ``eagle3`` method can load it.

The head (Li et al. 2025; ``accel.serving.speculators_format`` has the details) reads, with the token ``x_{p+1}`` at
position ``p + 1``, the target's residual streams ``a_p`` entering the layers ``layer_ids`` at position ``p``:
``g = fc(a_p)``; one decoder layer attends with ``concat(input_layernorm(embed(x)), hidden_norm(g))`` (q/k/v take
``2 H`` inputs), adds the residual ``g``, then the Llama MLP; the final ``norm`` and ``lm_head`` give the draft's
distribution of ``x_{p+2}``. Attention is causal over the positions 1 .. p + 1 (never slot 0: EAGLE-3 reads no
``x_0``). The embedding is the target's, frozen; ``lm_head`` starts from the target's head and is trained.

Training (``distill_eagle3``): teacher-forced on token sequences, the loss is the cross-entropy of the draft's
distribution against the target's next-token distribution at every row (KL up to a constant). Only EAGLE-3's first
step is trained: its training-time-test steps (the head drafting from its own state, speculators' ``ttt_steps``) are
not, so drafts after the first come from a state the head was not trained on and are accepted less often than a
TTT-trained head's. Exactness of SpD does not depend on it (every proposer's drafts are verified).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from accel.errors import DraftError
from accel.models.config import ModelConfig
from accel.models.decoder import MLP, Attention, Decoder, RMSNorm, new_cache

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
    """

    layer_ids: tuple[int, ...] | None = None
    steps: int = 200
    lr: float = 1e-3
    batch: int = 1
    seed: int = 0
    std: float = 0.02
    train_head: bool = True

    def resolved_layers(self, num_layers: int) -> tuple[int, ...]:
        """The layer ids to read; DraftError for ids outside ``0 .. num_layers``, repeated ids or no ids."""
        ids = default_layer_ids(num_layers) if self.layer_ids is None else tuple(int(i) for i in self.layer_ids)
        if not ids or len(set(ids)) != len(ids) or not all(0 <= i <= num_layers for i in ids):
            raise DraftError(f"EAGLE-3 layer_ids must be distinct layers in 0..{num_layers}; got {self.layer_ids!r}")
        for name in ("steps", "batch"):
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
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv.float(), persistent=False)

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

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[B, S, vocab]`` of tokens ``input_ids [B, S]`` at ``position_ids`` (>= 1, increasing) with
        the target states ``aux [B, S, n H]`` of the positions before them."""
        bsz = input_ids.shape[0]
        g = self.fc(aux)
        x = torch.cat([self.input_layernorm(self.embed_tokens(input_ids)), self.hidden_norm(g)], dim=-1)
        freqs = position_ids.float()[:, :, None] * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        ctx = int(position_ids.max()) + 1
        keys, values = new_cache(self.config, bsz, ctx, dtype=x.dtype)
        slots = torch.arange(ctx, device=x.device)
        visible = (slots[None, None, :] <= position_ids[:, :, None]) & (slots >= 1)
        attn, _, _ = self.self_attn(x, (emb.cos(), emb.sin()), position_ids, keys[0], values[0],
                                    visible[:, None, None], False)  # fmt: skip
        h = g + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return self.lm_head(self.norm(h))

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
            pos = torch.arange(1, ids.shape[1] + 1)[None]
            logp = F.log_softmax(head(aux, ids, pos)[0].float(), dim=-1)
            loss = -(probs * logp).sum(-1).mean() / cfg.batch
            loss.backward()
            total += float(loss.detach())
        opt.step()
        sched.step()
        losses.append(total)
    return head.eval(), losses
