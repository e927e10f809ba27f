"""MX weights on this CPU: SmolLM2-135M decode steps per weight export, GEMV bandwidth, accuracy, and accel.sim.

What runs (docs/backends.md, "MX weights on onnxruntime"): ``fp32``; ``mx-packed`` MXFP6 (the in-graph decode is
constant-folded into float32 weights at session start, so it runs as fp32); ``mxint8-nbits`` / ``mxfp6-nbits`` /
``mxfp4-nbits`` (exact MX weights as onnxruntime's 8-bit MatMulNBits, int8 activations per block of 32,
``accuracy_level=4``) and ``mxfp6-nbits`` at ``accuracy_level=1`` (float32 activations).

1. Step time: median ms of a decode call (S = 1) and a K+1 = 4 scoring call after a 128-token prefix, timed round
   robin over all exports in one run, in a new random order every round (machine-load drift and order effects hit
   them alike); ratio = fp32 time / export time.
2. GEMV: one ``[1, K] x [K, N]`` product (K = 4096, N = 8192: 134 MB of float32 weights, far over the caches) as a
   float32 MatMul and as a MatMulNBits; effective bandwidth = bytes of the stored format / time, and the MXFP6
   bandwidth = MXFP6's 6.25 bits per weight / time (what a kernel reading MXFP6 bytes would have to stream).
3. Accuracy: teacher-forced on the fp32 export's greedy continuations of held-out prompts: top-1 agreement and
   KL(fp32 || export) in nats per position.
4. accel.sim: ``measure_host`` profile of this machine, ``step_time`` of SmolLM2-135M (S = 1, past 128) per format,
   against the measured step (MatMulNBits streams 8-bit codes for every MX format: the ``int8`` row is what runs).

    flock /work/helpers/bench.lock python benchmarks/mx.py            # ~3 minutes on 2 cores
    python benchmarks/mx.py --quick                                    # fewer repeats, no accuracy

Prints tables and writes results/mx.json. Timings on a shared machine are noisy: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from tqdm.auto import tqdm

from accel.backends import ExportWeights, OrtBackend, export_onnx, prefill
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.formats import get_format, quantize
from accel.models import load_checkpoint, load_tokenizer, smollm2_checkpoint
from accel.spd import GREEDY, generate_ar

EXPORTS = {
    "fp32": ExportWeights("fp32"),
    "mx-packed mxfp6": ExportWeights("mx-packed", mx_format="mxfp6"),
    "mxint8-nbits": ExportWeights("mxint8-nbits"),
    "mxfp6-nbits": ExportWeights("mxfp6-nbits"),
    "mxfp4-nbits": ExportWeights("mxfp4-nbits"),
    "mxfp6-nbits level 1": ExportWeights("mxfp6-nbits", accuracy_level=1),
}
SIM_FORMATS = {"fp32": "fp32", "int8": "int8", "mxint8": "mxint8", "mxfp6": "mxfp6", "mxfp4": "mxfp4"}
PAST, SCORE = 128, 4


def time_steps(backends: dict[str, OrtBackend], repeats: int, bar) -> dict[str, dict[str, float]]:
    """Median ms of an S=1 and an S=SCORE call after a PAST-token prefix, round robin over ``backends``."""
    vocab = next(iter(backends.values())).info.vocab_size
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, (1, PAST))
    calls = {}
    for name, b in backends.items():
        b.reset()
        prefill(b, prompt)
        for s in (1, SCORE):
            ids, pos = rng.integers(0, vocab, (1, s)), np.arange(PAST, PAST + s)[None]
            calls[(name, s)] = lambda b=b, ids=ids, pos=pos: b.forward(ids, pos)  # rewrites the same slots
    for fn in calls.values():
        fn()
    times: dict[tuple[str, int], list[float]] = {k: [] for k in calls}
    keys = list(calls)
    for _ in range(repeats):
        for i in rng.permutation(len(keys)):  # a new order every round: no export always follows the same one
            t0 = time.perf_counter()
            calls[keys[i]]()
            times[keys[i]].append((time.perf_counter() - t0) * 1e3)
        bar.update(1)
    return {name: {f"S={s}": statistics.median(times[(name, s)]) for s in (1, SCORE)} for name in backends}


def _session(nodes, inits, k: int, n: int, threads: int) -> ort.InferenceSession:
    graph = helper.make_graph(
        nodes,
        "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def time_gemv(threads: int, repeats: int, k: int = 4096, n: int = 8192) -> dict[str, dict[str, float]]:
    """ms and bandwidths of one-row products with a [k, n] weight: float32 MatMul vs 8-bit MatMulNBits (MXFP6)."""
    from accel.backends.onnx_weights import nbits_blocks

    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k)).astype(np.float32)
    mx = quantize(w, get_format("mxfp6"), axis=-1, block_size=32)
    q, scales = nbits_blocks("w", mx)
    sessions = {
        "fp32 MatMul": _session(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            [numpy_helper.from_array(np.ascontiguousarray(w.T), "w")],
            k,
            n,
            threads,
        )
    }
    del w
    for level in (4, 1):
        node = helper.make_node(
            "MatMulNBits",
            ["x", "q", "s"],
            ["y"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=8,
            block_size=32,
            accuracy_level=level,
        )
        inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scales.reshape(-1), "s")]
        sessions[f"MatMulNBits level {level}"] = _session([node], inits, k, n, threads)
    stored = {"fp32 MatMul": 4.0 * k * n, **{s: q.nbytes + scales.nbytes for s in sessions if "NBits" in s}}
    feed = {"x": rng.standard_normal((1, k)).astype(np.float32)}
    times: dict[str, list[float]] = {s: [] for s in sessions}
    names = list(sessions)
    for i in range(repeats + 3):
        for j in rng.permutation(len(names)):
            t0 = time.perf_counter()
            sessions[names[j]].run(None, feed)
            if i >= 3:
                times[names[j]].append(time.perf_counter() - t0)
    out = {}
    for name, ts in times.items():
        t = statistics.median(ts)
        out[name] = {"ms": t * 1e3, "stored_GB_s": stored[name] / t / 1e9, "mxfp6_GB_s": 6.25 / 8 * k * n / t / 1e9}
    return out


def measure_accuracy(model, backends: dict[str, OrtBackend], prompts: int, new_tokens: int, bar) -> dict:
    """Top-1 agreement and KL(fp32 || export) per position, teacher-forced on fp32's greedy continuations."""
    tok = load_tokenizer(smollm2_checkpoint())
    ref = backends["fp32"]
    seqs = []
    for text in HELD_OUT_PROMPTS[:prompts]:
        ids = tok.encode(text).ids
        cont = generate_ar(ref, [ids], max_new_tokens=new_tokens, sampling=GREEDY).tokens[0]
        seqs.append((ids, list(ids) + list(cont[:-1])))
    logp = {}
    for name, b in backends.items():
        rows = []
        for ids, seq in seqs:
            b.reset()
            x = b.forward(np.array([seq]), np.arange(len(seq))[None])[0, len(ids) - 1 :].astype(np.float64)
            x -= x.max(-1, keepdims=True)
            rows.append(x - np.log(np.exp(x).sum(-1, keepdims=True)))
        logp[name] = np.concatenate(rows)
        bar.update(1)
    a = logp["fp32"]
    return {
        name: {
            "top1_agreement": float((b.argmax(-1) == a.argmax(-1)).mean()),
            "kl_nats": float((np.exp(a) * (a - b)).sum(-1).mean()),
            "positions": len(a),
        }
        for name, b in logp.items()
    }


def predict() -> dict[str, float]:
    """accel.sim step time (ms) of SmolLM2-135M, S = 1 after PAST tokens, per format, on a measure_host profile."""
    from accel.sim import measure_host, step_time

    hw = measure_host()
    return {
        label: step_time("smollm2-135m", hw, weight_format=fmt, context_len=PAST).time_s * 1e3
        for label, fmt in SIM_FORMATS.items()
    }


def report(r: dict) -> None:
    """Print the tables of a result ``r``."""
    print(
        f"\nSmolLM2-135M on onnxruntime, {r['threads']} threads, past {PAST}; median ms per call; ratio = fp32 / "
        f"this (load average {r['load_start']:.1f} -> {r['load_end']:.1f})"
    )
    steps, fp32 = r["steps"], r["steps"]["fp32"]
    print(f"{'export':<22}{'S=1 ms':>9}{'x fp32':>8}{f'S={SCORE} ms':>9}{'x fp32':>8}")
    for name, t in steps.items():
        s1, sk = t["S=1"], t[f"S={SCORE}"]
        print(f"{name:<22}{s1:>9.2f}{fp32['S=1'] / s1:>7.2f}x{sk:>9.2f}{fp32[f'S={SCORE}'] / sk:>7.2f}x")
    g = r["gemv"]
    print("\nGEMV [1, 4096] x [4096, 8192]: ms, GB/s of the stored bytes, GB/s counted as MXFP6 bytes (6.25 bit)")
    base = g["fp32 MatMul"]["stored_GB_s"]
    for name, v in g.items():
        line = f"{name:<22}{v['ms']:>8.2f} ms {v['stored_GB_s']:>7.2f} GB/s"
        if name != "fp32 MatMul":
            line += f" {v['mxfp6_GB_s']:>7.2f} GB/s as MXFP6 = {v['mxfp6_GB_s'] / base:.0%} of the fp32 GEMV's"
        print(line)
    if r.get("accuracy"):
        print("\naccuracy vs the fp32 export (teacher-forced on its greedy continuations)")
        for name, a in r["accuracy"].items():
            print(f"{name:<22} top-1 {a['top1_agreement']:.4f}  KL {a['kl_nats']:.5f} nats/pos ({a['positions']})")
    if r.get("predicted_ms"):
        p = r["predicted_ms"]
        print("\naccel.sim (measure_host profile) S=1 step vs measured")
        pairs = [("fp32", "fp32"), ("int8", "mxint8-nbits"), ("int8", "mxfp6-nbits"), ("int8", "mxfp4-nbits")]
        for fmt, name in pairs:
            m = steps[name]["S=1"]
            print(f"{fmt:<8} predicted {p[fmt]:>7.2f} ms, measured {name:<14}{m:>7.2f} ms ({p[fmt] / m - 1:+.0%})")
        print(
            "if the MX bytes were streamed (a kernel reading packed codes): "
            + ", ".join(f"{f} {p[f]:.2f} ms ({p['fp32'] / p[f]:.2f}x fp32)" for f in ("mxint8", "mxfp6", "mxfp4"))
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30, quick 8)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, no accuracy, no simulator")
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts for the accuracy (default 4)")
    ap.add_argument("--new-tokens", type=int, default=48, help="fp32 greedy tokens per prompt (default 48)")
    ap.add_argument("--out", default="results/mx.json", help="JSON output path")
    args = ap.parse_args()
    repeats = args.repeats or (8 if args.quick else 30)
    r = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": args.threads}
    r["load_start"] = os.getloadavg()[0]
    model = load_checkpoint(smollm2_checkpoint())
    with tempfile.TemporaryDirectory() as tmp:
        backends = {}
        for name, w in tqdm(EXPORTS.items(), desc="export", unit="file"):
            path = export_onnx(model, Path(tmp) / f"{len(backends)}.onnx", ctx_len=2 * PAST, weights=w, progress=False)
            backends[name] = OrtBackend(path, threads=args.threads)
        with tqdm(total=repeats + (0 if args.quick else len(backends)), desc="mx benchmark") as bar:
            r["steps"] = time_steps(backends, repeats, bar)
            if not args.quick:
                r["accuracy"] = measure_accuracy(model, backends, args.prompts, args.new_tokens, bar)
        del backends
    r["gemv"] = time_gemv(args.threads, repeats)
    r["predicted_ms"] = None if args.quick else predict()
    r["load_end"] = os.getloadavg()[0]
    report(r)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
