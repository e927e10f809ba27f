"""accel.compress / save / load on a tiny random Llama built from a config (transformers is the reference)."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import accel  # noqa: E402
from accel.errors import FormatError  # noqa: E402
from accel.formats import quantize  # noqa: E402
from accel.formats.compress import select_linear_layers  # noqa: E402
from accel.formats.torch_ops import MXLinear  # noqa: E402

CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
)


def tiny_llama(seed: int = 0, **overrides):
    config = transformers.LlamaConfig(**{**CONFIG, **overrides})
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))


def test_compress_tiny_llama(ids):
    model = tiny_llama()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        logits_ref = reference(ids).logits
    compressed, report = accel.compress(model, "mxfp6")
    linear_names = [n for n, m in reference.named_modules() if isinstance(m, torch.nn.Linear)]
    assert report.skipped == ["lm_head"]
    assert [layer.name for layer in report.layers] == [f"{n}.weight" for n in linear_names if n != "lm_head"]
    assert all(isinstance(compressed.get_submodule(n), MXLinear) for n in linear_names if n != "lm_head")
    assert isinstance(compressed.lm_head, torch.nn.Linear) and not isinstance(compressed.lm_head, MXLinear)
    # 6.25 bits / element against 16: 60.9 % saving (docs/reference.md §1); every in_features here is a multiple of 32
    assert report.saving_vs_fp16 == pytest.approx(1 - 6.25 / 16, abs=1e-12)
    assert report.saving_vs_fp32 == pytest.approx(1 - 6.25 / 32, abs=1e-12)
    assert round(report.saving_vs_fp16 * 100, 1) == 60.9
    dumped = json.loads(report.model_dump_json())  # the totals are part of the JSON report
    assert dumped["saving_vs_fp16"] == report.saving_vs_fp16 and len(dumped["layers"]) == 14
    assert dumped["bytes_after"] == sum(layer.bytes_after for layer in report.layers)
    assert all(layer.sqnr_db > 25 for layer in report.layers)  # E2M3 on Gaussian-like init: ~30 dB
    with torch.no_grad():
        logits = compressed(ids).logits
    # Exact check: the same model with each Linear weight replaced by numpy's dequantize(quantize(w)) gives the
    # same logits up to float32 summation order (the matmuls are the same, so 1e-5 is generous).
    emulated = copy.deepcopy(reference)
    for name in linear_names[:-1]:
        lin = emulated.get_submodule(name)
        lin.weight.data = torch.from_numpy(quantize(lin.weight.detach().numpy(), "mxfp6", axis=1).dequantize())
    with torch.no_grad():
        torch.testing.assert_close(logits, emulated(ids).logits, rtol=0, atol=1e-5)
    # Closeness to the uncompressed model: weights at ~30 dB SQNR (~3 % RMS error) perturb logits by a few % of
    # their scale; allow 10 % of the largest logit and require the argmax to mostly agree.
    assert (logits - logits_ref).abs().max() <= 0.1 * logits_ref.abs().max()
    assert (logits.argmax(-1) == logits_ref.argmax(-1)).float().mean() >= 0.9


def test_save_load_round_trip(tmp_path, ids):
    model, _ = accel.compress(tiny_llama(), "mxfp4", exclude=["*.mlp.down_proj"])
    path = tmp_path / "tiny.safetensors"
    accel.save_compressed(model, path)
    skeleton = tiny_llama(seed=1)  # different random weights: everything must come from the file
    loaded = accel.load_compressed(path, model=skeleton)
    assert isinstance(loaded.model.layers[0].mlp.down_proj, torch.nn.Linear)
    assert not isinstance(loaded.model.layers[0].mlp.down_proj, MXLinear)
    for name, module in model.named_modules():
        if isinstance(module, MXLinear):
            assert loaded.get_submodule(name).mx_weight() == module.mx_weight()
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k1 == k2 and torch.equal(v1, v2), k1
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_tied_embeddings_are_kept_and_saved_once(tmp_path, ids):
    model = tiny_llama(tie_word_embeddings=True)
    model.lm_head.weight = model.model.embed_tokens.weight  # make sure the tie is real
    _chosen, skipped = select_linear_layers(model, exclude=None)
    assert "lm_head" in skipped
    assert select_linear_layers(model, include=["*q_proj"])[0] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.self_attn.q_proj",
    ]
    model, report = accel.compress(model, "mxfp8", include=["*q_proj", "*k_proj"], exclude=["model.layers.1.*"])
    assert [layer.name for layer in report.layers] == [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ]
    path = tmp_path / "tied.safetensors"
    accel.save_compressed(model, path)
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        keys = set(f.keys())
    assert ("lm_head.weight" in keys) != ("model.embed_tokens.weight" in keys)  # stored once
    loaded = accel.load_compressed(path, tiny_llama(seed=3, tie_word_embeddings=True))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_bad_inputs(tmp_path):
    with pytest.raises(FormatError, match=r"nn.Module"):
        accel.compress(object(), "mxfp6")
    with pytest.raises(FormatError, match="known formats"):
        accel.compress(tiny_llama(), "mxfp3")
    model, _ = accel.compress(tiny_llama(), "mxfp6")
    path = tmp_path / "m.safetensors"
    accel.save_compressed(model, path)
    wrong = tiny_llama(hidden_size=96, intermediate_size=128)
    with pytest.raises(FormatError, match="shape"):
        accel.load_compressed(path, wrong)
    with pytest.raises(FormatError, match="missing"):
        accel.load_compressed(path, tiny_llama(num_hidden_layers=3))


def test_bf16_model_round_trip(tmp_path, ids):
    model = tiny_llama().to(torch.bfloat16)
    model, report = accel.compress(model, "mxfp6")
    assert report.layers[0].bytes_before == 64 * 64 * 2
    assert report.saving_vs_fp16 == pytest.approx(1 - 6.25 / 16, abs=1e-12)
    path = tmp_path / "bf16.safetensors"
    accel.save_compressed(model, path)
    loaded = accel.load_compressed(path, tiny_llama(seed=5).to(torch.bfloat16))
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k1 == k2 and v1.dtype == v2.dtype and torch.equal(v1, v2), k1
    with torch.no_grad():
        out = loaded(ids).logits
    assert out.dtype == torch.bfloat16 and torch.equal(out, model(ids).logits)


def test_failed_load_leaves_the_skeleton_untouched(tmp_path):
    model, _ = accel.compress(tiny_llama(), "mxfp6")
    path = tmp_path / "m.safetensors"
    accel.save_compressed(model, path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # corrupt the last stored bytes
    path.write_bytes(bytes(data))
    skeleton = tiny_llama(seed=7)
    before = {k: v.clone() for k, v in skeleton.state_dict().items()}
    with pytest.raises(FormatError, match="checksum mismatch"):
        accel.load_compressed(path, skeleton)
    assert not any(isinstance(m, MXLinear) for m in skeleton.modules())
    assert all(torch.equal(before[k], v) for k, v in skeleton.state_dict().items())
