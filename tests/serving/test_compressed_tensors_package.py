"""compressed-tensors' own code against accel's MX checkpoints: transformers + compressed-tensors decompress the
files accel writes to exactly accel's dequantized weights, and compressed-tensors' compressor, given accel's scales,
writes byte for byte the tensors accel writes. Skipped without the ``compressed-tensors`` package (``[serving]``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel.formats import quantize
from accel.serving import export_mx_checkpoint, load_mx_checkpoint
from accel.serving.safetensors_plain import PlainFile
from tests.serving.helpers import logits, saved, tiny_llama

pytest.importorskip("compressed_tensors")
transformers = pytest.importorskip("transformers")

PRESETS = {"mxfp4_e2m1": "MXFP4A16", "mxfp6_e2m3": "MXFP6A16", "mxfp8_e4m3": "MXFP8A16"}


def _load_with_transformers(path):
    from transformers.utils.quantization_config import CompressedTensorsConfig

    cfg = CompressedTensorsConfig(run_compressed=False)  # decompress with compressed-tensors' own code
    return transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=cfg).eval()


@pytest.mark.parametrize("fmt", sorted(PRESETS))
def test_transformers_decompresses_accel_files_to_accel_weights(tmp_path, fmt):
    model = tiny_llama(tied=False)
    export_mx_checkpoint(saved(model, tmp_path / "src"), tmp_path / "ct", fmt, "compressed-tensors")
    theirs = _load_with_transformers(tmp_path / "ct")
    ours = load_mx_checkpoint(tmp_path / "ct")
    n = 0
    for name, p in model.named_parameters():
        hf = theirs.get_parameter(name if name == "lm_head.weight" else f"model.{name}")
        if name.endswith("proj.weight"):
            want = quantize(p.detach().numpy(), fmt, axis=1, block_size=32).dequantize(np.float32)
            assert torch.equal(hf.detach().float(), torch.from_numpy(want)), name
            n += 1
        else:
            assert torch.equal(hf.detach().float(), p.detach()), name
    assert n == 14
    tokens = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hf_logits = theirs(tokens).logits.float()
    torch.testing.assert_close(hf_logits, logits(ours, tokens), atol=2e-5, rtol=0)


@pytest.mark.parametrize("fmt", sorted(PRESETS))
def test_compressed_tensors_compressor_writes_the_same_bytes(tmp_path, fmt):
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme

    model = tiny_llama(tied=False)
    export_mx_checkpoint(saved(model, tmp_path / "src"), tmp_path / "ours", fmt, "compressed-tensors")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval()
    scheme = preset_name_to_scheme(PRESETS[fmt], ["Linear"])
    apply_quantization_config(hf, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for module in hf.modules():
            if hasattr(module, "weight_scale"):  # accel's floor-rule scales, as float powers of two
                mx = quantize(module.weight.detach().numpy(), fmt, axis=1, block_size=32)
                exp = torch.from_numpy(mx.scales.astype(np.float32) - 127)
                module.weight_scale.copy_(torch.exp2(exp).to(module.weight_scale.dtype))
    compressor = ModelCompressor.from_pretrained_model(hf)
    compressor.compress_model(hf)
    hf.save_pretrained(tmp_path / "theirs")
    ours, theirs = (
        PlainFile(tmp_path / "ours" / "model.safetensors"),
        PlainFile(tmp_path / "theirs" / "model.safetensors"),
    )
    quantized = [n for n in ours.entries if n.endswith("weight_scale")]
    assert len(quantized) == 14
    for name in ours.entries:
        assert ours.entries[name] == theirs.entries[name], name
        np.testing.assert_array_equal(ours.raw(name), theirs.raw(name), err_msg=name)
