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


def test_export_cli_streams_gguf_with_external_data(tmp_path, capsys):
    """A .gguf exported by the CLI with external data: the size printed counts both files, both are 0644, and the
    file runs and matches the export of the loaded model."""
    from accel.backends.export import export_onnx, onnx_file_bytes
    from accel.models import load_checkpoint
    from accel.models.random_checkpoint import write_random_checkpoint

    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    src = write_random_checkpoint(cfg, tmp_path / "tiny.gguf", kind="gguf")
    out = tmp_path / "m.onnx"
    assert main(["export", str(src), "-o", str(out), "--ctx-len", "16", "--external-data", "--quiet"]) == 0
    data = tmp_path / "m.onnx.data"
    assert data.is_file() and data.stat().st_size > out.stat().st_size
    printed = capsys.readouterr().out
    assert f"+ m.onnx.data ({onnx_file_bytes(out) / 1e6:.1f} MB in all" in printed
    assert {oct(f.stat().st_mode & 0o777) for f in (out, data)} == {"0o644"}
    ref = export_onnx(load_checkpoint(src), tmp_path / "ref.onnx", ctx_len=16, progress=False)
    ids, pos = np.array([[1, 2, 3, 4]]), np.arange(4)[None]
    np.testing.assert_array_equal(OrtBackend(out).forward(ids, pos), OrtBackend(ref).forward(ids, pos))


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


def test_export_cli_ort_ops(tmp_path, capsys):
    """``--ort-ops`` writes onnxruntime's fused operators into an fp32 graph (off by default), same logits."""
    import onnx

    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = Decoder(cfg).init_weights(5, std=0.1)
    ckpt = save_pretrained(model, tmp_path / "ckpt")
    ops = {}
    for flag in ("--ort-ops", "--no-ort-ops", None):
        out = tmp_path / f"{flag}.onnx"
        argv = ["export", str(ckpt), "-o", str(out), "--ctx-len", "16", "--quiet"]
        assert main(argv + ([flag] if flag else [])) == 0
        ops[flag] = {n.op_type for n in onnx.load(str(out)).graph.node}
        ids, pos = np.array([[1, 2, 3, 4]]), np.arange(4)[None]
        np.testing.assert_allclose(
            OrtBackend(out).forward(ids, pos), TorchBackend(model, ctx_len=16).forward(ids, pos), atol=1e-5
        )
    assert {"SkipSimplifiedLayerNormalization", "RotaryEmbedding"} <= ops["--ort-ops"]
    assert not {"SkipSimplifiedLayerNormalization", "RotaryEmbedding"} & (ops["--no-ort-ops"] | ops[None])


def test_export_writes_the_tokenizer_beside_the_graph(tmp_path, capsys):
    """``accel export`` carries the checkpoint's tokenizer to ``NAME.tokenizer.json`` beside the graph (from a
    directory's ``tokenizer.json``); without one it says what ``accel generate`` will need."""
    from tests.helpers.drafts import byte_tokenizer

    cfg = ModelConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    ckpt = save_pretrained(Decoder(cfg).init_weights(0, std=0.1), tmp_path / "ckpt")
    out = tmp_path / "g" / "m.onnx"
    assert main(["export", str(ckpt), "-o", str(out), "--ctx-len", "16", "--quiet"]) == 0
    assert "no tokenizer in" in capsys.readouterr().out and not (tmp_path / "g" / "m.tokenizer.json").exists()
    byte_tokenizer().save(str(ckpt / "tokenizer.json"))
    assert main(["export", str(ckpt), "-o", str(out), "--ctx-len", "16", "--quiet"]) == 0
    assert "m.tokenizer.json" in capsys.readouterr().out
    assert (tmp_path / "g" / "m.tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["m.onnx", "m.tokenizer.json"]  # no temp files


def test_generate_reads_the_exported_tokenizer(tmp_path, capsys):
    """``accel generate --target m.onnx`` encodes a text prompt with ``m.tokenizer.json`` (it used to fail with "no
    tokenizer found")."""
    import json

    from tests.helpers.drafts import byte_tokenizer

    cfg = ModelConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    ckpt = save_pretrained(Decoder(cfg).init_weights(0, std=0.1), tmp_path / "ckpt")
    byte_tokenizer().save(str(ckpt / "tokenizer.json"))
    out = tmp_path / "g" / "m.onnx"
    assert main(["export", str(ckpt), "-o", str(out), "--ctx-len", "32", "--quiet"]) == 0
    capsys.readouterr()
    args = ["generate", "--target", str(out), "--prompt", "hi there", "--greedy", "--max-new-tokens", "3", "--json"]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got["tokens"][0]) == 3
