"""The ``early_exit`` (PPD's candidates on the SpD loop) and ``superposed`` kinds of a ``DecodeSpec``: built from the
recipe alone, greedy output equals the target's own decoding (torch and onnxruntime, chains and trees), the CLI runs
the same spec file to the same tokens, and combinations that cannot run exactly are refused by name."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from accel.cli import main
from accel.decode import DecodeSpec, build
from accel.decode.opening import GraphNeeds, Opener
from accel.errors import SpdError
from accel.models import save_pretrained
from accel.spd.exit_proposer import EarlyExit
from accel.superposed.proposer import SuperposedProposer
from tests.helpers.decoders import perturbed, random_model

PROMPT = [5, 17, 2, 9, 5, 17, 3]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds_ckpt")
    target = random_model(seed=4, std=0.5)
    return save_pretrained(target, d / "target"), save_pretrained(perturbed(target, 5, 0.02), d / "draft")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path_factory.getbasetemp() / "kinds_cache"))


def _spec(target, proposer: dict, backend: str = "ort", **target_fields) -> DecodeSpec:
    return DecodeSpec.model_validate(
        {
            "target": {"path": str(target), "ctx_len": 48, "threads": 1, "backend": backend, **target_fields},
            "proposer": proposer,
            "sampling": {"greedy": True},
            "max_new_tokens": 14,
        }
    )


@pytest.mark.parametrize("backend", ["ort", "torch"])
@pytest.mark.parametrize("k", [1, 3])
def test_early_exit_gives_the_targets_greedy_tokens(checkpoints, backend, k):
    target, _ = checkpoints
    ar = build(_spec(target, {"kind": "none"}, backend)).generate([PROMPT]).tokens
    setup = build(_spec(target, {"kind": "early_exit", "exit_layer": 1, "k": k}, backend))
    assert isinstance(setup.proposer, EarlyExit) and setup.proposer.k == k and setup.proposer.exit_layer == 1
    assert ("tree" in setup.target.info.capabilities) == (k > 1 or backend == "torch")  # torch targets always can
    res = setup.generate([PROMPT])
    assert res.tokens == ar and res.stats.proposed_drafts > 0


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_superposed_drafts_give_the_targets_greedy_tokens(checkpoints, backend):
    target, draft = checkpoints
    ar = build(_spec(target, {"kind": "none"}, backend)).generate([PROMPT]).tokens
    setup = build(_spec(target, {"kind": "superposed", "draft": str(draft), "k": 2, "depth": 3}, backend))
    assert isinstance(setup.proposer, SuperposedProposer) and "mix" in setup.drafts[0].info.capabilities
    res = setup.generate([PROMPT])
    assert res.tokens == ar and res.stats.accepted_drafts > 0  # the draft is the target, slightly perturbed


def test_the_cli_runs_a_spec_file_of_each_kind(checkpoints, tmp_path, capsys):
    target, draft = checkpoints
    for i, proposer in enumerate(
        ({"kind": "early_exit", "exit_layer": 1, "k": 2}, {"kind": "superposed", "draft": str(draft), "depth": 2})
    ):
        spec = _spec(target, proposer)
        path = tmp_path / f"spec{i}.json"
        path.write_text(spec.model_dump_json())
        assert main(["generate", "--spec", str(path), "--prompt", " ".join(map(str, PROMPT)), "--json"]) == 0
        cli = json.loads(capsys.readouterr().out)
        assert cli["tokens"] == build(spec).generate([PROMPT]).tokens


def test_an_opener_shares_the_exit_stage(checkpoints):
    target, _ = checkpoints
    opener = Opener(GraphNeeds(tree=True))
    a, b = (build(_spec(target, {"kind": "early_exit", "exit_layer": 1, "k": k}), opener=opener) for k in (1, 2))
    assert a.target is b.target and a.proposer.model.backend.stage_backend is b.proposer.model.backend.stage_backend


def test_bad_early_exits_and_superposed_drafts_are_refused(checkpoints, tmp_path):
    target, draft = checkpoints
    with pytest.raises(SpdError, match="the target has 2 layers"):
        build(_spec(target, {"kind": "early_exit", "exit_layer": 2}))
    with pytest.raises(ValidationError, match="a token tree cannot verify exactly"):
        _spec(target, {"kind": "early_exit", "exit_layer": 1, "k": 2}, weights="mxfp6-nbits")
    with pytest.raises(ValidationError, match="a token tree cannot verify exactly"):
        _spec(target, {"kind": "superposed", "draft": str(draft), "k": 2}, weights="mxfp6-nbits")
    onnx = tmp_path / "t.onnx"
    onnx.write_bytes(b"")
    with pytest.raises(ValidationError, match=r"early exit .* checkpoint directory"):
        DecodeSpec.model_validate({"target": {"path": str(onnx)}, "proposer": {"kind": "early_exit", "exit_layer": 1}})
    with pytest.raises(ValidationError, match="exit_layer 1 would be ignored: it needs an early exit"):
        _spec(target, {"kind": "chain", "draft": str(draft), "exit_layer": 1})
    with pytest.raises(ValidationError, match="depth"):
        _spec(target, {"kind": "superposed", "draft": str(draft), "depth": 65})
