"""``ModelSpec`` from a Hugging Face ``config.json``: each supported family is read with its own architecture (FFN
kind, norms, parallel blocks, biases, tied heads, experts, windows); anything else is rejected with a message
naming what is unsupported, never read as a Llama by default.

Supported ``model_type``: llama (Llama 1-3, TinyLlama, SmolLM, XGen, AmberChat), mistral, mixtral, qwen2, qwen3,
gemma, gemma2, gemma3_text, phi, phi3, opt, gptj, codegen, gpt_neox, falcon, gpt2; also the dict of
``accel.models.ModelConfig.to_dict()``. Types are strict: a boolean must be a JSON boolean
(``"tie_word_embeddings": "false"`` is an error, not ``True``), an integer a JSON integer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from accel.errors import SimError
from accel.sim.models import ModelSpec
from accel.sim.presets import preset

_LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")
SUPPORTED = (*_LLAMA_LIKE, "phi", "opt", "gptj", "codegen", "gpt_neox", "falcon", "gpt2")
_REJECTED = {
    "qwen2_moe": "shared experts with their own sizes (moe_intermediate_size) are not modelled",
    "qwen3_moe": "experts with their own size (moe_intermediate_size) are not modelled",
    "deepseek_v2": "multi-head latent attention and shared experts are not modelled",
    "deepseek_v3": "multi-head latent attention and shared experts are not modelled",
    "gemma3": "a multimodal config: pass its text_config (model_type gemma3_text)",
    "llama4": "interleaved MoE layers and chunked attention are not modelled",
    "mllama": "a multimodal config: vision cross-attention layers are not modelled",
    "bloom": "ALiBi-only BLOOM layout is not modelled",
    "mpt": "MPT layout is not modelled",
    "RefinedWeb": "old Falcon config keys; use a current tiiuae config (model_type falcon)",
    "RefinedWebModel": "old Falcon config keys; use a current tiiuae config (model_type falcon)",
}
_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_MISSING = object()


class _Config:
    """Strict typed access to a config dict; ``None`` values count as missing (HF writes null for defaults)."""

    def __init__(self, cfg: dict[str, Any], where: str) -> None:
        self.cfg, self.where = cfg, where

    def _raw(self, key: str, default: Any) -> Any:
        v = self.cfg.get(key)
        if v is None:
            if default is _MISSING:
                raise SimError(f"model config {self.where} lacks {key!r}")
            return default
        return v

    def int_(self, key: str, default: Any = _MISSING) -> Any:
        v = self._raw(key, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise SimError(f"model config {self.where}: {key!r} must be a JSON integer, got {v!r}")
        return v

    def bool_(self, key: str, default: bool) -> bool:
        v = self._raw(key, default)
        if not isinstance(v, bool):
            raise SimError(f"model config {self.where}: {key!r} must be a JSON boolean (true/false), got {v!r}")
        return v

    def float_(self, key: str, default: Any = _MISSING) -> Any:
        v = self._raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SimError(f"model config {self.where}: {key!r} must be a JSON number, got {v!r}")
        return v

    def str_(self, key: str, default: str) -> str:
        v = self._raw(key, default)
        if not isinstance(v, str):
            raise SimError(f"model config {self.where}: {key!r} must be a JSON string, got {v!r}")
        return v


def _dtype(c: _Config) -> str:
    raw = c.cfg.get("torch_dtype", c.cfg.get("dtype"))
    if raw is None:
        return "fp16"
    if raw not in _DTYPES:
        raise SimError(f"model config {c.where}: torch_dtype {raw!r} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[raw]


def _llama_family(c: _Config, mtype: str) -> dict[str, Any]:
    n_heads = c.int_("num_attention_heads")
    n_layers = c.int_("num_hidden_layers")
    gemma = mtype.startswith("gemma")
    kw: dict[str, Any] = dict(
        n_layers=n_layers,
        d_model=c.int_("hidden_size"),
        n_heads=n_heads,
        n_kv_heads=c.int_("num_key_value_heads", n_heads),
        head_dim=c.int_("head_dim", None),
        ffn_dim=c.int_("intermediate_size"),
        vocab_size=c.int_("vocab_size"),
        tied_embeddings=c.bool_("tie_word_embeddings", gemma),
        qkv_bias=c.bool_("attention_bias", mtype == "qwen2") or mtype == "qwen2",
        o_bias=c.bool_("attention_bias", False) and mtype != "qwen2",
        mlp_bias=c.bool_("mlp_bias", False),
        max_context=c.int_("max_position_embeddings", None),
        qk_norm=mtype in ("qwen3", "gemma3_text"),
        norms_per_layer=4 if mtype in ("gemma2", "gemma3_text") else 2,
    )
    if mtype == "mixtral":
        kw.update(n_experts=c.int_("num_local_experts"), experts_per_token=c.int_("num_experts_per_tok"))
    elif "num_local_experts" in c.cfg or "num_experts" in c.cfg:
        raise SimError(f"model config {c.where}: experts in a {mtype!r} config are not modelled (only mixtral's)")
    window = c.int_("sliding_window", None)
    if mtype in ("qwen2", "qwen3"):
        if window is not None and c.bool_("use_sliding_window", False):
            kw.update(sliding_window=window, sliding_layers=n_layers - c.int_("max_window_layers", 0))
    elif mtype == "gemma2" and window is not None:
        kw.update(sliding_window=window, sliding_layers=(n_layers + 1) // 2)  # even layers slide
    elif mtype == "gemma3_text" and window is not None:
        types = c.cfg.get("layer_types")
        if isinstance(types, list):
            kw.update(sliding_window=window, sliding_layers=sum(t == "sliding_attention" for t in types))
        else:
            pattern = c.int_("sliding_window_pattern", 6)
            kw.update(sliding_window=window, sliding_layers=sum((i + 1) % pattern != 0 for i in range(n_layers)))
    elif window is not None and mtype in ("mistral", "mixtral", "phi3"):
        kw.update(sliding_window=window)
    return kw


def _falcon(c: _Config) -> dict[str, Any]:
    n_heads = c.int_("num_attention_heads")
    d = c.int_("hidden_size")
    new_arch = c.bool_("new_decoder_architecture", False)
    if new_arch:
        kv = c.int_("num_kv_heads", n_heads)
        norms = c.int_("num_ln_in_parallel_attn", 2)
    else:
        kv = 1 if c.bool_("multi_query", True) else n_heads
        norms = 1 if c.bool_("parallel_attn", True) else 2
    bias = c.bool_("bias", False)
    return dict(
        n_layers=c.int_("num_hidden_layers"),
        d_model=d,
        n_heads=n_heads,
        n_kv_heads=kv,
        ffn_dim=c.int_("ffn_hidden_size", 4 * d),
        ffn_type="mlp",
        vocab_size=c.int_("vocab_size"),
        tied_embeddings=c.bool_("tie_word_embeddings", True),
        norm_type="layernorm",
        norms_per_layer=norms,
        parallel_block=new_arch or c.bool_("parallel_attn", True),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        max_context=c.int_("max_position_embeddings", 2048),
    )


def _opt(c: _Config) -> dict[str, Any]:
    d = c.int_("hidden_size")
    proj = c.int_("word_embed_proj_dim", d)
    if proj != d:
        raise SimError(
            f"model config {c.where}: OPT with word_embed_proj_dim {proj} != hidden_size {d} (project_in/out, e.g. "
            "opt-350m) is not modelled"
        )
    bias = c.bool_("enable_bias", True)
    affine = c.bool_("layer_norm_elementwise_affine", True)
    n_pos = c.int_("max_position_embeddings", 2048)
    return dict(
        n_layers=c.int_("num_hidden_layers"),
        d_model=d,
        n_heads=c.int_("num_attention_heads"),
        ffn_dim=c.int_("ffn_dim"),
        ffn_type="mlp",
        vocab_size=c.int_("vocab_size"),
        tied_embeddings=c.bool_("tie_word_embeddings", True),
        norm_type="layernorm",
        norms_per_layer=2 if affine else 0,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        learned_positions=n_pos + 2,  # OPT's position table has 2 offset rows
        max_context=n_pos,
    )


def _gpt_style(c: _Config, mtype: str) -> dict[str, Any]:
    """gpt2 / gptj / codegen: n_embd-style keys."""
    d = c.int_("n_embd")
    gpt2 = mtype == "gpt2"
    n_pos = c.int_("n_positions", 1024 if gpt2 else None)
    return dict(
        n_layers=c.int_("n_layer"),
        d_model=d,
        n_heads=c.int_("n_head"),
        ffn_dim=c.int_("n_inner", 4 * d),
        ffn_type="mlp",
        vocab_size=c.int_("vocab_size"),
        norm_type="layernorm",
        tied_embeddings=c.bool_("tie_word_embeddings", gpt2),
        mlp_bias=True,
        qkv_bias=gpt2,
        o_bias=gpt2,
        lm_head_bias=not gpt2,
        parallel_block=not gpt2,  # GPT-J and CodeGen: attention and MLP read one ln_1
        norms_per_layer=2 if gpt2 else 1,
        learned_positions=n_pos if gpt2 else 0,
        max_context=n_pos,
    )


def _other(c: _Config, mtype: str) -> dict[str, Any]:
    """gpt_neox and phi (LayerNorm, biases, parallel blocks)."""
    neox = mtype == "gpt_neox"
    n_heads = c.int_("num_attention_heads")
    attn_bias = c.bool_("attention_bias", True) if neox else True
    kw = dict(
        n_layers=c.int_("num_hidden_layers"),
        d_model=c.int_("hidden_size"),
        n_heads=n_heads,
        n_kv_heads=c.int_("num_key_value_heads", n_heads),
        ffn_dim=c.int_("intermediate_size"),
        ffn_type="mlp",
        vocab_size=c.int_("vocab_size"),
        norm_type="layernorm",
        tied_embeddings=c.bool_("tie_word_embeddings", False),
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        mlp_bias=True,
        max_context=c.int_("max_position_embeddings", None),
    )
    if neox:
        kw.update(parallel_block=c.bool_("use_parallel_residual", True), norms_per_layer=2)
    else:  # phi-1/1.5/2: one input LayerNorm feeds attention and MLP in parallel; the LM head has a bias
        kw.update(parallel_block=True, norms_per_layer=1, lm_head_bias=True, qk_norm=c.bool_("qk_layernorm", False))
    return kw


def _accel_dict(c: _Config) -> dict[str, Any]:
    """The dict of ``accel.models.ModelConfig.to_dict()`` (results/*.json)."""
    mlp, norm, pos = c.str_("mlp", "gated"), c.str_("norm", "rms"), c.str_("positions", "rope")
    return dict(
        n_layers=c.int_("num_layers"),
        d_model=c.int_("hidden_size"),
        n_heads=c.int_("num_heads"),
        n_kv_heads=c.int_("num_kv_heads", c.int_("num_heads")),
        head_dim=c.int_("head_dim", 0) or None,
        ffn_dim=c.int_("intermediate_size"),
        ffn_type="mlp" if mlp == "plain" else "gated",
        vocab_size=c.int_("vocab_size"),
        norm_type="layernorm" if norm == "layer" else "rmsnorm",
        tied_embeddings=c.bool_("tie_word_embeddings", False),
        qkv_bias=c.bool_("qkv_bias", False),
        o_bias=c.bool_("o_bias", False),
        mlp_bias=c.bool_("mlp_bias", False),
        learned_positions=c.int_("max_position_embeddings", 0) if pos == "learned" else 0,
        max_context=c.int_("max_position_embeddings", None),
        head_vocab=c.int_("head_vocab", 0),
        feature_dim=c.int_("feature_size", 0),
        embed_dim=c.int_("embed_size", 0),
    )


def _size(n: int) -> str:
    return f"{n / 1e9:.3g}b" if n >= 1e9 else f"{n / 1e6:.3g}m"


def from_hf_config(config: dict[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` (dict or path) of a supported family (module docstring).
    The name is ``name``, else ``_name_or_path``, else the config's folder, else ``<model_type>-<size>``."""
    where = "dict"
    if not isinstance(config, dict):
        path = Path(config)
        where = repr(str(path))
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SimError(f"cannot read model config {where}: {exc}") from exc
        if not isinstance(config, dict):
            raise SimError(f"model config {where} is not a JSON object")
        name = name or path.parent.name or None
    c = _Config(config, where)
    if config.get("quantization_config") is not None:
        raise SimError(
            f"model config {where} holds a quantization_config: give the unquantized model's config and choose the "
            "weight format (weight_format / target_format) instead"
        )
    mtype = config.get("model_type")
    if not isinstance(mtype, str):
        raise SimError(f"model config {where} has no model_type; supported: {', '.join(SUPPORTED)}")
    if mtype in _REJECTED:
        raise SimError(f"model config {where}: model_type {mtype!r} is not supported: {_REJECTED[mtype]}")
    if "num_layers" in config and "hidden_size" in config:
        kw, note = _accel_dict(c), "from an accel.models config dict"
    elif mtype in _LLAMA_LIKE:
        kw = _llama_family(c, mtype)
    elif mtype == "falcon":
        kw = _falcon(c)
    elif mtype == "opt":
        kw = _opt(c)
    elif mtype in ("gpt2", "gptj", "codegen"):
        kw = _gpt_style(c, mtype)
    elif mtype in ("gpt_neox", "phi"):
        kw = _other(c, mtype)
    else:
        raise SimError(
            f"model config {where}: model_type {mtype!r} is not supported; supported: {', '.join(SUPPORTED)}"
        )
    if "num_layers" not in config:
        note = f"from config.json (model_type={mtype})"
    kw.update(head_vocab=kw.get("head_vocab") or c.int_("accel_head_vocab", 0),
              feature_dim=kw.get("feature_dim") or c.int_("accel_feature_size", 0),
              embed_dim=kw.get("embed_dim") or c.int_("accel_embed_size", 0))  # fmt: skip
    given = name or config.get("_name_or_path")
    spec = ModelSpec(**{"name": str(given) if given else "custom", "dtype": _dtype(c), "note": note, **kw})
    return spec if given else spec.model_copy(update={"name": f"{mtype}-{_size(spec.num_params)}"})


def resolve_model(model: ModelSpec | str | dict[str, Any] | Path, name: str | None = None) -> ModelSpec:
    """Accept a ``ModelSpec``, a preset name, a config dict, or a path to a ``config.json`` (or its folder);
    ``name`` renames the result."""
    if isinstance(model, ModelSpec):
        spec = model
    elif isinstance(model, dict) and "n_layers" in model and "model_type" not in model:  # a ModelSpec's dump
        spec = ModelSpec(**model)
    elif isinstance(model, dict):
        spec = from_hf_config(model, name)
    elif isinstance(model, Path) or (isinstance(model, str) and (model.endswith(".json") or Path(model).exists())):
        path = Path(model)
        spec = from_hf_config(path / "config.json" if path.is_dir() else path, name)
    elif isinstance(model, str):
        spec = preset(model)
    else:
        raise SimError(
            f"model must be a preset name, ModelSpec, config dict or config.json path, got {type(model).__name__}"
        )
    return spec.model_copy(update={"name": name}) if name and spec.name != name else spec
