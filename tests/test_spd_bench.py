"""benchmarks/spd.py's settings are DecodeSpecs: every mode of its grammar maps to the recipe ``accel generate --spec``
runs (the proposer kind, the shape as given, no controller), and a setting run by the benchmark gives the tokens the
CLI and Python give for its spec file; no timed assertions."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from accel.cli import main
from accel.decode import DecodeSpec, TargetSpec, build
from accel.decode.opening import GraphNeeds, Opener
from accel.models import save_pretrained
from accel.spd import GREEDY, Sampling
from tests.helpers.decoders import perturbed, random_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spd() -> ModuleType:
    """benchmarks/spd.py loaded from its file under a private name (its siblings importable while it loads)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("_benchmarks_spd", ROOT / "benchmarks" / "spd.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["_benchmarks_spd"] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


ARGS = argparse.Namespace(
    tree_top_k=2, tree_depth=3, feature_draft_weights="int8", feature_draft_threads=2, draft_threads=1, ngram=3,
    ngram_k=5,
)  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "k", "thr", "kind", "inner"),
    [
        ("ar", 0, None, "none", None),
        ("spd", 3, None, "chain", None),
        ("spd_dyn", 6, 0.5, "chain", None),
        ("spd_feat", 2, None, "chain", None),
        ("spd_feat_tree", 8, (0.05, 0.2), "tree", None),
        ("spd+ngram", 3, None, "first_of", "chain"),
        ("spd_feat_tree+ngram", 8, (0.0, None), "first_of", "tree"),
        ("spd_feat_tree+merge", 8, (0.0, None), "merge", "tree"),
    ],
)
def test_every_mode_is_a_decode_spec(spd, tmp_path, mode, k, thr, kind, inner):
    draft, feat = tmp_path / "draft", tmp_path / "feat"
    setup = SimpleNamespace(
        target_spec=TargetSpec(path=tmp_path / "target", ctx_len=64), draft_path=draft, feat_path=feat, max_new=7
    )
    sampling = ("multinomial", Sampling(temperature=0.7)) if mode == "spd" else ("greedy", GREEDY)
    spec = spd.job_spec(setup, (sampling, mode, k, thr), ARGS)
    assert isinstance(spec, DecodeSpec) and spec.proposer.kind == kind and spec.autotune is False
    assert spec.max_new_tokens == 7 and spec.eos_token_id == [] and spec.target == setup.target_spec
    assert spec.sampling.greedy == (mode != "spd") and (mode != "spd" or spec.sampling.temperature == 0.7)
    part = spec.proposer
    if inner is not None:  # lookup first, or lookup's chain merged into the tree
        assert (part.lookup.n, part.lookup.k) == (3, 5)
        part = part.then if kind == "first_of" else part.tree
        assert part.kind == inner
    if mode.startswith("spd_feat_tree"):
        assert (part.draft, part.nodes, part.top_k, part.depth, part.min_prob) == (feat, k, 2, 3, thr[0])
        assert part.expand_prob == thr[1] and part.weights.value == "int8" and part.threads == 2
    elif mode != "ar":
        feature = mode.startswith("spd_feat")
        assert (part.draft, part.k, part.min_draft_prob) == (
            feat if feature else draft,
            k,
            None if mode != "spd_dyn" else 0.5,
        )
        assert part.threads == (2 if feature else 1)
    assert DecodeSpec.model_validate_json(spec.model_dump_json()) == spec  # what a spec file holds means the same


def test_a_benchmark_setting_runs_as_the_cli_runs_its_spec_file(spd, tmp_path, tmp_path_factory, monkeypatch, capsys):
    """One benchmark setting, written once as a DecodeSpec: the benchmark's own path (``open_job`` on its shared
    sessions), ``accel generate --spec`` on the spec's JSON and ``build(spec)`` in Python give the same tokens (greedy,
    lookup first, then the draft's chain), all equal to the target's own decoding."""
    monkeypatch.setenv("ACCEL_CACHE", str(tmp_path_factory.getbasetemp() / "spd_bench_cache"))
    target_model = random_model(seed=2, std=0.5)
    target = save_pretrained(target_model, tmp_path / "target")
    draft = save_pretrained(perturbed(target_model, 3, 0.05), tmp_path / "draft")
    setup = SimpleNamespace(
        target_spec=TargetSpec(path=target, ctx_len=48, threads=1),
        draft_path=draft,
        feat_path=None,
        max_new=16,
        opener=Opener(GraphNeeds(hidden_output=True)),  # as the benchmark: one target graph for every mode
    )
    prompt = [5, 17, 2, 9, 5, 17, 3]
    job = (("greedy", GREEDY), "spd+ngram", 3, None)
    spec = spd.job_spec(setup, job, ARGS)
    bench = spd.open_job(setup, job, ARGS).generate([prompt], seed=0).tokens
    path = tmp_path / "setting.json"
    path.write_text(spec.model_dump_json())
    assert main(["generate", "--spec", str(path), "--prompt", " ".join(map(str, prompt)), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["tokens"]
    ar = spd.open_job(setup, (("greedy", GREEDY), "ar", 0, None), ARGS).generate([prompt]).tokens
    assert bench == cli == build(spec).generate([prompt]).tokens == ar
