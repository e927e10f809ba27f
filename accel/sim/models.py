"""Model architecture specs (``ModelSpec``) and their byte counts. Presets: ``presets.py``; Hugging Face configs:
``hf_config.py``.

The parameter count is *derived* from the architecture, never typed in. Which weights take the compressed format:
the linear layers of the decoder blocks (Q, K, V, O, FFN, MoE router and experts) - what Qualcomm's
``-mxfp6-matmul`` compresses (docs/reference.md §2). Embeddings, norms and biases stay in the model's dtype; the LM
head too unless ``compress_lm_head=True`` (it is a MatMul, so on Cloud AI 100 ``-mxfp6-matmul`` compresses it: set
the option to model that). A tied LM head is the embedding table, stored once and read in full by every call.

Architecture variants honoured: gated (SwiGLU/GeGLU, 3 matrices) or plain (2 matrices) FFNs, RMSNorm or LayerNorm
(weight + bias), 1 to 4 norms per layer and per-head q/k norms, parallel attention + MLP blocks (GPT-J, NeoX,
Falcon, Phi: one all-reduce per layer under tensor parallelism), biases per group, tied heads, learned position
tables, mixture-of-experts FFNs (bytes of the experts a step actually touches), sliding-window attention.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.formats import bytes_per_element, kv_bytes_per_element

DTYPES = ("fp16", "bf16", "fp32")


class ModelSpec(SimModel):
    """Decoder-only transformer architecture (sizes in elements). ``num_params`` is derived."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    n_layers: int = Field(gt=0, le=1_000)
    d_model: int = Field(gt=0, le=1 << 20)
    n_heads: int = Field(gt=0, le=1 << 14)
    n_kv_heads: int | None = Field(default=None, gt=0, description="None = n_heads (multi-head attention)")
    head_dim: int | None = Field(default=None, gt=0, description="None = d_model // n_heads")
    ffn_dim: int = Field(gt=0, le=1 << 22)
    ffn_type: Literal["gated", "mlp"] = "gated"  # gated = SwiGLU/GeGLU (3 matrices), mlp = GELU/ReLU MLP (2)
    vocab_size: int = Field(gt=0, le=1 << 24)
    dtype: Literal["fp16", "bf16", "fp32"] = Field(default="fp16", description="stored dtype of the checkpoint")
    tied_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: int = Field(default=2, ge=0, le=4, description="1: GPT-J/Phi; 2: Llama; 4: Gemma 2/3")
    qk_norm: bool = Field(default=False, description="per-head q and k norms (Qwen3, Gemma 3)")
    parallel_block: bool = Field(default=False, description="attention and MLP in parallel (GPT-J, NeoX, Falcon)")
    n_experts: int = Field(default=0, ge=0, le=4096, description="MoE experts per layer; 0 = a dense FFN")
    experts_per_token: int = Field(default=0, ge=0, le=4096)
    sliding_window: int | None = Field(default=None, gt=0, description="attention window of the sliding layers")
    sliding_layers: int | None = Field(default=None, ge=0, description="layers with the window; None = all")
    max_context: int | None = Field(default=None, gt=0, description="max_position_embeddings; None = unknown")
    learned_positions: int = Field(default=0, ge=0, description="rows of a learned position table (GPT-2); 0 = rotary")
    head_vocab: int = Field(default=0, ge=0, description="rows of a restricted (untied) LM head; 0 = vocab_size")
    feature_dim: int = Field(
        default=0,
        ge=0,
        description="feature draft (accel.drafts.feature): width of the target hidden state it reads; 0 = ordinary",
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
        if bool(self.n_experts) != bool(self.experts_per_token) or self.experts_per_token > self.n_experts:
            raise SimError(
                f"model {self.name!r}: a mixture of experts needs 1 <= experts_per_token <= n_experts, got "
                f"{self.experts_per_token} of {self.n_experts}"
            )
        if self.sliding_layers is not None and (self.sliding_window is None or self.sliding_layers > self.n_layers):
            raise SimError(f"model {self.name!r}: sliding_layers needs sliding_window and at most n_layers layers")
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
    def attn_params_per_layer(self) -> int:
        """Q, K, V and O matrices of one layer."""
        return self.d_model * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.d_model

    @property
    def expert_params(self) -> int:
        """Matrices of one FFN (one expert of a mixture)."""
        return (3 if self.ffn_type == "gated" else 2) * self.d_model * self.ffn_dim

    @property
    def router_params(self) -> int:
        """The MoE router (gate) of one layer: d_model x n_experts (0 for a dense model)."""
        return self.d_model * self.n_experts

    @property
    def linear_params_per_layer(self) -> int:
        """Stored weights of the layer's matrices (attention, router, every expert): the compressed ones."""
        return self.attn_params_per_layer + self.router_params + max(self.n_experts, 1) * self.expert_params

    @property
    def active_linear_params_per_layer(self) -> int:
        """Matrix weights one token multiplies by (attention, router, its ``experts_per_token`` experts)."""
        return self.attn_params_per_layer + self.router_params + max(self.experts_per_token, 1) * self.expert_params

    def expected_experts(self, rows: Any) -> Any:
        """Expected number of distinct experts ``rows`` tokens touch in one layer (uniform routing):
        ``E (1 - (1 - k/E)^rows)``; 1 for a dense model."""
        if not self.n_experts:
            return 1.0
        e, k = self.n_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** rows)

    @property
    def norm_size(self) -> int:
        return self.d_model * (2 if self.norm_type == "layernorm" else 1)

    @property
    def small_params_per_layer(self) -> int:
        """Norm weights and biases of one layer (kept in the model's dtype)."""
        norms = self.norms_per_layer * self.norm_size + (2 * self.dim_head if self.qk_norm else 0)
        bias = (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + self.d_model * self.o_bias
        if self.mlp_bias:
            bias += max(self.n_experts, 1) * ((2 if self.ffn_type == "gated" else 1) * self.ffn_dim + self.d_model)
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
        return self.norm_size + (self.head_rows if self.lm_head_bias else 0)

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

    @property
    def allreduces_per_layer(self) -> int:
        """All-reduces per layer under tensor parallelism: 2, or 1 for a parallel attention + MLP block."""
        return 1 if self.parallel_block else 2

    def attended_tokens(self, context: Any) -> Any:
        """Mean tokens a layer's attention reads when ``context`` tokens are cached (sliding layers read at most
        their window); vectorized over ``context``."""
        ctx = np.asarray(context, dtype=np.float64)
        if self.sliding_window is None:
            return ctx
        n_slide = self.n_layers if self.sliding_layers is None else self.sliding_layers
        return (n_slide * np.minimum(ctx, self.sliding_window) + (self.n_layers - n_slide) * ctx) / self.n_layers

    def kv_bytes_per_token(self, kv_format: str = "fp16") -> float:
        """KV-cache bytes one token occupies across all layers (K and V, grouped-query heads)."""
        return 2.0 * self.n_layers * self.kv_dim * kv_bytes_per_element(kv_format)

    def kv_cache_bytes(self, tokens: float, kv_format: str = "fp16") -> float:
        """KV-cache bytes of one sequence of ``tokens`` positions (sliding layers keep at most their window)."""
        return float(self.attended_tokens(tokens)) * self.kv_bytes_per_token(kv_format)

    def weight_bytes(self, weight_format: str | None = None, *, compress_lm_head: bool = False) -> float:
        """Bytes the weights occupy in device memory with the linear layers stored as ``weight_format`` (default:
        the model's dtype)."""
        return weight_breakdown(self, weight_format or self.dtype, compress_lm_head=compress_lm_head)["total"]


def weight_breakdown(spec: ModelSpec, weight_format: str, *, compress_lm_head: bool = False) -> dict[str, float]:
    """Storage bytes per weight group: ``linear`` (compressed), ``small`` (norms/biases), ``embedding``, ``lm_head``.
    Everything but the linear layers (and a compressed LM head) stays in the model's dtype."""
    b_w = bytes_per_element(weight_format)
    b_16 = bytes_per_element(spec.dtype)
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


# the older single module's names, for callers that import them from here (presets and config parsing now live in
# their own modules; imported lazily because both import ModelSpec from this one)
_MOVED = {
    "from_hf_config": "accel.sim.hf_config",
    "resolve_model": "accel.sim.hf_config",
    "PRESETS": "accel.sim.presets",
    "list_presets": "accel.sim.presets",
    "preset": "accel.sim.presets",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DTYPES", "ModelSpec", "weight_breakdown"]
