"""``checkpoint_dir``: a .gguf converted once to a float32 HF directory that loads to the same model bit for bit, with
its tokenizer; and the directory-taking commands (compress, eval-draft) run on .gguf files through it."""

from __future__ import annotations

import json

import pytest
import torch

from accel.cli import main
from accel.models import ModelConfig, load_checkpoint
from accel.models.gguf_convert import checkpoint_dir
from accel.models.random_checkpoint import write_random_checkpoint
from tests.helpers.gguf import BYTE_TOKENS, byte_tokenizer

_CFG = ModelConfig(
    vocab_size=BYTE_TOKENS, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
)


@pytest.fixture
def gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    return write_random_checkpoint(_CFG, tmp_path / "m.gguf", kind="gguf", seed=3, tokenizer=byte_tokenizer())


def test_converted_directory_loads_the_same_model(gguf_file, tmp_path):
    lines: list[str] = []
    d = checkpoint_dir(gguf_file, say=lines.append)
    assert d.parent == tmp_path / "cache" / "gguf" and len(lines) == 2
    ours, ref = load_checkpoint(d).state_dict(), load_checkpoint(gguf_file).state_dict()
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)
    from accel.models import load_tokenizer

    assert load_tokenizer(d).encode("hello world").ids == load_tokenizer(gguf_file).encode("hello world").ids
    assert json.loads((d / "config.json").read_text())["model_type"] == "llama"
    assert oct((d / "model.safetensors").stat().st_mode & 0o777) == "0o644"
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    assert checkpoint_dir(gguf_file, say=lines.append) == d and len(lines) == 2  # cached: no second conversion
    assert (d / "model.safetensors").stat().st_mtime_ns == mtime
    assert checkpoint_dir(d) == d


def test_unsupported_tokenizer_leaves_it_out(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    tok = dict(byte_tokenizer(), tokenizer_pre="deepseek-llm")
    path = write_random_checkpoint(_CFG, tmp_path / "m.gguf", kind="gguf", tokenizer=tok)
    lines: list[str] = []
    d = checkpoint_dir(path, say=lines.append)
    assert (d / "model.safetensors").is_file() and not (d / "tokenizer.json").exists()
    assert "deepseek-llm" in lines[-1]
    assert checkpoint_dir(tmp_path / "missing.gguf") == tmp_path / "missing.gguf"  # the command reports it


def test_compress_and_eval_draft_take_gguf(gguf_file, tmp_path, capsys):
    assert main(["compress", str(gguf_file), "-o", str(tmp_path / "mx"), "--quiet"]) == 0
    assert (tmp_path / "mx" / "config.json").is_file()
    draft = write_random_checkpoint(
        _CFG.with_(num_layers=1), tmp_path / "d.gguf", kind="gguf", seed=4, tokenizer=byte_tokenizer()
    )
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello hello world " * 4)
    capsys.readouterr()
    args = ["eval-draft", str(gguf_file), str(draft), "--data", str(text), "--max-k", "2", "--json"]
    assert main(args) == 0
    ev = json.loads(capsys.readouterr().out)
    assert 0.0 <= ev["alpha"] <= 1.0
