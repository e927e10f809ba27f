"""``accel generate`` on tiny checkpoint directories (saved with ``save_pretrained``) and exported ONNX files."""

from __future__ import annotations

import json
import re

import pytest

from accel.cli import main
from accel.models import save_pretrained
from tests.helpers.decoders import perturbed, random_model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("spd_ckpt")
    target = random_model(seed=1, std=0.5)
    return save_pretrained(target, d / "target"), save_pretrained(perturbed(target, 3, 0.02), d / "draft")


def _args(target, *extra: str, prompt: str = "5 17 2") -> list[str]:
    """The options every run here shares (tiny target, 12 greedy tokens, ctx 32, 1 thread), then ``extra``."""
    base = ["--target", str(target), "--prompt", prompt, "--max-new-tokens", "12", "--greedy"]
    return [*base, "--ctx-len", "32", "--threads", "1", *extra]


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_generate_greedy_matches_ar(checkpoints, backend, capsys):
    target, draft = checkpoints
    common = _args(target, "--backend", backend)
    assert main(["generate", *common, "--draft", str(draft), "--k", "3", "--json"]) == 0
    spd = json.loads(capsys.readouterr().out)
    assert main(["generate", *common, "--json"]) == 0
    ar = json.loads(capsys.readouterr().out)
    assert spd["tokens"] == ar["tokens"] and len(spd["tokens"][0]) == 12
    assert spd["stats"]["mode"] == "spd" and ar["stats"]["mode"] == "ar"
    # dynamic draft length (1.0: one draft per round) changes the proposals, not the output
    assert main(["generate", *common, "--draft", str(draft), "--k", "3", "--min-draft-prob", "1", "--json"]) == 0
    dyn = json.loads(capsys.readouterr().out)
    assert dyn["tokens"] == ar["tokens"] and dyn["stats"]["proposed_per_position"][1:] == [0, 0]
    # text mode: the prompt, then the streamed ids, accepted draft tokens in [brackets] (stdout is not a TTY)
    assert main(["generate", *common, "--draft", str(draft), "--k", "3"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("5 17 2")
    assert [int(t) for t in re.findall(r"\d+", first)][3:] == spd["tokens"][0]
    assert first.count("[") == spd["stats"]["accepted_drafts"] > 0
    assert "alpha" in out and "tokens/s" in out
    st = spd["stats"]
    assert (
        f"{st['mean_tokens_per_loop']:.3f} tokens and {st['mean_drafts_per_loop']:.3f} drafts per loop, "
        f"{st['all_accepted_rounds']}/{st['row_calls']} all accepted"
    ) in out


def test_generate_errors(checkpoints, tmp_path, capsys):
    target, draft = checkpoints
    other = save_pretrained(random_model(seed=4, vocab_size=48), tmp_path / "other")
    args = ["generate", "--target", str(target), "--prompt", "1 2", "--backend", "torch", "--ctx-len", "32"]
    assert main([*args, "--draft", str(other)]) == 2
    assert "vocab_size" in capsys.readouterr().err
    assert main([*args, "--draft", str(draft), "--k", "0"]) == 2
    assert main([*args, "--draft", str(draft), "--min-draft-prob", "2"]) == 2
    assert "min_draft_prob" in capsys.readouterr().err
    assert main(["generate", "--target", str(target), "--prompt", "hello", "--backend", "torch"]) == 2
    assert "tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_generate_with_feature_draft(checkpoints, backend, tmp_path, capsys):
    """A feature-draft checkpoint: the CLI exports the target with its hidden states (ort) and the output is AR's."""
    import numpy as np

    from accel.models import load_checkpoint
    from tests.helpers.decoders import oracle_feature_draft

    target, _ = checkpoints
    common = _args(target, "--backend", backend, "--json")
    assert main(["generate", *common]) == 0
    ar = json.loads(capsys.readouterr().out)
    unused = next(t for t in range(32) if t not in ar["tokens"][0])
    fd = oracle_feature_draft(
        load_checkpoint(target), [t for t in range(32) if t != unused]
    )  # the target as a feature draft
    fd_dir = save_pretrained(fd, tmp_path / "feature_draft")
    assert main(["generate", *common, "--draft", str(fd_dir), "--k", "3"]) == 0
    spd = json.loads(capsys.readouterr().out)
    assert spd["tokens"] == ar["tokens"]
    # the tiny feature draft is distilled to agree with its target: >= 6 of ~9 drafts accepted (int8 included)
    accepted = spd["stats"]["accepted_drafts"]
    assert accepted >= 6, (
        f"only {accepted} draft tokens accepted: the (int8 on ort) feature draft disagrees with its target; "
        "check this CPU's int8 path (accel.backends.onnx_int8)"
    )
    assert np.isfinite(spd["stats"]["alpha_counts"])
    if backend == "ort":  # the feature draft was exported with int8 matmuls (the default); fp32 on request
        import onnx

        from accel.models.smollm2 import cache_root

        exported = sorted((cache_root() / "onnx").glob("feature_draft-*.onnx"), key=lambda f: f.stat().st_mtime)
        assert {p.key: p.value for p in onnx.load(exported[-1]).metadata_props}["accel.weights"] == "int8"
        assert main(["generate", *common, "--draft", str(fd_dir), "--k", "3", "--draft-weights", "fp32"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == ar["tokens"]
        exported = sorted((cache_root() / "onnx").glob("feature_draft-*.onnx"), key=lambda f: f.stat().st_mtime)
        assert {p.key: p.value for p in onnx.load(exported[-1]).metadata_props}["accel.weights"] == "fp32"


def test_generate_with_mxint8_nbits_target(checkpoints, capsys):
    """``--target-weights mxint8-nbits``: the target checkpoint is exported with MatMulNBits weights; greedy SpD gives
    that target's own greedy AR tokens; the option is refused where it cannot apply."""
    import onnx

    from accel.models.smollm2 import cache_root

    target, draft = checkpoints
    common = _args(target, "--json", "--target-weights", "mxint8-nbits")
    assert main(["generate", *common]) == 0
    ar = json.loads(capsys.readouterr().out)
    exported = sorted((cache_root() / "onnx").glob("*.onnx"), key=lambda f: f.stat().st_mtime)[-1]
    assert {p.key: p.value for p in onnx.load(exported).metadata_props}["accel.weights"] == "mxint8-nbits"
    assert main(["generate", *common, "--draft", str(draft), "--k", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == ar["tokens"]
    assert main(["generate", *common, "--backend", "torch"]) == 2
    assert (
        "--target-weights applies to a target checkpoint (directory or .gguf) on --backend ort"
        in capsys.readouterr().err
    )


def test_generate_with_ngram_lookup(checkpoints, capsys):
    """``--ngram``/``--ngram-k``: lookup drafts where the text repeats (the prompt's last two tokens occurred before,
    so the first round is a lookup round); greedy output is still the target's own; the summary reports the lookups."""
    target, draft = checkpoints
    common = _args(target, prompt="5 17 2 9 5 17")
    assert main(["generate", *common, "--json"]) == 0
    ar = json.loads(capsys.readouterr().out)
    assert (
        main(["generate", *common, "--draft", str(draft), "--k", "2", "--ngram", "2", "--ngram-k", "3", "--json"]) == 0
    )
    spd = json.loads(capsys.readouterr().out)
    assert spd["tokens"] == ar["tokens"] and spd["stats"]["lookup_rounds"] >= 1
    assert main(["generate", *common, "--draft", str(draft), "--k", "2", "--ngram", "2"]) == 0
    assert "n-gram lookup: " in (out := capsys.readouterr().out) and "--lookup-fraction" in out
    assert main(["generate", *common, "--ngram", "2", "--json"]) == 0  # no draft: lookup drafts only
    alone = json.loads(capsys.readouterr().out)
    assert alone["tokens"] == ar["tokens"] and alone["stats"]["draft_calls"] == 0
    assert main(["generate", *common, "--draft", str(draft), "--ngram", "-1"]) == 2
    assert "ngram must be an int >= 1" in capsys.readouterr().err


def test_generate_with_lookup_merged_into_a_tree(checkpoints, capsys):
    """``--ngram-merge``: lookup's chain joined into the draft's tree; greedy output is still the target's own."""
    target, draft = checkpoints
    common = _args(target, "--backend", "torch", prompt="5 17 2 9 5 17")
    assert main(["generate", *common, "--json"]) == 0
    ar = json.loads(capsys.readouterr().out)
    tree = ["--draft", str(draft), "--tree-nodes", "3", "--tree-top-k", "2", "--ngram", "2", "--ngram-k", "3"]
    assert main(["generate", *common, *tree, "--ngram-merge", "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged["tokens"] == ar["tokens"] and merged["stats"]["tree_rounds"] >= 1
    assert max(i for i, c in enumerate(merged["stats"]["tree_nodes_histogram"]) if c) > 3  # lookup's nodes joined
    assert main(["generate", *common, "--draft", str(draft), "--ngram", "2", "--ngram-merge"]) == 2
    assert "--ngram-merge joins lookup into a tree" in capsys.readouterr().err


def test_generate_with_a_dynamic_tree(checkpoints, capsys):
    """``--tree-min-prob``: DraftTree's threshold reaches the proposer; greedy output is still the target's own."""
    target, draft = checkpoints
    common = _args(target, "--backend", "torch", prompt="5 17 2 9 5 17")
    assert main(["generate", *common, "--json"]) == 0
    ar = json.loads(capsys.readouterr().out)
    tree = ["--draft", str(draft), "--tree-nodes", "4", "--tree-top-k", "2"]
    assert main(["generate", *common, *tree, "--tree-min-prob", "0.25", "--tree-expand-prob", "0.5", "--json"]) == 0
    dyn = json.loads(capsys.readouterr().out)
    assert dyn["tokens"] == ar["tokens"]
    assert "min_prob=0.25, expand_prob=0.5" in dyn["stats"]["proposer"]
    assert main(["generate", *common, *tree, "--tree-min-prob", "1.5"]) == 2
    assert "min_prob must be a probability in [0, 1)" in capsys.readouterr().err
