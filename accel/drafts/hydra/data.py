"""Training data of Hydra heads: target-written sequences with the target's top-k next-token distributions
(``accel.drafts.distill_data``'s shards) plus the target's final-norm hidden states of the same sequences.

A heads' training example is a base position ``t`` of a sequence: the target's hidden state ``h_t``, the tokens
``x_{t+1} .. x_{t+K}`` and the teacher distributions at positions ``t+1 .. t+K`` (those of ``x_{t+2} .. x_{t+K+1}``).
The hidden states are computed once per data shard (``target_features``, bfloat16) and cached next to the shards.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tqdm.auto import tqdm

from accel._io import check_output_path, writing
from accel.drafts.feature import target_features
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["ShardBatches", "feature_shards", "load_shard"]


def feature_shards(
    target: Decoder, data_dir: str | Path, feature_dir: str | Path, *, progress: bool = True
) -> list[tuple[Path, Path]]:
    """Pairs ``(data shard, feature shard)``: the target's bfloat16 hidden states ``[N, L, H]`` of every
    ``*.safetensors`` data shard in ``data_dir``, computed once into ``feature_dir`` (same file names, written
    atomically; an interrupted run resumes with the next missing shard)."""
    from safetensors.torch import load_file, save_file

    data_dir, feature_dir = Path(data_dir), Path(feature_dir)
    shards = sorted(data_dir.glob("*.safetensors"))
    if not shards:
        raise DraftError(f"no data shards (*.safetensors) in {data_dir}")
    check_output_path(feature_dir, "the feature shards", DraftError, folder=True)
    with writing(feature_dir, "the feature shards", DraftError):
        feature_dir.mkdir(parents=True, exist_ok=True)
    pairs = []
    for src in tqdm(shards, desc="target hidden states", unit="shard", disable=not progress):
        dst = feature_dir / src.name
        if not dst.is_file():
            hidden = target_features(target, load_file(str(src))["tokens"]).contiguous()
            tmp = feature_dir / f".{src.name}.tmp"
            with writing(feature_dir, "the feature shards", DraftError):
                save_file({"hidden": hidden}, str(tmp))
                os.replace(tmp, dst)
        pairs.append((src, dst))
    return pairs


def load_shard(data_path: Path, feature_path: Path) -> dict[str, torch.Tensor]:
    """One shard as ``{"tokens" [N, L] int64, "mask" [N, L] bool, "topk_ids" [N, L, k] int64, "topk_logp" float32,
    "hidden" [N, L, H] bfloat16}``; ``DraftError`` when the two files do not belong together."""
    from safetensors.torch import load_file

    try:
        t = load_file(str(data_path))
        hidden = load_file(str(feature_path))["hidden"]
    except Exception as exc:
        raise DraftError(f"cannot read the shard {data_path} / {feature_path}: {exc}") from exc
    if hidden.shape[:2] != t["tokens"].shape:
        raise DraftError(
            f"{feature_path} holds hidden states {tuple(hidden.shape)} for tokens {tuple(t['tokens'].shape)}"
        )
    return {
        "tokens": t["tokens"].long(),
        "mask": t["mask"].bool(),
        "topk_ids": t["topk_ids"].long(),
        "topk_logp": t["topk_logp"].float(),
        "hidden": hidden,
    }


class ShardBatches:
    """Batches of up to ``rows`` sequences from shards, in a seeded random order over (shard, part) pairs;
    reshuffled each epoch. The position in the order (``state``/``load_state``) is part of a training checkpoint, so
    a resumed run sees the same batches as an uninterrupted one. Keeps the last few shards loaded."""

    def __init__(self, pairs: list[tuple[Path, Path]], rows: int, seed: int) -> None:
        from safetensors import safe_open

        if not pairs:
            raise DraftError("no training shards")
        if rows < 1:
            raise DraftError(f"batch rows must be >= 1; got {rows}")
        self.pairs, self.rows = pairs, rows
        self.parts: list[tuple[int, int]] = []  # (shard index, first row)
        for i, (data_path, _) in enumerate(pairs):
            with safe_open(str(data_path), framework="pt") as f:
                n = f.get_slice("tokens").get_shape()[0]
            self.parts += [(i, start) for start in range(0, n, rows)]
        self.gen = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(len(self.parts), generator=self.gen)
        self.cursor = 0
        self._cache: dict[Path, dict[str, torch.Tensor]] = {}

    def state(self) -> dict[str, torch.Tensor | int]:
        return {"order": self.order, "cursor": self.cursor, "rng": self.gen.get_state()}

    def load_state(self, state: dict) -> None:
        if len(state["order"]) != len(self.parts):
            raise DraftError(
                f"the saved data order has {len(state['order'])} batches; these shards make {len(self.parts)}"
            )
        self.order, self.cursor = state["order"], int(state["cursor"])
        self.gen.set_state(state["rng"])

    def next(self) -> dict[str, torch.Tensor]:
        """The next batch (a dict as ``load_shard``'s, up to ``rows`` sequences, cut after its last masked
        position)."""
        if self.cursor >= len(self.order):
            self.order = torch.randperm(len(self.order), generator=self.gen)
            self.cursor = 0
        index, start = self.parts[int(self.order[self.cursor])]
        self.cursor += 1
        data_path, feat_path = self.pairs[index]
        if data_path not in self._cache:
            if len(self._cache) >= 4:
                self._cache.pop(next(iter(self._cache)))
            self._cache[data_path] = load_shard(data_path, feat_path)
        shard = self._cache[data_path]
        return trim({k: v[start : start + self.rows] for k, v in shard.items()})


def trim(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch cut after its last masked position (+1: the token that position predicts)."""
    used = batch["mask"].any(dim=0).nonzero()
    width = int(used.max()) + 2 if used.numel() else 1
    width = min(width, batch["tokens"].shape[1])
    return {k: v[:, :width] for k, v in batch.items()}
