"""Strict reading of a Hugging Face ``config.json`` into ``ModelConfig`` fields (used by ``ModelConfig.from_hf``).

Every field is type-checked as JSON gives it: integers must be JSON integers (``"576"``, ``576.5`` and ``true`` are
refused), booleans must be JSON booleans (``"false"`` is refused, never read as true), floats must be finite
numbers; a missing required field, a list where an object is expected, or a value out of range raises ``ModelError``
naming the field and what is allowed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from accel.errors import ModelError

#: upper bounds of the fields that size memory (checked before any weight is allocated); generous next to the largest
#: published models (vocab 256k, hidden 16k-25k, 126 layers, 128 heads, 10M-token contexts)
SIZE_LIMITS: dict[str, int] = {
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 16,
    "num_layers": 1 << 10,
    "num_heads": 1 << 10,
    "num_kv_heads": 1 << 10,
    "intermediate_size": 1 << 18,
    "head_dim": 1 << 12,
    "max_position_embeddings": 1 << 24,
    "head_vocab": 1 << 22,
    "feature_size": 1 << 16,
    "embed_size": 1 << 16,
}

GELU_ACTS = ("gelu_new", "gelu_pytorch_tanh", "gelu", "gelu_fast")
HEAD_VOCAB_KEY = "accel_head_vocab"  # config.json key of head_vocab (written only when > 0)
FEATURE_SIZE_KEY = "accel_feature_size"  # feature drafts only (written only when > 0)
EMBED_SIZE_KEY = "accel_embed_size"
_MISSING = object()


def check_size(field: str, value: Any, minimum: int = 1, label: str | None = None) -> int:
    """``value`` as an int in ``minimum..SIZE_LIMITS[field]`` (ModelError naming the field otherwise)."""
    label = label or f"config field {field}"
    limit = SIZE_LIMITS.get(field)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ModelError(f"{label} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum or (limit is not None and value > limit):
        allowed = f"{minimum}..{limit}" if limit is not None else f">= {minimum}"
        raise ModelError(f"{label}={value} is out of range; allowed: {allowed}")
    return value


class ConfigReader:
    """Typed access to the fields of one config.json dict; every error names the field."""

    def __init__(self, cfg: Any, prefix: str = "") -> None:
        if not isinstance(cfg, dict):
            raise ModelError(f"config.json must hold a JSON object (a dict of fields), got {type(cfg).__name__}")
        self.cfg, self.prefix = cfg, prefix

    def _label(self, key: str) -> str:
        return f"config field {self.prefix}{key}"

    def _get(self, key: str, default: Any) -> Any:
        value = self.cfg.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise ModelError(f"config.json is missing the required field {self.prefix + key!r}")
            return default
        return value

    def size(self, key: str, field: str, default: Any = _MISSING, minimum: int = 1) -> int:
        """An integer field (``key`` in the JSON, ``field`` in ModelConfig, whose bounds apply)."""
        return check_size(field, self._get(key, default), minimum, label=self._label(key))

    def number(self, key: str, default: float, positive: bool = True) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ModelError(f"{self._label(key)} must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise ModelError(f"{self._label(key)} must be > 0, got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise ModelError(f"{self._label(key)} must be a JSON boolean (true/false), got {value!r}")
        return value

    def text(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is not None and not isinstance(value, str):
            raise ModelError(f"{self._label(key)} must be a string, got {value!r}")
        return value

    def token_ids(self, key: str) -> int | list[int] | None:
        """``bos_token_id`` / ``eos_token_id``: null, a token id, or a list of them."""
        value = self.cfg.get(key)
        ids = value if isinstance(value, list) else [value] if value is not None else []
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < SIZE_LIMITS["vocab_size"] for t in ids):
            raise ModelError(
                f"{self._label(key)} must be a token id (int >= 0), a list of them, or null; got {value!r}"
            )
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.cfg.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ModelError(f"{self._label(key)} must be a JSON object or null, got {type(value).__name__}")
        return value

    def accel_size(self, key: str, field: str) -> int:
        """An accel-only field (0 when absent)."""
        return self.size(key, field, default=0, minimum=0)


def llama_fields(r: ConfigReader, model_type: str) -> dict[str, Any]:
    """ModelConfig keyword arguments of a Llama-family config (llama, mistral, qwen2)."""
    act = r.text("hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"config field hidden_act={act!r} is not supported for {model_type}; supported: 'silu'")
    if r.flag("use_sliding_window", False):
        raise ModelError("config field use_sliding_window=true is not supported (full attention only)")
    mlp_bias = r.flag("mlp_bias", False)
    if mlp_bias and model_type != "llama":
        raise ModelError("config field mlp_bias=true is only supported for model_type llama")
    heads = r.size("num_attention_heads", "num_heads")
    rope = r.mapping("rope_parameters")  # transformers >= 5 keeps rope_theta and scaling here
    theta = r.number("rope_theta", 1.0) if r.cfg.get("rope_theta") is not None else None
    theta = theta if theta is not None else ConfigReader(rope).number("rope_theta", 10000.0)
    attention_bias = r.flag("attention_bias", False)
    window = r.size("sliding_window", "max_position_embeddings", default=0, minimum=0)
    return {
        "model_type": model_type,
        "vocab_size": r.size("vocab_size", "vocab_size"),
        "hidden_size": r.size("hidden_size", "hidden_size"),
        "num_layers": r.size("num_hidden_layers", "num_layers"),
        "num_heads": heads,
        "num_kv_heads": r.size("num_key_value_heads", "num_kv_heads", default=heads),
        "head_dim": r.size("head_dim", "head_dim", default=0, minimum=0),
        "intermediate_size": r.size("intermediate_size", "intermediate_size"),
        "norm": "rms",
        "norm_eps": r.number("rms_norm_eps", 1e-6),
        "mlp": "gated",
        "activation": "silu",
        "positions": "rope",
        "rope_theta": theta,
        "rope_scaling": rope_scaling(r.mapping("rope_scaling") or rope),
        "max_position_embeddings": r.size("max_position_embeddings", "max_position_embeddings", default=2048),
        "qkv_bias": model_type == "qwen2" or attention_bias,
        "o_bias": attention_bias,
        "mlp_bias": mlp_bias,
        "tie_word_embeddings": r.flag("tie_word_embeddings", False),
        "bos_token_id": r.token_ids("bos_token_id"),
        "eos_token_id": r.token_ids("eos_token_id"),
        "extra": {"sliding_window": window} if window else {},
        "head_vocab": r.accel_size(HEAD_VOCAB_KEY, "head_vocab"),
        "feature_size": r.accel_size(FEATURE_SIZE_KEY, "feature_size"),
        "embed_size": r.accel_size(EMBED_SIZE_KEY, "embed_size"),
    }


def gpt2_fields(r: ConfigReader) -> dict[str, Any]:
    """ModelConfig keyword arguments of a GPT-2 config."""
    act = r.text("activation_function", "gelu_new")
    if act not in GELU_ACTS:
        raise ModelError(f"config field activation_function={act!r} is not supported; supported: {GELU_ACTS}")
    if act == "gelu":
        raise ModelError("config field activation_function='gelu' (exact erf GELU) is not supported; use gelu_new")
    if r.flag("scale_attn_by_inverse_layer_idx", False) or r.flag("reorder_and_upcast_attn", False):
        raise ModelError("config fields scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
    hidden = r.size("n_embd", "hidden_size")
    heads = r.size("n_head", "num_heads")
    return {
        "model_type": "gpt2",
        "vocab_size": r.size("vocab_size", "vocab_size"),
        "hidden_size": hidden,
        "num_layers": r.size("n_layer", "num_layers"),
        "num_heads": heads,
        "num_kv_heads": heads,
        "intermediate_size": r.size("n_inner", "intermediate_size", default=min(4 * hidden, 1 << 18)),
        "norm": "layer",
        "norm_eps": r.number("layer_norm_epsilon", 1e-5),
        "mlp": "plain",
        "activation": "gelu_tanh",
        "positions": "learned",
        "max_position_embeddings": r.size("n_positions", "max_position_embeddings", default=1024),
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": r.flag("tie_word_embeddings", True),
        "bos_token_id": r.token_ids("bos_token_id"),
        "eos_token_id": r.token_ids("eos_token_id"),
        "head_vocab": r.accel_size(HEAD_VOCAB_KEY, "head_vocab"),
    }


def rope_scaling(rs: dict[str, Any]) -> Any:
    """The RopeScaling of a ``rope_scaling`` (or ``rope_parameters``) object, None for none/default."""
    # import cycle: accel.models.config reads its HF fields with this module
    from accel.models.config import RopeScaling

    if not rs:
        return None
    r = ConfigReader(rs, prefix="rope_scaling.")
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return RopeScaling(kind="linear", factor=r.number("factor", 1.0))
    if kind == "llama3":
        if r.number("high_freq_factor", 4.0) <= r.number("low_freq_factor", 1.0):
            raise ModelError("config field rope_scaling: high_freq_factor must be greater than low_freq_factor")
        return RopeScaling(
            kind="llama3",
            factor=r.number("factor", 1.0),
            low_freq_factor=r.number("low_freq_factor", 1.0),
            high_freq_factor=r.number("high_freq_factor", 4.0),
            original_max_position_embeddings=r.size(
                "original_max_position_embeddings", "max_position_embeddings", default=8192
            ),
        )
    raise ModelError(f"config field rope_scaling type {kind!r} is not supported; supported: 'llama3', 'linear'")
