"""MX weights on this CPU: SmolLM2-135M decode steps per weight export, GEMV bandwidth, accuracy, and accel.sim.

What runs (docs/backends.md, "MX weights on onnxruntime"), every export with onnxruntime's fused operators
(``ort_ops=True``: RMSNorm + residual and RoPE as one node each, docs/backends.md "The graph of a layer"): ``fp32``
(the ratios' reference; ``fp32 portable``: the standard-ONNX graph); ``mx-packed`` MXFP6 (the in-graph decode is
constant-folded into float32 weights at session start, so it runs as fp32); ``mxint8-nbits`` / ``mxfp6-nbits`` /
``mxfp4-nbits`` (exact MX weights as onnxruntime's 8-bit MatMulNBits, int8 activations per block of 32,
``accuracy_level=4``) and ``mxfp6-nbits`` at ``accuracy_level=1`` (float32 activations); ``mxint8-kernel`` /
``mxfp6-kernel`` / ``mxfp4-kernel`` (the same exact weights packed, on accel's fused kernel as the onnxruntime
operator ``ai.accel::MXLinear``, float32 activations; docs/backends.md "MX weights on accel's fused kernel");
``mxfp6-kernel-q8`` / ``mxfp4-kernel-q8`` (the same packed weights, activations quantized per block of 32 to int8 and
integer dot products: docs/backends.md, "int8 activations").

1. Step time: median ms of a decode call (S = 1) and a K+1 = 4 scoring call after a 128-token prefix, timed round
   robin over all exports in one run, in a new random order every round (machine-load drift and order effects hit
   them alike); ratio = fp32 time / export time. The ``*-nbits`` S = 1 call runs as one row (``OrtBackend``'s
   ``min_rows`` default for these GQA graphs: their one-token call equals the multi-row calls bit for bit); the
   ``, padded`` rows time the same graph padded to 2 rows (``min_rows=2``, the default before the grouped rows).
2. GEMV: one ``[1, K] x [K, N]`` product (K = 4096, N = 8192: 134 MB of float32 weights, far over the caches) as a
   float32 MatMul and as a MatMulNBits; effective bandwidth = bytes of the stored format / time, and the MXFP6
   bandwidth = MXFP6's 6.25 bits per weight / time (what a kernel reading MXFP6 bytes would have to stream).
3. Accuracy: teacher-forced on the fp32 export's greedy continuations of held-out prompts: top-1 agreement and
   KL(fp32 || export) in nats per position.
4. accel.sim: a ``measure_host`` profile of this machine (its layer terms: docs/sim.md, "This CPU as a device"),
   ``step_time`` of SmolLM2-135M after 128 tokens per export (the head in the export's weight format) at 1 row, 2 rows
   (the padded step) and S = 4, against the measured calls; and what the MX formats would give if their own bytes
   were streamed (the same profile without the 8-bit kernel's rate), against the ``*-kernel`` steps (which do).
5. ``--profile N``: onnxruntime's per-node profiler over N S = 1 calls of fp32 and mxfp6-nbits (1 row, padded),
   summed per operator type: where a step's time goes.

    python benchmarks/mx.py --profile 20                            # ~5 minutes on 2 cores
    python benchmarks/mx.py --quick                                 # fewer repeats, no accuracy
    python benchmarks/mx.py --quick --exports "fp32 portable,mxfp6-nbits"  # a subset
    python benchmarks/mx.py --sim-check                             # the simulated and kernel exports + accel.sim
    python benchmarks/mx.py --quick --accel-attention --exports "mxfp6-kernel,mxfp6-kernel-q8"  # the decode graphs

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
from bench_support import json_out, save_results
from onnx import TensorProto, helper, numpy_helper
from tqdm.auto import tqdm

from accel.backends import ExportWeights, OrtBackend, export_onnx, prefill
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.formats import get_format, quantize
from accel.models import load_checkpoint, load_tokenizer, smollm2_checkpoint
from accel.spd import GREEDY, generate_ar

EXPORTS = {  # name: weights (every export with onnxruntime's fused operators, ort_ops=True, but "fp32 portable")
    "fp32": ExportWeights("fp32"),
    "fp32 portable": ExportWeights("fp32"),
    "mx-packed mxfp6": ExportWeights("mx-packed", mx_format="mxfp6"),
    "mxint8-nbits": ExportWeights("mxint8-nbits"),
    "mxfp6-nbits": ExportWeights("mxfp6-nbits"),
    "mxfp4-nbits": ExportWeights("mxfp4-nbits"),
    "mxfp6-nbits level 1": ExportWeights("mxfp6-nbits", accuracy_level=1),
    "mxint8-kernel": ExportWeights("mxint8-kernel"),
    "mxfp6-kernel": ExportWeights("mxfp6-kernel"),
    "mxfp4-kernel": ExportWeights("mxfp4-kernel"),
    "mxfp6-kernel-q8": ExportWeights("mxfp6-kernel-q8"),
    "mxfp4-kernel-q8": ExportWeights("mxfp4-kernel-q8"),
}
PADDED = ("mxint8-nbits", "mxfp6-nbits", "mxfp4-nbits")  # also timed padded to 2 rows: OrtBackend(min_rows=2)
SIM_FORMATS = {"fp32": "fp32", "mxint8-nbits": "mxint8", "mxfp6-nbits": "mxfp6", "mxfp4-nbits": "mxfp4"}
PROFILED = ("fp32", "mxfp6-nbits", "mxfp6-nbits, padded")
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


def predict(threads: int) -> dict[str, dict[str, float]]:
    """accel.sim step times (ms) of SmolLM2-135M after PAST tokens on a ``measure_host`` profile of this machine, per
    export and rows per call (S=1, S=2: the padded one-token call, S=SCORE); the head in the weight format, as the
    exports hold it, over every row (the exports return every row's logits, padding included). ``streamed``: the
    same profile with the MX bytes themselves streamed (no 8-bit kernel rate)."""
    from accel.sim import CallShape, measure_host, step_time

    hw = measure_host(ort_threads=threads)
    streamed = hw.model_copy(update={"decompress_elements_per_s": {}})
    out: dict[str, dict[str, float]] = {"_profile": {"notes": hw.notes}}  # type: ignore[dict-item]

    def ms(h, fmt: str, s: int) -> float:  # the head over all s rows, in the weight format
        call = CallShape(new_tokens=s, context_len=PAST, num_logits=s)
        t = step_time("smollm2-135m", h, call, weight_format=fmt, compress_lm_head=True)
        return t.time_s * 1e3

    for label, fmt in SIM_FORMATS.items():
        out[label] = {f"S={s}": ms(hw, fmt, s) for s in (1, 2, SCORE)}
        out[label]["streamed S=1"] = ms(streamed, fmt, 1)
    for fmt, (rate, beta, gamma) in kernel_terms(threads).items():  # the *-kernel exports: the fused kernel's rate
        kernel = hw.model_copy(update={"decompress_elements_per_s": {fmt: rate}, "decompress_multi_token_penalty": beta,
                                       "decompress_multi_token_exponent": gamma})  # fmt: skip
        out[f"{fmt}-kernel"] = {f"S={s}": ms(kernel, fmt, s) for s in (1, SCORE)}
        out[f"{fmt}-kernel"]["terms"] = {"weights_per_s": rate, "beta": beta, "gamma": gamma}  # type: ignore[assignment]
    return out


def kernel_terms(threads: int, repeats: int = 25) -> dict[str, tuple[float, float, float]]:
    """The fused kernel's own terms for accel.sim, per format: its rate (weights/s) on SmolLM2's LM head shape
    [49152, 576] (the model's K: its activation rows stay in L1, as in a step) with one activation row, streamed from
    memory (a 64 MB buffer is touched before each call), on ``threads`` threads, and the (beta, gamma) of its growth
    over rows fitted to 2 and 4 rows (``T(r) / T(1) = 1 + beta (r - 1)^gamma``), as ``measure_host`` fits
    MatMulNBits'. Every (format, rows) pair is timed round robin; each time is the fastest of ``repeats``."""
    from accel.formats.mxkernel import PackedMX

    rng = np.random.default_rng(0)
    w = rng.standard_normal((49152, 576)).astype(np.float32)
    evict = np.ones(64 << 20, np.uint8)
    packed = {fmt: PackedMX(quantize(w, fmt, axis=1)) for fmt in ("mxint8", "mxfp6", "mxfp4")}
    xs = {rows: rng.standard_normal((rows, w.shape[1])).astype(np.float32) for rows in (1, 2, 4)}
    best = {(fmt, rows): float("inf") for fmt in packed for rows in xs}
    for _ in range(repeats):
        for fmt, rows in best:
            evict[::64] += 1
            t0 = time.perf_counter()
            packed[fmt].matmul(xs[rows], threads=threads)
            best[fmt, rows] = min(best[fmt, rows], time.perf_counter() - t0)
    out = {}
    for fmt in packed:
        t1 = best[fmt, 1]
        g2, g4 = best[fmt, 2] / t1 - 1, best[fmt, 4] / t1 - 1
        gamma = float(np.log(g4 / g2) / np.log(3)) if g2 > 0 and g4 > g2 else 1.0
        out[fmt] = (w.size / t1, max(g2, 0.0), gamma)
    return out


def profile_ops(paths: dict[str, Path], threads: int, calls: int, tmp: Path) -> dict[str, dict[str, list[float]]]:
    """onnxruntime's profiler over the last ``calls`` of ``calls + 3`` S=1 calls after PAST tokens, per backend of
    ``PROFILED``: per operator type, [ms per call, nodes per call] summed over the graph's nodes; and the median
    ``(whole call)`` as the profiler saw it (profiling itself adds a little per node)."""
    out = {}
    rng = np.random.default_rng(0)
    for name in (n for n in PROFILED if n.split(",")[0] in paths):
        rows = 2 if "padded" in name else None
        b = OrtBackend(paths[name.split(",")[0]], threads=threads, min_rows=rows, profile=tmp / "profile")
        prefill(b, rng.integers(0, b.info.vocab_size, (1, PAST)))
        ids, pos = rng.integers(0, b.info.vocab_size, (1, 1)), np.array([[PAST]])
        for _ in range(calls + 3):
            b.forward(ids, pos)
        events = json.loads(Path(b.session.end_profiling()).read_text())
        runs = [e for e in events if e.get("name") == "model_run"][-calls:]
        per: dict[str, list[float]] = {}
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= runs[0]["ts"]:
                row = per.setdefault(e["args"]["op_name"], [0.0, 0.0])
                row[0] += e["dur"] / 1e3 / calls
                row[1] += 1 / calls
        per["(whole call)"] = [statistics.median(e["dur"] for e in runs) / 1e3, 0.0]
        out[name] = per
        del b
    return out


def report(r: dict) -> None:
    """Print the tables of a result ``r``."""
    print(
        f"\nSmolLM2-135M on onnxruntime, {r['threads']} threads (spinning {'on' if r.get('spin') else 'off'}), past "
        f"{PAST}{', accel attention' if r.get('accel_attention') else ''}; median ms per call; ratio = fp32 / "
        f"this (load average {r['load_start']:.1f} -> {r['load_end']:.1f})"
    )
    steps, fp32 = r["steps"], r["steps"]["fp32"]
    print(f"{'export':<22}{'S=1 ms':>9}{'x fp32':>8}{f'S={SCORE} ms':>9}{'x fp32':>8}")
    for name, t in steps.items():
        s1, sk = t["S=1"], t[f"S={SCORE}"]
        print(f"{name:<22}{s1:>9.2f}{fp32['S=1'] / s1:>7.2f}x{sk:>9.2f}{fp32[f'S={SCORE}'] / sk:>7.2f}x")
    if r.get("gemv"):
        report_gemv(r["gemv"])
    if r.get("accuracy"):
        print("\naccuracy vs the fp32 export (teacher-forced on its greedy continuations)")
        for name, a in r["accuracy"].items():
            print(f"{name:<22} top-1 {a['top1_agreement']:.4f}  KL {a['kl_nats']:.5f} nats/pos ({a['positions']})")
    if r.get("predicted_ms"):
        report_sim(r["predicted_ms"], steps)
    if r.get("profile"):
        report_profile(r["profile"])


def report_gemv(g: dict) -> None:
    """The GEMV table: ms, stored bytes' GB/s, and GB/s counted as MXFP6 bytes."""
    print("\nGEMV [1, 4096] x [4096, 8192]: ms, GB/s of the stored bytes, GB/s counted as MXFP6 bytes (6.25 bit)")
    base = g["fp32 MatMul"]["stored_GB_s"]
    for name, v in g.items():
        line = f"{name:<22}{v['ms']:>8.2f} ms {v['stored_GB_s']:>7.2f} GB/s"
        if name != "fp32 MatMul":
            line += f" {v['mxfp6_GB_s']:>7.2f} GB/s as MXFP6 = {v['mxfp6_GB_s'] / base:.0%} of the fp32 GEMV's"
        print(line)


def report_sim(p: dict, steps: dict) -> None:
    """Predicted vs measured step times: S=1 one row, the padded S=1 call (2 rows), S=SCORE."""
    print(f"\naccel.sim on a measure_host profile of this machine ({p['_profile']['notes']})")
    head = [("1 row: sim", 12), ("measured", 9), ("err", 6), ("2 rows: sim", 13), ("measured", 9), ("err", 6)]
    head += [(f"S={SCORE}: sim", 12), ("measured", 9), ("err", 6)]
    print(f"{'export':<14}" + "".join(f"{h:>{w}}" for h, w in head))
    for name in (n for n in SIM_FORMATS if n in steps):
        one = steps[name]["S=1"]
        two = steps[f"{name}, padded"]["S=1"] if f"{name}, padded" in steps else None
        cells = [(p[name]["S=1"], one), (p[name]["S=2"], two), (p[name][f"S={SCORE}"], steps[name][f"S={SCORE}"])]
        line = f"{name:<14}"
        for pred, meas in cells:
            line += f"{pred:>12.2f}" + (f"{meas:>9.2f}{pred / meas - 1:>+6.0%}" if meas else f"{'-':>9}{'':>6}")
        print(line)
    for name in (n for n in steps if n.endswith("-kernel") and n in p):
        t = p[name]["terms"]
        cells = [f"{p[name][k]:.2f} / {steps[name][k]:.2f} ms ({p[name][k] / steps[name][k] - 1:+.0%})"
                 for k in ("S=1", f"S={SCORE}")]  # fmt: skip
        print(f"{name:<14} S=1 {cells[0]}, S={SCORE} {cells[1]} (the kernel's {t['weights_per_s'] / 1e9:.1f} G "
              f"weights/s, rows beta {t['beta']:.2f} gamma {t['gamma']:.2f})")  # fmt: skip
    print(
        "if the MX bytes themselves were streamed (a kernel reading packed codes), S=1: "
        + ", ".join(f"{n} {p[n]['streamed S=1']:.2f} ms ({p['fp32']['S=1'] / p[n]['streamed S=1']:.2f}x fp32"
                    f"{_kernel_measured(n, p[n]['streamed S=1'], steps)})" for n in list(SIM_FORMATS)[1:])
    )  # fmt: skip


def _kernel_measured(nbits: str, streamed_ms: float, steps: dict) -> str:
    """``; <format>-kernel measured X ms, err`` when the run timed the fused-kernel export of ``nbits``'s format."""
    kernel = nbits.replace("-nbits", "-kernel")
    if kernel not in steps:
        return ""
    meas = steps[kernel]["S=1"]
    return f"; {kernel} measured {meas:.2f} ms, {streamed_ms / meas - 1:+.0%}"


def report_profile(prof: dict) -> None:
    """Per-operator time of the profiled backends (ms per S=1 call, nodes)."""
    names = list(prof)
    ops = sorted({op for v in prof.values() for op in v}, key=lambda op: -max(v.get(op, [0])[0] for v in prof.values()))
    print("\nonnxruntime profiler, S=1 after 128 tokens: ms per call (nodes) per operator type")
    print(f"{'operator':<30}" + "".join(f"{n:>24}" for n in names))
    for op in ops:
        cells = [prof[n].get(op) for n in names]
        print(f"{op:<30}" + "".join(f"{c[0]:>16.3f} ({c[1]:>4.0f})" if c else f"{'-':>24}" for c in cells))


def _chosen(args: argparse.Namespace) -> dict[str, ExportWeights]:
    """The exports to time: ``--exports`` (fp32 always, the ratios' reference), the simulated ones with
    ``--sim-check``, else all."""
    if args.exports:
        names = ["fp32"] + [n.strip() for n in args.exports.split(",") if n.strip() and n.strip() != "fp32"]
        unknown = [n for n in names if n not in EXPORTS]
        if unknown:
            raise SystemExit(f"--exports: unknown {unknown}; choose from {list(EXPORTS)}")
        return {n: EXPORTS[n] for n in names}
    return {n: w for n, w in EXPORTS.items() if n in SIM_FORMATS or n.endswith("-kernel") or not args.sim_check}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30, quick 8)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, no accuracy, no simulator")
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts for the accuracy (default 4)")
    ap.add_argument("--new-tokens", type=int, default=48, help="fp32 greedy tokens per prompt (default 48)")
    ap.add_argument("--spin", action="store_true", help="idle threads spin (onnxruntime default; OrtBackend: off)")
    ap.add_argument(
        "--accel-attention",
        action="store_true",
        help="each layer's attention as accel's CacheAttention operator, as accel generate exports",
    )
    ap.add_argument("--profile", type=int, default=0, help="profile this many S=1 calls per operator (default 0: no)")
    ap.add_argument("--sim-check", action="store_true", help="only the simulated exports' steps and accel.sim (~2 min)")
    ap.add_argument("--exports", help="comma-separated subset of: " + ", ".join(EXPORTS) + " (fp32 always)")
    ap.add_argument("--out", type=json_out, default="results/mx.json", help="JSON output path")
    args = ap.parse_args()
    repeats = args.repeats or (8 if args.quick else 30)
    r = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": args.threads}
    r["spin"], r["accel_attention"] = args.spin, args.accel_attention
    r["load_start"] = os.getloadavg()[0]
    model = load_checkpoint(smollm2_checkpoint())
    with tempfile.TemporaryDirectory() as tmp:
        backends, paths = {}, {}
        for name, w in tqdm(_chosen(args).items(), desc="export", unit="file"):
            path = Path(tmp) / f"{len(paths)}.onnx"
            ort_ops = name != "fp32 portable"
            attn = args.accel_attention and ort_ops  # accel's CacheAttention needs the fused operators
            paths[name] = export_onnx(
                model, path, ctx_len=2 * PAST, weights=w, progress=False, ort_ops=ort_ops, accel_attention=attn
            )
            backends[name] = OrtBackend(paths[name], threads=args.threads, spin=args.spin)
            if name in PADDED:  # the same graph, its one-token call padded to 2 rows (the same logits)
                backends[f"{name}, padded"] = OrtBackend(paths[name], threads=args.threads, min_rows=2, spin=args.spin)
        scored = {n: b for n, b in backends.items() if not n.endswith("padded")}
        accuracy = not (args.quick or args.sim_check)
        with tqdm(total=repeats + (len(scored) if accuracy else 0), desc="mx benchmark") as bar:
            r["steps"] = time_steps(backends, repeats, bar)
            if accuracy:
                r["accuracy"] = measure_accuracy(model, scored, args.prompts, args.new_tokens, bar)
        del backends, scored
        if args.profile:
            r["profile"] = profile_ops(paths, args.threads, args.profile, Path(tmp))
    r["gemv"] = None if args.sim_check else time_gemv(args.threads, repeats)
    r["predicted_ms"] = None if args.quick else predict(args.threads)
    r["load_end"] = os.getloadavg()[0]
    report(r)
    print(f"\nwrote {save_results(args.out, r, __file__)}")


if __name__ == "__main__":
    main()
