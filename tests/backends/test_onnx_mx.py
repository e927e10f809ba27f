"""MX weights in ONNX: packed codes decoded in-graph and MX-rounded floats, against the torch model compressed with
``accel.compress`` (MXLinear). Both sides compute with the same dequantized weights, so only fp32 kernel order differs
(``atol=1e-5`` on O(1) logits). The packed file's size is checked against the bit count of what it stores."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest

import accel
from accel.backends import ExportWeights, OrtBackend, TorchBackend, export_onnx
from accel.models import Decoder, ModelConfig
from tests.helpers.scenario import make_tokens, run_scenario

PROMPTS = (4, 6)
CTX = 16


def _model(hidden=64, inter=80, vocab=96, layers=2, tied=False) -> Decoder:
    # inter=80 is not a multiple of the block (32): down_proj's padded last block exercises the in-graph Slice
    cfg = ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=inter,
        tie_word_embeddings=tied,
    )
    return Decoder(cfg).init_weights(0, std=0.1)


def _compressed(model: Decoder, fmt: str) -> Decoder:
    out = copy.deepcopy(model)
    accel.compress(out, fmt)
    return out


@pytest.mark.parametrize("fmt", ["mxfp6", "mxfp6_e3m2", "mxfp4", "mxfp8", "mxint8"])
@pytest.mark.parametrize("weights", ["mx-packed", "mx-rounded"])
def test_mx_export_matches_compressed_torch(fmt, weights, tmp_path):
    model = _model(tied=fmt == "mxfp6")
    reference = _compressed(model, fmt)
    path = export_onnx(
        model,
        tmp_path / "m.onnx",
        ctx_len=CTX,
        batch_size=2,
        weights=ExportWeights(weights, mx_format=fmt),
        progress=False,
    )
    from_compressed = export_onnx(
        reference, tmp_path / "c.onnx", ctx_len=CTX, batch_size=2, weights=weights, progress=False
    )
    rows = make_tokens(96, PROMPTS, seed=11)
    want = run_scenario(TorchBackend(reference, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    for p in (path, from_compressed):
        for got, w in zip(run_scenario(OrtBackend(p), rows, PROMPTS), want, strict=True):
            np.testing.assert_allclose(got, w, atol=1e-5, rtol=0)
    meta = {m.key: m.value for m in onnx.load(str(path), load_external_data=False).metadata_props}
    assert meta["accel.weights"] == weights and meta["accel.mx_format"] == accel.formats.get_format(fmt).name


def test_packed_stores_codes_not_floats(tmp_path):
    model = _model()
    path = export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, weights="mx-packed", progress=False)
    inits = {t.name: t for t in onnx.load(str(path)).graph.initializer}
    assert "layers.0.self_attn.q_proj.weight" not in inits
    assert inits["layers.0.self_attn.q_proj.weight.codes"].data_type == onnx.TensorProto.UINT8
    assert inits["layers.0.self_attn.q_proj.weight.scales"].data_type == onnx.TensorProto.UINT8


def test_mxfp6_file_size_matches_bit_count(tmp_path):
    # big enough that the graph itself (nodes, LUTs) is well under 1% of the file
    model = _model(hidden=256, inter=704, vocab=512, layers=2)
    path = export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, weights="mx-packed", progress=False)
    compressed = _compressed(model, "mxfp6")
    mx_bytes, float_bytes, mx_params = 0, 0, 0
    for module in compressed.modules():
        if hasattr(module, "mx_weight"):
            mx = module.mx_weight()
            mx_bytes += mx.nbytes
            mx_params += int(np.prod(mx.shape))
    for p in compressed.parameters():
        float_bytes += 4 * p.numel()
    expected = mx_bytes + float_bytes
    assert mx_bytes == pytest.approx(mx_params * 6.25 / 8, rel=1e-3)  # 6 bits + one 8-bit scale per 32
    size = path.stat().st_size
    assert abs(size - expected) / expected < 0.02, (size, expected)
    fp16 = export_onnx(model, tmp_path / "h.onnx", ctx_len=CTX, weights="fp16", progress=False).stat().st_size
    assert size < fp16


def test_packed_with_fp16_float_weights(tmp_path):
    import torch

    model = _model(tied=True)
    path = export_onnx(
        model,
        tmp_path / "m.onnx",
        ctx_len=CTX,
        batch_size=2,
        weights=ExportWeights("mx-packed", float_storage="fp16"),
        progress=False,
    )
    reference = _compressed(model, "mxfp6")
    with torch.no_grad():
        for p in reference.parameters():  # the weights left float are stored as fp16
            p.copy_(p.half().float())
    rows = make_tokens(96, PROMPTS, seed=12)
    for got, want in zip(
        run_scenario(OrtBackend(path), rows, PROMPTS),
        run_scenario(TorchBackend(reference, ctx_len=CTX, batch_size=2), rows, PROMPTS),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert OrtBackend(path).metadata["accel.float_weights"] == "fp16"
