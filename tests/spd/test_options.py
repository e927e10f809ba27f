"""``accel generate`` uses every option as given or refuses it with one line naming it: no option is silently
clamped (``--tree-nodes 0`` running the default) or ignored (``--exit-head`` without ``--ppd``)."""

from __future__ import annotations

import json

import pytest

from accel.cli import EXIT_ERROR, main
from accel.models import save_pretrained
from tests.helpers.decoders import random_model


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_pretrained(random_model(seed=1, std=0.5), tmp_path_factory.mktemp("opts") / "target")


def _run(target, *extra: str) -> list[str]:
    return [
        "generate",
        *("--target", str(target), "--prompt", "5 17 2", "--max-new-tokens", "4", "--greedy"),
        *("--backend", "torch", "--ctx-len", "32", "--threads", "1", *extra),
    ]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--draft", "{T}", "--tree-nodes", "0"], "--tree-nodes must be an int >= 1; got 0"),
        (["--draft", "{T}", "--tree-nodes", "-3"], "--tree-nodes must be an int >= 1; got -3"),
        (["--tree-nodes", "0"], "--tree-nodes must be an int >= 1"),
        (["--tree-depth", "0"], "--tree-depth must be an int >= 1; got 0"),
        (["--draft", "{T}", "--tree-nodes", "2", "--tree-depth", "0"], "--tree-depth must be an int >= 1"),
        (["--tree-depth", "3"], "--tree-depth 3 would be ignored: it needs a tree"),
        (["--draft", "{T}", "--tree-depth", "3"], "--tree-depth 3 would be ignored: it needs a tree"),
        (["--draft", "{T}", "--tree-top-k", "2"], "--tree-top-k 2 would be ignored"),
        (["--draft", "{T}", "--tree-min-prob", "0.2"], "--tree-min-prob 0.2 would be ignored"),
        (["--tree-expand-prob", "0.2"], "--tree-expand-prob 0.2 would be ignored"),
        (["--min-draft-prob", "0.5"], "--min-draft-prob 0.5 would be ignored: it needs a chain: --draft or --eagle3"),
        (["--draft", "{T}", "--tree-nodes", "2", "--min-draft-prob", "0.5"], "--min-draft-prob 0.5 would be ignored"),
        (["--ngram-k", "3"], "--ngram-k 3 would be ignored: it needs --ngram"),
        (["--k", "3"], "--k 3 would be ignored: it needs a chain (--draft or --eagle3"),
        (["--draft", "{T}", "--tree-nodes", "2", "--k", "3"], "--k 3 would be ignored"),
        (["--ngram", "2", "--ngram-k", "2", "--k", "3"], "--k 3 would be ignored"),
        (["--draft", "{T}", "--k", "0"], "--k must be an int >= 1; got 0"),
        (["--ngram", "0"], "--ngram must be an int >= 1; got 0"),
        (["--draft-threads", "2"], "--draft-threads 2 would be ignored"),
        (["--draft-threads", "0", "--draft", "{T}"], "--draft-threads must be an int >= 1"),
        (["--draft-weights", "int8"], "--draft-weights int8 would be ignored"),
        (["--exit-head"], "--exit-head shipped would be ignored: it needs --ppd"),
        (["--exit-head", "{T}"], "would be ignored: it needs --ppd"),
        (["--ppd-k", "2"], "--ppd-k 2 would be ignored: it needs --ppd"),
        (["--ppd", "1", "--ppd-k", "0"], "--ppd-k must be an int >= 1; got 0"),
        (["--ctx-len", "0"], "--ctx-len must be an int >= 1; got 0"),
    ],
)
def test_refused_not_clamped_or_ignored(target, capsys, extra, named):
    argv = _run(target, *[a.format(T=target) for a in extra])
    assert main(argv) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "Traceback" not in err, err


def test_the_same_options_work_where_they_apply(target, capsys):
    """The refusals above are about the combination: each option still runs where it shapes something."""
    runs = [
        ["--draft", str(target), "--tree-nodes", "3", "--tree-depth", "2", "--tree-top-k", "2"],
        ["--draft", str(target), "--min-draft-prob", "0.5"],
        ["--ngram", "2", "--ngram-k", "3"],
        ["--draft", str(target), "--tree-nodes", "2", "--tree-min-prob", "0.01", "--tree-expand-prob", "0.1"],
    ]
    for extra in runs:
        assert main([*_run(target, *extra), "--json"]) == 0, capsys.readouterr().err
        res = json.loads(capsys.readouterr().out)
        assert len(res["tokens"][0]) == 4
    assert main([*_run(target, *runs[0]), "--json"]) == 0
    assert "tree(nodes=3, top_k=2, depth=2" in json.loads(capsys.readouterr().out)["stats"]["proposer"]


def test_ctx_len_is_refused_for_an_onnx_target(target, tmp_path, capsys):
    """An .onnx file keeps the cache length it was exported with: --ctx-len beside it (or ctx_len in a spec) would be
    ignored, so it is refused; without it the file runs."""
    from accel.backends import export_onnx
    from accel.decode import DecodeSpec
    from accel.models import load_checkpoint

    onnx_path = export_onnx(load_checkpoint(target), tmp_path / "t.onnx", ctx_len=32, batch_size=1)
    capsys.readouterr()  # the export's progress bar
    argv = ["generate", "--target", str(onnx_path), "--prompt", "5 17 2", "--max-new-tokens", "3", "--greedy"]
    assert main([*argv, "--ctx-len", "64"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ctx-len 64 would be ignored" in err and ".onnx" in err, err
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)["tokens"][0]) == 3
    with pytest.raises(ValueError, match="ctx_len 64 would be ignored"):
        DecodeSpec.model_validate({"target": {"path": str(onnx_path), "ctx_len": 64}})
