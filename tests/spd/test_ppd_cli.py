"""``accel generate --ppd``: the stages of a tiny checkpoint directory (torch and onnxruntime) decode what AR does,
with a trained exit head or the plain exit, and bad options are clear errors."""

from __future__ import annotations

import json

import pytest

from accel.cli import EXIT_ERROR, main
from accel.drafts.early_exit import ExitHead, save_exit_head
from accel.models import save_pretrained
from tests.helpers.decoders import random_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ppd_ckpt")
    model = random_model(seed=1, std=0.5)
    path = save_pretrained(model, d / "target")
    return path, save_exit_head(ExitHead(model, 1, width=8), model, d / "exit")


def _run(capsys, args):
    assert main(["generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_generate_ppd_matches_ar(checkpoint, backend, capsys):
    target, head = checkpoint
    common = ["--target", str(target), "--prompt", "5 17 2", "--max-new-tokens", "12", "--greedy"]
    common += ["--backend", backend, "--ctx-len", "32", "--threads", "1"]
    ar = _run(capsys, common)["tokens"][0]
    ppd = _run(capsys, [*common, "--ppd", "1", "--ppd-k", "2", "--exit-head", str(head)])
    assert ppd["tokens"] == ar
    assert ppd["stats"]["k"] == 2 and ppd["stats"]["exit_layer"] == 1
    assert main(["generate", *common, "--ppd", "1"]) == 0  # the plain exit, text output
    out = capsys.readouterr().out
    assert "PPD exit layer 1/2, k 3" in out and "p_correct" in out


def test_generate_ppd_errors(checkpoint, capsys):
    target, head = checkpoint
    args = ["generate", "--target", str(target), "--prompt", "5 17 2", "--backend", "torch", "--ctx-len", "32"]
    assert main([*args, "--ppd", "2"]) == EXIT_ERROR
    assert "exit layer must be in 1..1" in capsys.readouterr().err
    assert main([*args, "--ppd", "1", "--ngram", "3"]) == EXIT_ERROR
    assert "drop --draft" in capsys.readouterr().err
    assert main([*args, "--ppd", "1", "--ppd-k", "0"]) == EXIT_ERROR
    assert "--ppd-k" in capsys.readouterr().err
    assert main([*args, "--ppd", "1", "--exit-head", str(head.parent)]) == EXIT_ERROR
    assert "not an exit head directory" in capsys.readouterr().err
    assert main([*args, "--ppd", "1", "--exit-head"]) == EXIT_ERROR  # bare: the shipped head for that layer
    assert "no shipped exit head for layer 1" in capsys.readouterr().err
