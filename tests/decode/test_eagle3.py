"""An EAGLE-3 head in the speculators format as a proposer of a ``DecodeSpec`` (kinds ``eagle3`` / ``eagle3_tree``,
``accel generate --eagle3``): the same greedy tokens from the flags, from a spec file and from Python
(``build(spec).generate``), equal to greedy AR; the target's aux-layer export and the head's graph cached; the
combinations that cannot work refused by name.

The head is built and saved by the ``speculators`` package itself (``tests/serving/speculators_env.py``; the tests
skip without it), for a tiny random Llama target, with ``lm_head`` rows fitted to the target's continuation so that
rounds accept drafts.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.serving.speculators_env import build_eagle3, import_speculators

import_speculators()

from accel.cli import EXIT_ERROR, main  # noqa: E402
from accel.decode import DecodeSpec, FirstOfSpec, build  # noqa: E402
from accel.decode.spec import Eagle3ChainSpec, Eagle3TreeSpec  # noqa: E402
from accel.models import save_pretrained  # noqa: E402
from accel.spd import DraftChain, DraftTree  # noqa: E402
from accel.spd.autotune import AutoTune  # noqa: E402
from tests.serving.test_speculators import LAYER_IDS, VOCAB, fit_head, tiny_target  # noqa: E402

PROMPT = [5, 17, 3, 60, 22, 8]
NEW = 20
CTX = 64


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path_factory.getbasetemp() / "eagle3_cache"))


def _spec(target: Path, proposer: dict, **fields) -> DecodeSpec:
    return DecodeSpec.model_validate(
        {
            "target": {"path": str(target), "ctx_len": CTX, "threads": 1},
            "proposer": proposer,
            "sampling": {"greedy": True},
            "max_new_tokens": NEW,
            **fields,
        }
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, list[int]]:
    """The target checkpoint, a head the package built and saved for it (fitted to the target's continuation of
    PROMPT) and greedy AR's tokens (``build`` of an autoregressive spec)."""
    tmp = tmp_path_factory.mktemp("eagle3_decode")
    mp = pytest.MonkeyPatch()
    mp.setenv("ACCEL_CACHE", str(tmp / "cache"))
    try:
        model = tiny_target()
        target = save_pretrained(model, tmp / "target")
        ar = build(_spec(target, {"kind": "none"})).generate([PROMPT]).tokens[0]
    finally:
        mp.undo()
    sequence = PROMPT + ar
    used = sorted(set(sequence))
    fill = [t for t in range(VOCAB) if t not in used][: max(0, 40 - len(used))]
    import torch

    head = build_eagle3(
        target, tmp / "eagle3", layer_ids=LAYER_IDS, draft_vocab=len(used + fill), draft_ids=torch.tensor(used + fill),
        seed=5, fit=fit_head(model, [sequence]),
    )  # fmt: skip
    return target, head, ar


def _cli(argv: list[str], capsys) -> dict:
    code = main(["generate", *argv, "--prompt", " ".join(map(str, PROMPT)), "--json"])
    assert code == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


FORMS = {
    "chain": ({"kind": "eagle3", "k": 3}, ["--k", "3"], DraftChain),
    "tree": ({"kind": "eagle3_tree", "nodes": 6, "top_k": 3}, ["--tree-nodes", "6", "--tree-top-k", "3"], DraftTree),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_cli_spec_file_and_python_give_greedy_ar(models, tmp_path, capsys, form):
    """One EAGLE-3 decode as flags, as a spec file and as ``build(spec).generate``: the same tokens, equal to greedy
    AR, with drafts accepted (the head is used, not bypassed)."""
    target, head, ar = models
    proposer, flags, kind = FORMS[form]
    spec = _spec(target, {**proposer, "head": str(head)})
    assert not spec.autotune  # k / nodes pin the shape
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json(indent=2))
    base = ["--target", str(target), "--ctx-len", str(CTX), "--threads", "1", "--greedy"]
    from_flags = _cli([*base, "--max-new-tokens", str(NEW), "--eagle3", str(head), *flags], capsys)
    from_file = _cli(["--spec", str(path)], capsys)
    setup = build(spec)
    assert isinstance(setup.proposer, kind)
    res = setup.generate([PROMPT])
    assert from_flags["tokens"] == from_file["tokens"] == res.tokens == [ar]
    assert res.stats.accepted_drafts > 0 and res.stats.tokens_per_target_call > 1
    assert from_flags["stats"]["accepted_drafts"] == res.stats.accepted_drafts


def test_autotune_and_lookup_first(models):
    """Without a size the head's chain is sized by ``AutoTune`` (a single proposer); lookup first (``first_of``)
    falls back to the head. Both stay greedy AR."""
    target, head, ar = models
    tuned = build(_spec(target, {"kind": "eagle3", "head": str(head)}))
    assert tuned.spec.autotune and isinstance(tuned.proposer, AutoTune)
    assert tuned.generate([PROMPT]).tokens == [ar]
    first = _spec(target, {"kind": "first_of", "lookup": {"n": 2}, "then": {"kind": "eagle3", "head": str(head)}})
    assert isinstance(first.proposer, FirstOfSpec) and isinstance(first.proposer.then, Eagle3ChainSpec)
    res = build(first.model_copy(update={"autotune": False})).generate([PROMPT])
    assert res.tokens == [ar] and res.stats.accepted_drafts > 0


def test_lookup_merged_into_the_head_tree_runs_exact(models):
    """``merge``: lookup's chain joined into the EAGLE-3 tree every round, one target call verifying both: greedy AR's
    tokens, with drafts accepted; the same decode from the flags."""
    from accel.decode.spec import MergeSpec

    target, head, ar = models
    tree = {"kind": "eagle3_tree", "head": str(head), "nodes": 6, "top_k": 3}
    spec = _spec(target, {"kind": "merge", "lookup": {"n": 2}, "tree": tree})
    assert isinstance(spec.proposer, MergeSpec) and isinstance(spec.proposer.tree, Eagle3TreeSpec)
    res = build(spec).generate([PROMPT])
    assert res.tokens == [ar] and res.stats.accepted_drafts > 0


def test_exports_are_cached_and_keyed_on_the_head_layers(models, tmp_path, monkeypatch):
    """The target's aux export and the head's graph are written once per settings (a second build exports nothing);
    a head reading other target layers gets its own target export."""
    target, head, _ = models
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path / "cache"))
    onnx = tmp_path / "cache" / "onnx"
    spec = _spec(target, {"kind": "eagle3", "head": str(head), "k": 2})
    build(spec)
    first = {p: p.stat().st_mtime_ns for p in onnx.rglob("*") if p.is_file()}
    graphs = sorted(p.parent.name.rsplit("-", 1)[0] for p in first if p.name == "model.onnx")
    assert graphs == [f"eagle3-{head.name}", f"eagle3-target-{target.name}"]
    build(spec)
    assert {p: p.stat().st_mtime_ns for p in onnx.rglob("*") if p.is_file()} == first
    other = shutil.copytree(head, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [0, 2, 3]  # fc reads three
    (other / "config.json").write_text(json.dumps(config))
    build(_spec(target, {"kind": "eagle3", "head": str(other), "k": 2}))
    targets = sorted(p.name for p in onnx.iterdir() if p.name.startswith("eagle3-target-"))
    assert len(targets) == 2 and not [p for p in onnx.iterdir() if p.name.startswith(".")]


def test_head_without_embedding_reads_the_targets(models, tmp_path):
    """A head saved without ``embed_tokens`` (the package then loads the verifier's) runs with the target's."""
    from safetensors.torch import load_file, save_file

    target, head, ar = models
    bare = Path(shutil.copytree(head, tmp_path / "bare"))
    tensors = load_file(bare / "model.safetensors")
    del tensors["embed_tokens.weight"]
    save_file(tensors, bare / "model.safetensors", metadata={"format": "pt"})
    res = build(_spec(target, {"kind": "eagle3", "head": str(bare), "k": 3})).generate([PROMPT])
    assert res.tokens == [ar] and res.stats.accepted_drafts > 0


MISPLACED = {
    "nodes on a chain": ({"kind": "eagle3", "nodes": 4}, "nodes 4 would be ignored: it needs a tree (kind tree, hydra"),
    "k on a tree": ({"kind": "eagle3_tree", "k": 3}, "k 3 would be ignored: it needs a chain (kind chain or eagle3)"),
    "min_draft_prob on a tree": ({"kind": "eagle3_tree", "min_draft_prob": 0.5}, "min_draft_prob 0.5 would be"),
    "draft": ({"kind": "eagle3", "draft": "d"}, "draft 'd' would be ignored: it needs a draft model"),
    "weights": ({"kind": "eagle3", "weights": "int8"}, "an EAGLE-3 head runs float32"),
    "heads": ({"kind": "eagle3_tree", "heads": "h"}, "heads 'h' would be ignored: it needs Hydra heads"),
}


@pytest.mark.parametrize("case", list(MISPLACED))
def test_misplaced_fields_are_refused_by_name(models, tmp_path, capsys, case):
    target, head, _ = models
    fields, named = MISPLACED[case]
    with pytest.raises(ValidationError, match=re.escape(named)):
        _spec(target, {"head": str(head), **fields})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"target": {"path": str(target)}, "proposer": {"head": str(head), **fields}}))
    assert main(["generate", "--spec", str(path), "--prompt", "1 2"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err


def test_a_head_on_the_wrong_target_is_refused_by_name(models, tmp_path, capsys):
    """An .onnx target (it has no aux-layer outputs) and backend torch are spec errors; flags that would be ignored
    or name two proposers are CLI errors: one line on stderr, exit code EXIT_ERROR, nothing built."""
    target, head, _ = models
    onnx = tmp_path / "t.onnx"
    onnx.write_bytes(b"")
    with pytest.raises(ValidationError, match=r"needs the target as a checkpoint directory or \.gguf file"):
        DecodeSpec.model_validate({"target": {"path": str(onnx)}, "proposer": {"kind": "eagle3", "head": str(head)}})
    with pytest.raises(ValidationError, match="runs on backend ort only"):
        DecodeSpec.model_validate(
            {"target": {"path": str(target), "backend": "torch"}, "proposer": {"kind": "eagle3_tree", "head": "h"}}
        )
    cases = [
        (["--target", str(onnx), "--eagle3", str(head)], "needs the target as a checkpoint directory or .gguf"),
        (["--target", str(target), "--eagle3", str(head), "--backend", "torch"], "runs on backend ort only"),
        (["--target", str(target), "--eagle3", str(head), "--draft", str(target)], "not --draft and --eagle3"),
        (["--target", str(target), "--eagle3", str(head), "--tree-top-k", "2"], "--tree-top-k 2 would be ignored"),
        (["--target", str(target), "--eagle3", str(head), "--tree-nodes", "4", "--k", "2"], "--k 2 would be ignored"),
        (["--target", str(target), "--eagle3", str(head), "--draft-weights", "int8"], "--draft-weights int8 would"),
        (["--target", str(target), "--eagle3", str(tmp_path / "none")], "no EAGLE-3 head folder"),
    ]
    for argv, named in cases:
        assert main(["generate", *argv, "--prompt", "1 2"]) == EXIT_ERROR, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err, (argv, err)


def test_flags_map_onto_the_eagle3_kinds(models):
    """``--eagle3`` is a chain (``k``, ``min_draft_prob``, ``threads``), with ``--tree-nodes`` a tree."""
    from accel.apps.generate_flags import spec_from_args
    from accel.cli import build_parser

    target, head, _ = models
    parse = build_parser().parse_args
    base = ["generate", "--target", str(target), "--prompt", "1", "--eagle3", str(head)]
    chain = spec_from_args(parse([*base, "--k", "2", "--min-draft-prob", "0.3", "--draft-threads", "2"]))
    assert chain.proposer == Eagle3ChainSpec(head=head, k=2, min_draft_prob=0.3, threads=2)
    tree = spec_from_args(parse([*base, "--tree-nodes", "5", "--tree-depth", "3", "--ngram", "3", "--ngram-merge"]))
    assert tree.proposer.kind == "merge" and tree.proposer.tree == Eagle3TreeSpec(head=head, nodes=5, depth=3)
