"""accel generate on unreadable model files: one line, exit 2, a named BackendError/SpdError (no protobuf traceback)."""

from __future__ import annotations

import pytest

from accel.backends import export_onnx
from accel.backends.ort_backend import check_inplace_cache
from accel.cli import EXIT_ERROR, main
from accel.errors import BackendError
from tests.helpers.decoders import random_model


@pytest.fixture(scope="module")
def onnx_bytes(tmp_path_factory):
    path = export_onnx(random_model(0), tmp_path_factory.mktemp("g") / "m.onnx", ctx_len=32, progress=False)
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["junk", "truncated", "flipped", "empty"])
def test_corrupt_onnx_target_or_draft(tmp_path, capsys, onnx_bytes, damage):
    good = tmp_path / "good.onnx"
    good.write_bytes(onnx_bytes)
    bad = tmp_path / "bad.onnx"
    data = {
        "junk": b"junk\n",
        "truncated": onnx_bytes[: len(onnx_bytes) // 3],
        "flipped": onnx_bytes[:100] + bytes(b ^ 0xFF for b in onnx_bytes[100:400]) + onnx_bytes[400:],
        "empty": b"",
    }[damage]
    bad.write_bytes(data)
    for argv in (["--target", str(bad)], ["--target", str(good), "--draft", str(bad)]):
        assert main(["generate", *argv, "--prompt", "1 2 3", "--max-new-tokens", "2"]) == EXIT_ERROR
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "bad.onnx" in err and "Traceback" not in err, err


def test_check_inplace_cache_names_a_corrupt_file(tmp_path):
    (tmp_path / "x.onnx").write_bytes(b"junk\n")
    with pytest.raises(BackendError, match="not a readable ONNX file"):
        check_inplace_cache(tmp_path / "x.onnx", 2)


@pytest.mark.parametrize("content", ["{", "[1]", '{"model_type": "llama", "hidden_size": "x"}'])
def test_bad_config_json_next_to_the_target(tmp_path, capsys, content):
    (tmp_path / "config.json").write_text(content)
    assert main(["generate", "--target", str(tmp_path), "--prompt", "1 2", "--backend", "torch"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json" in err, err
