"""Standalone drafts as plain Hugging Face checkpoints, for engines that take a draft model by path (vLLM's
``draft_model`` speculative method, Qualcomm's vllm-qaic): ``transformers.AutoModelForCausalLM`` loads the result.

A draft checkpoint is already HF-shaped (``accel.models.save_pretrained``); three things are not, and are converted:

- MX-compressed weights (``accel-mx`` files) are dequantized, exactly, to float32;
- a restricted LM head (``head_vocab > 0``: ``[head_vocab, hidden]`` rows scoring ``lm_head.token_ids``) becomes a
  full-vocabulary head whose rows outside the head are zero. The logits of the head's tokens are unchanged; every
  other token gets logit 0 where accel gives ``MASKED_LOGIT`` (no bias term exists in ``LlamaForCausalLM`` to carry
  a constant). A proposal then may be a token outside the head when every head logit is below 0: speculative
  decoding stays exact (the target verifies against the draft's own distribution), only acceptance can change;
- the ``accel_*`` config keys are dropped (``accel_head_vocab``).

Feature drafts (``feature_size > 0``) read the target's hidden states and are no plain causal LM: they are refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from accel._io import check_output_path
from accel.drafts.checkpoint import copy_tokenizer, load_model, save_model
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["export_hf_draft", "full_vocab_draft"]


@torch.no_grad()
def full_vocab_draft(draft: Decoder) -> Decoder:
    """``draft`` as an unrestricted float32 ``Decoder`` (a copy): a restricted head widened to the whole vocabulary
    with zero rows outside ``lm_head_token_ids``; unrestricted drafts are copied as they are."""
    cfg = draft.config
    if cfg.feature_size > 0:
        raise DraftError(
            "a feature draft reads the target's hidden states and is no plain causal LM; export it in the "
            "speculators format instead"
        )
    out = Decoder(cfg.with_(head_vocab=0)).float().eval()
    state = {k: v.float() if v.is_floating_point() else v for k, v in draft.state_dict().items()}
    ids = state.pop("lm_head_token_ids", None)
    if ids is not None:
        head = torch.zeros(cfg.vocab_size, cfg.hidden_size)
        head[ids.long()] = state.pop("lm_head.weight")
        state["lm_head.weight"] = head
    missing, unexpected = out.load_state_dict(state, strict=False)
    allowed = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise DraftError(f"draft weights do not fit its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return out


def export_hf_draft(draft: Decoder | str | Path, out_dir: str | Path) -> Path:
    """Write ``draft`` (a ``Decoder`` or a draft checkpoint directory, plain or MX-compressed) to ``out_dir`` as a
    float32 Hugging Face checkpoint (``config.json``, ``model.safetensors``, the tokenizer files of a source
    directory). Returns ``out_dir``. DraftError for a feature draft, an unreadable source or an ``out_dir`` that cannot
    be written (checked before the draft is read)."""
    check_output_path(out_dir, "the Hugging Face draft", DraftError, folder=True)
    model = load_model(draft, role="draft")
    out = save_model(full_vocab_draft(model), out_dir)
    copy_tokenizer(None if isinstance(draft, Decoder) else draft, out)
    return out
