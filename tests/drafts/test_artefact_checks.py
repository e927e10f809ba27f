"""Draft artefacts go through checked readers: Hydra heads with NaN/±Inf weights and truncated or damaged exit heads
are a named ``DraftError`` at load (and one line from the CLI, with no figures reported for them), and the Hydra
tree options are refused beyond what the heads can grow instead of being clamped."""

from __future__ import annotations

import pytest
import torch

from accel.cli import EXIT_ERROR, main
from accel.drafts.early_exit import ExitHead, load_exit_head, save_exit_head
from accel.drafts.hydra.model import build_hydra, load_hydra, save_hydra
from accel.errors import DraftError
from accel.models import load_checkpoint


@pytest.fixture(scope="module")
def decoder(tiny_target):
    return load_checkpoint(tiny_target).eval()


def _heads(decoder, out, poison: float | None = None):
    """Two heads for ``decoder`` saved at ``out``; with ``poison``, one weight of head 2 set to it."""
    heads = build_hydra(decoder, num_heads=2, mlp_layers=1)
    if poison is not None:
        with torch.no_grad():
            dict(heads.named_parameters())["heads.1.blocks.0.linear.weight"][0, 0] = poison
    return save_hydra(heads, out)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_hydra_heads_with_nonfinite_weights_are_refused(decoder, tiny_target, tmp_path, capsys, poison):
    bad = _heads(decoder, tmp_path / "bad", poison)
    with pytest.raises(DraftError, match=r"heads.1.blocks.0.linear.weight holds NaN or infinite weights"):
        load_hydra(bad, decoder)
    assert main(["eval-draft", str(tiny_target), str(bad)]) == EXIT_ERROR
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "NaN or infinite" in captured.err


def test_finite_heads_still_load(decoder, tmp_path):
    assert load_hydra(_heads(decoder, tmp_path / "good"), decoder).config.num_heads == 2


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            ["--tree-nodes", "1000000"],
            "--tree-nodes 1000000 exceeds the 20 nodes a tree of depth 2 with --tree-top-k 4",
        ),
        (["--tree-nodes", "7", "--tree-top-k", "2"], "exceeds the 6 nodes"),
        (["--tree-nodes", "5", "--tree-depth", "1"], "--tree-nodes 5 exceeds the 4 nodes a tree of depth 1"),
        (["--tree-depth", "3"], "--tree-depth 3 exceeds the 2 Hydra heads"),
    ],
)
def test_hydra_tree_options_beyond_the_heads(decoder, tiny_target, tmp_path, monkeypatch, capsys, extra, named):
    """Before: clamped without a word (the proposer reported nodes=1000000 and grew at most 20; depth 3 ran 2).
    Now refused before anything is exported (nothing written to the cache)."""
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    heads = _heads(decoder, tmp_path / "heads")
    argv = ["generate", "--target", str(tiny_target), "--prompt", "x", "--max-new-tokens", "2", "--hydra", str(heads)]
    assert main([*argv, *extra]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err
    assert not (tmp_path / "cache").exists()


@pytest.fixture()
def exit_head(decoder, tmp_path):
    return save_exit_head(ExitHead(decoder, 1, width=8), decoder, tmp_path / "exit")


@pytest.mark.parametrize("damage", ["truncated", "junk", "empty", "nan"])
def test_a_damaged_exit_head_is_a_named_error(decoder, exit_head, damage):
    weights = exit_head / "exit_head.safetensors"
    data = weights.read_bytes()
    if damage == "nan":
        from safetensors.torch import load_file, save_file

        state = load_file(str(weights))
        state[sorted(state)[0]].view(-1)[0] = float("nan")
        save_file(state, str(weights))
    else:
        weights.write_bytes({"truncated": data[: len(data) // 2], "junk": b"junk" * 10, "empty": b""}[damage])
    match = "NaN or infinite" if damage == "nan" else "cannot read the exit head .*exit_head.safetensors"
    with pytest.raises(DraftError, match=match):
        load_exit_head(exit_head, decoder)


def test_an_intact_exit_head_loads(decoder, exit_head):
    assert load_exit_head(exit_head, decoder).layer == 1
