"""Shared fixtures for the speculative decoding tests: tiny random Llama-style decoders behind TorchBackend.

torch runs single-threaded here: the tiny models are latency-bound and the CI machine's 2 cores are shared.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from accel.backends import TorchBackend  # noqa: E402
from accel.models import Decoder, ModelConfig  # noqa: E402

torch.set_num_threads(1)


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
