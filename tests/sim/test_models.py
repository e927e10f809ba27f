"""ModelSpec: derived parameter counts, byte counts per format, HF config parsing, presets, bad input."""

import json

import pytest

from accel.errors import SimError
from accel.sim import ModelSpec, bits_per_element, from_hf_config, list_presets, preset, weight_breakdown

LLAMA2_7B_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


def test_llama2_7b_param_count_by_hand():
    d, f, L, V = 4096, 11008, 32, 32000
    per_layer = 4 * d * d + 3 * d * f + 2 * d  # Q K V O, gate/up/down, two RMSNorms
    hand = L * per_layer + 2 * V * d + d  # embeddings, LM head, final norm
    spec = from_hf_config(LLAMA2_7B_CONFIG)
    assert spec.num_params == hand == 6_738_415_616  # HF reports 6.74B
    assert preset("llama-2-7b").num_params == hand


@pytest.mark.parametrize(
    "fmt,bits",
    [
        ("fp32", 32),
        ("fp16", 16),
        ("bf16", 16),
        ("mxfp8", 8.25),
        ("mxfp6", 6.25),
        ("mxfp4", 4.25),
        ("mxint8", 8.25),
        ("int8", 8),
        ("int4", 4.25),
    ],
)
def test_bits_per_element(fmt, bits):
    assert bits_per_element(fmt) == bits
    assert bits_per_element(fmt.upper()) == bits


def test_llama2_7b_bytes_fp16_and_mxfp6():
    spec = preset("llama-2-7b")
    fp16 = weight_breakdown(spec, "fp16")
    mx = weight_breakdown(spec, "mxfp6")
    assert fp16["total"] == 2 * spec.num_params
    assert mx["linear"] / fp16["linear"] == 0.390625  # exactly 6.25 / 16 (docs/reference.md §1)
    lin = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    assert mx["linear"] == lin * 6.25 / 8
    # embeddings, LM head and norms stay fp16 by default
    for part in ("embedding", "lm_head", "small"):
        assert mx[part] == fp16[part]
    head = weight_breakdown(spec, "mxfp6", compress_lm_head=True)
    assert head["lm_head"] == 32000 * 4096 * 6.25 / 8


def test_kv_bytes_grouped_query_attention():
    spec = preset("llama-3-8b")  # 32 layers, 8 KV heads of 128
    assert spec.kv_bytes_per_token("fp16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert preset("llama-2-7b").kv_bytes_per_token("fp16") == 2 * 32 * 32 * 128 * 2  # MHA: 4x more
    assert spec.kv_bytes_per_token("fp8") == 65536


@pytest.mark.parametrize(
    "name,params",
    [
        ("gpt2", 124_439_808),
        ("smollm2-135m", 134_515_008),
        ("qwen2.5-0.5b", 494_032_768),
        ("llama-3-8b", 8_030_261_248),
    ],
)
def test_presets_match_published_counts(name, params):
    assert preset(name).num_params == params


def test_hf_config_families(tmp_path):
    gpt2 = from_hf_config(
        {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
    )
    assert gpt2.num_params == preset("gpt2").num_params
    qwen = from_hf_config(
        {
            "model_type": "qwen2",
            "hidden_size": 896,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "intermediate_size": 4864,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        }
    )
    assert qwen.num_params == preset("qwen2.5-0.5b").num_params
    codegen = from_hf_config(
        {
            "model_type": "codegen",
            "n_embd": 1024,
            "n_layer": 20,
            "n_head": 16,
            "vocab_size": 51200,
            "n_positions": 2048,
            "rotary_dim": 32,
            "n_inner": None,
            "tie_word_embeddings": False,
        }
    )
    assert codegen.ffn_dim == 4096 and codegen.ffn_type == "mlp"
    assert codegen.num_params == preset("codegen-350m").num_params
    p = tmp_path / "m" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(LLAMA2_7B_CONFIG))
    assert from_hf_config(p).num_params == 6_738_415_616


def test_bad_input():
    with pytest.raises(SimError, match=r"known presets: .*llama-2-7b"):
        preset("llama-9000")
    with pytest.raises(SimError, match="n_layers"):
        ModelSpec(n_layers=-2, d_model=64, n_heads=4, ffn_dim=128, vocab_size=100)
    with pytest.raises(SimError, match="n_kv_heads"):
        ModelSpec(n_layers=2, d_model=64, n_heads=4, n_kv_heads=3, ffn_dim=128, vocab_size=100)
    with pytest.raises(SimError, match="lacks"):
        from_hf_config({"model_type": "llama", "hidden_size": 64})
    with pytest.raises(SimError, match=r"allowed: .*mxfp6"):
        bits_per_element("fp5")
    assert "qualcomm-llama2-draft-115m" in list_presets()
    assert "ASSUMED" in preset("qualcomm-llama2-draft-115m").note
    assert abs(preset("qualcomm-llama2-draft-115m").num_params - 115e6) < 1e6


def test_accel_models_config_dict():
    """The dict accel.models.ModelConfig.to_dict() writes into results/*.json (SmolLM2-135M, GPT-2)."""
    smol = {
        "vocab_size": 49152,
        "hidden_size": 576,
        "num_layers": 30,
        "num_heads": 9,
        "num_kv_heads": 3,
        "intermediate_size": 1536,
        "model_type": "llama",
        "head_dim": 64,
        "norm": "rms",
        "mlp": "gated",
        "positions": "rope",
        "max_position_embeddings": 8192,
        "qkv_bias": False,
        "o_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
    }
    assert from_hf_config(smol).num_params == preset("smollm2-135m").num_params
    gpt2 = {
        "vocab_size": 50257,
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "num_kv_heads": 12,
        "intermediate_size": 3072,
        "model_type": "gpt2",
        "head_dim": 0,
        "norm": "layer",
        "mlp": "plain",
        "positions": "learned",
        "max_position_embeddings": 1024,
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    }
    assert from_hf_config(gpt2).num_params == 124_439_808
