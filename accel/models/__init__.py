"""Compact reference decoders (Llama family, GPT-2) with a position-indexed KV cache; checkpoint loading.

The decoders and the loaders need torch (the ``[torch]`` extra) and are imported on first use, so that the
torch-free parts (``accel.models.config``, ``accel.models.sources``, the GGUF reader and tokenizer) can be imported
without it: ``accel export`` of a checkpoint directory or a ``.gguf`` file never loads torch.
"""

from typing import TYPE_CHECKING

from accel._lazy import lazy_getattr
from accel.models.config import MASKED_LOGIT, ModelConfig, RopeScaling

if TYPE_CHECKING:  # what type checkers see; at run time these are imported on first use
    from accel.models.decoder import Decoder, ExtraInputs, new_cache
    from accel.models.loading import load_checkpoint, save_pretrained
    from accel.models.smollm2 import load_tokenizer, smollm2_checkpoint, smollm2_gguf_path

_LAZY = {
    "Decoder": "accel.models.decoder",
    "ExtraInputs": "accel.models.decoder",
    "new_cache": "accel.models.decoder",
    "load_checkpoint": "accel.models.loading",
    "save_pretrained": "accel.models.loading",
    "load_tokenizer": "accel.models.smollm2",
    "smollm2_checkpoint": "accel.models.smollm2",
    "smollm2_gguf_path": "accel.models.smollm2",
}

#: renamed public names, kept for one release (removed in accel 0.2.0): old name -> (module, new name); docs/api.md
_DEPRECATED = {"load": ("accel.models.loading", "load_checkpoint")}

__getattr__ = lazy_getattr(__name__, _LAZY, deprecated=_DEPRECATED)


__all__ = [
    "MASKED_LOGIT",
    "Decoder",
    "ExtraInputs",
    "ModelConfig",
    "RopeScaling",
    "load_checkpoint",
    "load_tokenizer",
    "new_cache",
    "save_pretrained",
    "smollm2_checkpoint",
    "smollm2_gguf_path",
]
