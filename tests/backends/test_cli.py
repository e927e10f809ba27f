"""``accel export`` end to end on a tiny checkpoint: the written file runs on OrtBackend and matches torch."""

from __future__ import annotations

import numpy as np

from accel.backends import OrtBackend, TorchBackend
from accel.cli import main
from accel.models import Decoder, ModelConfig, save_pretrained


def test_export_cli(tmp_path, capsys):
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = Decoder(cfg).init_weights(3, std=0.1)
    ckpt = save_pretrained(model, tmp_path / "ckpt")
    out = tmp_path / "m.onnx"
    code = main(
        [
            "export",
            str(ckpt),
            "-o",
            str(out),
            "--ctx-len",
            "16",
            "--weights",
            "mx-packed",
            "--qaic-dir",
            str(tmp_path / "qaic"),
            "--prompt-len",
            "8",
            "--k",
            "3",
            "--quiet",
        ]
    )
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "qaic" / "specializations.json").is_file()
    backend = OrtBackend(out)
    assert backend.metadata["accel.weights"] == "mx-packed" and backend.info.ctx_len == 16
    ids = np.array([[1, 2, 3, 4]])
    pos = np.arange(4)[None]
    import accel

    accel.compress(model, "mxfp6")
    np.testing.assert_allclose(backend.forward(ids, pos), TorchBackend(model, ctx_len=16).forward(ids, pos), atol=1e-5)


def test_export_cli_error_exit_code(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing"), "-o", str(tmp_path / "x.onnx"), "--quiet"]) == 2
    assert "neither a checkpoint directory nor a .gguf file" in capsys.readouterr().err


def test_export_cli_mxfp6_nbits_accuracy_level(tmp_path, capsys):
    """``--weights mxfp6-nbits --nbits-accuracy 1``: MatMulNBits nodes with float32 activations; the flag outside the
    nbits modes is an error that names it (exit status 2)."""
    import onnx

    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    ckpt = save_pretrained(Decoder(cfg).init_weights(3, std=0.1), tmp_path / "ckpt")
    out = tmp_path / "n.onnx"
    args = ["export", str(ckpt), "-o", str(out), "--ctx-len", "16", "--weights", "mxfp6-nbits", "--quiet"]
    assert main([*args, "--nbits-accuracy", "1"]) == 0
    nodes = [n for n in onnx.load(str(out)).graph.node if n.op_type == "MatMulNBits"]
    assert nodes and all(
        onnx.helper.get_attribute_value(a) == 1 for n in nodes for a in n.attribute if a.name == "accuracy_level"
    )
    assert OrtBackend(out).metadata["accel.mx_format"] == "mxfp6_e2m3"
    assert main([*args[:-3], "--weights", "fp32", "--nbits-accuracy", "1", "--quiet"]) == 2
    assert "accuracy_level applies to the *-nbits formats only, not fp32" in capsys.readouterr().err
