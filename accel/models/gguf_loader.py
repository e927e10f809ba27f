"""Read llama.cpp GGUF files: the model config from ``{arch}.*`` metadata, tensors dequantized to float32, and the
byte-level BPE tokenizer from ``tokenizer.ggml.*`` metadata (``accel.models.gguf_tokenizer``; no transformers needed).

llama.cpp's converter permutes the rows of Q and K for its rotary layout (``convert_hf_to_gguf.py``, ``permute``);
``_unpermute`` undoes it exactly as transformers' GGUF loader does (``LlamaTensorProcessor._reverse_permute_weights``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import FormatError, ModelError
from accel.formats.ggml import GGUF_KERNEL_TYPES, GGMLTensor
from accel.models.config import ModelConfig
from accel.models.sources import CheckpointTensors

__all__ = ["SUPPORTED_GGUF_ARCHS", "gguf_config", "gguf_tokenizer", "open_gguf", "read_gguf"]

SUPPORTED_GGUF_ARCHS = ("llama", "mistral", "qwen2")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def _reader(path: str | Path) -> _Parsed:
    """The parsed ``gguf.GGUFReader`` of ``path`` (its fields' values and its tensors), shared by every caller in
    this process while the file is unchanged.

    Parsing is slow for large vocabularies (the reader builds every metadata field eagerly: seconds for 49 K tokens,
    tens of seconds for 150 K tokens and merges), and one ``accel generate`` reads a GGUF three times (its config,
    its tokenizer, its weights): what it read is kept, keyed by the resolved path, size and modification time."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ModelError(f"{path} is not a readable GGUF file: {exc}") from exc
    return _cached_reader(str(p.resolve()), st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class _Field:
    """A metadata field's value as ``gguf.ReaderField.contents()`` gives it: what this package reads of a field."""

    value: Any

    def contents(self) -> Any:
        return self.value

    @property
    def data(self) -> list:
        """One entry per element (``ReaderField.data``'s length): the list itself, or the one value."""
        return self.value if isinstance(self.value, list) else [self.value]


@dataclass(frozen=True)
class _Parsed:
    """What is kept of a ``gguf.GGUFReader``: the fields' values and the tensors (names, types, shapes, their bytes
    mapped from the file). The reader itself holds a numpy memmap and a dict per element of every array field
    (~500 K objects for a 49 K-token vocabulary with its merges): kept for the process, they made every full
    garbage collection during decoding walk them."""

    fields: dict[str, Any]
    tensors: list


@lru_cache(maxsize=2)
def _cached_reader(path: str, size: int, mtime_ns: int) -> _Parsed:
    try:
        import gguf
    except ImportError as exc:
        raise ModelError("reading .gguf files needs the gguf package: pip install 'accel[gguf]'") from exc
    try:
        reader = gguf.GGUFReader(path)
        fields: dict[str, Any] = {}
        for key, field in reader.fields.items():
            try:
                fields[key] = _Field(field.contents())
            except Exception:  # a field type this gguf version cannot give a value of: kept as read, never needed
                fields[key] = field
        return _Parsed(fields, list(reader.tensors))
    except Exception as exc:
        raise ModelError(f"{path} is not a readable GGUF file: {exc}") from exc


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader) -> ModelConfig:
    """ModelConfig from GGUF metadata (``general.architecture`` and its ``{arch}.*`` keys)."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise ModelError(f"GGUF general.architecture={arch!r} is not supported; supported: {SUPPORTED_GGUF_ARCHS}")
    rope_type = _field(reader, f"{arch}.rope.scaling.type")
    if rope_type not in (None, "none"):
        raise ModelError(f"GGUF {arch}.rope.scaling.type={rope_type!r} is not supported; supported: none")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ModelError("GGUF tensor rope_freqs.weight (Llama 3 rope scaling) is not supported")
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    cfg = {
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, f"{arch}.rope.dimension_count", hidden // heads)),
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    return ModelConfig.from_hf(cfg)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation of a Q/K weight ``[n_head * head_dim, in]`` (or bias)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _decoder_name(tensor_name: str) -> tuple[str, str | None]:
    """(``Decoder`` name, layer tensor kind or None) of a GGUF tensor name; ModelError for an unknown tensor."""
    m = re.match(r"blk\.(\d+)\.(\w+)\.(weight|bias)$", tensor_name)
    top = re.match(r"(\w+)\.(weight|bias)$", tensor_name)
    if m:
        layer, kind, part = m.groups()
        if kind not in _LAYER_NAMES:
            raise ModelError(f"GGUF tensor {tensor_name!r} is not supported (unknown layer tensor {kind!r})")
        return f"layers.{layer}.{_LAYER_NAMES[kind]}.{part}", kind
    if top and top.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[top.group(1)]}.{top.group(2)}", None
    raise ModelError(f"GGUF tensor {tensor_name!r} is not supported")


def _load_tensor(path: Path, t: Any, unpermute_heads: int | None) -> np.ndarray:
    """One GGUF tensor, read from the file (only its own bytes) and dequantized to float32 ``Decoder`` layout."""
    from gguf.quants import dequantize

    try:
        raw = np.fromfile(path, dtype=np.uint8, count=int(t.n_bytes), offset=int(t.data_offset))
        if raw.size != int(t.n_bytes):
            raise ModelError(f"GGUF tensor {t.name!r}: file is truncated ({raw.size} of {int(t.n_bytes)} bytes)")
        stored = raw.view(t.data.dtype).reshape(t.data.shape)  # as GGUFReader lays it out (bytes for quant types)
        arr = np.asarray(dequantize(stored, t.tensor_type), dtype=np.float32)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"cannot dequantize GGUF tensor {t.name!r} ({t.tensor_type.name}): {exc}") from exc
    arr = arr.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims fastest-first
    return _unpermute(arr, unpermute_heads) if unpermute_heads else arr


def _load_blocks(path: Path, t: Any, unpermute_heads: int | None) -> Any:
    """One 2-D GGUF tensor of a type the kernel runs (``GGUF_KERNEL_TYPES``) as a ``GGMLTensor`` ``[out, in]``
    (``Decoder`` layout; Q/K rows unpermuted as ``_load_tensor`` does), its blocks as the file stores them or
    repacked exactly."""
    raw = np.fromfile(path, dtype=np.uint8, count=int(t.n_bytes), offset=int(t.data_offset))
    if raw.size != int(t.n_bytes):
        raise ModelError(f"GGUF tensor {t.name!r}: file is truncated ({raw.size} of {int(t.n_bytes)} bytes)")
    k, n = (int(d) for d in t.shape)  # GGUF lists dims fastest-first
    try:
        w = GGMLTensor.from_blocks(raw, t.tensor_type.name, (n, k))
    except FormatError as exc:
        raise ModelError(f"GGUF tensor {t.name!r}: {exc}") from None
    if unpermute_heads:
        w = w.take_rows(_unpermute(np.arange(n), unpermute_heads))
    return w


def open_gguf(path: str | Path, blocks: bool = False) -> tuple[ModelConfig, Any]:
    """Config and lazily read float32 tensors (``Decoder`` names; a ``accel.models.sources.CheckpointTensors``) of a
    GGUF file: each tensor is read and dequantized when looked up, so memory holds one tensor at a time.

    ``blocks``: the 2-D tensors stored as ``Q8_0``, ``Q4_0`` or ``Q4_1`` (their blocks as the file stores them) or
    ``Q2_K`` to ``Q6_K``, ``Q5_0``, ``Q5_1`` (repacked exactly, ``accel.formats.ggml_repack``;
    ``accel.formats.ggml.GGUF_KERNEL_TYPES``) are looked up as ``GGMLTensor`` instead (what ``weights="gguf-kernel"``
    exports); every other tensor is float32 as without it."""
    path = Path(path)
    reader = _reader(path)
    config = gguf_config(reader)
    permuted = config.model_type in ("llama", "mistral")  # llama.cpp permutes Q/K only for these
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads} if permuted else {}
    loaders: dict[str, Any] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for t in reader.tensors:
        name, kind = _decoder_name(t.name)
        n_heads = heads.get(kind or "")
        kernel_type = t.tensor_type.name in GGUF_KERNEL_TYPES
        as_blocks = blocks and len(t.shape) == 2 and kernel_type and int(t.shape[0]) % 32 == 0
        loaders[name] = partial(_load_blocks if as_blocks else _load_tensor, path, t, n_heads)
        shapes[name] = tuple(int(d) for d in reversed(t.shape))
    return config, CheckpointTensors(loaders, shapes)


def read_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Config and float32 tensors (``Decoder`` names) of a GGUF file; quantized tensors are dequantized."""
    config, tensors = open_gguf(path)
    return config, {name: tensors[name] for name in tensors}


def gguf_tokenizer(path: str | Path):
    """The GGUF's byte-level BPE tokenizer (``accel.models.gguf_tokenizer.gguf_tokenizer``)."""
    # import cycle: accel.models.gguf_tokenizer reads the file with this module's reader
    from accel.models.gguf_tokenizer import gguf_tokenizer as build

    return build(path)
