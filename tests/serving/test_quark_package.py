"""AMD Quark's own code against accel's Quark OCP-MX checkpoints: transformers + Quark load the files accel writes
and Quark's dequantization gives exactly accel's weights; Quark's exporter (floor-rule scales, as accel) writes
tensors that accel reads back as accel's own quantization (the same scales and values; Quark writes +0 where
accel writes -0). Skipped without ``amd-quark`` (see docs/serving.md:
it is installed with ``--no-deps`` beside the ``[serving]`` extra). Importing ``quark.torch`` takes ~40 s."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel.formats import quantize
from accel.serving import export_mx_checkpoint, load_mx_checkpoint, read_mx_checkpoint
from tests.serving.helpers import logits, saved, tiny_llama

pytest.importorskip("quark")
quark_torch = pytest.importorskip("quark.torch")
transformers = pytest.importorskip("transformers")

FORMATS = ["mxfp4_e2m1", "mxfp6_e2m3", "mxfp6_e3m2"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_quark_dequantizes_accel_files_to_accel_weights(tmp_path, fmt):
    model = tiny_llama(tied=False)
    export_mx_checkpoint(saved(model, tmp_path / "src"), tmp_path / "q", fmt, "quark")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q").eval()
    n = 0
    for name, module in theirs.named_modules():
        if type(module).__name__ == "QParamsLinear":
            with torch.no_grad():
                got = module._get_qweight(module.weight)  # Quark's unpack + dequantize
            w = model.get_parameter(f"{name.removeprefix('model.')}.weight").detach().numpy()
            want = quantize(w, fmt, axis=1, block_size=32).dequantize(np.float32)
            assert torch.equal(got.float(), torch.from_numpy(want)), name
            n += 1
    assert n == 14
    tokens = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hf_logits = theirs(tokens).logits.float()
    torch.testing.assert_close(hf_logits, logits(load_mx_checkpoint(tmp_path / "q"), tokens), atol=2e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["mxfp4_e2m1", "mxfp6_e2m3"])
def test_quark_export_reads_back_as_accel_quantization(tmp_path, fmt):
    from quark.torch import ModelQuantizer, export_safetensors
    from quark.torch.quantization.config.config import OCP_MXFP4Spec, OCP_MXFP6E2M3Spec, QConfig, QLayerConfig

    spec = {"mxfp4_e2m1": OCP_MXFP4Spec, "mxfp6_e2m3": OCP_MXFP6E2M3Spec}[fmt]
    hf = transformers.AutoModelForCausalLM.from_pretrained(saved(tiny_llama(tied=False), tmp_path / "src")).eval()
    originals = {n: m.weight.detach().numpy().copy() for n, m in hf.named_modules() if n.endswith("proj")}
    weight = spec(ch_axis=-1, is_dynamic=False, scale_calculation_mode="floor").to_quantization_spec()
    quantizer = ModelQuantizer(QConfig(global_quant_config=QLayerConfig(weight=weight), exclude=["lm_head"]))
    hf = quantizer.freeze(quantizer.quantize_model(hf, None))
    export_safetensors(hf, tmp_path / "quark")
    _, tensors = read_mx_checkpoint(tmp_path / "quark")
    assert len(originals) == 14
    neg_zero = 1 << (quantize(np.ones((1, 32), np.float32), fmt).fmt.bits - 1)
    for name, w in originals.items():
        got, want = tensors[f"{name}.weight"], quantize(w, fmt, axis=1, block_size=32)
        np.testing.assert_array_equal(got.scales, want.scales, err_msg=name)
        # Quark writes +0 for a value that rounds to zero; accel keeps its sign (-0, as ml_dtypes): same value
        plus_zero = [np.where(c == neg_zero, 0, c) for c in (got.unpacked_codes(), want.unpacked_codes())]
        np.testing.assert_array_equal(*plus_zero, err_msg=name)
        np.testing.assert_array_equal(got.dequantize(), want.dequantize(), err_msg=name)
