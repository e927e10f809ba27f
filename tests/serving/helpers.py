"""Tiny random Llama checkpoints for the serving-layout tests."""

from __future__ import annotations

from pathlib import Path

import torch

from accel.models import Decoder, ModelConfig, save_pretrained

#: every (layout, format) pair the serving layouts define
PAIRS = [
    ("quark", "mxfp4_e2m1"),
    ("quark", "mxfp6_e2m3"),
    ("quark", "mxfp6_e3m2"),
    ("compressed-tensors", "mxfp4_e2m1"),
    ("compressed-tensors", "mxfp6_e2m3"),
    ("compressed-tensors", "mxfp8_e4m3"),
]


def tiny_llama(seed: int = 0, hidden: int = 64, intermediate: int = 96, tied: bool = True) -> Decoder:
    """A 2-layer grouped-query Llama whose Linear weights have in_features % 32 == 0."""
    cfg = ModelConfig(
        vocab_size=96,
        hidden_size=hidden,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=intermediate,
        tie_word_embeddings=tied,
    )
    return Decoder(cfg).init_weights(seed, 0.5).eval()


def saved(model: Decoder, path: Path) -> Path:
    save_pretrained(model, path)
    return path


def logits(model: Decoder, tokens: torch.Tensor) -> torch.Tensor:
    """Full-sequence logits of an accel Decoder (no cache)."""
    with torch.no_grad():
        return model.causal_forward(tokens).float()
