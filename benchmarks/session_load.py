"""onnxruntime session creation time by export format and model size, and what session options change it.

For each preset (``accel.models.random_checkpoint.PRESETS``) a random checkpoint is exported once per weight format;
then each way of opening the file runs in a fresh subprocess (the file is in the page cache: one untimed open first),
timing ``InferenceSession`` creation and a decode step (S = 1, 2 threads, median of 15 calls):

- ``all``: what ``OrtBackend`` did so far (``ORT_ENABLE_ALL``: constant folding, fusions, weight pre-packing);
- ``basic``: ``ORT_ENABLE_BASIC`` (no fusions);
- ``save``: ``ORT_ENABLE_ALL`` and write the optimized graph (``optimized_model_filepath``, external initializers):
  what the first open with an optimized-graph cache costs;
- ``cached``: open that optimized graph with optimizations off (what every later open costs).

    flock /work/helpers/bench.lock python benchmarks/session_load.py --presets smollm2-135m,qwen2.5-0.5b

Writes ``results/session_load.json``: ``{"run": {...}, "rows": [one per model and format]}``
(``bench_support``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_support import json_out, save_results

MODES = ("all", "basic", "save", "cached")

_CHILD = r"""
import json, os, statistics, sys, time
import numpy as np, onnxruntime as ort
path, mode, opt = sys.argv[1:4]
L = ort.GraphOptimizationLevel
o = ort.SessionOptions()
o.log_severity_level = 3
o.intra_op_num_threads, o.inter_op_num_threads = 2, 1
o.add_session_config_entry("session.intra_op.allow_spinning", "0")
o.graph_optimization_level = {"basic": L.ORT_ENABLE_BASIC, "cached": L.ORT_DISABLE_ALL}.get(mode, L.ORT_ENABLE_ALL)
if mode == "save":
    o.optimized_model_filepath = opt
    data_name = os.path.basename(opt) + ".data"
    o.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
    o.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
src = opt if mode.startswith("cached") else path
t0 = time.perf_counter()
s = ort.InferenceSession(src, o, providers=["CPUExecutionProvider"])
create = time.perf_counter() - t0
feeds = {}
for i in s.get_inputs():
    shape = [d if isinstance(d, int) else 1 for d in i.shape]
    kind = np.int64 if "int64" in i.type else np.float32
    feeds[i.name] = np.full(shape, 5, kind) if i.name == "position_ids" else np.zeros(shape, kind)
s.run(None, feeds)
times = []
for _ in range(15):
    t0 = time.perf_counter(); s.run(None, feeds); times.append(time.perf_counter() - t0)
print(json.dumps({"create_s": create, "step_ms": 1e3 * statistics.median(times)}))
"""


def _open(path: Path, mode: str, opt: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", _CHILD, str(path), mode, str(opt)], capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def _bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="smollm2-135m,qwen2.5-0.5b")
    p.add_argument("--formats", default="fp32,int8,mxint8-nbits,mx-packed")
    p.add_argument("--ctx-len", type=int, default=512)
    p.add_argument("--work-dir", default=None)
    p.add_argument("--out", type=json_out, default="results/session_load.json")
    args = p.parse_args(argv)

    from accel.backends.export import export_onnx
    from accel.models.random_checkpoint import preset_config, write_random_checkpoint

    work = Path(tempfile.mkdtemp(prefix="accel-session-load-", dir=args.work_dir))
    rows = []
    print(f"{'model':<14} {'format':<13} {'GB':>5} " + " ".join(f"{m:>17}" for m in MODES) + "   (create s / step ms)")
    try:
        for preset in args.presets.split(","):
            src = write_random_checkpoint(preset_config(preset), work / preset)
            for fmt in args.formats.split(","):
                path = export_onnx(src, work / "m.onnx", ctx_len=args.ctx_len, weights=fmt, progress=False)
                opt = work / "opt" / "m.onnx"
                opt.parent.mkdir(exist_ok=True)
                _open(path, "all", opt)  # untimed: the file into the page cache
                row = {"model": preset, "format": fmt, "bytes": _bytes(path)}
                for mode in MODES:
                    row[mode] = _open(path, mode, opt)
                row["optimized_bytes"] = _bytes(opt) if opt.is_file() else None
                rows.append(row)
                cells = [
                    f"{row[m]['create_s']:>7.2f} / {row[m]['step_ms']:>6.1f}"
                    if "create_s" in row[m]
                    else f"{'error':>17}"
                    for m in MODES
                ]
                print(f"{preset:<14} {fmt:<13} {row['bytes'] / 1e9:>5.2f} " + " ".join(cells), flush=True)
                shutil.rmtree(opt.parent)
                for f in (path, path.with_name(path.name + ".data")):
                    f.unlink(missing_ok=True)
            shutil.rmtree(src)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {save_results(args.out, {'rows': rows}, __file__, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
