"""benchmarks/gguf_q8.py: its random blocks are valid weights of every layout, and a quick run writes both layouts'
timings for every int8 path the CPU has (no timed assertions)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from accel.backends.cpu import cpu_flags
from accel.formats.ggml import GGML_TYPES
from accel.formats.mxkernel_build import load_kernel
from tests.test_autotune_bench import _load


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setitem(sys.modules, "bench_support", _load("bench_support"))
    return _load("gguf_q8")


@pytest.mark.parametrize("name", list(GGML_TYPES))
def test_random_blocks_are_finite_weights_of_every_layout(bench, name):
    t = bench.random_blocks(np.random.default_rng(0), name, 32, 64)
    assert t.qtype.name == name and t.shape == (32, 64)
    assert np.isfinite(t.dequantize()).all()


@pytest.mark.skipif(load_kernel() is None, reason="the fused kernel cannot be built")
def test_a_quick_run_times_both_layouts_on_both_paths(bench, tmp_path, capsys):
    out = tmp_path / "g.json"
    bench.main(["--quick", "--out", str(out)])
    data = json.loads(out.read_text())
    paths = [k for k in data if k not in ("run", "shape", "threads")]
    assert "avx2" in paths and len(paths) == len(set(paths))  # the best, AVX-VNNI where the CPU has it, AVX2
    assert ("avx-vnni" in paths) == ("avx_vnni" in cpu_flags())
    for rows in (data[p] for p in paths):
        assert [(r["layout"], r["rows"]) for r in rows] == [(n, s) for n in ("Q4_1", "Q8_0") for s in bench.ROWS]
        assert all(r["stored_s"] > 0 and r["interleaved_s"] > 0 for r in rows)
    assert "stored / interleaved" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])
