"""Bad command lines, one per row: the exit status the table gives (0 works, 2 a named error), one line on stderr
for an error (no traceback), and nothing left in the output folder by a failed command."""

from __future__ import annotations

import pytest

from accel.cli import EXIT_ERROR, main
from tests.helpers.drafts import write_target

# {T}: a tiny checkpoint dir, {F}: a text file, {D}: a text data file, {E}: an empty file,
# {W}: an empty work folder (outputs go there)
GEN = ["generate", "--target", "{T}", "--prompt", "hi", "--backend", "torch", "--max-new-tokens", "2"]
CASES = [
    (["compress", "{T}", "-o", "{W}/c"], 0),
    (["compress", "{T}", "-o", "{F}"], EXIT_ERROR),
    (["compress", "{T}", "-o", "{F}/sub"], EXIT_ERROR),
    (["compress", "{T}", "-o", "{W}/c", "--block-size", "0"], EXIT_ERROR),
    (["compress", "{T}", "-o", "{W}/c", "--block-size", "-5"], EXIT_ERROR),
    (["compress", "{T}", "-o", "{W}/c", "--block-size", "268435456"], EXIT_ERROR),
    (["compress", "{T}", "-o", "{W}/c", "--fmt", "fp6"], EXIT_ERROR),
    (["compress", "{T}", "-o", "{W}/c", "--resume"], 0),  # nothing to resume: a fresh run
    (["compress", "{F}", "-o", "{W}/c"], EXIT_ERROR),
    (["compress", "{W}/nope", "-o", "{W}/c"], EXIT_ERROR),
    (["compress", "{T}", "-o", "{T}"], EXIT_ERROR),
    (["export", "{T}", "-o", "{W}/m.onnx", "--ctx-len", "16"], 0),
    (["export", "{T}", "-o", "{W}", "--ctx-len", "16"], EXIT_ERROR),
    (["export", "{T}", "-o", "{W}/m.onnx", "--ctx-len", "0"], EXIT_ERROR),
    (["export", "{T}", "-o", "{W}/m.onnx", "--ctx-len", "99999999999"], EXIT_ERROR),
    (["export", "{T}", "-o", "{W}/m.onnx", "--batch-size", "100000"], EXIT_ERROR),
    (["export", "{T}", "-o", "{W}/m.onnx", "--ctx-len", "16", "--num-logits", "99"], EXIT_ERROR),
    (["export", "{F}", "-o", "{W}/m.onnx"], EXIT_ERROR),
    (["export", "{T}", "-o", "{W}/m.onnx", "--ctx-len", "16", "--qaic-dir", "{F}"], EXIT_ERROR),
    (["export", "{T}", "-o", "{W}/m.onnx", "--ctx-len", "16", "--qaic-dir", "{W}/q", "--k", "99"], EXIT_ERROR),
    ([*GEN], 0),
    ([*GEN, "--max-new-tokens", "-1"], EXIT_ERROR),
    ([*GEN, "--k", "0", "--draft", "{T}"], EXIT_ERROR),
    ([*GEN, "--temperature", "nan"], EXIT_ERROR),
    ([*GEN, "--temperature", "0"], EXIT_ERROR),
    ([*GEN, "--top-p", "1.5"], EXIT_ERROR),
    ([*GEN, "--seed", "-1"], EXIT_ERROR),
    ([*GEN, "--ctx-len", "0"], EXIT_ERROR),
    ([*GEN, "--ctx-len", "99999999999"], EXIT_ERROR),
    ([*GEN, "--threads", "0"], EXIT_ERROR),
    ([*GEN, "--threads", "-3"], EXIT_ERROR),
    ([*GEN, "--tokenizer", "{F}"], EXIT_ERROR),
    ([*GEN, "--draft", "{F}"], EXIT_ERROR),
    ([*GEN, "--draft", "{T}", "--tree-nodes", "0"], EXIT_ERROR),  # ran a chain
    ([*GEN, "--draft", "{T}", "--tree-nodes", "-2"], EXIT_ERROR),
    ([*GEN, "--tree-depth", "0"], EXIT_ERROR),  # ignored
    ([*GEN, "--draft", "{T}", "--tree-depth", "2"], EXIT_ERROR),  # no tree: ignored
    ([*GEN, "--draft", "{T}", "--tree-nodes", "2", "--tree-depth", "2"], 0),
    ([*GEN, "--exit-head"], EXIT_ERROR),  # without --ppd: ignored
    ([*GEN, "--ngram-k", "3"], EXIT_ERROR),  # without --ngram: ignored
    ([*GEN, "--min-draft-prob", "0.5"], EXIT_ERROR),  # without a draft: ignored
    (["generate", "--target", "{F}", "--prompt", "hi"], EXIT_ERROR),
    (["generate", "--target", "{W}/nope.onnx", "--prompt", "1 2"], EXIT_ERROR),
    (["generate", "--target", "{T}", "--prompt", "", "--backend", "torch"], EXIT_ERROR),
    (["eval-draft", "{T}", "{T}", "--data", "{D}", "--max-k", "3"], 0),
    (["eval-draft", "{T}", "{T}", "--data", "{W}/nope.txt"], EXIT_ERROR),
    (["eval-draft", "{T}", "{T}", "--data", "{D}", "--max-k", "0"], EXIT_ERROR),
    (["eval-draft", "{T}", "{T}", "--data", "{D}", "--max-k", "100000000"], EXIT_ERROR),
    (["eval-draft", "{T}", "{T}", "--data", "{D}", "--temperature", "-1"], EXIT_ERROR),
    (["eval-draft", "{T}", "{F}", "--data", "{D}"], EXIT_ERROR),
    (["distill", "{T}", "-o", "{W}/d", "--steps", "0", "--data", "{D}"], EXIT_ERROR),
    (["distill", "{T}", "-o", "{W}/d", "--layers", "0", "--data", "{D}"], EXIT_ERROR),
    (["distill", "{T}", "-o", "{W}/d", "--d-model", "100000000", "--data", "{D}"], EXIT_ERROR),
    (["distill", "{T}", "-o", "{W}/d", "--batch-size", "100000000", "--data", "{D}"], EXIT_ERROR),
    (["distill", "{T}", "-o", "{W}/d", "--lr", "nan", "--data", "{D}"], EXIT_ERROR),
    (["distill", "{T}", "-o", "{W}/d", "--heads", "3", "--data", "{D}"], EXIT_ERROR),
    (["distill", "{T}", "-o", "{W}/d"], EXIT_ERROR),  # no data
    (["distill", "{T}", "-o", "{W}/d", "--data", "{E}"], EXIT_ERROR),  # no text windows
    (["distill", "{T}", "-o", "{W}/d", "--data", "{W}/nope.txt"], EXIT_ERROR),
    (["ngrams", "build", "-o", "{W}/n", "--max-order", "0", "--tokenizer", "{T}", "{D}"], EXIT_ERROR),
    (["ngrams", "build", "-o", "{W}/n", "--tokenizer", "{T}", "{W}/nope.txt"], EXIT_ERROR),
    (["ngrams", "build", "-o", "{W}/n", "--tokenizer", "{T}", "{E}"], EXIT_ERROR),
    (["complete", "--prompt", "a", "--target", "{T}", "--backend", "torch", "--k", "100000000"], EXIT_ERROR),
    (
        ["complete", "--prompt", "a", "--target", "{T}", "--backend", "torch", "--max-new-tokens", "10000000"],
        EXIT_ERROR,
    ),
    (["complete", "--prompt", "a", "--target", "{T}", "--backend", "torch", "--n-token-sample", "-1"], EXIT_ERROR),
    (["complete", "--prompt", "a", "--target", "{T}", "--backend", "torch", "--alpha", "nan"], EXIT_ERROR),
    (["complete", "--prompt", "a", "--target", "{F}", "--k", "2"], EXIT_ERROR),
    (["predict", "--target", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "8"], 0),
    (["predict", "--target", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "99"], EXIT_ERROR),
    (["demo", "--target", "{F}", "--quick"], EXIT_ERROR),
    (["demo", "--k", "0", "--quick"], EXIT_ERROR),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "notes.txt").write_text("not a model\n")
    (root / "empty.txt").write_text("")
    (root / "data.txt").write_text("def add(a, b):\n    return a + b\n" * 20)
    return {
        "T": str(write_target(root / "ckpt")),
        "F": str(root / "notes.txt"),
        "D": str(root / "data.txt"),
        "E": str(root / "empty.txt"),
    }


@pytest.mark.parametrize(("argv", "status"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_cli_table(places, tmp_path, capsys, argv, status):
    names = {**places, "W": str(tmp_path)}
    argv = [a.format(**names) for a in argv]
    assert main(argv) == status
    err = capsys.readouterr().err
    if status == EXIT_ERROR:
        lines = [line for line in err.splitlines() if line.startswith("accel ")]
        assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in err, err
        assert "internal error" not in err
        assert list(tmp_path.iterdir()) == [], "a failed command left output behind"
    leftovers = [p for p in tmp_path.rglob("*") if ".tmp" in p.name or p.name.endswith(".accel-partial")]
    assert leftovers == []
