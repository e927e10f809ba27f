"""Built-in model presets: the seed papers' models (docs/reference.md §6) and common open models, with values copied
from their Hugging Face ``config.json`` (named in each ``note``). Fields a source does not give are assumptions,
stated in the ``note``. ``dtype`` is the checkpoint's ``torch_dtype`` (fp32 checkpoints are listed as fp16, the
format one deploys; said in the note). ``max_context`` is ``max_position_embeddings``.
"""

from __future__ import annotations

from typing import Any

from accel.errors import SimError
from accel.sim.models import ModelSpec


def _llama(name: str, L: int, d: int, h: int, ffn: int, vocab: int, kv: int | None = None, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, n_layers=L, d_model=d, n_heads=h, n_kv_heads=kv, ffn_dim=ffn, vocab_size=vocab, **kw)


def _mlp(name: str, L: int, d: int, h: int, vocab: int, ffn: int | None = None, **kw: Any) -> ModelSpec:
    """A plain-MLP LayerNorm model (GPT-2, OPT, GPT-J, CodeGen, Pythia, Phi, Falcon, Chinchilla)."""
    kw.setdefault("norm_type", "layernorm")
    return ModelSpec(
        name=name, n_layers=L, d_model=d, n_heads=h, ffn_dim=ffn or 4 * d, ffn_type="mlp", vocab_size=vocab, **kw
    )


def _gptj_like(name: str, L: int, d: int, h: int, vocab: int, note: str, **kw: Any) -> ModelSpec:
    """GPT-J / CodeGen: parallel attention + MLP behind one LayerNorm, MLP and LM-head biases, no attention bias."""
    return _mlp(
        name,
        L,
        d,
        h,
        vocab,
        parallel_block=True,
        norms_per_layer=1,
        mlp_bias=True,
        lm_head_bias=True,
        max_context=2048,
        note=note,
        **kw,
    )


def _opt(name: str, L: int, d: int, h: int) -> ModelSpec:
    """OPT: ReLU MLP, two LayerNorms, biases everywhere, tied head, learned positions (2048 + 2 offset rows)."""
    return _mlp(
        name,
        L,
        d,
        h,
        50272,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        tied_embeddings=True,
        learned_positions=2050,
        max_context=2048,
        note=f"HF facebook/{name} config",
    )


_SEED = "docs/reference.md §6"
_FP32 = " (checkpoint stored fp32; deployed as fp16)"
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # models of the seed papers; fields the papers do not give are assumptions, stated in `note`
        _mlp(
            "chinchilla-70b",
            80,
            8192,
            64,
            32000,
            note=f"{_SEED}: d 8192, 64 heads, 80 layers. Assumed: FFN 4*d "
            "plain MLP, vocab 32000, untied; derived count ~65B (the paper rounds to 70B).",
        ),
        _mlp(
            "chinchilla-4b-draft",
            8,
            6144,
            48,
            32000,
            note=f"{_SEED}: d 6144, 48 heads, 8 layers (Chen et al. draft). Assumed: FFN 4*d plain MLP, vocab 32000.",
        ),
        _llama("llama-2-7b", 32, 4096, 32, 11008, 32000, max_context=4096, note="HF meta-llama/Llama-2-7b-hf"),
        _llama("llama-2-13b", 40, 5120, 40, 13824, 32000, max_context=4096, note="HF meta-llama/Llama-2-13b-hf"),
        _llama("llama-2-70b", 80, 8192, 64, 28672, 32000, kv=8, max_context=4096, note="HF meta-llama/Llama-2-70b-hf"),
        _llama("vicuna-13b", 40, 5120, 40, 13824, 32000, max_context=4096, note=f"{_SEED}: Llama 2 13B architecture"),
        _llama("amberchat-7b", 32, 4096, 32, 11008, 32000, max_context=2048, note="HF LLM360/AmberChat config"),
        _llama("xgen-7b", 32, 4096, 32, 11008, 51200, max_context=8192, note="HF Salesforce/xgen-7b-8k-base" + _FP32),
        _gptj_like("codegen-6b-mono", 33, 4096, 16, 51200, f"{_SEED} (CodeGen 1-7B); HF Salesforce/codegen-6B-mono"),
        _gptj_like("codegen-350m-mono", 20, 1024, 16, 51200, "HF Salesforce/codegen-350M-mono" + _FP32),
        _gptj_like("gpt-j-6b", 28, 4096, 16, 50400, "HF EleutherAI/gpt-j-6b" + _FP32),
        _llama(
            "qualcomm-llama2-draft-115m",
            9,
            768,
            12,
            2176,
            32000,
            max_context=4096,
            note=f"ASSUMED architecture: "
            f"{_SEED} says Qualcomm's Llama 2 draft has 115M FP16 parameters, architecture not published. Chosen: "
            "Llama layout, Llama 2 vocab (shared tokenizer), d 768, 12 heads, 9 layers, FFN 2176 (115.5M).",
        ),
        _llama(
            "llama-3-8b",
            32,
            4096,
            32,
            14336,
            128256,
            kv=8,
            dtype="bf16",
            max_context=8192,
            note="HF meta-llama/Meta-Llama-3-8B",
        ),
        _llama(
            "llama-3.1-8b",
            32,
            4096,
            32,
            14336,
            128256,
            kv=8,
            dtype="bf16",
            max_context=131072,
            note="HF meta-llama/Llama-3.1-8B",
        ),
        _llama(
            "llama-3.1-70b",
            80,
            8192,
            64,
            28672,
            128256,
            kv=8,
            dtype="bf16",
            max_context=131072,
            note="HF meta-llama/Llama-3.1-70B",
        ),
        _llama(
            "mistral-7b",
            32,
            4096,
            32,
            14336,
            32000,
            kv=8,
            dtype="bf16",
            max_context=32768,
            sliding_window=4096,
            note="HF mistralai/Mistral-7B-v0.1",
        ),
        _llama(
            "mixtral-8x7b",
            32,
            4096,
            32,
            14336,
            32000,
            kv=8,
            dtype="bf16",
            max_context=32768,
            n_experts=8,
            experts_per_token=2,
            note="HF mistralai/Mixtral-8x7B-v0.1",
        ),
        _llama(
            "qwen2.5-0.5b",
            24,
            896,
            14,
            4864,
            151936,
            kv=2,
            tied_embeddings=True,
            qkv_bias=True,
            dtype="bf16",
            max_context=32768,
            note="HF Qwen/Qwen2.5-0.5B",
        ),
        _llama(
            "qwen2.5-1.5b",
            28,
            1536,
            12,
            8960,
            151936,
            kv=2,
            tied_embeddings=True,
            qkv_bias=True,
            dtype="bf16",
            max_context=32768,
            note="HF Qwen/Qwen2.5-1.5B",
        ),
        _llama(
            "qwen2.5-7b",
            28,
            3584,
            28,
            18944,
            152064,
            kv=4,
            qkv_bias=True,
            dtype="bf16",
            max_context=131072,
            note="HF Qwen/Qwen2.5-7B",
        ),
        _llama(
            "smollm2-135m",
            30,
            576,
            9,
            1536,
            49152,
            kv=3,
            tied_embeddings=True,
            dtype="bf16",
            max_context=8192,
            note="HF HuggingFaceTB/SmolLM2-135M; docs/reference.md §7",
        ),
        _llama(
            "smollm2-360m",
            32,
            960,
            15,
            2560,
            49152,
            kv=5,
            tied_embeddings=True,
            dtype="bf16",
            max_context=8192,
            note="HF HuggingFaceTB/SmolLM2-360M",
        ),
        _llama(
            "smollm2-1.7b",
            24,
            2048,
            32,
            8192,
            49152,
            kv=32,
            tied_embeddings=True,
            dtype="bf16",
            max_context=8192,
            note="HF HuggingFaceTB/SmolLM2-1.7B",
        ),
        _llama(
            "tinyllama-1.1b",
            22,
            2048,
            32,
            5632,
            32000,
            kv=4,
            dtype="bf16",
            max_context=2048,
            note="HF TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        ),
        _llama(
            "gemma-7b",
            28,
            3072,
            16,
            24576,
            256000,
            kv=16,
            head_dim=256,
            tied_embeddings=True,
            dtype="bf16",
            max_context=8192,
            note="HF google/gemma-7b",
        ),
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
            max_context=1024,
            note="HF openai-community/gpt2" + _FP32,
        ),
        _opt("opt-2.7b", 32, 2560, 32),
        _opt("opt-6.7b", 32, 4096, 32),
        _opt("opt-13b", 40, 5120, 40),
        _mlp(
            "pythia-6.9b",
            32,
            4096,
            32,
            50432,
            parallel_block=True,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            max_context=2048,
            note="HF EleutherAI/pythia-6.9b (GPT-NeoX, parallel residual)",
        ),
        _mlp(
            "falcon-7b",
            32,
            4544,
            71,
            65024,
            n_kv_heads=1,
            parallel_block=True,
            norms_per_layer=1,
            tied_embeddings=True,
            dtype="bf16",
            max_context=2048,
            note="HF tiiuae/falcon-7b (multi-query)",
        ),
        _mlp(
            "phi-2",
            32,
            2560,
            32,
            51200,
            parallel_block=True,
            norms_per_layer=1,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            lm_head_bias=True,
            max_context=2048,
            note="HF microsoft/phi-2",
        ),
    ]
}
_ALIASES = {
    "codegen-6b": "codegen-6b-mono",
    "codegen-1-7b": "codegen-6b-mono",
    "codegen-350m": "codegen-350m-mono",
    "qualcomm-draft-115m": "qualcomm-llama2-draft-115m",
    "llama2-draft-115m": "qualcomm-llama2-draft-115m",
    "llama2-7b": "llama-2-7b",
    "mistral-7b-v0.1": "mistral-7b",
    "gptj-6b": "gpt-j-6b",
    "xgen-7b-8k": "xgen-7b",
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
