"""Compact reference decoders (Llama family, GPT-2) with a position-indexed KV cache; checkpoint loading.

Importing this package needs torch (the ``[torch]`` extra).
"""

from accel.models.config import MASKED_LOGIT, ModelConfig, RopeScaling
from accel.models.decoder import Decoder, new_cache
from accel.models.loading import load_checkpoint, save_pretrained
from accel.models.smollm2 import load_tokenizer, smollm2_checkpoint, smollm2_gguf_path

__all__ = [
    "MASKED_LOGIT",
    "Decoder",
    "ModelConfig",
    "RopeScaling",
    "load_checkpoint",
    "load_tokenizer",
    "new_cache",
    "save_pretrained",
    "smollm2_checkpoint",
    "smollm2_gguf_path",
]
