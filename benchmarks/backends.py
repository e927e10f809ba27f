"""Cost of one decoder call with S new tokens, onnxruntime vs torch, and OrtBackend's host overhead.

For SmolLM2-135M and a ~40M random Llama (hidden 512, 8 layers, 8 heads, FFN 1536, vocab 32000): median ms per call
for S = 1, 2, 4, 8, 16 at past lengths 128 and 512 (the cache is prefilled, then the timed call writes positions
past .. past+S-1 again and again -- overwriting is free in the cache contract). Note the exported graph attends over
all ctx_len slots (masked), so its cost depends on ctx_len, not on the past length; torch's eager decoder does the
same. Ratios T(S)/T(1) are what speculative decoding lives on (docs/reference.md §8). The overhead line compares
OrtBackend.forward with a bare ``session.run`` on the
same inputs (numpy feeds for the whole cache) and with a bare IO-binding run (no validation, no flipping). Calls are
timed round robin over all (past, S) points of a runtime, so drifting machine load affects the ratios less.

    python benchmarks/backends.py            # full run, a few minutes on 2 cores
    python benchmarks/backends.py --quick    # S in (1, 8), past 128, fewer repeats

Prints a table and writes results/backends.json. Timings on a shared machine are noisy: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_support import json_out, save_results
from tqdm.auto import tqdm

from accel.backends import OrtBackend, TorchBackend, export_onnx, prefill
from accel.backends.ort_backend import session_feeds
from accel.models import Decoder, ModelConfig, load_checkpoint, smollm2_checkpoint

LLAMA_40M = ModelConfig(
    vocab_size=32000, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=8, intermediate_size=1536
)


def _call(backend, past: int, seq: int):
    ids = np.random.default_rng(seq).integers(0, backend.info.vocab_size, (1, seq))
    pos = np.arange(past, past + seq)[None]
    return lambda: backend.forward(ids, pos)


def bench_model(name: str, model: Decoder, seqs, pasts, repeats: int, threads: int, workdir: Path, bar) -> dict:
    ctx = max(pasts) + max(seqs)
    path = export_onnx(model, workdir / f"{name}.onnx", ctx_len=ctx, progress=False)
    backends = {
        "onnxruntime": OrtBackend(path, threads=threads),
        "torch": TorchBackend(model, ctx_len=ctx, threads=threads),
    }
    rows = []
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, (1, max(pasts)))
    points = [(past, seq) for past in pasts for seq in seqs]
    for runtime, backend in backends.items():
        backend.reset()
        prefill(backend, prompt)  # slots 0..max(past)-1 hold a real prefix; timing does not depend on the values
        calls = {pt: _call(backend, *pt) for pt in points}
        for fn in calls.values():  # warm-up
            fn()
        times: dict[tuple[int, int], list[float]] = {pt: [] for pt in points}
        for _ in range(repeats):  # round robin over (past, S): machine-load drift hits every point alike
            for pt, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                times[pt].append((time.perf_counter() - t0) * 1e3)
            bar.update(len(points) / repeats)
        for (past, seq), ts in times.items():
            rows.append({"model": name, "runtime": runtime, "past": past, "seq": seq, "ms": statistics.median(ts)})
    # host overhead of OrtBackend: same inputs, bare session.run (numpy cache in/out) and bare IO binding
    ort_b = backends["onnxruntime"]
    ort_b.reset()
    prefill(ort_b, prompt[:, : pasts[0]])
    ids, pos = np.array([[1]]), np.array([[pasts[0]]])
    feeds = session_feeds(ort_b, ids, pos)
    io = ort_b._binding

    def bare_binding():
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", pos)
        io.bind_output("logits")
        ort_b.session.run_with_iobinding(io)
        return io.get_outputs()[0].numpy()

    # interleaved, so drifting machine load hits the three alike
    fns = {
        "backend_ms": lambda: ort_b.forward(ids, pos),
        "session_run_ms": lambda: ort_b.session.run(["logits"], feeds),
        "bare_iobinding_ms": bare_binding,
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(3 * repeats + 2):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i >= 2:
                times[key].append((time.perf_counter() - t0) * 1e3)
    overhead = {"model": name, **{k: statistics.median(v) for k, v in times.items()}}
    bar.update(1)
    path.unlink()
    return {"calls": rows, "overhead": overhead}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S in (1, 8), past 128, 5 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per point (default 15, quick 5)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for both runtimes (default 2)")
    parser.add_argument("--models", default="llama40m,smollm2", help="comma list of llama40m, smollm2")
    parser.add_argument("--out", type=json_out, default="results/backends.json", help="JSON output path")
    args = parser.parse_args()
    seqs = (1, 8) if args.quick else (1, 2, 4, 8, 16)
    pasts = (128,) if args.quick else (128, 512)
    repeats = args.repeats or (5 if args.quick else 15)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    torch.set_num_threads(args.threads)
    results = {
        "threads": args.threads,
        "load_average_1min_start": os.getloadavg()[0],
        "models": {},
    }
    total = len(names) * (2 * len(seqs) * len(pasts) + 1)
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=total, desc="backends benchmark", unit="point") as bar:
        for name in names:
            if name == "llama40m":
                model = Decoder(LLAMA_40M).init_weights(0).eval()
            elif name == "smollm2":
                model = load_checkpoint(smollm2_checkpoint())
            else:
                raise SystemExit(f"unknown model {name!r}; allowed: llama40m, smollm2")
            results["models"][name] = bench_model(name, model, seqs, pasts, repeats, args.threads, Path(tmp), bar)
    results["load_average_1min_end"] = os.getloadavg()[0]
    _print(results, seqs, pasts)
    print(f"\nwrote {save_results(args.out, results, __file__)}")


def _print(results: dict, seqs, pasts) -> None:
    print(
        f"\nms per call (median), {results['threads']} threads; ratio T(S)/T(1) in parentheses; machine load "
        f"(1-min average) {results['load_average_1min_start']:.1f} at start, "
        f"{results['load_average_1min_end']:.1f} at end"
    )
    head = f"{'model':<10} {'runtime':<12} {'past':>5} " + " ".join(f"{'S=' + str(s):>15}" for s in seqs)
    print(head)
    print("-" * len(head))
    for name, res in results["models"].items():
        for runtime in ("onnxruntime", "torch"):
            for past in pasts:
                pts = {r["seq"]: r["ms"] for r in res["calls"] if r["runtime"] == runtime and r["past"] == past}
                cells = " ".join(f"{pts[s]:7.1f} ({pts[s] / pts[seqs[0]]:4.2f}x)" for s in seqs)
                print(f"{name:<10} {runtime:<12} {past:>5} {cells}")
    print("\nOrtBackend host overhead at S=1 (same inputs):")
    for name, res in results["models"].items():
        o = res["overhead"]
        print(
            f"  {name:<10} OrtBackend.forward {o['backend_ms']:.2f} ms | bare session.run (numpy cache in/out) "
            f"{o['session_run_ms']:.2f} ms ({(o['backend_ms'] / o['session_run_ms'] - 1) * 100:+.1f}%) | "
            f"bare IO-binding run {o['bare_iobinding_ms']:.2f} ms "
            f"({(o['backend_ms'] / o['bare_iobinding_ms'] - 1) * 100:+.1f}%)"
        )


if __name__ == "__main__":
    main()
