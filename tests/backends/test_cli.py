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
    assert main(["export", str(tmp_path / "missing"), "-o", str(tmp_path / "x.onnx"), "--quiet"]) == 1
    assert "neither a checkpoint directory nor a .gguf file" in capsys.readouterr().err
