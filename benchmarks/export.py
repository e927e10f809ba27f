"""Peak memory of ``accel export`` by weight format and model size, on random checkpoints of real shapes.

For each preset (``accel.models.random_checkpoint.PRESETS``) a random checkpoint is written to disk (BF16 safetensors
like a Hugging Face release, or a Q8_0 GGUF like a llama.cpp one; no download), then exported once per format, each
export in a fresh subprocess: ``export_onnx(path)`` reading the checkpoint tensor by tensor, as ``accel export`` does.
Reported per export: peak resident memory (VmHWM of the subprocess, imports included), the output's bytes (``.onnx``
+ ``.onnx.data``), their ratio (goal: <= 1.5), the growth over the process's resident memory before the export, and
the wall time. Files are removed as soon as they are measured.

    python benchmarks/export.py                                   # smollm2-135m, qwen2.5-0.5b; fp32, int8, mx-packed
    flock /work/helpers/bigmem.lock python benchmarks/export.py --presets qwen2.5-1.5b
    flock /work/helpers/bigmem.lock python benchmarks/export.py --presets llama2-7b --source gguf \\
        --formats mxint8-nbits,mx-packed

Writes ``results/export.json``: ``{"run": {...}, "rows": [one per model and format]}`` (``bench_support``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_support import json_out, save_results

# VmHWM, not ru_maxrss: after fork + exec, ru_maxrss still counts the parent's resident memory at the fork
# base: the interpreter plus what ``accel export`` imports (numpy, onnx, the exporter, the GGUF reader; no torch)
_CHILD = """
import json, sys, time
from accel.backends import ExportWeights
from accel.backends.export import export_onnx, onnx_file_bytes
import accel.models.sources
if sys.argv[1].endswith(".gguf"):
    import accel.models.gguf_loader, gguf
kib = lambda key: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) * 1024
base = kib("VmRSS")
t0 = time.perf_counter()
spec = ExportWeights(sys.argv[3], mx_format=sys.argv[4])
path = export_onnx(sys.argv[1], sys.argv[2], ctx_len=512, weights=spec, progress=False)
assert "torch" not in sys.modules, "the export imported torch"
print(json.dumps({"base": base, "peak": kib("VmHWM"), "out": onnx_file_bytes(path), "s": time.perf_counter() - t0}))
"""


def measure(src: Path, out: Path, weights: str, mx_format: str) -> dict:
    """Export ``src`` in a subprocess; its peak memory, output bytes and time. The output is deleted afterwards."""
    try:
        run = subprocess.run(
            [sys.executable, "-c", _CHILD, str(src), str(out), weights, mx_format],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            return {"error": (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]}
        return json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        for f in (out, out.with_name(out.name + ".data")):
            f.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="smollm2-135m,qwen2.5-0.5b", help="comma-separated model presets")
    p.add_argument("--formats", default="fp32,int8,mx-packed", help="comma-separated export weight formats")
    p.add_argument("--mx-format", default="mxfp6", help="element format of mx-packed / mx-rounded (default mxfp6)")
    p.add_argument("--source", choices=("safetensors", "gguf"), default="safetensors", help="checkpoint kind")
    p.add_argument("--work-dir", default=None, help="where the checkpoints and exports go (default: a temp dir)")
    p.add_argument("--out", type=json_out, default="results/export.json")
    args = p.parse_args(argv)

    from accel.models.random_checkpoint import preset_config, write_random_checkpoint

    work = Path(tempfile.mkdtemp(prefix="accel-export-bench-", dir=args.work_dir))
    rows: list[dict] = []
    print(f"{'model':<14} {'source':<11} {'format':<13} {'params':>7} {'out GB':>7} {'peak GB':>8} {'peak/out':>8} "
          f"{'grow/out':>8} {'s':>6}")  # fmt: skip
    try:
        for preset in args.presets.split(","):
            cfg = preset_config(preset)
            t0 = time.perf_counter()
            name = "ckpt.gguf" if args.source == "gguf" else "ckpt"
            src = write_random_checkpoint(cfg, work / name, kind=args.source)
            write_s = time.perf_counter() - t0
            from accel.models.sources import open_checkpoint

            params = open_checkpoint(src)[1].num_elements()
            for fmt in args.formats.split(","):
                r = measure(src, work / "model.onnx", fmt, args.mx_format)
                row = dict(model=preset, source=args.source, format=fmt, mx_format=args.mx_format, params=params, **r)
                row["write_checkpoint_s"] = round(write_s, 1)
                rows.append(row)
                label = f"{fmt}" + (f" {args.mx_format}" if fmt in ("mx-packed", "mx-rounded") else "")
                if "error" in r:
                    print(f"{preset:<14} {args.source:<11} {label:<13} error: {r['error']}")
                    continue
                print(
                    f"{preset:<14} {args.source:<11} {label:<13} {params / 1e9:>6.2f}B {r['out'] / 1e9:>7.2f} "
                    f"{r['peak'] / 1e9:>8.2f} {r['peak'] / r['out']:>8.2f} {(r['peak'] - r['base']) / r['out']:>8.2f} "
                    f"{r['s']:>6.0f}",
                    flush=True,
                )
            shutil.rmtree(src) if src.is_dir() else src.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {save_results(args.out, {'rows': rows}, __file__, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
