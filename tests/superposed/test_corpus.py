"""Corpora for n-gram stores (``accel.superposed.corpus``): the text readers' byte budget, and target-written token
rows read from real ``accel.drafts.distill_data`` shards (made by ``self_generate`` on a tiny random decoder and
saved the way ``ShardCache`` saves them), with every malformed input a clear ``NgramError``."""

from __future__ import annotations

import numpy as np
import pytest

from accel.superposed import NgramError, NgramStore
from accel.superposed.corpus import drop_containing, stdlib_files, teacher_shards, user_text_files


def test_text_over_the_budget_is_skipped_and_reading_goes_on(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 100)
    (tmp_path / "b.txt").write_text("b" * 5000)  # alone over the budget: skipped, not the end of reading
    (tmp_path / "c.txt").write_text("c" * 300)
    (tmp_path / "d.txt").write_text("d" * 700)  # does not fit in what is left after a and c
    (tmp_path / "e.txt").write_text("e" * 50)
    texts, desc = user_text_files([tmp_path], max_bytes=1000)
    assert texts == ["a" * 100, "c" * 300, "e" * 50]
    assert desc.startswith("text: 3 files, 450 bytes") and "2 files over --max-bytes skipped" in desc
    texts, desc = user_text_files([tmp_path])
    assert len(texts) == 5 and "skipped" not in desc
    with pytest.raises(NgramError, match="no UTF-8 text within max_bytes=10"):
        user_text_files([tmp_path / "b.txt"], max_bytes=10)


def test_stdlib_fills_its_budget():
    """Small budgets still read files (the sorted stdlib's first sources are larger than 3000 bytes)."""
    texts, desc = stdlib_files(max_bytes=3000)
    used = sum(len(t.encode()) for t in texts)
    assert texts and 0 < used <= 3000 and "skipped" in desc


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two real distill-data shards: a tiny random target continues ragged prompts (greedy and sampled rows, an
    end-of-sequence token that stops some rows), saved with safetensors like ``ShardCache``."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from accel.drafts.data import self_generate
    from accel.models.decoder import Decoder
    from tests.helpers.drafts import tiny_config

    model = Decoder(tiny_config(64)).init_weights(seed=3, std=0.3).eval()
    d = tmp_path_factory.mktemp("shards")
    rows = []
    with torch.inference_mode():
        for b, prompts in enumerate(([[5, 6, 7], [9], [1, 2, 3, 4, 5]], [[8, 8], [3, 1, 4, 1, 5, 9]])):
            data = self_generate(model, prompts, [0.0, 1.0, 1.0][: len(prompts)], 12, 4, seed=b, eos_token_ids=(7, 11))
            save_file(data.tensors(), str(d / f"gen-{b:05d}.safetensors"))
            rows += [(p, data.tokens[i].tolist()) for i, p in enumerate(prompts)]
    return d, rows


def _expected(prompt: list[int], row: list[int]) -> list[int]:
    """prompt + the continuation up to and including its first end-of-sequence token (or all 12 tokens)."""
    new = row[len(prompt) : len(prompt) + 12]
    cut = next((j + 1 for j, t in enumerate(new) if t in (7, 11)), len(new))
    return prompt + new[:cut]


def test_shard_rows_are_prompt_and_continuation(shards):
    folder, rows = shards
    docs, desc = teacher_shards([folder], 64)
    assert [d.tolist() for d in docs] == [_expected(p, r) for p, r in rows]
    assert desc.startswith("shards: 5 target-written rows") and "from 2 files" in desc
    one, _ = teacher_shards([folder / "gen-00001.safetensors"], 64)
    assert [d.tolist() for d in one] == [d.tolist() for d in docs[3:]]
    assert any(len(d) < len(p) + 12 for d, (p, _) in zip(docs, rows, strict=True))  # some rows stopped at eos


def test_bad_shards(shards, tmp_path):
    from safetensors.numpy import save_file

    folder, _ = shards
    with pytest.raises(NgramError, match="token ids outside"):
        teacher_shards([folder], 10)
    save_file({"hidden": np.zeros((2, 3), np.float32)}, str(tmp_path / "feat.safetensors"))
    with pytest.raises(NgramError, match=r"not a distill-data shard.*'hidden'"):
        teacher_shards([tmp_path / "feat.safetensors"], 64)
    save_file({"tokens": np.zeros((2, 3), np.float32), "mask": np.ones((2, 3), np.uint8)}, str(tmp_path / "f.st"))
    with pytest.raises(NgramError, match="2-D integer"):
        teacher_shards([tmp_path / "f.st"], 64)
    save_file({"tokens": np.zeros((2, 3), np.int64), "mask": np.ones((2, 4), np.uint8)}, str(tmp_path / "m.st"))
    with pytest.raises(NgramError, match="shaped like"):
        teacher_shards([tmp_path / "m.st"], 64)
    raw = (folder / "gen-00000.safetensors").read_bytes()
    (tmp_path / "torn.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(NgramError, match="cannot read the shard"):
        teacher_shards([tmp_path / "torn.safetensors"], 64)
    (tmp_path / "empty").mkdir()
    with pytest.raises(NgramError, match=r"no \*\.safetensors shards"):
        teacher_shards([tmp_path / "empty"], 64)
    with pytest.raises(NgramError, match="no shard file"):
        teacher_shards([tmp_path / "missing"], 64)


def test_drop_containing():
    docs = [np.array([1, 2, 3, 4]), np.array([2, 3]), np.array([5, 1, 2]), np.array([256, 1])]
    kept, dropped = drop_containing(docs, [[2, 3], [9]])
    assert [d.tolist() for d in kept] == [[5, 1, 2], [256, 1]] and dropped == 2
    kept, dropped = drop_containing(docs, [[0, 1]])  # bytes of 256 = 00 01 00 00: only whole tokens match
    assert len(kept) == 4 and dropped == 0


def test_cli_builds_from_shards(shards, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from accel.cli import main
    from tests.helpers.drafts import write_target

    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    folder, rows = shards
    target = write_target(tmp_path / "tiny", vocab=64)
    out = tmp_path / "s.ngrams"
    assert main(["ngrams", "build", "--shards", str(folder), "--target", str(target), "-o", str(out)]) == 2
    assert "tokenizer" in capsys.readouterr().err  # a 64-token checkpoint has no tokenizer.json
    tok_dir = write_target(tmp_path / "bytes")  # the byte tokenizer (256 tokens): shards' ids fit its vocabulary
    argv = ["ngrams", "build", "--shards", str(folder), "--target", str(tok_dir), "--exclude-held-out", "-o", str(out)]
    assert main(argv) == 0
    store = NgramStore.load(out)
    assert store.meta["sources"][0].startswith("shards: 5 target-written rows")
    assert "0 rows holding a held-out prompt dropped" in store.meta["sources"][0]
    p, r = rows[2]
    doc = _expected(p, r)
    assert store.positions == sum(len(_expected(p, r)) for p, r in rows)
    assert store.count(np.array([doc[:6]]))[0] >= 1
