"""Compact reference decoders (Llama family, GPT-2) with a position-indexed KV cache.

Importing this package needs torch (the ``[torch]`` extra).
"""

from accel.models.config import ModelConfig, RopeScaling
from accel.models.decoder import Decoder, new_cache

__all__ = ["Decoder", "ModelConfig", "RopeScaling", "new_cache"]
