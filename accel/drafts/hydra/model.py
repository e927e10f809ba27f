"""Hydra heads in torch: ``HydraHeads`` (training, teacher-forced evaluation, and the reference the ONNX graphs are
tested against), ``build_hydra``, ``save_hydra`` / ``load_hydra``.

Notation: a base position ``t`` has the target's final-norm hidden state ``h_t``, which the target's LM head turns
into the distribution of ``x_{t+1}``. Head ``i`` reads ``concat(b_t, e(x_{t+1}), ..., e(x_{t+i}))`` -- ``b_t`` the
base state (``h_t``, or the Hydra++ prefix layer's output at ``t``), ``e`` the target's input embedding -- and
predicts ``x_{t+i+1}``. In speculative decoding ``x_{t+1}`` is the row's last token (known), and ``x_{t+2} ..`` are
the tokens speculated by the heads before: head ``i`` is conditioned on them (Medusa's heads are not).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from accel._io import output_folder
from accel.drafts.architecture import sorted_token_ids
from accel.drafts.hydra.config import HydraConfig
from accel.errors import AccelError, DraftError
from accel.models.config import ModelConfig
from accel.models.decoder import Block, Decoder, rope_inv_freq, rotate_half
from accel.models.loading import CHECKPOINT_FILES, _atomic_write, read_checkpoint_tensors

__all__ = ["HydraHeads", "ResBlock", "build_hydra", "load_hydra", "save_hydra", "target_fingerprint"]


class ResBlock(nn.Module):
    """``res(x) + silu(linear(x))``; ``res`` is the identity when the widths agree, else a Linear (the first block of
    a head, which reads the concatenation)."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width_in, width_out)
        self.res = nn.Linear(width_in, width_out) if width_in != width_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = x if self.res is None else self.res(x)
        return r + F.silu(self.linear(x))


class HydraHead(nn.Module):
    """Head ``i``: a ResBlock from ``(i + 1) x hidden`` to ``hidden``, then ``layers - 1`` ResBlocks of width
    ``hidden``, each with its own weights (the reference code's ``[ResBlock] * n`` repeated one object)."""

    def __init__(self, index: int, hidden: int, layers: int) -> None:
        super().__init__()
        widths = [(index + 1) * hidden] + [hidden] * layers
        self.blocks = nn.ModuleList(ResBlock(a, b) for a, b in itertools.pairwise(widths))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def target_fingerprint(target: Decoder) -> float:
    """Mean absolute value of the target's first 256 embedding rows (float64, rounded to 1e-9)."""
    return round(float(target.embed_tokens.weight.detach()[:256].double().abs().mean()), 9)


class HydraHeads(nn.Module):
    """The heads of a ``HydraConfig`` (see there and the module docstring), attached to their target.

    Persistent state (the checkpoint): ``heads.*``, ``prefix.*`` (Hydra++) and ``token_ids`` (the LM head's token
    ids, int64, sorted; all ids for a full head). The target's embedding and LM head rows are buffers outside the
    state dict (``attach``).
    """

    token_ids: torch.Tensor
    embed: torch.Tensor
    lm_weight: torch.Tensor
    inv_freq: torch.Tensor

    def __init__(self, config: HydraConfig) -> None:
        super().__init__()
        self.config = config
        self.target_config = ModelConfig.from_hf(config.target)
        tc = self.target_config
        hidden = config.hidden_size
        self.prefix = Block(tc) if config.prefix else None
        self.heads = nn.ModuleList(HydraHead(i, hidden, config.mlp_layers) for i in range(1, config.num_heads + 1))
        n = config.head_vocab or config.vocab_size
        self.register_buffer("token_ids", torch.arange(n, dtype=torch.int64))
        self.register_buffer("embed", torch.zeros(0, hidden), persistent=False)
        self.register_buffer("lm_weight", torch.zeros(0, hidden), persistent=False)
        self.register_buffer("inv_freq", rope_inv_freq(tc), persistent=False)

    # ------------------------------------------------------------------ target

    def attach(self, target: Decoder) -> HydraHeads:
        """Take the target's input embedding and LM head rows (at ``token_ids``); DraftError unless the target is the
        one the heads were built for (same config sizes and embedding fingerprint)."""
        tc, c = target.config, self.config
        if (tc.hidden_size, tc.vocab_size) != (c.hidden_size, c.vocab_size):
            raise DraftError(
                f"the heads were built for a target with hidden size {c.hidden_size} and vocabulary {c.vocab_size}; "
                f"this target has {tc.hidden_size} and {tc.vocab_size}"
            )
        if tc.head_vocab or tc.feature_size:
            raise DraftError("Hydra heads need a full target (not a restricted-head or feature draft)")
        fp = target_fingerprint(target)
        if not math.isclose(fp, c.target_fingerprint, rel_tol=1e-4, abs_tol=1e-9):
            raise DraftError(
                f"the heads were trained for another target (embedding fingerprint {c.target_fingerprint:.6g}, "
                f"this target's {fp:.6g})"
            )
        with torch.no_grad():
            self.embed = target.embed_tokens.weight.detach()
            self.lm_weight = target.lm_head.weight.detach()[self.token_ids].clone()
        return self

    def _check_attached(self) -> None:
        if self.embed.numel() == 0:
            raise DraftError("the heads have no target attached (HydraHeads.attach(target))")

    # ------------------------------------------------------------------ base states

    def base_states(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base states ``[B, L, H]`` of whole sequences of target states ``hidden [B, L, H]`` (positions 0..L-1):
        ``hidden`` itself, or (Hydra++) the prefix layer run causally over it."""
        hidden = hidden.float()  # stored bfloat16 states: the heads' weights are float32 (autocast handles training)
        if self.prefix is None:
            return hidden
        return causal_block(self.prefix, self.target_config, hidden, self.rope(hidden.shape[1], hidden.dtype))

    def rope(self, seq: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE ``(cos, sin)`` ``[1, 1, seq, head_dim]`` of positions ``0..seq-1``."""
        return rope_tables(self.inv_freq, torch.arange(seq)[None], dtype)

    def prefix_step(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prefix layer on new target states ``hidden [B, S, H]`` at ``position_ids [B, S]`` with its cache
        ``keys``/``values`` ``[B, H_kv, ctx, D]`` (position-indexed, docs/reference.md §2; -1 = padding); returns
        ``(base [B, S, H], keys, values)``. What the ONNX prefix graph computes."""
        if self.prefix is None:
            raise DraftError("these heads have no prefix layer (HydraConfig.prefix is False)")
        ctx = keys.shape[2]
        slots = torch.arange(ctx, dtype=position_ids.dtype)
        visible = (slots[None, None, :] <= position_ids[:, :, None])[:, None, None, :, :]
        rope = rope_tables(self.inv_freq, position_ids, hidden.dtype)
        return self.prefix(hidden, rope, position_ids, keys, values, visible, False)

    # ------------------------------------------------------------------ heads

    def head_state(self, index: int, base: torch.Tensor, path_embeds: torch.Tensor) -> torch.Tensor:
        """Head ``index``'s output state ``[..., H]`` from ``base [..., H]`` and ``path_embeds [..., index, H]``."""
        x = torch.cat([base, path_embeds.flatten(-2)], dim=-1)
        return self.heads[index - 1](x)

    def level_logp(self, index: int, base: torch.Tensor, path_ids: torch.Tensor) -> torch.Tensor:
        """Head ``index``'s log-probabilities ``[B, M, n]`` over its ``n`` LM-head tokens (``token_ids``) for ``M``
        paths per row: ``base [B, 1, H]``, ``path_ids [B, M, index]`` (token ids from the root on). What one ONNX
        level graph computes before its top-k."""
        self._check_attached()
        if path_ids.shape[-1] != index:
            raise DraftError(f"head {index} reads {index} path tokens; got paths of length {path_ids.shape[-1]}")
        out = self.head_state(index, base.expand(-1, path_ids.shape[1], -1), self.embed[path_ids])
        return torch.log_softmax((out @ self.lm_weight.T).float(), dim=-1)

    def teacher_forced(self, hidden: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Every head's output state along whole sequences: item ``i-1`` is ``[B, L - i, H]``, head ``i`` at base
        positions ``0 .. L-i-1`` reading the sequence's own tokens as its path (its prediction is of token
        ``t + i + 1``)."""
        self._check_attached()
        base = self.base_states(hidden)
        emb = self.embed[tokens].to(base.dtype)
        seq = tokens.shape[1]
        outs = []
        for i in range(1, min(self.config.num_heads, seq - 1) + 1):
            parts = [base[:, : seq - i]] + [emb[:, j : seq - i + j] for j in range(1, i + 1)]
            outs.append(self.heads[i - 1](torch.cat(parts, dim=-1)))
        return outs

    @property
    def num_parameters(self) -> int:
        """Trained parameters (the target's embedding and head are not counted)."""
        return sum(p.numel() for p in self.parameters())


def rope_tables(inv_freq: torch.Tensor, position_ids: torch.Tensor, dtype: torch.dtype):
    """RoPE ``(cos, sin)`` ``[B, 1, S, D]`` as ``Decoder.rope_tables``."""
    freqs = position_ids.to(torch.float32)[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def causal_block(block: Block, c: ModelConfig, x: torch.Tensor, rope) -> torch.Tensor:
    """One decoder block over whole sequences ``x [B, L, H]`` with causal attention (no cache): the same math as
    ``Block.forward`` at positions 0..L-1, with ``scaled_dot_product_attention`` (cheaper for training)."""
    att = block.self_attn
    bsz, seq, _ = x.shape
    h = block.input_layernorm(x)
    q = att.q_proj(h).view(bsz, seq, c.num_heads, c.head_dim).transpose(1, 2)
    k = att.k_proj(h).view(bsz, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
    v = att.v_proj(h).view(bsz, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
    cos, sin = rope
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    groups = c.num_heads // c.num_kv_heads
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + att.o_proj(out.transpose(1, 2).reshape(bsz, seq, c.num_heads * c.head_dim))
    return x + block.mlp(block.post_attention_layernorm(x))


def build_hydra(
    target: Decoder,
    *,
    num_heads: int = 4,
    mlp_layers: int = 1,
    prefix: bool = False,
    head_ids: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    seed: int = 0,
) -> HydraHeads:
    """New heads for ``target``, attached to it. ``head_ids``: the LM head's token ids (default: all).

    Initialisation: every head starts as the identity on the base state (the first block's residual projection is
    ``[I | 0 ..]``, every ``linear`` zero), so an untrained head predicts what the target predicts for the next
    token; the Hydra++ prefix layer is the target's last layer with ``o_proj`` and ``down_proj`` zeroed (it starts as
    the identity too, i.e. Hydra++ starts as the MLP heads). Deterministic in ``seed``.
    """
    tc = target.config
    if tc.head_vocab or tc.feature_size:
        raise DraftError("Hydra heads need a full target (not a restricted-head or feature draft)")
    ids = None if head_ids is None else sorted_token_ids(head_ids, tc.vocab_size)
    try:
        config = HydraConfig(
            num_heads=num_heads,
            mlp_layers=mlp_layers,
            prefix=prefix,
            head_vocab=0 if ids is None else len(ids),
            target=tc.to_hf(),
            target_fingerprint=target_fingerprint(target),
        )
    except ValueError as exc:
        raise DraftError(f"bad Hydra heads settings: {exc}") from exc
    torch.manual_seed(seed)
    heads = HydraHeads(config)
    hidden = tc.hidden_size
    with torch.no_grad():
        for head in heads.heads:
            assert isinstance(head, HydraHead)
            for block in head.blocks:
                assert isinstance(block, ResBlock)
                block.linear.weight.zero_()
                block.linear.bias.zero_()
                if block.res is not None:
                    eye = torch.zeros_like(block.res.weight)
                    eye[:, :hidden] = torch.eye(hidden)
                    block.res.weight.copy_(eye)
                    block.res.bias.zero_()
        if heads.prefix is not None:
            last = f"layers.{tc.num_layers - 1}."
            state = {k[len(last) :]: v for k, v in target.state_dict().items() if k.startswith(last)}
            heads.prefix.load_state_dict(state)
            heads.prefix.self_attn.o_proj.weight.zero_()
            heads.prefix.mlp.down_proj.weight.zero_()
        if ids is not None:
            heads.token_ids = ids.clone()
    return heads.attach(target)


def save_hydra(heads: HydraHeads, out_dir: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (atomically); returns the directory."""
    from safetensors.torch import save_file

    state = {
        k: v.detach().float().contiguous().clone() if v.is_floating_point() else v.clone()
        for k, v in heads.state_dict().items()
    }
    with output_folder(out_dir, "the Hydra heads", DraftError, CHECKPOINT_FILES) as out:
        _atomic_write(out / "model.safetensors", lambda p: save_file(state, str(p), metadata={"format": "pt"}))
        _atomic_write(out / "config.json", lambda p: Path(p).write_text(heads.config.model_dump_json(indent=2)))
    return out


def load_hydra(directory: str | Path, target: Decoder) -> HydraHeads:
    """The heads in ``directory`` (plain or MX-compressed safetensors, ``accel.formats``), attached to ``target``.

    DraftError naming the problem: no directory / config.json / weights, a config that is not a heads config,
    weights that do not match it or are not finite (NaN / ±Inf), or heads built for another target.
    """
    d = Path(directory)
    if not d.is_dir():
        raise DraftError(f"Hydra heads directory {d} does not exist")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise DraftError(f"Hydra heads directory {d} has no config.json")
    try:
        config = HydraConfig.model_validate(json.loads(cfg_path.read_text()))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DraftError(f"{cfg_path} is not a Hydra heads config: {exc}") from exc
    try:
        tensors = read_checkpoint_tensors(d)
    except AccelError as exc:
        raise DraftError(f"cannot read the Hydra heads weights in {d}: {exc}") from exc
    heads = HydraHeads(config)
    expected = heads.state_dict()
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise DraftError(f"{d}: weights do not match config.json: missing {missing[:4]}, unexpected {extra[:4]}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise DraftError(
                f"{d}: {name} has shape {tuple(t.shape)}; the config implies {tuple(expected[name].shape)}"
            )
    bad = [n for n, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise DraftError(
            f"{d}: {bad[0]} holds NaN or infinite weights ({len(bad)} tensor(s) do): the heads are damaged; "
            "train them again (accel distill-hydra)"
        )
    ids = tensors["token_ids"]
    if config.head_vocab:
        try:
            sorted_token_ids(ids, config.vocab_size)
        except DraftError as exc:
            raise DraftError(f"{d}: token_ids: {exc}") from exc
    heads.load_state_dict({k: v.to(expected[k].dtype) for k, v in tensors.items()})
    return heads.eval().attach(target)


def weights_bytes(directory: str | Path) -> int:
    """Bytes of the safetensors files in a heads directory."""
    return sum(os.path.getsize(f) for f in Path(directory).glob("*.safetensors"))
