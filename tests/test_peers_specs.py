"""benchmarks/peers.py's pinned SpD rows: every row's recipe is a valid ``DecodeSpec`` for its target, with the chain
after lookup on every target and the tree only where the target scores trees (float32 activations)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from accel.decode import DecodeSpec
from accel.decode.proposers import FirstOfSpec, MergeSpec
from accel.models import smollm2_checkpoint
from accel.models.smollm2 import smollm2_gguf_path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, file: str) -> ModuleType:
    """A benchmarks/ module from its file, registered under ``name`` (peers.py imports its helpers by these names;
    benchmarks/ itself stays off sys.path, where its formats.py, spd.py, ... would shadow names)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_load("bench_support", "bench_support.py")
_load("peers_support", "peers_support.py")
peers = _load("bench_peers", "peers.py")


@pytest.mark.parametrize(
    ("weights", "kinds"),
    [
        ("fp32", [FirstOfSpec, MergeSpec]),
        ("gguf-kernel", [FirstOfSpec, MergeSpec]),
        ("gguf-kernel-q8", [FirstOfSpec]),
        ("mxfp6-kernel-q8", [FirstOfSpec]),
    ],
)
def test_pinned_spd_rows_are_valid_recipes(weights, kinds):
    path = smollm2_gguf_path() if weights.startswith("gguf") else smollm2_checkpoint()
    target = {"path": str(path), "weights": weights, "ctx_len": 256, "threads": 2}
    base = {"target": target, "sampling": {"greedy": True}, "eos_token_id": [], "max_new_tokens": 1}
    specs = peers._spd_specs(base, weights, 8, 1)
    parsed = [DecodeSpec.model_validate(spec) for spec, _ in specs]
    assert [type(d.proposer) for d in parsed] == kinds
    names = [name for _, name in specs]
    assert names[0] == f"accel {weights} SpD (feature chain 1 after lookup)"
    assert parsed[0].proposer.then.k == 1
    if len(names) > 1:
        assert names[1] == f"accel {weights} SpD (feature tree 8 + lookup)"
        assert parsed[1].proposer.tree.nodes == 8
