"""benchmarks/tree_attention.py: its tree call is the tree it says (each token sees the committed prefix and its
path, positions by depth), and a quick run writes a chain and a tree timing per point (no timed assertions)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from accel.formats.mxkernel_build import load_kernel
from tests.test_autotune_bench import _load


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setitem(sys.modules, "bench_support", _load("bench_support"))
    return _load("tree_attention")


def test_the_tree_call_sees_the_prefix_and_each_tokens_path(bench):
    chain, tree = bench.feeds(9, 20, 64, np.random.default_rng(0))
    assert chain["position_ids"].tolist() == [list(range(20, 29))] and chain["tree_mask"].size == 0
    mask, pos = tree["tree_mask"][0], tree["position_ids"][0]
    parents = [-1, 0, 0, 0, 1, 1, 1, 2, 2]  # node i's parent (i - 1) // 3
    for i in range(9):
        path = {i}
        while parents[min(path)] >= 0:
            path.add(parents[min(path)])
        assert set(np.flatnonzero(mask[i]).tolist()) == set(range(20)) | {20 + j for j in path}
        assert pos[i] == 20 + len(path) - 1
    assert tree["slots"].tolist() == chain["position_ids"].tolist()


@pytest.mark.skipif(load_kernel() is None, reason="the fused kernel cannot be built")
def test_a_quick_run_times_a_chain_and_a_tree_per_point(bench, tmp_path, capsys):
    out = tmp_path / "t.json"
    bench.main(["--past", "16", "--ctx", "64,128", "--tokens", "2,5", "--repeats", "3", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["ctx_len"], r["tokens"]) for r in rows] == [(c, s) for c in (64, 128) for s in (2, 5)]
    assert all(r["chain_s"] > 0 and r["tree_s"] > 0 for r in rows)
    assert "tree / chain" in capsys.readouterr().out
    for bad in (["--repeats", "0"], ["--ctx", "16", "--past", "16"], ["--tokens", "two"], ["--ctx", ","]):
        with pytest.raises(SystemExit):
            bench.main(bad)
