"""Streaming checkpoint compression (multi-shard directory written here with safetensors) and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from accel.cli import main
from accel.errors import FormatError
from accel.formats import CompressSettings, compress_checkpoint, load_tensors, quantize
from tests.helpers.formats import make_checkpoint


@pytest.mark.parametrize("with_index", [True, False])
def test_compress_checkpoint_matches_quantize(tmp_path, rng, with_index):
    originals = make_checkpoint(tmp_path / "src", rng, with_index)
    report = compress_checkpoint(tmp_path / "src", tmp_path / "out", "mxfp6", progress=False)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "config.json",
            "tokenizer.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
        ]
    )
    loaded = {}
    for shard in sorted(out.glob("*.safetensors")):
        loaded.update(load_tensors(shard))
    assert set(loaded) == set(originals)
    compressed = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"}
    assert {layer.name for layer in report.layers} == compressed
    for name, original in originals.items():
        if name in compressed:
            assert loaded[name] == quantize(original, "mxfp6", axis=1)
        else:
            assert loaded[name].dtype == original.dtype
            np.testing.assert_array_equal(loaded[name], original)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.0.mlp.up_proj.weight.mx_codes"] == "model-00002-of-00002.safetensors"
    assert "model.layers.0.mlp.up_proj.weight" not in index


def test_cli_compress(tmp_path, rng, capsys):
    originals = make_checkpoint(tmp_path / "src", rng)
    code = main(
        [
            "compress",
            str(tmp_path / "src"),
            "-o",
            str(tmp_path / "out"),
            "--fmt",
            "mxfp4",
            "--quiet",
            "--exclude",
            "*embed*",
            "--exclude",
            "*lm_head*",
            "--exclude",
            "*norm*",
            "--exclude",
            "*mlp*",
        ]
    )
    assert code == 0
    assert "1 weights compressed to mxfp4_e2m1" in capsys.readouterr().out
    loaded = load_tensors(tmp_path / "out" / "model-00001-of-00002.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert loaded[name] == quantize(originals[name], "mxfp4", axis=1)
    # errors are reported, not raised, with exit code 2
    assert main(["compress", str(tmp_path / "src"), "-o", str(tmp_path / "out"), "--quiet"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["compress", str(tmp_path / "src"), "-o", str(tmp_path / "o2"), "--fmt", "mxfp5", "--quiet"]) == 2
    assert "known formats" in capsys.readouterr().err


def test_deprecated_keywords_write_the_same_files(tmp_path, rng):
    """The keywords of the old signature (``fmt=``, ``exclude=``, ...) fold into a ``CompressSettings`` with one
    DeprecationWarning naming it, also after a positional format name, and write the same bytes."""
    make_checkpoint(tmp_path / "src", rng, True)
    settings = CompressSettings("mxfp4", exclude=["*up_proj*"], block_size=32)
    new = compress_checkpoint(tmp_path / "src", tmp_path / "new", settings, progress=False)
    with pytest.warns(DeprecationWarning, match=r"fmt=, exclude=, block_size=.*CompressSettings\("):
        old = compress_checkpoint(
            tmp_path / "src", tmp_path / "old", fmt="mxfp4", exclude=["*up_proj*"], block_size=32, progress=False
        )
    with pytest.warns(DeprecationWarning, match="exclude="):
        mixed = compress_checkpoint(
            tmp_path / "src", tmp_path / "mixed", "mxfp4", exclude=["*up_proj*"], progress=False
        )
    assert new == old == mixed and "model.layers.0.mlp.up_proj.weight" in new.skipped
    for shard in sorted((tmp_path / "new").glob("*.safetensors")):
        assert shard.read_bytes() == (tmp_path / "old" / shard.name).read_bytes()
        assert shard.read_bytes() == (tmp_path / "mixed" / shard.name).read_bytes()
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) fromat"):
        compress_checkpoint(tmp_path / "src", tmp_path / "x", fromat="mxfp4")
    with pytest.raises(TypeError, match="give settings alone"):
        compress_checkpoint(tmp_path / "src", tmp_path / "x", settings, block_size=32)
    with pytest.raises(TypeError, match="multiple values for the format"):
        compress_checkpoint(tmp_path / "src", tmp_path / "x", "mxfp4", fmt="mxfp6")
    assert not (tmp_path / "x").exists()


def test_stream_bad_inputs(tmp_path, rng):
    with pytest.raises(FormatError, match="not a directory"):
        compress_checkpoint(tmp_path / "nope", tmp_path / "out")
    make_checkpoint(tmp_path / "src", rng)
    (tmp_path / "src" / "model-00002-of-00002.safetensors").write_bytes(b"\x05")
    with pytest.raises(FormatError, match="truncated"):
        compress_checkpoint(tmp_path / "src", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written
    (tmp_path / "src" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FormatError, match="missing"):
        compress_checkpoint(tmp_path / "src", tmp_path / "out", progress=False)


def test_bf16_checkpoint(tmp_path, rng):
    """BF16 weights are widened exactly for quantization; BF16 tensors that are copied stay BF16 on disk."""
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    w = torch.from_numpy(rng.standard_normal((32, 64)).astype(np.float32)).to(torch.bfloat16)
    norm = torch.from_numpy(rng.standard_normal(64).astype(np.float32)).to(torch.bfloat16)
    save_file({"layers.0.o_proj.weight": w, "layers.0.norm.weight": norm}, str(src / "model.safetensors"))
    report = compress_checkpoint(src, tmp_path / "out", "mxfp8", progress=False)
    assert report.layers[0].bytes_before == 32 * 64 * 2
    out = tmp_path / "out" / "model.safetensors"
    with safe_open(str(out), framework="pt") as f:
        assert f.get_tensor("layers.0.norm.weight").dtype == torch.bfloat16
        assert torch.equal(f.get_tensor("layers.0.norm.weight"), norm)
    loaded = load_tensors(out)
    assert loaded["layers.0.o_proj.weight"] == quantize(w.float().numpy(), "mxfp8", axis=1)
    np.testing.assert_array_equal(loaded["layers.0.norm.weight"], norm.float().numpy())
