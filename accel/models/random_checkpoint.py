"""Random checkpoints of real model shapes, written to disk tensor by tensor (no downloads): what the export benchmark
(``benchmarks/export.py``) and the memory tests measure on.

``write_random_checkpoint(config, out, kind="safetensors")`` writes an HF directory (``config.json`` +
``model.safetensors``, BF16 like most released checkpoints); ``kind="gguf"`` writes a llama.cpp GGUF (``Q8_0``
matrices, F32 norms and biases, Q/K rows permuted as llama.cpp's converter does), optionally with tokenizer metadata.
Memory stays at about one tensor whatever the model's size. ``PRESETS`` holds the shapes of a few released models.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import ModelError
from accel.formats.file import TensorSpec
from accel.formats.writer import SafetensorsWriter
from accel.models.config import ModelConfig

__all__ = ["PRESETS", "preset_config", "write_random_checkpoint"]

#: HF config fields of released models (shapes only; the weights written are random)
PRESETS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
    ),
    "llama2-7b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False,
    ),
}  # fmt: skip


def preset_config(name: str) -> ModelConfig:
    """The ``ModelConfig`` of a preset (``PRESETS``); ``ModelError`` for an unknown name."""
    if name not in PRESETS:
        raise ModelError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return ModelConfig.from_hf(dict(PRESETS[name], rms_norm_eps=1e-6, max_position_embeddings=4096))


def _shapes(c: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """HF names and shapes of a Llama-family checkpoint."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    yield "model.embed_tokens.weight", (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (c.hidden_size,)
        for proj, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{proj}.weight", (out, c.hidden_size)
            if c.qkv_bias:
                yield p + f"self_attn.{proj}.bias", (out,)
        yield p + "self_attn.o_proj.weight", (c.hidden_size, q)
        yield p + "post_attention_layernorm.weight", (c.hidden_size,)
        yield p + "mlp.gate_proj.weight", (c.intermediate_size, c.hidden_size)
        yield p + "mlp.up_proj.weight", (c.intermediate_size, c.hidden_size)
        yield p + "mlp.down_proj.weight", (c.hidden_size, c.intermediate_size)
    yield "model.norm.weight", (c.hidden_size,)
    if not c.tie_word_embeddings:
        yield "lm_head.weight", (c.vocab_size, c.hidden_size)


def _random(rng: np.random.Generator, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def write_random_checkpoint(
    config: ModelConfig,
    out: str | Path,
    *,
    kind: str = "safetensors",
    seed: int = 0,
    std: float = 0.02,
    tokenizer: dict[str, Any] | None = None,
    gguf_type: str | Callable[[str], str] = "Q8_0",
) -> Path:
    """Write a random Llama-family checkpoint of ``config``'s shapes; returns the directory or ``.gguf`` path.

    ``kind``: ``"safetensors"`` (``out`` is a directory; BF16 tensors) or ``"gguf"`` (``out`` is the file; its
    matrices quantized by the ``gguf`` package as ``gguf_type``: a block type of 32 (``Q8_0``, ``Q4_0``, ``Q4_1``,
    ...) or a function of the GGUF tensor name giving one; the rest F32; ``Q2_K`` .. ``Q6_K``, ``IQ4_XS`` and
    ``IQ4_NL``, which the package does not quantize, as random blocks (their weights are what those decode to)).
    ``tokenizer``: GGUF only, tokenizer metadata
    by ``gguf.GGUFWriter`` method suffix (``tokenizer_model``, ``tokenizer_pre``, ``token_list``, ``token_merges``,
    ``token_types``, ``bos_token_id``, ...).
    """
    if config.model_type not in ("llama", "mistral", "qwen2"):
        raise ModelError(f"random checkpoints are Llama-family only; got model_type {config.model_type!r}")
    rng = np.random.default_rng(seed)
    if kind == "gguf":
        type_of = gguf_type if callable(gguf_type) else (lambda _name: gguf_type)
        return _write_gguf(config, Path(out), rng, std, tokenizer or {}, type_of)
    return _write_safetensors(config, Path(out), rng, std)


def _write_safetensors(config: ModelConfig, out: Path, rng: np.random.Generator, std: float) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    shapes = list(_shapes(config))
    with SafetensorsWriter(out / "model.safetensors", [TensorSpec(n, "BF16", s) for n, s in shapes]) as w:
        for name, shape in shapes:
            w.write(name, (_random(rng, name, shape, std).view(np.uint32) >> 16).astype(np.uint16))  # bf16 bits
    (out / "config.json").write_text(json.dumps(config.to_hf(), indent=2))
    return out


_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf in top:
        return top[hf]
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, part = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_LAYER[module]}.{part}"


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary row permutation of a Q/K weight (``convert_hf_to_gguf.py``); the loader undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(
    c: ModelConfig,
    out: Path,
    rng: np.random.Generator,
    std: float,
    tok: dict[str, Any],
    type_of: Callable[[str], str],
) -> Path:
    import gguf

    def qtype(name: str, shape: tuple[int, ...]) -> Any:  # a matrix in whole blocks: the asked type
        if len(shape) == 2 and shape[1] % 32 == 0:
            try:
                t = gguf.GGMLQuantizationType[type_of(_gguf_name(name))]
            except KeyError as exc:
                raise ModelError(f"gguf_type: {exc} is not a GGUF quantization type") from None
            if shape[1] % gguf.GGML_QUANT_SIZES[t][0]:
                raise ModelError(f"gguf_type {t.name} needs rows of whole blocks; {name} has {shape[1]} columns")
            return t
        return gguf.GGMLQuantizationType.F32

    arch = c.model_type
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(c.num_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_heads)
    w.add_head_count_kv(c.num_kv_heads)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_rope_freq_base(c.rope_theta)
    w.add_vocab_size(c.vocab_size)
    for key, value in tok.items():
        getattr(w, f"add_{key}")(value)  # e.g. tokenizer_model, tokenizer_pre, token_list, token_merges, token_types
    shapes = list(_shapes(c))
    for name, shape in shapes:
        t = qtype(name, shape)
        block, type_bytes = gguf.GGML_QUANT_SIZES[t]
        nbytes = int(np.prod(shape)) // block * type_bytes
        w.add_tensor_info(_gguf_name(name), shape, np.dtype(np.float32), nbytes, raw_dtype=t)
    out.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    permuted = arch in ("llama", "mistral")
    for name, shape in shapes:
        arr = _random(rng, name, shape, std)
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            arr = _permute(arr, c.num_heads)
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            arr = _permute(arr, c.num_kv_heads)
        w.write_tensor_data(_tensor_data(rng, arr, qtype(name, shape), std))
    w.close()
    return out


def _tensor_data(rng: np.random.Generator, arr: np.ndarray, t: Any, std: float) -> np.ndarray:
    """What a GGUF stores for the weight ``arr`` as type ``t``: float32 as it is, the ``gguf`` package's blocks, or
    (K-quants, which the package does not quantize) random blocks (``_random_blocks``)."""
    import gguf
    from gguf.quants import quantize

    if t == gguf.GGMLQuantizationType.F32:
        return arr
    if t.name in _RANDOM_BLOCK_SCALES:
        return _random_blocks(rng, t.name, arr.shape, std, gguf.GGML_QUANT_SIZES[t])
    return quantize(arr, t)


#: K-quant super-blocks written as random bytes: byte offsets of their float16 scales, and each scale's size
#: relative to the tensor's std (so the weights they decode to stay within about +-3 std)
_RANDOM_BLOCK_SCALES: dict[str, tuple[tuple[int, ...], float]] = {
    "Q4_K": ((0, 2), 1 / 300),
    "Q5_K": ((0, 2), 1 / 600),
    "Q6_K": ((208,), 1 / 1400),
    "Q3_K": ((108,), 1 / 40),
    "Q2_K": ((80, 82), 1 / 15),
    "IQ4_XS": ((0,), 1 / 1300),
    "IQ4_NL": ((0,), 1 / 40),
}


def _random_blocks(
    rng: np.random.Generator, name: str, shape: tuple[int, ...], std: float, size: tuple[int, int]
) -> np.ndarray:
    """Random K-quant blocks ``[rows, row bytes]`` of a weight ``shape`` (random codes and sub-scales, float16 scales
    of either sign around ``std`` x the type's factor): the weights are whatever they decode to, not ``_random``'s."""
    block, type_bytes = size
    rows, nb = int(shape[0]), int(shape[1]) // block
    raw = rng.integers(0, 256, (rows, nb, type_bytes), dtype=np.uint8)
    offsets, factor = _RANDOM_BLOCK_SCALES[name]
    for at in offsets:
        scale = (std * factor * rng.uniform(0.5, 1.5, (rows, nb))).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * type_bytes)
