"""Model architecture specs (``ModelSpec``), presets, Hugging Face config parsing, and byte counts.

The parameter count is *derived* from the architecture, never typed in. Which weights take the compressed format:
the linear layers of the decoder blocks (Q, K, V, O, FFN) — what Qualcomm's ``-mxfp6-matmul`` compresses
(docs/reference.md §2).
Embeddings, norms and biases stay FP16; the LM head stays FP16 unless ``compress_lm_head=True`` (it is a MatMul too,
so on Cloud AI 100 ``-mxfp6-matmul`` would compress it: set the option to model that). A tied LM head is the
embedding table; it is stored once (in the LM-head format when compressed) and read in full by every call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.formats import bytes_per_element, kv_bytes_per_element

UNCOMPRESSED_FORMAT = "fp16"  # embeddings, norms, biases (and the LM head by default)


class ModelSpec(SimModel):
    """Decoder-only transformer architecture (sizes in elements). ``num_params`` is derived."""

    model_config = ConfigDict(frozen=True)

    name: str = "custom"
    n_layers: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int | None = Field(default=None, gt=0, description="None = n_heads (multi-head attention)")
    head_dim: int | None = Field(default=None, gt=0, description="None = d_model // n_heads")
    ffn_dim: int = Field(gt=0)
    ffn_type: Literal["gated", "mlp"] = "gated"  # gated = SwiGLU (3 matrices), mlp = GELU MLP (2 matrices)
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    learned_positions: int = Field(default=0, ge=0, description="rows of a learned position table (GPT-2); 0 = rotary")
    head_vocab: int = Field(default=0, ge=0, description="rows of a restricted (untied) LM head; 0 = vocab_size")
    feature_dim: int = Field(
        default=0,
        ge=0,
        description="feature draft (accel.drafts.feature): width of the target "
        "hidden state it reads; 0 = an ordinary model",
    )
    embed_dim: int = Field(default=0, ge=0, description="token-embedding width of a feature draft; 0 = d_model")
    note: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.n_heads % self.kv_heads:
            raise SimError(
                f"model {self.name!r}: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.kv_heads}"
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise SimError(
                f"model {self.name!r}: d_model={self.d_model} not divisible by n_heads={self.n_heads}; give head_dim"
            )
        if self.embed_dim and not self.feature_dim:
            raise SimError(f"model {self.name!r}: embed_dim needs feature_dim > 0 (a feature draft's input layer)")
        if self.head_vocab and (self.head_vocab >= self.vocab_size or self.tied_embeddings):
            raise SimError(
                f"model {self.name!r}: head_vocab={self.head_vocab} needs an untied LM head and "
                f"head_vocab < vocab_size={self.vocab_size}"
            )
        return self

    # --- derived sizes ---------------------------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.dim_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim_head

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the layer's matrices (Q, K, V, O and the FFN): the ones that take the compressed format."""
        attn = self.d_model * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.d_model
        ffn = (3 if self.ffn_type == "gated" else 2) * self.d_model * self.ffn_dim
        return attn + ffn

    @property
    def small_params_per_layer(self) -> int:
        """Norm weights and biases of one layer (kept FP16)."""
        norms = 2 * self.d_model * (2 if self.norm_type == "layernorm" else 1)
        bias = (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + self.d_model * self.o_bias
        if self.mlp_bias:
            bias += (2 if self.ffn_type == "gated" else 1) * self.ffn_dim + self.d_model
        return norms + bias

    @property
    def embedding_params(self) -> int:
        """Token embedding table (+ learned position table)."""
        return self.vocab_size * (self.embed_dim or self.d_model) + self.learned_positions * self.d_model

    @property
    def input_proj_params(self) -> int:
        """A feature draft's input layer ``fc``: ``(embedding width + feature_dim) x d_model`` (0 otherwise); stored
        and read like the layers' matrices."""
        if not self.feature_dim:
            return 0
        return ((self.embed_dim or self.d_model) + self.feature_dim) * self.d_model

    @property
    def head_rows(self) -> int:
        """Token ids the LM head scores per position: ``head_vocab`` for a restricted head, else ``vocab_size``."""
        return self.head_vocab or self.vocab_size

    @property
    def lm_head_params(self) -> int:
        """Separate LM head weights (0 when tied to the embeddings)."""
        return 0 if self.tied_embeddings else self.head_rows * self.d_model

    @property
    def final_norm_params(self) -> int:
        return self.d_model * (2 if self.norm_type == "layernorm" else 1)

    @property
    def num_params(self) -> int:
        """Total parameter count (elements), derived from the architecture."""
        return (
            self.n_layers * (self.linear_params_per_layer + self.small_params_per_layer)
            + self.input_proj_params
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
        )

    def kv_bytes_per_token(self, kv_format: str = "fp16") -> float:
        """KV-cache bytes one token occupies across all layers (K and V, grouped-query heads)."""
        return 2.0 * self.n_layers * self.kv_dim * kv_bytes_per_element(kv_format)

    def weight_bytes(self, weight_format: str = "fp16", *, compress_lm_head: bool = False) -> float:
        """Bytes the weights occupy in device memory with the linear layers stored as ``weight_format``."""
        return weight_breakdown(self, weight_format, compress_lm_head=compress_lm_head)["total"]


def weight_breakdown(spec: ModelSpec, weight_format: str, *, compress_lm_head: bool = False) -> dict[str, float]:
    """Storage bytes per weight group: ``linear`` (compressed), ``small`` (norms/biases), ``embedding``, ``lm_head``."""
    b_w = bytes_per_element(weight_format)
    b_16 = bytes_per_element(UNCOMPRESSED_FORMAT)
    b_head = b_w if compress_lm_head else b_16
    linear = (spec.n_layers * spec.linear_params_per_layer + spec.input_proj_params) * b_w
    small = (spec.n_layers * spec.small_params_per_layer + spec.final_norm_params) * b_16
    if spec.tied_embeddings:  # one table serves both; stored in the LM head's format
        embedding = spec.learned_positions * spec.d_model * b_16
        lm_head = spec.vocab_size * spec.d_model * b_head
    else:
        embedding = spec.embedding_params * b_16
        lm_head = spec.lm_head_params * b_head
    return {
        "linear": linear,
        "small": small,
        "embedding": embedding,
        "lm_head": lm_head,
        "total": linear + small + embedding + lm_head,
    }


# --- presets -------------------------------------------------------------------------------------------------------
def _llama(
    name: str,
    L: int,
    d: int,
    h: int,
    ffn: int,
    vocab: int,
    kv: int | None = None,
    tied: bool = False,
    note: str = "",
    **kw: Any,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        n_layers=L,
        d_model=d,
        n_heads=h,
        n_kv_heads=kv,
        ffn_dim=ffn,
        vocab_size=vocab,
        tied_embeddings=tied,
        note=note,
        **kw,
    )


def _mlp(name: str, L: int, d: int, h: int, vocab: int, note: str = "", **kw: Any) -> ModelSpec:
    return ModelSpec(
        name=name,
        n_layers=L,
        d_model=d,
        n_heads=h,
        ffn_dim=4 * d,
        ffn_type="mlp",
        vocab_size=vocab,
        norm_type="layernorm",
        note=note,
        **kw,
    )


_SEED = "docs/reference.md §6"
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # models of the seed papers (docs/reference.md §6); fields it does not give are assumptions, stated in `note`
        _mlp(
            "chinchilla-70b",
            80,
            8192,
            64,
            32000,
            tied_embeddings=False,
            note=f"{_SEED}: d 8192, 64 heads, 80 layers. Assumed: FFN 4*d plain MLP, vocab 32000, untied; "
            "derived count ~65B (the paper rounds to 70B).",
        ),
        _mlp(
            "chinchilla-4b-draft",
            8,
            6144,
            48,
            32000,
            tied_embeddings=False,
            note=f"{_SEED}: d 6144, 48 heads, 8 layers (Chen et al. draft). Assumed: FFN 4*d plain MLP, vocab 32000.",
        ),
        _llama("llama-2-7b", 32, 4096, 32, 11008, 32000, note=f"{_SEED}; HF meta-llama/Llama-2-7b-hf config"),
        _llama("llama-2-13b", 40, 5120, 40, 13824, 32000, note=f"{_SEED}; HF meta-llama/Llama-2-13b-hf config"),
        _llama("vicuna-13b", 40, 5120, 40, 13824, 32000, note=f"{_SEED}: Llama 2 13B architecture"),
        _mlp(
            "codegen-6b-mono",
            33,
            4096,
            16,
            51200,
            mlp_bias=True,
            tied_embeddings=False,
            note=f"{_SEED} (CodeGen 1-7B); HF Salesforce/codegen-6B-mono config (n_inner = 4*d, MLP biases)",
        ),
        _mlp(
            "codegen-350m-mono",
            20,
            1024,
            16,
            51200,
            mlp_bias=True,
            tied_embeddings=False,
            note=f"{_SEED}; HF Salesforce/codegen-350M-mono config",
        ),
        _llama(
            "qualcomm-llama2-draft-115m",
            9,
            768,
            12,
            2176,
            32000,
            note=f"ASSUMED architecture: {_SEED} says Qualcomm's Llama 2 draft has 115M FP16 parameters, architecture "
            "not published. Chosen: Llama layout, Llama 2 vocab (shared tokenizer), d 768, 12 heads, 9 layers, "
            "FFN 2176 (115.5M).",
        ),
        # common open models (HF config.json values)
        _llama("llama-3-8b", 32, 4096, 32, 14336, 128256, kv=8, note="HF meta-llama/Meta-Llama-3-8B config"),
        _llama("llama-3.1-70b", 80, 8192, 64, 28672, 128256, kv=8, note="HF meta-llama/Llama-3.1-70B config"),
        _llama("mistral-7b", 32, 4096, 32, 14336, 32000, kv=8, note="HF mistralai/Mistral-7B-v0.1 config"),
        _llama(
            "qwen2.5-0.5b",
            24,
            896,
            14,
            4864,
            151936,
            kv=2,
            tied=True,
            qkv_bias=True,
            note="HF Qwen/Qwen2.5-0.5B config",
        ),
        _llama(
            "qwen2.5-1.5b",
            28,
            1536,
            12,
            8960,
            151936,
            kv=2,
            tied=True,
            qkv_bias=True,
            note="HF Qwen/Qwen2.5-1.5B config",
        ),
        _llama("qwen2.5-7b", 28, 3584, 28, 18944, 152064, kv=4, qkv_bias=True, note="HF Qwen/Qwen2.5-7B config"),
        _llama(
            "smollm2-135m",
            30,
            576,
            9,
            1536,
            49152,
            kv=3,
            tied=True,
            note="HF HuggingFaceTB/SmolLM2-135M; docs/reference.md §7",
        ),
        _llama("smollm2-360m", 32, 960, 15, 2560, 49152, kv=5, tied=True, note="HF HuggingFaceTB/SmolLM2-360M config"),
        _llama(
            "smollm2-1.7b", 24, 2048, 32, 8192, 49152, kv=32, tied=True, note="HF HuggingFaceTB/SmolLM2-1.7B config"
        ),
        _llama("tinyllama-1.1b", 22, 2048, 32, 5632, 32000, kv=4, note="HF TinyLlama/TinyLlama-1.1B config"),
        _mlp(
            "gpt2",
            12,
            768,
            12,
            50257,
            tied_embeddings=True,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            learned_positions=1024,
            note="HF openai-community/gpt2 config",
        ),
    ]
}
_ALIASES = {
    "codegen-6b": "codegen-6b-mono",
    "codegen-1-7b": "codegen-6b-mono",
    "codegen-350m": "codegen-350m-mono",
    "qualcomm-draft-115m": "qualcomm-llama2-draft-115m",
    "llama2-draft-115m": "qualcomm-llama2-draft-115m",
    "llama-3.1-8b": "llama-3-8b",
    "mistral-7b-v0.1": "mistral-7b",
}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def list_presets() -> list[str]:
    """Names of the built-in model presets."""
    return sorted(PRESETS)


def preset(name: str) -> ModelSpec:
    """A built-in ``ModelSpec`` by (case-insensitive) name; ``SimError`` lists the known names."""
    key = _ALIASES.get(_key(name), _key(name))
    if key not in PRESETS:
        raise SimError(f"unknown model preset {name!r}; known presets: {', '.join(list_presets())}")
    return PRESETS[key]


def from_hf_config(config: dict[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` (dict or path): llama/mistral/qwen2/gpt2/codegen fields;
    also accepts the dict of ``accel.models.ModelConfig.to_dict()`` (num_layers/num_heads/num_kv_heads/...)."""
    if not isinstance(config, dict):
        path = Path(config)
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SimError(f"cannot read model config {str(path)!r}: {exc}") from exc
        if not isinstance(config, dict):
            raise SimError(f"model config {str(path)!r} is not a JSON object")
        name = name or path.parent.name or "custom"
    cfg = config
    mtype = str(cfg.get("model_type", "")).lower()
    name = name or cfg.get("_name_or_path") or mtype or "custom"

    def get(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        if default is None:
            raise SimError(f"model config {name!r} lacks {' / '.join(keys)}")
        return default

    try:
        if "num_layers" in cfg and "hidden_size" in cfg:  # accel.models.ModelConfig.to_dict() (results/*.json)
            return ModelSpec(
                name=name,
                n_layers=int(get("num_layers")),
                d_model=int(get("hidden_size")),
                n_heads=int(get("num_heads")),
                n_kv_heads=int(get("num_kv_heads", "num_heads")),
                head_dim=int(cfg.get("head_dim") or 0) or None,
                ffn_dim=int(get("intermediate_size")),
                ffn_type="mlp" if cfg.get("mlp") == "plain" else "gated",
                vocab_size=int(get("vocab_size")),
                norm_type="layernorm" if cfg.get("norm") == "layer" else "rmsnorm",
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=bool(cfg.get("qkv_bias")),
                o_bias=bool(cfg.get("o_bias")),
                mlp_bias=bool(cfg.get("mlp_bias")),
                learned_positions=int(cfg.get("max_position_embeddings", 0))
                if cfg.get("positions") == "learned"
                else 0,
                head_vocab=int(cfg.get("head_vocab") or 0),
                feature_dim=int(cfg.get("feature_size") or 0),
                embed_dim=int(cfg.get("embed_size") or 0),
                note="from an accel.models config dict",
            )
        if "n_embd" in cfg or mtype in ("gpt2", "codegen", "gptj"):
            d = int(get("n_embd", "hidden_size"))
            is_gpt2 = mtype == "gpt2" or (mtype == "" and "n_positions" in cfg and "rotary_dim" not in cfg)
            return ModelSpec(
                name=name,
                n_layers=int(get("n_layer", "num_hidden_layers")),
                d_model=d,
                n_heads=int(get("n_head", "num_attention_heads")),
                ffn_dim=int(get("n_inner", default=4 * d)),
                ffn_type="mlp",
                vocab_size=int(get("vocab_size")),
                norm_type="layernorm",
                tied_embeddings=bool(cfg.get("tie_word_embeddings", is_gpt2)),
                mlp_bias=True,
                qkv_bias=is_gpt2,
                o_bias=is_gpt2,
                learned_positions=int(cfg.get("n_positions", 0)) if is_gpt2 else 0,
                note=f"from config.json (model_type={mtype or '?'})",
            )
        n_heads = int(get("num_attention_heads"))
        attn_bias = bool(cfg.get("attention_bias", False))
        return ModelSpec(
            name=name,
            n_layers=int(get("num_hidden_layers")),
            d_model=int(get("hidden_size")),
            n_heads=n_heads,
            n_kv_heads=int(get("num_key_value_heads", default=n_heads)),
            head_dim=cfg.get("head_dim"),
            ffn_dim=int(get("intermediate_size")),
            ffn_type="gated",
            vocab_size=int(get("vocab_size")),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=attn_bias or mtype == "qwen2",
            o_bias=attn_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            head_vocab=int(cfg.get("accel_head_vocab") or 0),
            feature_dim=int(cfg.get("accel_feature_size") or 0),
            embed_dim=int(cfg.get("accel_embed_size") or 0),
            note=f"from config.json (model_type={mtype or '?'})",
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, SimError):
            raise
        raise SimError(f"bad model config {name!r}: {exc}") from exc


def resolve_model(model: ModelSpec | str | dict[str, Any] | Path) -> ModelSpec:
    """Accept a ``ModelSpec``, a preset name, a config dict, or a path to a ``config.json``."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, dict):
        return from_hf_config(model)
    if isinstance(model, Path) or (isinstance(model, str) and (model.endswith(".json") or Path(model).is_file())):
        path = Path(model)
        if path.is_dir():
            path = path / "config.json"
        return from_hf_config(path)
    if isinstance(model, str):
        return preset(model)
    raise SimError(
        f"model must be a preset name, ModelSpec, config dict or config.json path, got {type(model).__name__}"
    )
