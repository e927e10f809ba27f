"""Tiny random Llama-style decoders for the tests: configs, random and perturbed models, backends, oracle drafts."""

from __future__ import annotations

import torch

from accel.backends import TorchBackend
from accel.drafts.feature import build_feature_draft
from accel.models import Decoder, ModelConfig


def tiny_config(vocab_size: int = 32) -> ModelConfig:
    """A 2-layer grouped-query decoder small enough for thousands of calls per second."""
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
    )


def random_model(seed: int, vocab_size: int = 32, std: float = 0.5) -> Decoder:
    """A random decoder; a large ``std`` makes its next-token distributions peaked and context-dependent."""
    return Decoder(tiny_config(vocab_size)).init_weights(seed, std)


def perturbed(model: Decoder, seed: int, rel: float) -> Decoder:
    """A copy of ``model`` with every weight matrix perturbed by ``rel`` times its own std (a high-acceptance draft)."""
    out = Decoder(model.config)
    out.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.ndim > 1:
                p.add_(torch.randn(p.shape, generator=gen) * rel * p.std())
    return out


def backend(model: Decoder, batch_size: int, ctx_len: int = 64, max_seq_len: int | None = None) -> TorchBackend:
    return TorchBackend(model, ctx_len=ctx_len, batch_size=batch_size, max_seq_len=max_seq_len)


def oracle_feature_draft(target, head_ids, feature_weight: float = 0.0, seed: int = 0):
    """A feature draft that computes the target itself: all its layers copied, the full-width embedding copied and
    ``fc = [I | feature_weight * R]``, so with ``feature_weight = 0`` it ignores the features and its logits equal
    the target's at ``head_ids`` (greedy SpD then accepts every draft whose token is in the head)."""
    c = target.config
    draft = build_feature_draft(target, torch.as_tensor(head_ids), layers=c.num_layers, embed_size=c.hidden_size)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.embed_tokens.weight)
        fc = torch.zeros_like(draft.fc.weight)
        fc[:, : c.hidden_size] = torch.eye(c.hidden_size)
        fc[:, c.hidden_size :] = feature_weight * torch.randn(c.hidden_size, c.hidden_size, generator=gen)
        draft.fc.weight.copy_(fc)
    return draft.eval()
