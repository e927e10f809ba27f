"""Hydra test helpers: a tiny random target, target-written shards with hidden states, randomised heads."""

from __future__ import annotations

from pathlib import Path

import torch

from accel.drafts.hydra.data import feature_shards
from accel.drafts.hydra.model import HydraHeads, build_hydra
from accel.models import Decoder, ModelConfig

VOCAB = 24


def tiny_target(vocab: int = VOCAB, seed: int = 4, std: float = 0.5) -> Decoder:
    """A 2-layer grouped-query decoder with peaked, context-dependent next-token distributions."""
    cfg = ModelConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48)
    return Decoder(cfg).init_weights(seed, std=std).eval()


def write_shards(target: Decoder, out: Path, shards: int = 2, rows: int = 16, new: int = 14) -> list[tuple[Path, Path]]:
    """``shards`` data shards of ``rows`` continuations the target writes (half greedy, half at T = 1) of random
    3-token prompts, with their hidden states: the layout ``accel.drafts.distill_data`` and ``feature_shards``
    write."""
    from safetensors.torch import save_file

    from accel.drafts.data import self_generate

    (out / "data").mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    for s in range(shards):
        prompts = torch.randint(0, target.config.vocab_size, (rows, 3), generator=gen).tolist()
        temps = [0.0] * (rows // 2) + [1.0] * (rows - rows // 2)
        data = self_generate(target, prompts, temps, new, 8, seed=s)
        save_file(data.tensors(), str(out / "data" / f"gen-{s:05d}.safetensors"))
    return feature_shards(target, out / "data", out / "features", progress=False)


def random_heads(target: Decoder, seed: int = 1, scale: float = 0.2, **kw) -> HydraHeads:
    """Heads with every weight perturbed by ``scale`` x normal noise (so every block and the prefix layer matter)."""
    heads = build_hydra(target, seed=seed, **kw)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return heads.eval()


def trained_heads(target: Decoder, work: Path, *, prefix: bool, steps: int = 80) -> HydraHeads:
    """Three heads trained ``steps`` steps on 128 target-written rows (accepted often by greedy verification)."""
    from accel.drafts.hydra import HydraTrainConfig, ShardBatches, train_hydra

    pairs = write_shards(target, work, shards=2, rows=64)
    heads = build_hydra(target, num_heads=3, mlp_layers=2, prefix=prefix)
    cfg = HydraTrainConfig(max_steps=steps, batch_rows=8, lr=3e-3, warmup_steps=2, eval_every=1000, progress=False)
    train_hydra(heads, ShardBatches(pairs, 8, seed=0), work / "heads", cfg)
    return heads.eval()
