"""Tensor-name mapping between Hugging Face checkpoints and ``Decoder`` state dicts (both directions).

Llama family (llama, mistral, qwen2): HF names are ours with a ``model.`` prefix (``lm_head.weight`` has none).
GPT-2: HF uses ``Conv1D`` layers whose weight is ``[in, out]`` (transposed vs ``nn.Linear``) and a fused
``attn.c_attn`` projection ``[in, 3 * hidden]`` (columns q | k | v); we keep separate q/k/v ``Linear`` layers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accel.errors import ModelError
from accel.models.config import ModelConfig

if TYPE_CHECKING:  # torch is needed only for GPT-2's fused projection (a Llama-family rename is torch-free)
    import torch

__all__ = ["HEAD_IDS", "HF_HEAD_IDS", "IGNORED_HF_SUFFIXES", "accel_to_hf", "hf_to_accel"]

#: tensors some HF checkpoints carry that are not weights (recomputed buffers); dropped silently
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq", ".attn.masked_bias")
#: a restricted LM head's token ids (``head_vocab > 0``): checkpoint name -> ``Decoder`` buffer name
HF_HEAD_IDS, HEAD_IDS = "lm_head.token_ids", "lm_head_token_ids"
_GPT2_ATTN_MASK = re.compile(r"(^|\.)h\.\d+\.attn\.bias$")  # GPT-2's causal-mask buffer (NOT c_attn.bias)

# GPT-2 HF module -> ours (per layer), for weights stored as Conv1D [in, out]
_GPT2_LAYER = {
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attn.c_proj": "self_attn.o_proj",
    "mlp.c_fc": "mlp.up_proj",
    "mlp.c_proj": "mlp.down_proj",
}
_GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def _ignored(name: str) -> bool:
    return name.endswith(IGNORED_HF_SUFFIXES) or bool(_GPT2_ATTN_MASK.search(name))


def hf_to_accel(config: ModelConfig, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """Rename (and for GPT-2, split/transpose) HF checkpoint tensors to ``Decoder`` state-dict names.

    Names already in ``Decoder`` form pass through unchanged, so accel-written checkpoints load too.
    A restricted head's ``lm_head.token_ids`` becomes the ``lm_head_token_ids`` buffer.
    """
    if config.model_type == "gpt2":
        out = _gpt2_to_accel(config, tensors)
    else:
        out = {}
        for name, t in tensors.items():
            if _ignored(name):
                continue
            out[name[len("model.") :] if name.startswith("model.") else name] = t
    if HF_HEAD_IDS in out:
        out[HEAD_IDS] = out.pop(HF_HEAD_IDS)
    return out


def _gpt2_to_accel(config: ModelConfig, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    hidden = config.hidden_size
    for name, t in tensors.items():
        if _ignored(name):
            continue
        key = name[len("transformer.") :] if name.startswith("transformer.") else name
        m = re.match(r"h\.(\d+)\.(.+)\.(weight|bias)$", key)
        if key.startswith(("wte.", "wpe.", "ln_f.")):
            top = {"wte": "embed_tokens", "wpe": "embed_positions", "ln_f": "norm"}[key.split(".")[0]]
            out[f"{top}.{key.split('.', 1)[1]}"] = t
        elif m:
            layer, module, kind = m.groups()
            prefix = f"layers.{layer}."
            if module == "attn.c_attn":
                if t.shape[-1] != 3 * hidden:
                    raise ModelError(f"tensor {name!r}: shape {tuple(t.shape)}, expected last dim 3 * {hidden}")
                parts = t.split(hidden, dim=-1)
                for proj, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                    out[f"{prefix}self_attn.{proj}.{kind}"] = part.t().contiguous() if kind == "weight" else part
            elif module in _GPT2_LAYER:
                w = t.t().contiguous() if (kind == "weight" and module in _GPT2_CONV1D) else t
                out[f"{prefix}{_GPT2_LAYER[module]}.{kind}"] = w
            else:
                out[key] = t  # unknown: reported as unexpected by the caller
        else:
            out[key] = t
    return out


def accel_to_hf(config: ModelConfig, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``Decoder`` state dict -> HF checkpoint names (what ``transformers`` loads). Tied ``lm_head`` is dropped."""
    out: dict[str, torch.Tensor] = {}
    tied = config.tie_word_embeddings
    if config.model_type != "gpt2":
        for name, t in state.items():
            if name == HEAD_IDS:
                out[HF_HEAD_IDS] = t
            elif name == "lm_head.weight":
                if not tied:
                    out[name] = t
            else:
                out[f"model.{name}"] = t
        return out
    import torch

    inverse = {v: k for k, v in _GPT2_LAYER.items()}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, t in state.items():
        if name == "lm_head.weight":
            if not tied:
                out[name] = t
            continue
        if name == HEAD_IDS:
            out[HF_HEAD_IDS] = t
            continue
        top = name.split(".")[0]
        if top in ("embed_tokens", "embed_positions", "norm"):
            hf_top = {"embed_tokens": "wte", "embed_positions": "wpe", "norm": "ln_f"}[top]
            out[f"transformer.{hf_top}.{name.split('.', 1)[1]}"] = t
            continue
        m = re.match(r"layers\.(\d+)\.(.+)\.(weight|bias)$", name)
        if not m:
            raise ModelError(f"tensor {name!r} has no GPT-2 checkpoint name")
        layer, module, kind = m.groups()
        if module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            qkv.setdefault((layer, kind), {})[module.split(".")[1]] = t
            continue
        hf_module = inverse[module]
        w = t.t().contiguous() if (kind == "weight" and hf_module in _GPT2_CONV1D) else t
        out[f"transformer.h.{layer}.{hf_module}.{kind}"] = w
    for (layer, kind), parts in qkv.items():
        ordered = [parts[p] for p in ("q_proj", "k_proj", "v_proj")]
        fused = torch.cat([p.t() for p in ordered], dim=1) if kind == "weight" else torch.cat(ordered)
        out[f"transformer.h.{layer}.attn.c_attn.{kind}"] = fused.contiguous()
    return out
