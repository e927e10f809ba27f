"""``accel ngrams build`` and ``accel complete`` end to end on a tiny random checkpoint with a byte-level tokenizer
(real files, a real onnxruntime session exported with mixed inputs)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from accel.cli import main
from accel.superposed import NgramStore
from tests.helpers.drafts import byte_tokenizer, write_target

TEXT = "the cat sat on the mat. the cat ate the rat. " * 20


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_target(tmp_path_factory.mktemp("tgt") / "tiny")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))


def test_build_and_complete(target, tmp_path, capsys):
    (tmp_path / "a.txt").write_text(TEXT)
    out = tmp_path / "s.ngrams"
    args = ["ngrams", "build", str(tmp_path / "a.txt"), "--stdlib", "--max-bytes", "20000"]
    assert main([*args, "--self-written", "3", "--target", str(target), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    store = NgramStore.load(out)
    assert store.meta["sources"][0].startswith("text: 1 files") and len(store.meta["sources"]) == 3
    tok = byte_tokenizer()
    cat = tok.encode("the cat").ids
    assert store.count(np.array([cat[-6:]]))[0] >= 40  # every "the cat" of the text (6 byte tokens, max order)

    argv = ["complete", "--prompt", "the cat", "--target", str(target), "--store", str(out), "--max-new-tokens", "5"]
    assert main([*argv, "--json", "--threads", "1"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in res] == ["superposed", "nucleus p=0.9"]
    for r in res:
        assert len(r["tokens"]) == 3 and all(len(t) == 5 for t in r["tokens"]) and len(r["perplexities"]) == 3
    assert res[0]["calls"] == 5 and res[1]["calls"] == 3 * 5
    assert main([*argv, "--no-nucleus", "--backend", "torch"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("superposed:") and "nucleus" not in text and text.count("(ppl") == 3


def test_errors(target, tmp_path, capsys):
    assert main(["ngrams", "build", "-o", str(tmp_path / "x"), "--tokenizer", str(target)]) == 2
    assert "no corpus" in capsys.readouterr().err
    bad = tmp_path / "bad.ngrams"
    bad.write_bytes(b"not a store at all")
    assert main(["complete", "--prompt", "a", "--target", str(target), "--store", str(bad)]) == 2
    assert "not an accel n-gram store" in capsys.readouterr().err
    assert main(["complete", "--prompt", "a", "--target", str(tmp_path), "--k", "2"]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err
    assert main(["complete", "--prompt", "a", "--target", str(target), "--k", "0"]) == 2
    assert "k must" in capsys.readouterr().err
    assert main(["complete", "--prompt", "a", "--target", str(target), "--settings", "paper", "--alpha", "2"]) == 2
    assert "alpha must" in capsys.readouterr().err
