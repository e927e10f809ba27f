"""Exporting an accel-compressed checkpoint directory (``accel compress``) from its path: its MX weights are kept
exactly as stored, as when the loaded model is exported, and a weight choice that would re-quantize them is refused
by name (it used to exit 0 with logits up to 46% off)."""

from __future__ import annotations

import numpy as np
import pytest

from accel.backends import OrtBackend, export_onnx
from accel.cli import main
from accel.errors import BackendError
from accel.models import Decoder, ModelConfig, load_checkpoint, save_pretrained
from accel.models.sources import checkpoint_mx

IDS, POS = np.arange(1, 9)[None], np.arange(8)[None]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    cfg = ModelConfig(vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96)
    plain = save_pretrained(Decoder(cfg).init_weights(0, std=0.1), d / "plain")
    out = {}
    for block in (32, 16):
        out[block] = d / f"mxfp6-{block}"
        args = ["compress", str(plain), "-o", str(out[block]), "--fmt", "mxfp6", "--block-size", str(block), "--quiet"]
        assert main(args) == 0
    return out


def _logits(path):
    return OrtBackend(path, threads=1).forward(IDS, POS, num_logits=8)


@pytest.mark.parametrize("block", [32, 16])
def test_mx_packed_path_export_keeps_the_stored_values(folders, tmp_path, block):
    """The graph computes with the stored MX values: its logits equal the fp32 graph of the dequantized checkpoint
    (the same float32 weights). Re-quantizing the block-16 folder to blocks of 32, as the path export did, is ~2%
    off."""
    src = folders[block]
    assert len(checkpoint_mx(src)) == 14  # 2 layers x 7 Linears
    got = _logits(export_onnx(src, tmp_path / "p.onnx", ctx_len=16, weights="mx-packed", progress=False))
    ref = _logits(export_onnx(load_checkpoint(src), tmp_path / "f.onnx", ctx_len=16, progress=False))
    assert np.abs(got - ref).max() <= 1e-5 * np.ptp(ref)


@pytest.mark.parametrize("weights", ["mxfp6-kernel", "mxfp6-nbits"])
def test_code_formats_from_the_path_equal_the_loaded_model(folders, tmp_path, weights):
    """The weights that run MX codes (and quantize the head too): the same graph from the path as from the loaded
    model (whose dequantized MXFP6 weights quantize back to the same codes)."""
    src = folders[32]
    by_path = export_onnx(src, tmp_path / "p.onnx", ctx_len=16, weights=weights, progress=False)
    by_model = export_onnx(load_checkpoint(src), tmp_path / "m.onnx", ctx_len=16, weights=weights, progress=False)
    np.testing.assert_array_equal(_logits(by_path), _logits(by_model))


@pytest.mark.parametrize(
    ("block", "weights", "extra", "message"),
    [
        (32, "mxfp4-kernel", [], "compressed with mxfp6_e2m3"),
        (16, "mxfp6-kernel", [], "blocks of 16"),
        (16, "mxfp6-nbits", [], "blocks of 16"),
        (32, "mxfp6-kernel", ["--fmt", "mxfp4"], "--fmt mxfp4 would be ignored"),
        (32, "int8", ["--fmt", "mxfp4"], "--fmt mxfp4 would be ignored"),
    ],
)
def test_requantizing_choices_are_refused(folders, tmp_path, capsys, block, weights, extra, message):
    out = tmp_path / "x.onnx"
    args = ["export", str(folders[block]), "-o", str(out), "--weights", weights, "--ctx-len", "16", "--quiet", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_api_refuses_too(folders, tmp_path):
    with pytest.raises(BackendError, match="compressed with mxfp6_e2m3"):
        export_onnx(folders[32], tmp_path / "x.onnx", ctx_len=16, weights="mxfp4-kernel", progress=False)
