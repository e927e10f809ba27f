"""Model configuration of the reference decoders, and its mapping from/to Hugging Face ``config.json``.

One frozen dataclass covers the Llama family (Llama 2/3, Mistral, Qwen2/2.5, SmolLM2, TinyLlama) and GPT-2; the
architecture differences are a handful of switches (norm type, MLP type, position encoding, biases).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import ModelError
from accel.models.config_json import (
    EMBED_SIZE_KEY,
    FEATURE_SIZE_KEY,
    HEAD_VOCAB_KEY,
    ConfigReader,
    check_size,
    gpt2_fields,
    llama_fields,
)

__all__ = ["MASKED_LOGIT", "SUPPORTED_MODEL_TYPES", "ModelConfig", "RopeScaling", "rope_inv_freq"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2")
#: logit of the tokens a restricted head (``head_vocab > 0``) does not score: finite (the SpD warps reject inf/NaN),
#: and low enough that ``exp`` underflows to exactly 0 probability in float32 after softmax / any temperature >= 1e-3
MASKED_LOGIT: float = -1e9


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind``: ``"llama3"`` (Llama 3.1+ wavelength-dependent) or ``"linear"``."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


# internal field -> the config.json field it comes from, per family (for error messages)
_HF_NAMES: dict[str, dict[str, str]] = {
    "llama": {
        "num_heads": "num_attention_heads",
        "num_kv_heads": "num_key_value_heads",
        "num_layers": "num_hidden_layers",
        "hidden_size": "hidden_size",
    },
    "gpt2": {"num_heads": "n_head", "num_kv_heads": "n_head", "num_layers": "n_layer", "hidden_size": "n_embd"},
}


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only transformer.

    Sizes are in elements (not bytes). ``head_dim`` defaults to ``hidden_size // num_heads``.
    ``head_vocab`` > 0 restricts the LM head to that many token ids (a draft-model option, see ``Decoder.logits``):
    the other tokens get ``MASKED_LOGIT``; 0 means the ordinary full head.
    ``feature_size`` > 0 makes a feature-conditioned draft (EAGLE-style, see ``Decoder.embed``): besides its tokens it
    reads the target's final-norm hidden states (``feature_size`` = the target's ``hidden_size``) and enters its layers
    with ``fc(concat(embed(token), feature))``; its token embedding then has width ``embed_size`` (0: ``hidden_size``).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    model_type: str = "llama"
    head_dim: int = 0
    norm: str = "rms"  # "rms" (Llama) or "layer" (GPT-2)
    norm_eps: float = 1e-5
    mlp: str = "gated"  # "gated" (SwiGLU: down(act(gate(x)) * up(x))) or "plain" (GPT-2: proj(act(fc(x))))
    activation: str = "silu"  # "silu" or "gelu_tanh"
    positions: str = "rope"  # "rope" or "learned" (GPT-2)
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    head_vocab: int = 0
    feature_size: int = 0
    embed_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self._check_types()
        if self.head_dim == 0:
            if self.num_heads <= 0 or self.hidden_size % self.num_heads:
                raise ModelError(
                    f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; give head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ModelError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads} (grouped-query)"
            )
        if self.norm not in ("rms", "layer"):
            raise ModelError(f"norm must be 'rms' or 'layer'; got {self.norm!r}")
        if self.mlp not in ("gated", "plain"):
            raise ModelError(f"mlp must be 'gated' or 'plain'; got {self.mlp!r}")
        if self.activation not in ("silu", "gelu_tanh"):
            raise ModelError(f"activation must be 'silu' or 'gelu_tanh'; got {self.activation!r}")
        if self.positions not in ("rope", "learned"):
            raise ModelError(f"positions must be 'rope' or 'learned'; got {self.positions!r}")
        self._check_head_vocab()
        self._check_features()

    def _check_types(self) -> None:
        """Sizes are ints within ``config_json.SIZE_LIMITS``, flags are bools, eps and theta finite and > 0."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            object.__setattr__(self, name, check_size(name, getattr(self, name)))
        for name in ("head_dim", "max_position_embeddings"):
            object.__setattr__(self, name, check_size(name, getattr(self, name), minimum=int(name != "head_dim")))
        for name in ("qkv_bias", "o_bias", "mlp_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ModelError(f"config field {name} must be a bool, got {getattr(self, name)!r}")
        for name in ("norm_eps", "rope_theta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ModelError(f"config field {name} must be a finite number > 0, got {v!r}")

    def _check_features(self) -> None:
        """``feature_size``/``embed_size`` are ints >= 0; a narrow embedding only with features, RoPE and no tying."""
        for name in ("feature_size", "embed_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ModelError(f"config field {name} must be an int >= 0; got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.embed_size and not self.feature_size:
            raise ModelError(
                "config field embed_size > 0 needs feature_size > 0 (only a feature draft has an fc "
                "layer that maps its embedding to hidden_size)"
            )
        if self.feature_size and self.positions != "rope":
            raise ModelError("feature_size > 0 (feature-conditioned draft) needs positions='rope' (Llama family)")
        if self.tie_word_embeddings and self.embed_size not in (0, self.hidden_size):
            raise ModelError(
                f"tie_word_embeddings needs embed_size == hidden_size ({self.hidden_size}); "
                f"got embed_size={self.embed_size}"
            )

    @property
    def embed_width(self) -> int:
        """Width of the token embedding (``embed_size`` or ``hidden_size``)."""
        return self.embed_size or self.hidden_size

    def _check_head_vocab(self) -> None:
        """``head_vocab`` is 0 (full head) or in 1..vocab_size-1 with an untied head."""
        hv = self.head_vocab
        if isinstance(hv, bool) or not isinstance(hv, (int, np.integer)):
            raise ModelError(f"config field head_vocab must be an int; got {hv!r}")
        hv = int(hv)
        object.__setattr__(self, "head_vocab", hv)
        if hv == 0:
            return
        if not 0 < hv < self.vocab_size:
            raise ModelError(
                f"config field head_vocab={hv} must be 0 (full head) or in 1..{self.vocab_size - 1} (< vocab_size)"
            )
        if self.tie_word_embeddings:
            raise ModelError(
                f"config field head_vocab={hv} needs tie_word_embeddings=false: a restricted head has its own "
                "[head_vocab, hidden] weight, it cannot share the [vocab, hidden] embedding"
            )

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """End-of-sequence token ids as a tuple (HF allows an int or a list)."""
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(int(t) for t in self.eos_token_id)

    def with_(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)

    # ------------------------------------------------------------------ Hugging Face config.json

    @classmethod
    def from_hf(cls, cfg: dict[str, Any] | str | Path) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` (a dict, a file path, or a checkpoint directory).

        Parsing is strict (``accel.models.config_json``): types as JSON gives them (booleans only from JSON
        booleans), required fields present, sizes within bounds. Raises ``ModelError`` naming the field, also when
        the config uses something the reference decoders do not implement (unknown ``model_type``, an unsupported
        ``rope_scaling`` type or activation, sliding windows).
        """
        if isinstance(cfg, (str, Path)):
            path = Path(cfg)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ModelError(f"no config.json at {path}")
            try:
                cfg = json.loads(path.read_text())
            except (UnicodeDecodeError, ValueError) as exc:
                raise ModelError(f"{path} is not valid JSON: {exc}") from exc
        reader = ConfigReader(cfg)
        model_type = reader.cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelError(
                f"config field model_type={model_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        fields = gpt2_fields(reader) if model_type == "gpt2" else llama_fields(reader, model_type)
        try:
            return cls(**fields)
        except ModelError as exc:  # name the config.json fields, not only the internal ones
            names = _HF_NAMES["gpt2" if model_type == "gpt2" else "llama"]
            hf = ", ".join(h if h == n else f"{h} (here {n})" for n, h in names.items() if n in str(exc))
            raise ModelError(f"config.json: {exc}" + (f"; config fields: {hf}" if hf else "")) from None

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict that ``from_hf`` maps back to this config (and transformers loads).

        ``head_vocab`` > 0 is written as ``accel_head_vocab`` (transformers ignores it; such a checkpoint's
        ``lm_head.weight`` is ``[head_vocab, hidden]``, which only accel loads).
        """
        out = self._to_hf_base()
        if self.head_vocab > 0:
            out[HEAD_VOCAB_KEY] = self.head_vocab
        if self.feature_size > 0:
            out[FEATURE_SIZE_KEY] = self.feature_size
            out[EMBED_SIZE_KEY] = self.embed_size
        return out

    def _to_hf_base(self) -> dict[str, Any]:
        if self.model_type == "gpt2":
            return {
                "model_type": "gpt2",
                "architectures": ["GPT2LMHeadModel"],
                "vocab_size": self.vocab_size,
                "n_embd": self.hidden_size,
                "n_layer": self.num_layers,
                "n_head": self.num_heads,
                "n_inner": self.intermediate_size,
                "n_positions": self.max_position_embeddings,
                "layer_norm_epsilon": self.norm_eps,
                "activation_function": "gelu_new",
                "tie_word_embeddings": self.tie_word_embeddings,
                "bos_token_id": self.bos_token_id,
                "eos_token_id": self.eos_token_id,
            }
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
        out: dict[str, Any] = {
            "model_type": self.model_type,
            "architectures": [arch[self.model_type]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.extra.get("sliding_window"):
            out["sliding_window"] = self.extra["sliding_window"]
        if self.model_type == "llama":
            out["attention_bias"] = self.qkv_bias
            out["mlp_bias"] = self.mlp_bias
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            out["rope_scaling"] = (
                {"rope_type": "linear", "factor": rs.factor}
                if rs.kind == "linear"
                else {
                    "rope_type": "llama3",
                    "factor": rs.factor,
                    "low_freq_factor": rs.low_freq_factor,
                    "high_freq_factor": rs.high_freq_factor,
                    "original_max_position_embeddings": rs.original_max_position_embeddings,
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for metadata and JSON)."""
        d = asdict(self)
        d.pop("extra", None)
        return d


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies ``[head_dim / 2]`` (float32, computed in float64), with Llama 3 or linear scaling.

    Shared by the torch decoder and the ONNX graph builder so both rotate by exactly the same angles.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rs = config.rope_scaling
    if rs is None:
        return inv_freq.astype(np.float32)
    if rs.kind == "linear":
        return (inv_freq / rs.factor).astype(np.float32)
    # Llama 3.1 wavelength-dependent scaling (as in Meta's reference implementation)
    low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq)
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)
