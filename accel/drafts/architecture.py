"""The draft's architecture and a plain causal forward for training.

A draft is a small Llama-family ``Decoder`` with the target's vocabulary and RoPE settings. Its embedding can start as
the target's embedding projected onto its top ``d_model`` right-singular directions: with ``E_t ~ E_t V V^T`` the
draft's
(tied) output layer then scores tokens the way the target does for hidden states in that subspace.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from accel.drafts.config import DistillConfig
from accel.errors import DraftError
from accel.models.config import ModelConfig
from accel.models.decoder import Decoder, rotate_half

__all__ = ["build_draft", "causal_hidden", "causal_logits", "draft_config", "restrict_head", "sorted_token_ids"]


def draft_config(target: ModelConfig, cfg: DistillConfig) -> ModelConfig:
    """The draft's ``ModelConfig``: target vocabulary, special tokens and RoPE base; the sizes from ``cfg``."""
    return ModelConfig(
        model_type="llama",
        vocab_size=target.vocab_size,
        hidden_size=cfg.d_model,
        num_layers=cfg.layers,
        num_heads=cfg.heads,
        num_kv_heads=cfg.kv_heads or cfg.heads,
        intermediate_size=cfg.ffn or 4 * cfg.d_model,
        norm_eps=target.norm_eps if target.norm == "rms" else 1e-5,
        rope_theta=target.rope_theta if target.positions == "rope" else 10000.0,
        max_position_embeddings=target.max_position_embeddings,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=target.bos_token_id,
        eos_token_id=target.eos_token_id,
    )


def build_draft(target: Decoder, cfg: DistillConfig) -> Decoder:
    """A freshly initialised draft for ``target`` (deterministic in ``cfg.seed``)."""
    model = Decoder(draft_config(target.config, cfg)).init_weights(seed=cfg.seed)
    if cfg.init_embeddings == "svd":
        with torch.no_grad():
            emb = svd_embedding(target.embed_tokens.weight.detach().float(), cfg.d_model)
            model.embed_tokens.weight.copy_(emb)
            if not cfg.tie_embeddings:
                head = target.lm_head.weight.detach().float()
                model.lm_head.weight.copy_(svd_embedding(head, cfg.d_model))
    return model


def svd_embedding(weight: torch.Tensor, d: int) -> torch.Tensor:
    """``weight [V, D]`` projected onto its top ``d`` right-singular vectors, ``[V, d]`` (exact PCA without centring;
    computed from the ``D x D`` Gram matrix, so it costs O(V D^2)). Zero-pads when ``d > D``."""
    w = weight.double()
    vocab, dim = w.shape
    evals, evecs = torch.linalg.eigh(w.T @ w)  # ascending
    top = evecs[:, torch.argsort(evals, descending=True)[: min(d, dim)]]
    # fix the sign of each direction (eigh's sign is arbitrary): largest |coefficient| positive
    signs = torch.sign(top[top.abs().argmax(dim=0), torch.arange(top.shape[1])])
    proj = w @ (top * signs)
    if d > dim:
        proj = torch.cat([proj, torch.zeros(vocab, d - dim, dtype=proj.dtype)], dim=1)
    return proj.float()


def causal_hidden(model: Decoder, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
    """Final-norm hidden states ``[B, S, hidden]`` of a plain causal pass (no KV cache; positions 0..S-1).

    Same weights and math as ``Decoder.causal_forward`` but with ``F.scaled_dot_product_attention(is_causal=True)``,
    which is several times cheaper for training (equal up to float32 rounding; tested).
    """
    c = model.config
    bsz, seq = input_ids.shape
    pos = torch.arange(seq, device=input_ids.device).expand(bsz, seq)
    x = model.embed(input_ids, pos, features)
    rope = model.rope_tables(pos, x.dtype)
    groups = c.num_heads // c.num_kv_heads
    for layer in model.blocks:
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = att.q_proj(h).view(bsz, seq, c.num_heads, c.head_dim).transpose(1, 2)
        k = att.k_proj(h).view(bsz, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = att.v_proj(h).view(bsz, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + att.o_proj(out.transpose(1, 2).reshape(bsz, seq, c.num_heads * c.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


def causal_logits(model: Decoder, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, S, V]`` of a plain causal pass (see ``causal_hidden``); full-vocabulary for a restricted head."""
    return model.logits(causal_hidden(model, input_ids))


def restrict_head(model: Decoder, token_ids: Sequence[int] | np.ndarray | torch.Tensor) -> Decoder:
    """A copy of ``model`` whose LM head scores only ``token_ids`` (``head_vocab = len(token_ids)``, untied).

    Every other weight is copied; the head keeps the source head's rows at the sorted ids (for a tied source, the
    embedding rows), so at those ids the logits equal the source's and elsewhere they are ``MASKED_LOGIT``.
    ``token_ids`` are distinct ids in ``[0, vocab_size)`` in any order, fewer than ``vocab_size``; ``DraftError``
    otherwise. The head's cost per token drops from ``vocab_size * hidden`` to ``head_vocab * hidden`` MACs.
    """
    cfg = model.config
    ids = sorted_token_ids(token_ids, cfg.vocab_size)
    if cfg.head_vocab:  # already restricted: the kept ids must be a subset of the scored ones
        have = model.lm_head_token_ids.cpu()
        pos = torch.searchsorted(have, ids)
        if bool((pos >= len(have)).any()) or not torch.equal(have[pos.clamp(max=len(have) - 1)], ids):
            raise DraftError("token_ids include ids the model's restricted head does not score")
        rows = pos
    else:
        rows = ids
    out = Decoder(cfg.with_(head_vocab=len(ids), tie_word_embeddings=False))
    state = {k: v for k, v in model.state_dict().items() if k not in ("lm_head.weight", "lm_head_token_ids")}
    weight = model.lm_head.weight.detach()
    state["lm_head.weight"] = weight[rows.to(weight.device)].clone()
    state["lm_head_token_ids"] = ids
    out.load_state_dict(state, strict=True)
    return out.to(device=weight.device, dtype=weight.dtype).train(model.training)


def sorted_token_ids(token_ids: Sequence[int] | np.ndarray | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``token_ids`` as a sorted int64 tensor; DraftError unless they are distinct ints in ``[0, vocab_size)``."""
    t = token_ids.detach().cpu() if isinstance(token_ids, torch.Tensor) else torch.as_tensor(np.asarray(token_ids))
    if t.ndim != 1 or t.numel() == 0:
        raise DraftError(f"token_ids must be a non-empty 1-D sequence; got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise DraftError(f"token_ids must be integers; got dtype {t.dtype}")
    ids = torch.sort(t.to(torch.int64)).values
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise DraftError(f"token_ids must be in [0, {vocab_size}); got min {int(ids[0])}, max {int(ids[-1])}")
    if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise DraftError("token_ids contain repeated ids")
    if len(ids) >= vocab_size:
        raise DraftError(f"token_ids keep all {vocab_size} tokens; a restricted head must keep fewer than vocab_size")
    return ids
