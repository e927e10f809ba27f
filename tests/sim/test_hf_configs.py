"""from_hf_config honours each family's architecture, or rejects it by name; never reads a config as a Llama by
default. The configs are the real config.json fields of the named checkpoints (copied from the Hugging Face Hub);
parameter counts are the published ones (or the HF module's exact count, stated)."""

import copy

import pytest

from accel.errors import SimError
from accel.sim import from_hf_config, predict_speedup, preset, step_time

OPT_2_7B = {  # facebook/opt-2.7b: no intermediate_size (ffn_dim), ReLU MLP, LayerNorm, biases, tied head
    "_name_or_path": "facebook/opt-2.7b",
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "do_layer_norm_before": True,
    "enable_bias": True,
    "ffn_dim": 10240,
    "hidden_size": 2560,
    "layer_norm_elementwise_affine": True,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "torch_dtype": "float16",
    "vocab_size": 50272,
    "word_embed_proj_dim": 2560,
}
GPTJ_6B = {  # EleutherAI/gpt-j-6b: parallel attention + MLP behind one ln_1, LM-head bias
    "_name_or_path": "EleutherAI/gpt-j-6b",
    "model_type": "gptj",
    "n_embd": 4096,
    "n_head": 16,
    "n_inner": None,
    "n_layer": 28,
    "n_positions": 2048,
    "rotary_dim": 64,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "vocab_size": 50400,
}
PYTHIA_6_9B = {  # EleutherAI/pythia-6.9b (GPT-NeoX)
    "model_type": "gpt_neox",
    "hidden_size": 4096,
    "intermediate_size": 16384,
    "max_position_embeddings": 2048,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_parallel_residual": True,
    "vocab_size": 50432,
}
FALCON_7B = {  # tiiuae/falcon-7b: multi-query, parallel attention, no biases, tied head
    "model_type": "falcon",
    "alibi": False,
    "bias": False,
    "hidden_size": 4544,
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 65024,
}
PHI_2 = {  # microsoft/phi-2
    "model_type": "phi",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "max_position_embeddings": 2048,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "partial_rotary_factor": 0.4,
    "qk_layernorm": False,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 51200,
}
MIXTRAL = {  # mistralai/Mixtral-8x7B-v0.1
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
GEMMA_7B = {  # google/gemma-7b: head_dim 256 (not d/h), tied by default
    "model_type": "gemma",
    "head_dim": 256,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "max_position_embeddings": 8192,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 16,
    "torch_dtype": "bfloat16",
    "vocab_size": 256000,
}
GEMMA2_2B = {  # google/gemma-2-2b: four norms per layer, sliding window on every other layer
    "model_type": "gemma2",
    "head_dim": 256,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "vocab_size": 256000,
}
QWEN3_8B = {  # Qwen/Qwen3-8B: q/k norms, no qkv bias, head_dim 128
    "model_type": "qwen3",
    "attention_bias": False,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}


@pytest.mark.parametrize(
    "cfg,params",
    [
        (OPT_2_7B, 2_651_596_800),  # published 2.7B; the HF module count
        (GPTJ_6B, 6_050_882_784),  # HF GPTJForCausalLM's parameter count (28 x ln_1, lm_head with bias)
        (PYTHIA_6_9B, 6_857_302_016),  # Pythia paper, Table 1 (6,857,302,016)
        (FALCON_7B, 6_921_720_704),
        (PHI_2, 2_779_683_840),
        (MIXTRAL, 46_702_792_704),
        (GEMMA_7B, 8_537_680_896),
        (GEMMA2_2B, 2_614_341_888),
        (QWEN3_8B, 8_190_735_360),
    ],
)
def test_families_match_published_parameter_counts(cfg, params):
    assert from_hf_config(cfg).num_params == params


def test_opt_is_read_as_opt_not_as_a_llama():
    """The old parser rejected OPT (no intermediate_size) and, with the key added, read it as SwiGLU/RMSNorm
    (+35 % parameters)."""
    opt = from_hf_config(OPT_2_7B)
    assert (opt.ffn_type, opt.norm_type, opt.tied_embeddings) == ("mlp", "layernorm", True)
    assert opt.qkv_bias and opt.mlp_bias and opt.learned_positions == 2050 and opt.max_context == 2048
    assert opt.name == "facebook/opt-2.7b" and opt.dtype == "fp16"
    assert opt.num_params == preset("opt-2.7b").num_params
    with_key = dict(OPT_2_7B, intermediate_size=10240)
    assert from_hf_config(with_key).num_params == opt.num_params  # the stray key changes nothing
    with pytest.raises(SimError, match="word_embed_proj_dim"):
        from_hf_config(dict(OPT_2_7B, word_embed_proj_dim=512))  # opt-350m's projections: refused, not misread


def test_parallel_blocks_are_honoured():
    gptj = from_hf_config(GPTJ_6B)
    assert gptj.parallel_block and gptj.norms_per_layer == 1 and gptj.lm_head_bias
    assert gptj.num_params == preset("gpt-j-6b").num_params
    # one all-reduce per layer under tensor parallelism instead of two
    four = step_time(gptj, "cloud-ai-100-ultra", devices=4)
    serial = gptj.model_copy(update={"parallel_block": False})
    assert step_time(serial, "cloud-ai-100-ultra", devices=4).comm_s == pytest.approx(2 * four.comm_s)
    neox = from_hf_config(PYTHIA_6_9B)
    assert neox.parallel_block and neox.norms_per_layer == 2
    assert not from_hf_config(dict(PYTHIA_6_9B, use_parallel_residual=False)).parallel_block
    falcon = from_hf_config(FALCON_7B)
    assert falcon.kv_heads == 1 and falcon.norms_per_layer == 1 and falcon.tied_embeddings


def test_windows_experts_norms_and_dtypes():
    g2 = from_hf_config(GEMMA2_2B)
    assert g2.sliding_window == 4096 and g2.sliding_layers == 13 and g2.norms_per_layer == 4 and g2.tied_embeddings
    assert g2.dtype == "fp32" and g2.dim_head == 256
    q3 = from_hf_config(QWEN3_8B)
    assert q3.qk_norm and not q3.qkv_bias and q3.sliding_window is None
    mix = from_hf_config(MIXTRAL)
    assert (mix.n_experts, mix.experts_per_token) == (8, 2) and mix.dtype == "bf16"
    assert from_hf_config(dict(MIXTRAL, sliding_window=4096)).sliding_window == 4096
    assert predict_speedup(MIXTRAL, None, "h100-sxm", devices=2).configs[0].name == "bf16 AR"


@pytest.mark.parametrize(
    "change,match",
    [
        ({"tie_word_embeddings": "false"}, "JSON boolean"),  # bool("false") used to tie the head
        ({"tie_word_embeddings": 0}, "JSON boolean"),
        ({"num_hidden_layers": "32"}, "JSON integer"),
        ({"num_hidden_layers": 32.0}, "JSON integer"),
        ({"num_hidden_layers": True}, "JSON integer"),
        ({"hidden_size": None}, "lacks 'hidden_size'"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        ({"model_type": "qwen2_moe"}, "qwen2_moe"),
        ({"model_type": "gemma3"}, "text_config"),
        ({"model_type": "bert"}, "not supported; supported:"),
        ({"model_type": None}, "no model_type"),
        ({"num_local_experts": 8}, "experts"),
    ],
)
def test_strict_types_and_named_rejections(change, match):
    cfg = copy.deepcopy(QWEN3_8B)
    cfg.update(change)
    with pytest.raises(SimError, match=match):
        from_hf_config(cfg)


def test_names_without_a_name_or_path(tmp_path):
    cfg = {k: v for k, v in QWEN3_8B.items()}
    assert from_hf_config(cfg).name == "qwen3-8.19b"
    assert from_hf_config(cfg, name="mine").name == "mine"
    d = tmp_path / "my-qwen"
    d.mkdir()
    (d / "config.json").write_text(__import__("json").dumps(cfg))
    assert from_hf_config(d / "config.json").name == "my-qwen"
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe not json")
    with pytest.raises(SimError, match="cannot read"):
        from_hf_config(bad)
