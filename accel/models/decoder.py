"""A compact decoder-only transformer (Llama family and GPT-2) with a position-indexed KV cache.

The cache contract is the one accelerator SDKs use (docs/reference.md §2): per layer fixed buffers
``[B, H_kv, ctx_len, D]``; a call writes its tokens' keys/values at ``position_ids`` and a query at position ``p``
attends to slots ``0..p``.
Slots beyond ``p`` may hold stale values from rejected speculative tokens: they are masked, and later overwritten.
Padding columns carry ``position_id = -1``: they write nothing and their outputs are garbage (finite).

Tree calls (docs/backends.md, "Tree calls") add ``slot_ids [B, S]`` (where each token's K/V are written; positions
then only drive RoPE, so siblings of a token tree can share one) and ``tree_mask [B, S, ctx]`` (the cache slots each
token attends to: its committed prefix, its ancestors and itself).

Module names follow Hugging Face's Llama naming (``embed_tokens``, ``layers.{i}.self_attn.q_proj``, ...), so a Llama
state dict maps 1:1 after dropping the ``model.`` prefix; GPT-2 weights are renamed by the loader.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from accel._legacy import Replaced, legacy_keywords
from accel.models.config import MASKED_LOGIT, ModelConfig
from accel.models.config import rope_inv_freq as _rope_inv_freq_np

__all__ = ["Block", "Decoder", "ExtraInputs", "WriteMode", "new_cache", "rope_inv_freq", "rotate_half", "write_cache"]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies ``[head_dim / 2]`` (float32), with Llama 3 or linear scaling applied."""
    return torch.from_numpy(_rope_inv_freq_np(config))


def new_cache(
    config: ModelConfig, batch_size: int, ctx_len: int, dtype: torch.dtype = torch.float32
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Zeroed KV cache: per layer ``[batch_size, num_kv_heads, ctx_len, head_dim]`` keys and values."""
    shape = (batch_size, config.num_kv_heads, ctx_len, config.head_dim)
    keys = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_layers)]
    values = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_layers)]
    return keys, values


#: how a call writes its K/V: False (functional, exportable), True (in place, -1 slots skipped), or "dense" (in
#: place, every column written: padding goes to the cache's last slot, a scratch slot no query sees; no data-dependent
#: shapes and no host sync, so CUDA graphs can capture it)
WriteMode = bool | Literal["dense"]


def write_cache(cache: torch.Tensor, new: torch.Tensor, position_ids: torch.Tensor, inplace: WriteMode) -> torch.Tensor:
    """Write ``new [B, H, S, D]`` into ``cache [B, H, ctx, D]`` at slots ``position_ids [B, S]``; -1 writes nothing.

    ``inplace=True`` uses index assignment (fast in eager torch). ``inplace=False`` is functional and made of
    standard ops (a one-hot ``[B, 1, ctx, S]`` matmul), so it exports to ONNX; it is exact because each slot
    receives one term and zeros (positions within a call must be distinct, which the callers guarantee).
    ``inplace="dense"``: every slot is in ``0 .. ctx - 1`` (the caller sent padding to a scratch slot).
    """
    if inplace == "dense":
        rows = torch.arange(cache.shape[0], device=cache.device)[:, None].expand_as(position_ids)
        cache[rows, :, position_ids, :] = new.transpose(1, 2).to(cache.dtype)  # [B, S, H, D] at (row, slot)
        return cache
    if inplace:
        rows, cols = torch.nonzero(position_ids >= 0, as_tuple=True)
        cache[rows, :, position_ids[rows, cols], :] = new[rows, :, cols, :].to(cache.dtype)
        return cache
    ctx = cache.shape[2]
    slots = torch.arange(ctx, device=cache.device, dtype=position_ids.dtype)
    onehot = (slots[None, :, None] == position_ids[:, None, :]).to(cache.dtype)  # [B, ctx, S]
    written = onehot.sum(dim=2)  # [B, ctx], 0 or 1
    keep = (1.0 - written)[:, None, :, None]
    return cache * keep + torch.matmul(onehot[:, None, :, :], new.to(cache.dtype))


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32 (as in Llama)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rms":
        return RMSNorm(config.hidden_size, config.norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation of the two halves of the last axis: ``concat(-x[D/2:], x[:D/2])``."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention over the position-indexed cache."""

    qkv_proj: nn.Linear  # after ``Block.fuse`` only (q_proj, k_proj, v_proj are then gone)

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        # the attention math (``attend``); a backend may swap in a kernel with the same contract
        self.attend: Callable[..., torch.Tensor] = attend

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        slots: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        visible: torch.Tensor,
        inplace: WriteMode,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention of ``x [B, S, hidden]``; K/V written at ``slots [B, S]`` (-1: nothing), queries see the cache
        slots where ``visible [B, 1, 1, S, ctx]`` holds."""
        bsz, seq, _ = x.shape
        if hasattr(self, "qkv_proj"):  # fused (``fuse``): one matmul, split
            nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split((nq, nkv, nkv), dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(bsz, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope  # [B, 1, S, D]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        k_cache = write_cache(k_cache, k, slots, inplace)
        v_cache = write_cache(v_cache, v, slots, inplace)
        out = self.attend(q, k_cache, v_cache, visible)
        out = out.transpose(1, 2).reshape(bsz, seq, self.num_heads * self.head_dim)
        return self.o_proj(out), k_cache, v_cache


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Attention of queries ``q [B, HQ, S, D]`` over the cache ``[B, HKV, ctx, D]`` (HQ a multiple of HKV) where
    ``visible [B, 1, 1, S, ctx]`` holds: scaled dot products in q's dtype, masked, a float32 softmax, then the
    weighted values; returns ``[B, HQ, S, D]``. (``Attention.attend``: a backend may set a kernel in its place.)"""
    bsz, num_heads, seq, head_dim = q.shape
    num_kv_heads, ctx = k_cache.shape[1], k_cache.shape[2]
    groups = num_heads // num_kv_heads
    # the G query heads of a KV head are stacked along the sequence axis:
    # [B, Hkv, G*S, D] x [B, Hkv, D, ctx] -> [B, Hkv, G*S, ctx]; no copy or repeat of the cache (a broadcast
    # matmul against an unsqueezed cache would materialise it G times per call)
    qg = q.reshape(bsz, num_kv_heads, groups * seq, head_dim)
    kc = k_cache.to(q.dtype)
    vc = v_cache.to(q.dtype)
    scores = torch.matmul(qg, kc.transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))
    scores = scores.view(bsz, num_kv_heads, groups, seq, ctx)
    scores = torch.where(visible, scores, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    probs = probs.view(bsz, num_kv_heads, groups * seq, ctx)
    return torch.matmul(probs, vc).reshape(bsz, num_heads, seq, head_dim)


def fuse_linears(names: tuple[str, ...], module: nn.Module, fused: str) -> None:
    """Replace ``module``'s Linear layers ``names`` (one input width) by one Linear ``fused`` whose output is their
    outputs concatenated, in that order; the old layers are removed (their weights are not kept twice)."""
    parts = [getattr(module, n) for n in names]
    w = torch.cat([p.weight.detach() for p in parts], dim=0)
    has_bias = parts[0].bias is not None
    layer = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
        if has_bias:
            layer.bias.copy_(torch.cat([p.bias.detach() for p in parts]))
    for n in names:
        delattr(module, n)
    setattr(module, fused, layer)


class MLP(nn.Module):
    """SwiGLU (``gated``) or GPT-2's two-layer MLP (``plain``)."""

    gate_up_proj: nn.Linear  # after ``Block.fuse`` only (gate_proj, up_proj are then gone)

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.gated = c.mlp == "gated"
        if self.gated:
            self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.silu = c.activation == "silu"

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x) if self.silu else F.gelu(x, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "gate_up_proj"):  # fused (``Block.fuse``)
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self._act(gate) * up)
        if self.gated:
            return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self._act(self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = _norm(config)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = _norm(config)
        self.mlp = MLP(config)

    def fuse(self) -> None:
        """Fuse q/k/v into one ``qkv_proj`` and (gated MLP) gate/up into one ``gate_up_proj``, in place: fewer,
        wider matmuls per token, the same values (each output is the same dot product). A fused block no longer has
        the Hugging Face layer names, so fuse only a model that is not exported or saved afterwards."""
        if not hasattr(self.self_attn, "qkv_proj"):
            fuse_linears(("q_proj", "k_proj", "v_proj"), self.self_attn, "qkv_proj")
        if self.mlp.gated and not hasattr(self.mlp, "gate_up_proj"):
            fuse_linears(("gate_proj", "up_proj"), self.mlp, "gate_up_proj")

    def forward(self, x, rope, slots, k_cache, v_cache, visible, inplace):
        attn, k_cache, v_cache = self.self_attn(
            self.input_layernorm(x), rope, slots, k_cache, v_cache, visible, inplace
        )
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_cache, v_cache


@dataclass(frozen=True)
class ExtraInputs:
    """The optional inputs of one ``Decoder`` call beyond tokens, positions and cache: a feature draft's ``features
    [B, S, feature_size]``, a tree call's ``slot_ids [B, S]`` and ``tree_mask [B, S, ctx]`` (bool; module docstring)
    and superposed inputs ``mix = (ids [B, S, M], weights [B, S, M])`` (``Decoder.embed``). None: not used."""

    features: torch.Tensor | None = None
    slot_ids: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None
    mix: tuple[torch.Tensor, torch.Tensor] | None = None


_NO_EXTRA = ExtraInputs()


def _legacy_extra(method: str, extra: ExtraInputs | None, legacy: dict[str, Any]) -> ExtraInputs | None:
    """``extra``, or the ``ExtraInputs`` built from the deprecated keywords ``legacy`` of ``Decoder.<method>``
    (``accel._legacy``: one ``DeprecationWarning`` naming them; unknown keywords, or both forms, a TypeError)."""
    if not legacy:
        return extra
    objects, _ = legacy_keywords(f"Decoder.{method}", legacy, [_EXTRA], {"extra": extra}, keep=())
    return objects["extra"]


_EXTRA = Replaced("extra", ExtraInputs, {f.name: f.name for f in fields(ExtraInputs)})


class Decoder(nn.Module):
    """Decoder-only transformer with a position-indexed KV cache.

    ``forward(input_ids [B,S], position_ids [B,S], past_keys, past_values, num_logits=None)`` returns
    ``(logits [B, N, V], new_keys, new_values)`` where N = num_logits (last N columns) or S.

    With ``config.head_vocab > 0`` the LM head is ``[head_vocab, hidden]`` and scores only the token ids in the
    persistent int64 buffer ``lm_head_token_ids`` (sorted, distinct); the logits stay full-vocabulary (``logits``).
    """

    # registered buffers and optional submodules, declared for type checkers (nn.Module resolves them dynamically)
    lm_head_token_ids: torch.Tensor
    inv_freq: torch.Tensor
    fc: nn.Linear
    embed_positions: nn.Embedding

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embed_width)
        if config.feature_size:  # feature draft: fc(concat(embed(token), target feature)) enters the layers
            self.fc = nn.Linear(config.embed_width + config.feature_size, config.hidden_size, bias=False)
        if config.positions == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = _norm(config)
        self.lm_head = nn.Linear(config.hidden_size, config.head_vocab or config.vocab_size, bias=False)
        if config.head_vocab:  # placeholder ids 0..head_vocab-1; the real ones come with the weights
            self.register_buffer("lm_head_token_ids", torch.arange(config.head_vocab, dtype=torch.int64))
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        if config.positions == "rope":
            self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def init_weights(self, seed: int = 0, std: float = 0.02) -> Decoder:
        """Deterministic random init (normal(0, std) matrices, unit norms, zero biases); returns self."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.ndim == 1:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    @property
    def blocks(self) -> list[Block]:
        """The transformer blocks, typed (``self.layers`` is an ``nn.ModuleList``)."""
        return list(self.layers)  # type: ignore[arg-type]

    def rope_tables(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """RoPE ``(cos, sin)`` tables ``[B, 1, S, head_dim]`` for ``position_ids [B, S]`` (None without RoPE)."""
        if self.config.positions != "rope":
            return None
        freqs = position_ids.to(torch.float32)[:, :, None] * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :, :]  # [B, 1, S, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def embed(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        features: torch.Tensor | None = None,
        mix: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Token (+ learned position) embeddings ``[B, S, hidden]``.

        A feature draft (``config.feature_size > 0``) needs ``features [B, S, feature_size]``: column ``s`` is the
        target's final-norm hidden state at position ``position_ids[s] - 1`` (the state that predicted this token;
        zeros at position 0), and the result is ``fc(concat(embed(token), feature))``.
        ``mix = (ids [B, S, M], weights [B, S, M])`` replaces each token embedding by ``sum_m weights * E[ids]``
        (superposed inputs, ``accel.superposed``; ``input_ids`` is then not read).
        """
        if mix is None:
            x = self.embed_tokens(input_ids)
        else:
            x = (self.embed_tokens(mix[0]) * mix[1].to(self.embed_tokens.weight.dtype)[..., None]).sum(dim=2)
        if self.config.positions == "learned":
            x = x + self.embed_positions(position_ids.clamp(min=0))
        fs = self.config.feature_size
        if fs:
            if features is None or tuple(features.shape) != (*input_ids.shape, fs):
                got = None if features is None else tuple(features.shape)
                raise ValueError(f"a feature draft needs features of shape {(*input_ids.shape, fs)}; got {got}")
            x = self.fc(torch.cat([x, features.to(x.dtype)], dim=-1))
        elif features is not None:
            raise ValueError("features given to a model without feature_size (not a feature draft)")
        return x

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        num_logits: int | None = None,
        inplace: bool = False,
        extra: ExtraInputs | None = None,
        **legacy: Any,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """``(logits [B, N, V], new_keys, new_values)``; see ``hidden_forward`` for the arguments."""
        extra = _legacy_extra("forward", extra, legacy)
        hidden, new_keys, new_values = self.hidden_forward(
            input_ids, position_ids, past_keys, past_values, inplace, extra
        )
        if num_logits is not None:
            hidden = hidden[:, -num_logits:, :]
        return self.logits(hidden), new_keys, new_values

    def hidden_forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        inplace: WriteMode = False,
        extra: ExtraInputs | None = None,
        **legacy: Any,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Final-norm hidden states ``[B, S, hidden]`` of every column (what the LM head reads), and the new cache.

        ``extra`` (``ExtraInputs``): a feature draft's ``features``, superposed ``mix`` inputs (both: see ``embed``),
        a tree call's ``slot_ids [B, S]`` and ``tree_mask [B, S, ctx]`` (bool; module docstring); without a tree the
        K/V of a token are written at its position and it sees slots ``0 .. position``.
        ``inplace="dense"`` (``WriteMode``): the cache's last slot is a scratch slot that padding columns write and no
        query may see (chain calls never do; a tree mask must hide it). Deprecated: ``features=``, ``slot_ids=``,
        ``tree_mask=``, ``mix=`` as keywords (use ``extra=ExtraInputs(...)``).
        """
        extra = _legacy_extra("hidden_forward", extra, legacy) or _NO_EXTRA
        slot_ids, tree_mask = extra.slot_ids, extra.tree_mask
        x = self.embed(input_ids, position_ids, extra.features, extra.mix)
        ctx = past_keys[0].shape[2]
        if (slot_ids is None) != (tree_mask is None):
            raise ValueError("a tree call needs both slot_ids and tree_mask")
        if tree_mask is not None and slot_ids is not None:
            slots = torch.where(position_ids >= 0, slot_ids, -1)
            visible = tree_mask.to(torch.bool)[:, None, None, :, :]
        else:
            cache_slots = torch.arange(ctx, device=x.device, dtype=position_ids.dtype)
            # visible[b, 0, 0, s, j] = slot j <= position of query s (nothing is visible to padding, p = -1)
            visible = (cache_slots[None, None, :] <= position_ids[:, :, None])[:, None, None, :, :]
            slots = position_ids
        if inplace == "dense":
            slots = torch.where(slots >= 0, slots, ctx - 1)
        rope = self.rope_tables(position_ids, x.dtype)
        new_keys, new_values = [], []
        for layer, k_cache, v_cache in zip(self.layers, past_keys, past_values, strict=True):
            x, k_cache, v_cache = layer(x, rope, slots, k_cache, v_cache, visible, inplace)
            new_keys.append(k_cache)
            new_values.append(v_cache)
        return self.norm(x), new_keys, new_values

    def stage_forward(
        self,
        position_ids: torch.Tensor,
        past_keys: list[torch.Tensor],
        past_values: list[torch.Tensor],
        *,
        layers: tuple[int, int],
        input_ids: torch.Tensor | None = None,
        hidden_in: torch.Tensor | None = None,
        inplace: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Layers ``[start, stop)`` only (a pipeline stage, ``accel.backends.stages``): the residual stream
        ``[B, S, hidden]`` after layer ``stop - 1`` (no norm), and the new cache of those layers.

        The first stage (``start == 0``) embeds ``input_ids``; a later one continues from ``hidden_in [B, S, hidden]``,
        an earlier stage's output. ``past_keys``/``past_values`` hold the stage's ``stop - start`` layers. Chained
        stages compute exactly what ``hidden_forward`` computes before its final norm (the same ops in the same order).
        """
        start, stop = layers
        if not 0 <= start < stop <= self.config.num_layers:
            raise ValueError(f"layers {layers} must satisfy 0 <= start < stop <= {self.config.num_layers}")
        if (input_ids is None) == (start == 0) or (hidden_in is None) == (start > 0):
            raise ValueError("the first stage takes input_ids, a later stage hidden_in (exactly one of them)")
        x = self.embed(input_ids, position_ids) if input_ids is not None else hidden_in
        assert x is not None
        ctx = past_keys[0].shape[2]
        slots = torch.arange(ctx, device=x.device, dtype=position_ids.dtype)
        visible = (slots[None, None, :] <= position_ids[:, :, None])[:, None, None, :, :]  # as in hidden_forward
        rope = self.rope_tables(position_ids, x.dtype)
        new_keys, new_values = [], []
        for layer, k_cache, v_cache in zip(self.blocks[start:stop], past_keys, past_values, strict=True):
            x, k_cache, v_cache = layer(x, rope, position_ids, k_cache, v_cache, visible, inplace)
            new_keys.append(k_cache)
            new_values.append(v_cache)
        return x, new_keys, new_values

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits ``[..., vocab_size]`` of final-norm hidden states ``[..., hidden_size]``.

        A restricted head (``head_vocab > 0``) scores its ``lm_head_token_ids``; every other token gets
        ``MASKED_LOGIT`` (clamped to the dtype's lowest finite value, e.g. -65504 in float16), so its probability
        is exactly 0 after softmax while the logits stay finite.
        """
        scored = self.lm_head(hidden)
        if not self.config.head_vocab:
            return scored
        fill = max(MASKED_LOGIT, torch.finfo(scored.dtype).min)
        full = scored.new_full((*scored.shape[:-1], self.config.vocab_size), fill)
        index = self.lm_head_token_ids.expand(*scored.shape[:-1], -1)
        return full.scatter(-1, index, scored)

    def causal_forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full-sequence logits ``[B, S, V]`` with plain causal attention and no cache (for training and checks)."""
        bsz, seq = input_ids.shape
        position_ids = torch.arange(seq, device=input_ids.device).expand(bsz, seq)
        keys, values = new_cache(self.config, bsz, seq, dtype=self.embed_tokens.weight.dtype)
        logits, _, _ = self.forward(input_ids, position_ids, keys, values)
        return logits

    @property
    def num_parameters(self) -> int:
        """Number of distinct parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())
