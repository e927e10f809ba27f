"""``accel distill-hydra``, ``accel eval-draft TARGET HEADS`` and ``accel generate --hydra`` end to end on a tiny
target (real files, real onnxruntime sessions)."""

from __future__ import annotations

import json

import pytest

from accel.cli import main


@pytest.fixture(scope="module")
def heads_dir(tiny_target, text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("hydra-cli") / "heads"
    args = ["distill-hydra", str(tiny_target), "-o", str(out), "--heads", "2", "--mlp-layers", "2", "--prefix"]
    args += ["--head-vocab", "0", "--data", str(text_file), "--self-generate", "70", "--gen-tokens", "10"]
    args += ["--steps", "6", "--batch-rows", "4", "--threads", "1"]
    assert main(args) == 0
    return out


def test_distill_hydra_writes_heads(heads_dir, capsys):
    assert (heads_dir / "model.safetensors").is_file() and (heads_dir / "config.json").is_file()
    report = json.loads((heads_dir / "hydra_report.json").read_text())
    assert report["steps"] == 6 and report["num_parameters"] > 0
    cfg = json.loads((heads_dir / "config.json").read_text())
    assert cfg["kind"] == "accel-hydra-heads" and cfg["num_heads"] == 2 and cfg["prefix"] is True


def test_eval_draft_on_heads(tiny_target, heads_dir, text_file, capsys):
    assert main(["eval-draft", str(tiny_target), str(heads_dir), "--data", str(text_file), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert len(ev["top1"]) == 2 and ev["positions"] > 100
    assert all(0 <= a <= 1 for a in ev["chain_accept_by_position"])
    assert 1.0 <= ev["tree_tokens_per_call"] <= 3.0
    assert main(["eval-draft", str(tiny_target), str(heads_dir), "--data", str(text_file)]) == 0
    assert "tokens per target call" in capsys.readouterr().out


def test_generate_with_hydra_equals_ar(tiny_target, heads_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    common = ["generate", "--target", str(tiny_target), "--prompt", "def f(x):", "--greedy", "--json"]
    common += ["--max-new-tokens", "16", "--ctx-len", "64"]
    assert main(common) == 0
    ar = json.loads(capsys.readouterr().out)
    assert main([*common, "--hydra", str(heads_dir), "--tree-nodes", "6", "--tree-top-k", "3"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tokens"] == ar["tokens"]
    assert res["stats"]["proposer"].startswith("hydra++(depth=2, top_k=3")
    assert res["stats"]["draft_calls"] > 0
    exports = list((tmp_path / "cache" / "onnx").glob("hydra-heads-*"))
    assert len(exports) == 1 and (exports[0] / "prefix.onnx").is_file()
    lookup = ["--ngram", "3", "--ngram-k", "5", "--ngram-merge", "--tree-min-prob", "0.05", "--tree-expand-prob", "0.2"]
    assert main([*common, "--hydra", str(heads_dir), *lookup]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tokens"] == ar["tokens"]
    assert "min_prob=0.05, expand_prob=0.2" in res["stats"]["proposer"] and res["stats"]["proposer"].startswith(
        "lookup(n=3, k=5) + hydra++"
    )


def test_kernel_target_defaults_to_a_smaller_tree(tiny_target, heads_dir, tmp_path, monkeypatch, capsys):
    """On a ``*-kernel`` target (compute-bound: wide calls cost more) the heads' default tree has
    ``KERNEL_DECODE_BUDGET`` nodes, ``--tree-nodes`` still wins, and greedy output equals that target's AR."""
    from accel.drafts.hydra.tree import DECODE_BUDGET, KERNEL_DECODE_BUDGET
    from accel.formats import mxkernel_build

    if mxkernel_build.load_kernel() is None:
        pytest.skip("the fused MX kernel cannot be built")
    assert KERNEL_DECODE_BUDGET < DECODE_BUDGET
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    common = ["generate", "--target", str(tiny_target), "--prompt", "def f(x):", "--greedy", "--json"]
    common += ["--max-new-tokens", "12", "--ctx-len", "64", "--target-weights", "mxfp6-kernel"]
    assert main(common) == 0
    ar = json.loads(capsys.readouterr().out)
    for extra, nodes in (([], KERNEL_DECODE_BUDGET), (["--tree-nodes", "5"], 5)):
        assert main([*common, "--hydra", str(heads_dir), *extra]) == 0
        res = json.loads(capsys.readouterr().out)
        assert res["tokens"] == ar["tokens"]
        assert f"nodes={nodes})" in res["stats"]["proposer"], res["stats"]["proposer"]


def test_cli_errors(tiny_target, heads_dir, tmp_path, capsys):
    """Bad input: a clear message naming the problem, a non-zero exit code and nothing on stdout (the prompt is
    echoed only once the heads have loaded)."""
    common = ["generate", "--target", str(tiny_target), "--prompt", "x", "--max-new-tokens", "2"]
    cases = [
        (
            [*common, "--hydra", str(heads_dir), "--draft", str(tiny_target)],
            "give one of --draft, --hydra and --eagle3",
        ),
        ([*common, "--hydra", str(tmp_path)], "not a Hydra heads directory"),
        ([*common, "--hydra", str(heads_dir), "--tree-min-prob", "1.5"], "min_prob must be a probability"),
        (["eval-draft", str(tiny_target), str(tiny_target)], "needs --data"),
    ]
    for argv, message in cases:
        assert main(argv) != 0
        captured = capsys.readouterr()
        assert message in captured.err and captured.out == ""
