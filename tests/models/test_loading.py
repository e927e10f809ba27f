"""Loaders vs transformers on tiny random models of every family, checkpoint round trips, and loader errors.

Tolerance: logits of these tiny models are O(1); ours and transformers' differ only by fp32 operation order (fused vs
separate ops, matmul blocking), measured ~4e-7, so ``atol=2e-5`` passes with margin and still catches any real mix-up
(a swapped or transposed weight changes logits by O(0.1)).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from accel.backends import TorchBackend
from accel.errors import ModelError
from accel.models import Decoder, ModelConfig, load_checkpoint, save_pretrained
from tests.helpers.scenario import hf_reference, make_tokens, run_scenario, tiny_hf_model

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")
PROMPTS = (4, 6)
ATOL = 2e-5


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(name, transformers model, its save_pretrained directory, token rows, transformers reference logits)."""
    hf = tiny_hf_model(request.param)
    directory = tmp_path_factory.mktemp(f"hf_{request.param}")
    hf.save_pretrained(directory)
    rows = make_tokens(hf.config.vocab_size, PROMPTS)
    return request.param, hf, directory, rows, hf_reference(hf, rows)


def _check(model: Decoder, rows, ref, atol=ATOL):
    got = run_scenario(TorchBackend(model, ctx_len=32, batch_size=2), rows, PROMPTS)
    for r, g in zip(ref, got, strict=True):
        np.testing.assert_allclose(g, r, atol=atol, rtol=0)


def test_load_live_model_matches_transformers(family):
    _, hf, _, rows, ref = family
    _check(load_checkpoint(hf), rows, ref)


def test_load_directory_matches_transformers(family):
    _, _, directory, rows, ref = family
    _check(load_checkpoint(directory), rows, ref)


def test_save_pretrained_round_trip_and_transformers_loads_it(family, tmp_path):
    from transformers import AutoModelForCausalLM

    _, _hf, directory, rows, ref = family
    model = load_checkpoint(directory)
    save_pretrained(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    again = load_checkpoint(tmp_path)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2), n1
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for r, g in zip(ref, hf_reference(theirs, rows), strict=True):
        np.testing.assert_allclose(g, r, atol=ATOL, rtol=0)


def test_sharded_and_bin_checkpoints(tmp_path):
    hf = tiny_hf_model("llama")
    rows = make_tokens(hf.config.vocab_size, PROMPTS)
    ref = hf_reference(hf, rows)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="30KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    _check(load_checkpoint(sharded), rows, ref)
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text(json.dumps(hf.config.to_dict()))
    torch.save(hf.state_dict(), binary / "pytorch_model.bin")
    _check(load_checkpoint(binary), rows, ref)


# ---------------------------------------------------------------------------------------------- errors


@pytest.fixture()
def saved_llama(tmp_path):
    model = Decoder(
        ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=48)
    ).init_weights(1)
    return save_pretrained(model, tmp_path / "ckpt")


def _rewrite(directory, change):
    from safetensors.torch import load_file, save_file

    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors")


def test_unsupported_config_field(saved_llama):
    cfg = json.loads((saved_llama / "config.json").read_text())
    (saved_llama / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(ModelError, match="hidden_act"):
        load_checkpoint(saved_llama)
    (saved_llama / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    with pytest.raises(ModelError, match="model_type"):
        load_checkpoint(saved_llama)


def test_missing_weight_is_named(saved_llama):
    _rewrite(saved_llama, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelError, match=r"missing weight.*layers\.1\.mlp\.up_proj\.weight"):
        load_checkpoint(saved_llama)


def test_extra_and_misshaped_weights_are_named(saved_llama):
    _rewrite(saved_llama, lambda t: t.update({"model.layers.2.mlp.up_proj.weight": torch.zeros(48, 32)}))
    with pytest.raises(ModelError, match=r"unexpected tensor.*layers\.2\.mlp\.up_proj\.weight"):
        load_checkpoint(saved_llama)
    _rewrite(
        saved_llama,
        lambda t: (t.pop("model.layers.2.mlp.up_proj.weight"), t.update({"model.norm.weight": torch.ones(31)})),
    )
    with pytest.raises(ModelError, match=r"'norm\.weight' has shape \(31,\)"):
        load_checkpoint(saved_llama)


def test_truncated_safetensors(saved_llama):
    f = saved_llama / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="truncated"):
        load_checkpoint(saved_llama)
    f.write_bytes(data[:5])
    with pytest.raises(ModelError, match="truncated"):
        load_checkpoint(saved_llama)


def test_bad_sources(tmp_path):
    with pytest.raises(ModelError, match=r"neither a checkpoint directory nor a .gguf"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(ModelError, match=r"no config.json"):
        load_checkpoint(tmp_path)
    with pytest.raises(ModelError, match="cannot load a model from int"):
        load_checkpoint(3)


def test_load_accel_compressed_checkpoint(saved_llama, tmp_path):
    import copy

    import accel
    from accel.formats import compress_checkpoint

    out = tmp_path / "mx"
    compress_checkpoint(saved_llama, out, "mxfp6", progress=False)
    loaded = load_checkpoint(out)  # MX tensors dequantized
    reference = copy.deepcopy(load_checkpoint(saved_llama))
    accel.compress(reference, "mxfp6")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(loaded.causal_forward(ids), reference.causal_forward(ids))


def test_unsupported_gguf_architecture(tmp_path):
    import gguf

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match=r"general.architecture='falcon' is not supported"):
        load_checkpoint(path)
    path.write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(ModelError, match="not a readable GGUF"):
        load_checkpoint(path)


def test_save_pretrained_refuses_compressed_models(tmp_path):
    import accel

    model = Decoder(
        ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    )
    accel.compress(model, "mxfp6")
    with pytest.raises(ModelError, match="MX-compressed layers"):
        save_pretrained(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()
