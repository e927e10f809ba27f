"""benchmarks/bench_support.py: the atomic results writer, the ``run`` block, and two cheap benchmarks' ``--out``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# loaded from its file, not by putting benchmarks/ on sys.path (its formats.py, spd.py, ... would shadow names)
_spec = importlib.util.spec_from_file_location("bench_support", ROOT / "benchmarks" / "bench_support.py")
assert _spec is not None and _spec.loader is not None
bs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)

RUN_KEYS = {"date_utc", "wall_s", "command", "machine", "versions"}


class _Unserialisable:
    pass


def test_write_json_creates_parents_and_round_trips(tmp_path):
    path = tmp_path / "a" / "b" / "r.json"
    data = {"x": [1, 2.5, None], "s": "é", "nested": {"k": True}}
    assert bs.write_json(path, data) == path
    assert json.loads(path.read_text()) == data
    assert path.stat().st_mode & 0o044, "results are readable like any other file (mkstemp makes 0600)"
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


@pytest.mark.parametrize("error", [TypeError, KeyboardInterrupt])
def test_failure_mid_write_leaves_the_old_file(tmp_path, error):
    path = tmp_path / "r.json"
    path.write_text('{"old": true}')
    seen = {}

    def fail(obj):  # json calls this half-way through the object, after ~200 kB went to the file
        partial = [p for p in tmp_path.iterdir() if p != path]
        seen["partial_bytes"] = sum(p.stat().st_size for p in partial)
        seen["target"] = path.read_text()
        raise error("cannot encode")

    data = {"big": list(range(40_000)), "bad": _Unserialisable()}
    with pytest.raises(error):
        bs.write_json(path, data, default=fail)
    assert seen["partial_bytes"] > 0, "the failure must come mid-write, with part of the file written"
    assert seen["target"] == '{"old": true}'
    assert path.read_text() == '{"old": true}'
    assert list(tmp_path.iterdir()) == [path], "the temporary file is removed"
    # the failure is real: the plain write the benchmarks used to do leaves a truncated file
    naive = tmp_path / "naive.json"
    with pytest.raises(TypeError), naive.open("w") as f:
        json.dump(data, f, indent=2)
    with pytest.raises(json.JSONDecodeError):
        json.loads(naive.read_text())


def test_unserialisable_value_raises_without_default(tmp_path):
    with pytest.raises(TypeError, match="_Unserialisable"):
        bs.write_json(tmp_path / "r.json", {"bad": _Unserialisable()})
    assert list(tmp_path.iterdir()) == []
    bs.write_json(tmp_path / "r.json", {"p": Path("x")}, default=str)
    assert json.loads((tmp_path / "r.json").read_text()) == {"p": "x"}


def test_directory_target_is_a_clear_error(tmp_path):
    with pytest.raises(IsADirectoryError, match=f"{tmp_path} is a directory; name a JSON file"):
        bs.write_json(tmp_path, {"a": 1})
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError, match=f"{blocker} is a file, not a directory"):
        bs.write_json(blocker / "sub" / "r.json", {"a": 1})
    assert blocker.read_text() == "x"
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory"):
        bs.json_out(str(tmp_path))
    assert bs.json_out(str(tmp_path / "new" / "r.json")) == tmp_path / "new" / "r.json"


def test_run_metadata_block():
    before = datetime.now(timezone.utc)
    run = bs.run_metadata(ROOT / "benchmarks" / "formats.py", ["--out", "a b.json", "--no-smollm"])
    assert set(run) == RUN_KEYS
    started = datetime.strptime(run["date_utc"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert started <= before + timedelta(seconds=1)  # the run's start: when the module was loaded
    assert run["wall_s"] >= 0
    assert run["command"] == "python benchmarks/formats.py --out 'a b.json' --no-smollm"
    assert run["machine"]["cpus"] == os.cpu_count()
    assert run["machine"]["cpu"] == bs.cpu_model()
    assert run["versions"]["numpy"] == np.__version__
    assert set(run["versions"]) == {"python", "numpy", "onnxruntime", "torch"}
    json.dumps(run)  # plain JSON values only


def test_save_results_puts_the_run_block_first(tmp_path):
    path = bs.save_results(tmp_path / "r.json", {"rows": [1], "x": 2}, ROOT / "benchmarks" / "spd.py", ["--quick"])
    data = json.loads(path.read_text())
    assert list(data) == ["run", "rows", "x"]
    assert data["run"]["command"] == "python benchmarks/spd.py --quick"
    with pytest.raises(ValueError, match="'run' key"):
        bs.save_results(tmp_path / "s.json", {"run": 1}, ROOT / "benchmarks" / "spd.py", [])
    assert not (tmp_path / "s.json").exists()


def test_cpu_model_and_versions(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core\nflags\t: avx2\n")
    assert bs.cpu_model(info) == "AMD EPYC 9R14 96-Core"
    assert bs.cpu_model(tmp_path / "missing")  # falls back to platform.processor() or the architecture
    assert bs.package_version("accel-no-such-package") is None
    import onnxruntime

    assert bs.package_version("onnxruntime") == onnxruntime.__version__


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_formats_benchmark_out(tmp_path):
    out = tmp_path / "sub" / "formats.json"
    run = _script("benchmarks/formats.py", "--elements", "4096", "--repeats", "1", "--no-smollm", "--out", str(out))
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert set(data) == {"run", "throughput", "load_average_1min", "goal_met", "goal_met_into_buffer"}
    assert set(data["run"]) == RUN_KEYS
    assert data["run"]["command"].startswith("python benchmarks/formats.py --elements 4096")
    assert data["throughput"]["elements"] == 4096
    assert "mxfp6_e2m3" in data["throughput"]["formats"]


def test_formats_benchmark_refuses_a_directory_before_running(tmp_path):
    run = _script("benchmarks/formats.py", "--elements", "4096", "--no-smollm", "--out", str(tmp_path))
    assert run.returncode == 2
    assert f"argument --out: {tmp_path} is a directory" in run.stderr
    assert "throughput" not in run.stdout


def test_sim_validation_published_out(tmp_path):
    run = _script("benchmarks/sim_validation.py", "--published-only", "--results-dir", str(tmp_path))
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "sim_validation_published.json").read_text())
    assert set(data) == {
        *("run", "one_point", "stock", "rows", "stock_rows", "gpu_calls", "leave_one_source_out"),
        *("first_set", "points", "device_types", "multi_device_points", "spd_points"),
    }
    spd = data["spd_points"]  # the SpD blog's points, priced as a band over acceptance
    assert len(spd["rows"]) == 5 and spd["acceptance_range"] == [0.5, 0.9]
    assert all(len(r["band"]) == 3 and r["band"][0] <= r["band"][2] for r in spd["rows"])
    assert data["points"] == len(data["stock_rows"]) >= 60 and data["device_types"] >= 6
    gpu = data["gpu_calls"]  # accel's own H200 calls: stock and calibrated on the fp16 curves
    assert len(gpu["stock"]) == len(gpu["calibrated_on_fp16"]) == 35
    # the stock h200 entry is itself the fp16 fit: both predict the held-out bf16 AR step within 5 %
    assert (
        abs(gpu["stock"]["llama-2-7b bf16 S=1"]) < 0.05 and abs(gpu["calibrated_on_fp16"]["llama-2-7b bf16 S=1"]) < 0.05
    )
    assert len(gpu["held_out_later"]) == 13 and abs(gpu["held_out_later"]["llama-2-13b fp16 S=1"]) < 0.10
    assert data["run"]["command"] == f"python benchmarks/sim_validation.py --published-only --results-dir {tmp_path}"
    assert 0 < data["one_point"]["points"] <= len(data["rows"])  # calibration points are not counted
