"""accel compress on bad input and interrupted runs: non-finite policy, nothing partial on disk, --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from accel.cli import EXIT_ERROR, main
from accel.errors import FormatError, NonFiniteWarning
from accel.formats import CompressSettings, compress_checkpoint, load_tensors
from accel.formats.staging import MARKER, PartialState, drop_temp_files, partial_dir, write_marker
from tests.helpers.formats import make_checkpoint, make_sharded_checkpoint, tree

pytest.importorskip("safetensors")


def _nan_checkpoint(root, where=(3, 5), value=np.nan):
    from safetensors.numpy import save_file

    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    w[where] = value
    root.mkdir()
    save_file({"model.layers.0.mlp.up_proj.weight": w}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return w


def test_nonfinite_weight_is_an_error_by_default_and_nothing_is_written(tmp_path, capsys):
    _nan_checkpoint(tmp_path / "src")
    with pytest.raises(FormatError, match=r"'model.layers.0.mlp.up_proj.weight' holds 1 NaN/Inf value\(s\) of 4096"):
        compress_checkpoint(tmp_path / "src", tmp_path / "a" / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no out, no partial, no parent folder
    assert main(["compress", str(tmp_path / "src"), "-o", str(tmp_path / "out"), "--quiet"]) == EXIT_ERROR
    assert "--nonfinite keep" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nonfinite_keep_is_loud_and_counted(tmp_path, capsys, value):
    w = _nan_checkpoint(tmp_path / "src", value=value)
    with pytest.warns(NonFiniteWarning, match="1 NaN/Inf"):
        report = compress_checkpoint(
            tmp_path / "src", tmp_path / "out", CompressSettings(nonfinite="keep"), progress=False
        )
    layer = report.layers[0]
    assert (layer.nonfinite_in, layer.nan_out, report.nan_out) == (1, 32, 32)  # the whole block of 32 decodes NaN
    assert report.nonfinite_layers == ["model.layers.0.mlp.up_proj.weight"]
    assert (
        "WARNING: 1 non-finite value(s)" in report.summary() and "32 element(s) now decode to NaN" in report.summary()
    )
    restored = load_tensors(tmp_path / "out" / "model.safetensors")["model.layers.0.mlp.up_proj.weight"].dequantize()
    assert np.isnan(restored).sum() == 32 and np.isnan(restored[3, :32]).all()
    assert np.isfinite(layer.sqnr_db) and 25 < layer.sqnr_db < 40  # over the finite elements, not hidden
    ok = np.isfinite(w) & np.isfinite(restored)
    assert layer.max_abs_error == pytest.approx(float(np.abs(w[ok] - restored[ok]).max()))
    argv = ["compress", str(tmp_path / "src"), "-o", str(tmp_path / "o2"), "--quiet", "--nonfinite", "keep"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "WARNING" in out and "WARNING" in err and "decode to NaN" in err


def test_model_compress_nonfinite_policy_leaves_the_model_untouched():
    torch = pytest.importorskip("torch")
    from accel import compress
    from accel.formats.torch_ops import MXLinear

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    with pytest.raises(FormatError, match=r"'1.weight' holds 1 NaN"):
        compress(model, "mxfp6")
    assert not any(isinstance(m, MXLinear) for m in model.modules())  # layer 0 was not swapped either
    with pytest.raises(FormatError, match="nonfinite must be one of"):
        compress(model, "mxfp6", nonfinite="ignore")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteWarning)
        _, report = compress(model, "mxfp6", nonfinite="keep")
    assert report.nonfinite_in == 1 and report.nan_out == 32 and "WARNING" in report.summary()


def test_output_paths_that_cannot_be_written(tmp_path, rng, capsys):
    make_checkpoint(tmp_path / "src", rng)
    (tmp_path / "file").write_text("keep me")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    cases = [
        (["-o", str(tmp_path / "file")], "exists and is not a directory"),
        (["-o", str(tmp_path / "file" / "out")], "file is not a directory"),
        (["-o", str(tmp_path / "other")], "not empty"),
        (["-o", str(tmp_path / "other"), "--overwrite"], "holds no config.json"),
        (["-o", "/proc/accel-no-such-dir/out"], "/proc/accel-no-such-dir"),
        (["-o", str(tmp_path / "bs0"), "--block-size", "0"], "block_size must be an int in 1..65536"),
        (["-o", str(tmp_path / "bs"), "--block-size", "1000000"], "block_size must be an int"),
        (["-o", str(tmp_path / "src"), "--overwrite"], "must differ from the source"),
        (["-o", str(tmp_path / "inc"), "--include", "*", "--nonfinite", "keep", "--fmt", "int8"], "unknown MX format"),
    ]
    before = tree(tmp_path)
    for extra, needle in cases:
        assert main(["compress", str(tmp_path / "src"), "--quiet", *extra]) == EXIT_ERROR, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, (extra, err)
        assert tree(tmp_path) == before, extra  # nothing created, nothing changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "other", "src"]


def test_overwrite_replaces_a_checkpoint_as_a_whole(tmp_path, rng):
    make_checkpoint(tmp_path / "src", rng)
    compress_checkpoint(tmp_path / "src", tmp_path / "out", "mxfp4", progress=False)
    (tmp_path / "out" / "stale.json").write_text("{}")
    compress_checkpoint(tmp_path / "src", tmp_path / "out", "mxfp6", progress=False, overwrite=True)
    compress_checkpoint(tmp_path / "src", tmp_path / "fresh", "mxfp6", progress=False)
    assert tree(tmp_path / "out") == tree(tmp_path / "fresh")  # no stale file, no mxfp4 shard left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out", "src"]


def _hand_made_partial(tmp_path, rng):
    """A real partial folder: shard 1 of 2 finished (copied from a complete run), as an interrupted run leaves it."""
    src = make_sharded_checkpoint(tmp_path / "src", shards=2, rows=16, cols=64)
    compress_checkpoint(src, tmp_path / "full", progress=False)
    report = compress_checkpoint(src, tmp_path / "full2", progress=False)
    staging = partial_dir(tmp_path / "out")
    staging.mkdir()
    shard = "model-00001-of-00002.safetensors"
    (staging / shard).write_bytes((tmp_path / "full" / shard).read_bytes())
    (staging / f".{shard}.abc.tmp").write_bytes(b"half a shard")  # what a SIGKILL leaves
    settings = {"fmt": "mxfp6_e2m3", "block_size": 32, "nonfinite": "error", "include": ["*"]}
    settings["exclude"] = ["*embed*", "*lm_head*", "*norm*", "*wte*", "*wpe*"]
    sources = {s: [(src / s).stat().st_size, (src / s).stat().st_mtime_ns] for s in json_shards(src)}
    part = {"layers": [report.layers[0].model_dump()], "skipped": []}
    write_marker(staging, PartialState(settings=settings, sources=sources, done={shard: part}))
    return src, staging


def json_shards(src):
    return sorted(set(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"].values()))


def test_resume_and_overwrite_of_a_partial_run(tmp_path, rng):
    src, staging = _hand_made_partial(tmp_path, rng)
    out = tmp_path / "out"
    with pytest.raises(FormatError, match=r"unfinished run.*--resume.*--overwrite"):
        compress_checkpoint(src, out, progress=False)
    with pytest.raises(FormatError, match=r"other settings.*fmt"):
        compress_checkpoint(src, out, "mxfp4", progress=False, resume=True)
    assert (staging / MARKER).is_file()  # a refused resume keeps the partial run
    report = compress_checkpoint(src, out, progress=False, resume=True)
    assert len(report.layers) == 2 and not staging.exists()
    assert tree(out) == tree(tmp_path / "full")  # bit-identical to an uninterrupted run, no .tmp
    # --overwrite clears a partial run and starts over
    _, staging = _hand_made_partial(tmp_path / "again", rng)
    compress_checkpoint(tmp_path / "again" / "src", tmp_path / "again" / "out", progress=False, overwrite=True)
    assert not staging.exists() and tree(tmp_path / "again" / "out") == tree(tmp_path / "full")


def test_resume_refuses_a_changed_source_and_never_deletes_foreign_folders(tmp_path, rng):
    src, _ = _hand_made_partial(tmp_path, rng)
    shard = src / "model-00002-of-00002.safetensors"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    with pytest.raises(FormatError, match="source shards changed"):
        compress_checkpoint(src, tmp_path / "out", progress=False, resume=True)
    foreign = partial_dir(tmp_path / "mine")
    foreign.mkdir()
    (foreign / "photo.jpg").write_bytes(b"x")
    for kw in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(FormatError, match="not made by accel compress"):
            compress_checkpoint(src, tmp_path / "mine", progress=False, **kw)
    assert (foreign / "photo.jpg").is_file()


def _compress_proc(src, out, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "accel.cli", "compress", str(src), "-o", str(out), "--quiet", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _interrupt_after_first_shard(src, out, sig):
    """Start accel compress and send ``sig`` once its first shard is recorded as done; returns (rc, stderr) or None
    when the run finished before the signal could land."""
    proc = _compress_proc(src, out)
    marker = partial_dir(out) / MARKER
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if json.loads(marker.read_text())["done"]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.002)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return None if proc.returncode == 0 else (proc.returncode, err)


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)]
)
def test_interrupted_compress_leaves_a_resumable_partial_state(tmp_path, sig, code):
    src = make_sharded_checkpoint(tmp_path / "src", shards=8, rows=512, cols=1024)
    out = tmp_path / "out"
    for _attempt in range(3):  # the run may outpace the signal on a fast machine: try again
        result = _interrupt_after_first_shard(src, out, sig)
        if result is not None:
            break
        import shutil

        shutil.rmtree(out)  # (a finished run: start again)
    else:
        pytest.skip("compress finished before the signal three times")
    rc, err = result
    assert rc == code
    if sig != signal.SIGKILL:
        assert "--resume" in err and "Traceback" not in err
    staging = partial_dir(out)
    assert not out.exists() and (staging / MARKER).is_file()
    state = PartialState.model_validate_json((staging / MARKER).read_text())
    assert 1 <= len(state.done) < 8
    if sig != signal.SIGKILL:
        assert not [p for p in staging.iterdir() if p.name.endswith(".tmp")]  # cleaned on Ctrl-C / SIGTERM
    proc = _compress_proc(src, out)  # neither flag: refuses to start beside the partial run
    assert proc.wait(timeout=120) == EXIT_ERROR and "--resume" in proc.stderr.read()
    assert main(["compress", str(src), "-o", str(out), "--quiet", "--resume"]) == 0
    assert not staging.exists()
    assert main(["compress", str(src), "-o", str(tmp_path / "fresh"), "--quiet"]) == 0
    assert tree(out) == tree(tmp_path / "fresh")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out", "src"]


def test_a_resume_drops_what_a_killed_writer_left(tmp_path):
    """A SIGKILL can land between a writer's mkstemp and its cleanup: its ``.tmp`` file, or the empty write probe of
    ``check_output_path``, stays in the partial folder. Resuming drops both and keeps every finished file."""
    staging = tmp_path / "out.accel-partial"
    staging.mkdir()
    (staging / "model-00001.safetensors").write_bytes(b"done")
    (staging / "model-00002.safetensors.x1.tmp").write_bytes(b"half")
    (staging / ".accel-probe-82cca99c").write_bytes(b"")
    drop_temp_files(staging)
    assert sorted(p.name for p in staging.iterdir()) == ["model-00001.safetensors"]
