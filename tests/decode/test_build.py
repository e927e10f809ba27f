"""``build(spec)``: the same decode written once as a ``DecodeSpec`` gives the same tokens from ``accel generate
--spec``, from the equivalent flags and from Python (``build`` + ``accel.spd.generate``), and the target's graph is
what the proposer declares it needs (``ProposerInfo.needs_hidden`` / ``branching``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from accel.cli import EXIT_ERROR, main
from accel.decode import ChainSpec, DecodeSpec, SamplingSpec, TargetSpec, TreeSpec, build
from accel.decode.opening import GraphNeeds, Opener
from accel.models import load_checkpoint, save_pretrained
from accel.spd import generate
from accel.spd.autotune import AutoTune
from tests.helpers.decoders import oracle_feature_draft, perturbed, random_model

PROMPT = [5, 17, 2, 9, 5, 17]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode_ckpt")
    target = random_model(seed=1, std=0.5)
    return save_pretrained(target, d / "target"), save_pretrained(perturbed(target, 3, 0.02), d / "draft")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path_factory.getbasetemp() / "decode_cache"))


def _spec(target: Path, draft: Path, kind: str, backend: str) -> tuple[DecodeSpec, list[str]]:
    """The decode of ``kind`` as a spec and as the flags that say the same."""
    flags = ["--target", str(target), "--backend", backend, "--ctx-len", "32", "--threads", "1", "--greedy"]
    flags += ["--max-new-tokens", "12"]
    proposer: dict = {"kind": "none"}
    if kind == "chain":
        proposer = ChainSpec(draft=draft, k=3).model_dump()
        flags += ["--draft", str(draft), "--k", "3"]
    elif kind == "tree":
        proposer = TreeSpec(draft=draft, nodes=4, top_k=2).model_dump()
        flags += ["--draft", str(draft), "--tree-nodes", "4", "--tree-top-k", "2"]
    spec = DecodeSpec(
        target=TargetSpec(path=target, backend=backend, ctx_len=32, threads=1),
        proposer=proposer,
        sampling=SamplingSpec(greedy=True),
        max_new_tokens=12,
    )
    return spec, flags


def _cli(argv: list[str], capsys) -> dict:
    assert main(["generate", *argv, "--prompt", " ".join(map(str, PROMPT)), "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_one_spec_same_tokens_from_cli_flags_and_python(checkpoints, backend, tmp_path, capsys):
    target, draft = checkpoints
    runs = {}
    for kind in ("none", "chain", "tree"):
        spec, flags = _spec(target, draft, kind, backend)
        path = tmp_path / f"{kind}.json"
        path.write_text(spec.model_dump_json(indent=2))
        from_file = _cli(["--spec", str(path)], capsys)
        from_flags = _cli(flags, capsys)
        setup = build(spec)
        res = generate(
            setup.target,
            setup.proposer,
            [PROMPT],
            max_new_tokens=spec.max_new_tokens,
            sampling=spec.sampling.sampling(),
            seed=spec.sampling.seed,
            eos_token_id=setup.eos_token_id,
        )
        assert from_file["tokens"] == from_flags["tokens"] == res.tokens == setup.generate([PROMPT]).tokens
        assert from_file["stats"]["proposer"] == from_flags["stats"]["proposer"] == res.stats.proposer
        assert len(res.tokens[0]) == 12
        runs[kind] = res
    # greedy SpD is the target's greedy decoding, whatever proposes; the chain and the tree really drafted
    assert runs["chain"].tokens == runs["tree"].tokens == runs["none"].tokens
    assert runs["none"].stats.mode == "ar" and runs["chain"].stats.accepted_drafts > 0
    assert runs["tree"].stats.tree_rounds > 0


def test_the_target_graph_is_what_the_proposer_needs(checkpoints, tmp_path):
    """On onnxruntime the target is exported with tree inputs for a branching proposer and with hidden states for a
    feature draft, and plain otherwise; the controller (autotune) over a draft model may choose a tree, so its
    target takes tree inputs. Its onnxruntime pool spins only when no proposer's session alternates with it."""
    target, draft = checkpoints
    fd = save_pretrained(oracle_feature_draft(load_checkpoint(target), list(range(31))), tmp_path / "fd")
    base = {"target": {"path": str(target), "ctx_len": 32, "threads": 1}, "sampling": {"greedy": True}}
    cases = [
        ({"kind": "none"}, set(), False),
        ({"kind": "chain", "draft": str(draft)}, set(), False),
        ({"kind": "tree", "draft": str(draft), "top_k": 2}, {"tree"}, False),
        ({"kind": "tree", "draft": str(draft), "top_k": 1}, set(), False),  # a tree of one child per node: a chain
        ({"kind": "chain", "draft": str(fd)}, {"hidden_states"}, False),
        ({"kind": "merge", "lookup": {}, "tree": {"kind": "tree", "draft": str(fd)}}, {"tree", "hidden_states"}, False),
        ({"kind": "chain", "draft": str(draft)}, {"tree"}, True),  # chains and a merged tree to choose from
        (
            {"kind": "first_of", "lookup": {}, "then": {"kind": "chain", "draft": str(fd)}},
            {"tree", "hidden_states"},
            True,
        ),
    ]
    tokens = []
    for proposer, needs, tuned in cases:
        setup = build(DecodeSpec.model_validate({**base, "proposer": proposer, "autotune": tuned}))
        assert isinstance(setup.proposer, AutoTune) == tuned
        if tuned:  # lookup first + chain, the chain alone, lookup + tree, over one draft backend; the lookup alone
            names = [type(a.proposer).__name__ for a in setup.proposer.arms]
            assert names == ["FirstOf", "DraftChain", "Merge", "NgramLookup"]
        info = setup.proposer.info if setup.proposer is not None else None
        assert bool(info and info.branching) == ("tree" in needs)
        assert {"tree", "hidden_states"} & set(setup.target.info.capabilities) == needs, proposer
        # onnxruntime's idle threads spin only where no draft session alternates with the target (autoregressive)
        spin = setup.target.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
        assert spin == ("1" if proposer["kind"] == "none" else "0"), proposer
        tokens.append(setup.generate([PROMPT]).tokens)
    assert all(t == tokens[0] for t in tokens)  # greedy: every proposer gives the target's own tokens


def test_builds_given_one_opener_share_their_backends(checkpoints, tmp_path):
    """An ``Opener`` shared by several builds (the demo's modes) opens each model once: an autoregressive spec and a
    feature-draft tree spec decode on one target session whose graph has what the widest needs (hidden states, tree
    inputs) and whose threads do not spin; two trees of one draft share its backend. Greedy tokens equal the ones
    each spec gives on its own backends; without an opener every build opens its own."""
    target, draft = checkpoints
    fd = save_pretrained(oracle_feature_draft(load_checkpoint(target), list(range(31))), tmp_path / "fd")
    base = {"target": {"path": str(target), "ctx_len": 32, "threads": 1}, "sampling": {"greedy": True}}
    specs = [
        DecodeSpec.model_validate({**base, "proposer": p})
        for p in (
            {"kind": "none"},
            {"kind": "tree", "draft": str(fd), "nodes": 4},
            {"kind": "tree", "draft": str(fd), "nodes": 2},
            {"kind": "chain", "draft": str(draft), "k": 2},
        )
    ]
    opener = Opener(GraphNeeds(hidden_output=True, tree=True), target_spin=False)
    shared = [build(s, opener=opener) for s in specs]
    assert all(s.target is shared[0].target for s in shared)
    assert {"tree", "hidden_states"} <= set(shared[0].target.info.capabilities)
    spin = shared[0].target.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
    assert spin == "0"
    assert shared[1].drafts[0] is shared[2].drafts[0] and shared[3].drafts[0] is not shared[1].drafts[0]
    alone = [build(s) for s in specs]
    assert alone[0].target is not alone[1].target and "tree" not in alone[0].target.info.capabilities
    for a, b in zip(shared, alone, strict=True):
        assert a.generate([PROMPT]).tokens == b.generate([PROMPT]).tokens == alone[0].generate([PROMPT]).tokens


def test_spec_file_replaces_the_decode_flags(checkpoints, tmp_path, capsys):
    target, _ = checkpoints
    path = tmp_path / "ar.json"
    path.write_text(DecodeSpec(target=TargetSpec(path=target, backend="torch", ctx_len=32)).model_dump_json())
    argv = ["generate", "--spec", str(path), "--prompt", "1 2", "--k", "3", "--greedy"]
    assert main(argv) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds the whole decode: drop --k, --greedy" in err
    (tmp_path / "bad.json").write_text('{"target": {"path": "t"}, "proposer": {"kind": "chain"}}')
    assert main(["generate", "--spec", str(tmp_path / "bad.json"), "--prompt", "1 2"]) == EXIT_ERROR
    assert "proposer.chain.draft: Field required" in capsys.readouterr().err
    assert main(["generate", "--prompt", "1 2"]) == EXIT_ERROR
    assert "give --target" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_autotune_from_flags_spec_and_python(checkpoints, tmp_path, capsys, kind):
    """``--autotune`` / ``DecodeSpec.autotune``: the proposer is sized each round by ``AutoTune`` (probed first), the
    tokens stay greedy AR's, and the run's stats list one tuned round per round; the text mode says what it chose."""
    target, draft = checkpoints
    spec, flags = _spec(target, draft, kind, "ort")
    _, ar_flags = _spec(target, draft, "none", "ort")
    ar = _cli(ar_flags, capsys)["tokens"]
    tuned = _cli([*flags, "--autotune"], capsys)
    assert tuned["tokens"] == ar and len(tuned["stats"]["tuned_rounds"]) >= 1
    setup = build(spec.model_copy(update={"autotune": True}))
    assert type(setup.proposer).__name__ == "AutoTune"
    assert setup.generate([PROMPT]).tokens == ar
    assert main(["generate", *flags, "--autotune", "--prompt", " ".join(map(str, PROMPT))]) == 0
    out = capsys.readouterr().out
    assert "autotune: " in out
    assert re.search(r"autotune rounds \(\d+\): .* x\d+", out)  # the shapes it chose, predicted against observed


def test_autotune_needs_a_proposer(checkpoints):
    target, _ = checkpoints
    with pytest.raises(ValueError, match="autotune would be ignored"):
        DecodeSpec(target=TargetSpec(path=target), autotune=True)


def test_autotune_is_the_default_unless_a_size_pins_the_shape(checkpoints, capsys):
    """Without ``autotune``, a spec with a proposer is autotuned unless a size field was given; the resolved value is
    stored, so a spec written out and read back means the same; the CLI says what it chose, or why it was off."""
    target, draft = checkpoints
    base = {"target": {"path": str(target), "ctx_len": 32, "threads": 1}, "sampling": {"greedy": True}}
    cases = [
        ({"kind": "chain", "draft": str(draft)}, True, []),
        ({"kind": "chain", "draft": str(draft), "k": 2}, False, ["chain.k"]),
        ({"kind": "tree", "draft": str(draft), "top_k": 2}, True, []),
        ({"kind": "tree", "draft": str(draft), "depth": 2}, False, ["tree.depth"]),
        ({"kind": "merge", "lookup": {"k": 3}, "tree": {"kind": "tree", "draft": str(draft)}}, False, ["lookup.k"]),
        ({"kind": "lookup"}, True, []),
        ({"kind": "none"}, False, []),
    ]
    for proposer, tuned, pinned in cases:
        spec = DecodeSpec.model_validate({**base, "proposer": proposer})
        assert spec.autotune is tuned and spec.pinned_shape() == pinned, proposer
        assert DecodeSpec.model_validate_json(spec.model_dump_json()).autotune is tuned
        assert DecodeSpec.model_validate_json(spec.model_dump_json(exclude_unset=True)).autotune is tuned
    flags = ["generate", "--target", str(target), "--ctx-len", "32", "--threads", "1", "--greedy"]
    flags += ["--max-new-tokens", "8", "--draft", str(draft), "--prompt", " ".join(map(str, PROMPT))]
    for extra, line in (
        ([], "autotune: "),
        (["--k", "2"], "autotune: off (chain.k pins the shape"),
        (["--no-autotune"], "autotune: off (--no-autotune"),
        (["--k", "2", "--autotune"], "autotune: "),
    ):
        assert main([*flags, *extra]) == 0
        out = capsys.readouterr().out
        assert line in out and ("off" in line) == ("autotune: off" in out), extra
    assert main([*flags, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["stats"]["tuned_rounds"]) >= 1  # tuned by default


def test_a_draft_with_nan_weights_is_refused_by_name(checkpoints, tmp_path, capsys):
    """A damaged draft checkpoint (a NaN weight) is a one-line DraftError naming the tensor, before any export: it
    would otherwise run with garbage proposals, exact but silently without speculation."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from accel.errors import DraftError

    target, draft = checkpoints
    bad = tmp_path / "bad-draft"
    bad.mkdir()
    for f in draft.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = load_file(bad / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].copy()
    weights[name].flat[0] = np.nan
    save_file(weights, bad / "model.safetensors")
    spec, flags = _spec(target, bad, "chain", "ort")
    with pytest.raises(DraftError, match=f"{name} holds NaN"):
        build(spec)
    assert main(["generate", *flags, "--prompt", "1 2 3"]) == EXIT_ERROR
    assert f"{name} holds NaN" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_a_draft_is_checked_once_per_version_of_its_files(checkpoints, tmp_path, monkeypatch, backend):
    """The NaN/Inf check reads every draft tensor (a 0.5B draft: ~2 GB) once per version of the draft's files: a
    second build (its draft export cached on ort) reads none, an edited draft is read again."""
    import os

    from accel.decode import draft_check

    target, draft = checkpoints
    copy = tmp_path / "draft"
    copy.mkdir()
    for f in draft.iterdir():  # new files: no earlier test of this module has checked them
        (copy / f.name).write_bytes(f.read_bytes())
    reads: list[Path] = []

    def counting(path):
        reads.append(Path(path))
        return real(path)

    real = draft_check.open_checkpoint
    monkeypatch.setattr(draft_check, "open_checkpoint", counting)
    spec, _ = _spec(target, copy, "chain", backend)
    build(spec)
    assert reads == [copy]
    build(spec)
    assert reads == [copy], "a second build read the draft's tensors again"
    weights = copy / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    build(spec)
    assert reads == [copy, copy], "an edited draft was not checked again"
