"""Strict config.json parsing: types as JSON gives them, required fields named, sizes bounded."""

from __future__ import annotations

import json

import pytest

from accel.errors import ModelError
from accel.models import ModelConfig
from accel.models.config_json import SIZE_LIMITS
from tests.helpers.decoders import tiny_config

LLAMA = tiny_config().to_hf()
GPT2 = (
    tiny_config()
    .with_(
        model_type="gpt2",
        norm="layer",
        mlp="plain",
        activation="gelu_tanh",
        positions="learned",
        num_kv_heads=4,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
    )
    .to_hf()
)


def test_valid_configs_round_trip():
    for cfg in (LLAMA, GPT2):
        assert ModelConfig.from_hf(cfg).to_hf() == cfg


@pytest.mark.parametrize("value", ["false", "true", 0, 1, "no", None])
def test_booleans_come_from_json_booleans_only(value):
    cfg = {**LLAMA, "tie_word_embeddings": value}
    if value is None:  # null: the default (false for Llama)
        assert ModelConfig.from_hf(cfg).tie_word_embeddings is False
        return
    with pytest.raises(ModelError, match="tie_word_embeddings must be a JSON boolean"):
        ModelConfig.from_hf(cfg)
    with pytest.raises(ModelError, match="attention_bias must be a JSON boolean"):
        ModelConfig.from_hf({**LLAMA, "attention_bias": "false"})


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"hidden_size": "32"}, "hidden_size must be an integer, got '32'"),
        ({"hidden_size": 32.0}, "hidden_size must be an integer, got 32.0"),
        ({"hidden_size": True}, "hidden_size must be an integer, got True"),
        ({"num_hidden_layers": 0}, r"num_hidden_layers=0 is out of range; allowed: 1\.\.1024"),
        ({"vocab_size": 10**9}, r"vocab_size=1000000000 is out of range; allowed: 1\.\.4194304"),
        ({"hidden_size": 2**40, "head_dim": 8}, "hidden_size=1099511627776 is out of range"),
        ({"num_key_value_heads": 0}, "num_key_value_heads=0 is out of range"),
        ({"max_position_embeddings": "x"}, "max_position_embeddings must be an integer"),
        ({"rms_norm_eps": "x"}, "rms_norm_eps must be a finite number"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be > 0"),
        ({"rope_theta": 0}, "rope_theta must be > 0"),
        ({"rope_theta": float("inf")}, "rope_theta must be a finite number"),
        ({"eos_token_id": "x"}, "eos_token_id must be a token id"),
        ({"eos_token_id": [1, "2"]}, "eos_token_id must be a token id"),
        ({"bos_token_id": -1}, "bos_token_id must be a token id"),
        ({"rope_scaling": [1]}, "rope_scaling must be a JSON object or null, got list"),
        ({"rope_scaling": {"rope_type": "linear", "factor": "x"}}, "rope_scaling.factor must be a finite number"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0}}, "high_freq_factor"),
        ({"hidden_act": 3}, "hidden_act must be a string"),
        ({"model_type": ["llama"]}, "model_type=\\['llama'\\] is not supported"),
        ({"accel_head_vocab": "8"}, "accel_head_vocab must be an integer"),
    ],
)
def test_wrong_types_and_ranges_are_named(changes, needle):
    with pytest.raises(ModelError, match=needle):
        ModelConfig.from_hf({**LLAMA, **changes})


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_attention_heads", "intermediate_size"])
def test_missing_required_fields_are_named(field):
    cfg = dict(LLAMA)
    del cfg[field]
    with pytest.raises(ModelError, match=f"missing the required field '{field}'"):
        ModelConfig.from_hf(cfg)
    cfg = dict(GPT2)
    del cfg["n_embd"]
    with pytest.raises(ModelError, match="missing the required field 'n_embd'"):
        ModelConfig.from_hf(cfg)


@pytest.mark.parametrize("content", ["[1, 2]", "null", "3", '"text"', "{", "\xff"])
def test_config_file_that_is_not_an_object(tmp_path, content):
    (tmp_path / "config.json").write_bytes(content.encode("latin-1"))
    with pytest.raises(ModelError, match=r"JSON object|not valid JSON"):
        ModelConfig.from_hf(tmp_path)


def test_direct_construction_is_checked_too():
    with pytest.raises(ModelError, match="vocab_size must be an integer"):
        tiny_config().with_(vocab_size="32")
    with pytest.raises(ModelError, match="tie_word_embeddings must be a bool"):
        tiny_config().with_(tie_word_embeddings="false")
    with pytest.raises(ModelError, match="norm_eps must be a finite number > 0"):
        tiny_config().with_(norm_eps=float("nan"))
    assert max(SIZE_LIMITS.values()) <= 1 << 24


def test_checkpoint_with_string_boolean_does_not_tie(tmp_path):
    """The issue's case: a config.json with "false" as a string used to tie the embeddings (bool("false"))."""
    torch = pytest.importorskip("torch")
    from accel.models import load_checkpoint, save_pretrained
    from tests.helpers.decoders import random_model

    save_pretrained(random_model(0), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": "false"}))
    with pytest.raises(ModelError, match="tie_word_embeddings must be a JSON boolean"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    model = load_checkpoint(tmp_path)
    assert model.lm_head.weight.data_ptr() != model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.embed_tokens.weight)
