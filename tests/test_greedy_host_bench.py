"""benchmarks/greedy_host.py: its two modes on a real (tiny) onnxruntime target; no timed assertions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from accel.backends import OrtBackend, export_onnx
from accel.spd import GREEDY, generate
from accel.spd import loop as spd_loop
from tests.helpers.decoders import backend, random_model

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    """A benchmarks/ module loaded from its file under a private name (as tests/test_autotune_bench.py does)."""
    spec = importlib.util.spec_from_file_location(f"_benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setitem(sys.modules, "bench_support", _load("bench_support"))
    return _load("greedy_host")


@pytest.mark.parametrize("proposer", ["ar", "lookup"])
def test_both_modes_decode_the_same_tokens_and_time_their_parts(bench, tmp_path, proposer):
    target = OrtBackend(export_onnx(random_model(seed=1, std=0.5), tmp_path / "t.onnx", ctx_len=64, progress=False))
    prompts = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7]]
    cell = bench.run_cell(target, proposer, prompts, n=12, passes=1)
    assert cell["equal"] is True
    for mode in ("plain", "general"):
        assert set(cell[mode]) == {"ms_per_token", "target_ms_per_round", "host_ms_per_round"}
        assert all(v > 0 for v in cell[mode].values())
    assert cell["ratio"] > 0 and len(cell["ratio_10_90"]) == 2


def test_general_rounds_route_every_round_through_the_tree_round_and_restore(bench, monkeypatch):
    plain = spd_loop._Loop._plain_round
    calls = []
    tree_round = spd_loop._Loop._tree_round
    monkeypatch.setattr(spd_loop._Loop, "_tree_round", lambda self, trees: calls.append(1) or tree_round(self, trees))
    with bench.general_rounds():
        assert spd_loop._Loop._plain_round is not plain
        target = random_model(seed=1, std=0.5)
        generate(backend(target, 1), None, [[1, 2, 3]], max_new_tokens=4, sampling=GREEDY)
    assert len(calls) == 4 and spd_loop._Loop._plain_round is plain
