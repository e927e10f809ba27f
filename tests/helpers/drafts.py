"""Draft-training test helpers: tiny random targets with a real (byte-level) tokenizer, built offline from configs."""

from __future__ import annotations

from pathlib import Path

from accel.models.config import ModelConfig
from accel.models.decoder import Decoder
from accel.models.loading import save_pretrained

VOCAB = 256  # one token per byte


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: 256 tokens, one per byte (GPT-2's byte-to-unicode alphabet)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def tiny_config(vocab: int = VOCAB, **kw) -> ModelConfig:
    base = dict(
        vocab_size=vocab,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return ModelConfig(**base)


def write_target(path: Path, vocab: int = VOCAB, seed: int = 0, std: float = 0.15) -> Path:
    """A random target checkpoint dir (config.json + model.safetensors + tokenizer.json)."""
    model = Decoder(tiny_config(vocab)).init_weights(seed=seed, std=std)
    save_pretrained(model, path)
    if vocab == VOCAB:
        byte_tokenizer().save(str(path / "tokenizer.json"))
    return path
