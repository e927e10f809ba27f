"""Decode on whatever GPU torch finds, beside accel.sim's prediction of it: AR step time, the verify-call cost curve
T(S) for S = 1..64, and greedy speculative decoding == AR, for Llama-2-7B-, Llama-2-13B- and TinyLlama-1.1B-shaped
random models in float16 and bfloat16 (weights generated on the device; nothing is downloaded or read). Options:
``--batches`` adds the AR step at larger batches; ``--mx mxfp6`` adds each shape with its block weights kept packed on
the device (``TorchBackend(mx=...)``); ``--layer`` first times each 7B projection alone (float, the MX kernel over
a sweep of launch configs, MX decode + matmul: ``benchmarks/gpu_layers.py``); ``--kernels`` adds rows with accel's
Triton decode kernels (``gemv``, ``attention``, ``gemv+attention``), ``--gemv-layer`` / ``--attention-layer`` first
sweep those kernels' launch configs on single layers (``benchmarks/gpu_gemv.py``), and ``--profile`` prints each row's
AR step by kernel (torch.profiler).

Each call runs through ``TorchBackend(device="cuda")``: weights and the KV cache on the GPU, every call signature
captured once as a CUDA graph. Two times per call: ``dev`` is the graph replay alone (CUDA events), ``call`` is
``backend.forward`` (uploads, replay, the float32 logits' download), what the SpD loop pays. Achieved bandwidth counts
every weight byte and the whole static KV cache (every call reads all ``ctx_len + 1`` slots), over ``dev``.

    python benchmarks/gpu.py                       # on a CUDA machine (~3 minutes on an H200)
    python benchmarks/gpu.py --device cpu --tiny   # the script's smoke test on a CPU (seconds)

Prints one table and writes JSON (``--out``). Goals (issue 37): AR of the 7B shape at >= 70% of the GPU's memory
bandwidth; T(16)/T(1) <= 1.2; the simulator within 10% of every measured row.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accel.backends import TorchBackend, prefill
from accel.backends.torch_graphs import resolve_device, resolve_dtype
from accel.backends.torch_mx_device import DeviceMXLinear
from accel.errors import AccelError
from accel.spd import DraftChain, DraftTree, Sampling, generate, generate_ar
from benchmarks.gpu_gemv import attention_sweep, gemv_sweep, print_gemv
from benchmarks.gpu_layers import layer_sweep, print_layer
from benchmarks.gpu_support import (
    SHAPES,
    cache_bytes,
    copy_bandwidth,
    make_mx_exact,
    mx_bytes,
    profile_step,
    random_model,
    sim_call,
    sim_hardware,
    sync,
    time_calls,
    time_replay,
    weight_bytes,
)

CURVE_POINTS = (1, 2, 4, 8, 16, 32, 64)  # the columns of the printed T(S)/T(1) table
#: --kernels: the TorchBackend settings of each kernel set
KERNEL_SETS = {
    "none": {},
    "gemv": {"gemv": True},
    "attention": {"decode_attention": True},
    "gemv+attention": {"gemv": True, "decode_attention": True},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--shapes", default="llama-2-7b,tinyllama-1.1b", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated: float16, bfloat16, float32")
    p.add_argument("--ctx-len", type=int, default=1024, help="KV-cache slots (tokens)")
    p.add_argument("--context", type=int, default=256, help="cached tokens before each timed call")
    p.add_argument("--max-s", type=int, default=64, help="longest verify call of the T(S) curve (tokens)")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions per call size")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens of each greedy SpD == AR check")
    p.add_argument("--compile", action="store_true", help="compile each block (TorchBackend(compile=True))")
    p.add_argument(
        "--all-sizes", action="store_true", help="every S of 1..max-s (default: powers of 2, multiples of 8)"
    )
    p.add_argument(
        "--mx",
        default="",
        help="also each shape with its block weights in this MX format (e.g. mxfp6), kept packed "
        "on the device and decoded inside each call (TorchBackend(mx=...)); its rows compute in each --dtypes",
    )
    p.add_argument("--mx-rows", type=int, default=None, help="fused decode-matmul up to this many rows (default: "
                   "the layer's default)")  # fmt: skip
    p.add_argument("--mx-only", action="store_true", help="with --mx: only the MX rows (not the float ones)")
    p.add_argument("--batches", default="", help="comma-separated batch sizes > 1: the AR step at each (float rows)")
    p.add_argument("--layer", action="store_true", help="time each 7B projection alone: float, the MX kernel (a "
                   "sweep of launch configs; the best then serves the model rows) and MX decode + matmul")  # fmt: skip
    p.add_argument(
        "--kernels",
        default="none",
        help="comma-separated kernel sets, each a row per float16/bfloat16 "
        "shape: none (cuBLAS and the torch attention), gemv, attention, gemv+attention (accel's Triton "
        "kernels: TorchBackend(gemv=True, decode_attention=True))",
    )
    p.add_argument(
        "--gemv-layer",
        action="store_true",
        help="first sweep the GEMV kernel's launch configs on each 7B "
        "projection alone against F.linear (benchmarks/gpu_gemv.py); the model rows then use the best",
    )
    p.add_argument(
        "--attention-layer",
        action="store_true",
        help="first time one layer's decode attention alone: the torch path and the Triton kernel at several splits "
        "(benchmarks/gpu_gemv.py); the model rows then use the best",
    )
    p.add_argument("--profile", action="store_true", help="print each row's kernels by device time in its AR step")
    p.add_argument("--tiny", action="store_true", help="the 2-layer smoke-test shape, float32, S up to 8")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        p.error(f"--batches {args.batches!r}: comma-separated integers")
    if any(b < 2 for b in args.batches):
        p.error("--batches: sizes above 1 (batch 1 is every row's AR step)")
    args.kernels = [k for k in args.kernels.split(",") if k]
    if not args.kernels or any(k not in KERNEL_SETS for k in args.kernels):
        p.error(f"--kernels {','.join(args.kernels)!r}: comma-separated, of {', '.join(KERNEL_SETS)}")
    if args.mx:
        from accel.formats.elements import get_format

        try:
            get_format(args.mx)
        except AccelError as exc:
            p.error(f"--mx: {exc}")
    if args.tiny:
        args.shapes, args.dtypes, args.max_s, args.reps = "tiny", "float32", 8, 3
        args.ctx_len, args.context, args.new_tokens = 128, 16, 16
    for s in args.shapes.split(","):
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    if not 1 <= args.max_s <= args.ctx_len - args.context:
        p.error(f"--max-s {args.max_s} must be in 1..ctx_len - context ({args.ctx_len - args.context})")
    return args


def batch_steps(shape: str, model, dtype: torch.dtype, args, hw: str | None, say) -> list[dict]:
    """The AR step (1 token per sequence) at each of ``args.batches``: device time, achieved bandwidth and the
    simulator's time, on the same model (a new backend, cache and graphs per batch size)."""
    out = []
    for b in args.batches:
        _, backend = build(shape, dtype, args, "", batch=b, model=model)
        prompt = np.random.default_rng(0).integers(0, backend.info.vocab_size, (b, args.context))
        prefill(backend, prompt)
        call = time_calls(backend, 1, args.context, args.reps)
        devt = time_replay(backend, 1, args.reps)
        sim = sim_call(shape, hw, dtype, 1, args.context, args.ctx_len + 1, batch=b)
        out.append({"B": b, "call_s": call, "dev_s": devt, "sim_s": sim.seconds, "sim_bound": sim.bound,
                    "bytes_per_step": weight_bytes(backend.model) + cache_bytes(backend)})  # fmt: skip
        say(f"  {shape} {dtype} batch {b}: call {call * 1e3:.3f} ms, dev {devt * 1e3:.3f} ms")
        del backend
        gc.collect()
    return out


def spd_check(model, backend: TorchBackend, args, dtype: torch.dtype, mx: str = "") -> dict:
    """Greedy SpD == greedy AR on this target: a chain drafted by the target itself (a second cache; acceptance near
    1) and a dynamic tree drafted by a small random model (acceptance near 0): tokens equal, and how many."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, backend.info.vocab_size, (1, 16))
    greedy = Sampling(greedy=True)
    backend.reset()
    ar = generate_ar(backend, prompt, max_new_tokens=args.new_tokens, sampling=greedy).tokens[0]
    kw = dict(ctx_len=args.ctx_len, device=backend.device, dtype=dtype, max_seq_len=args.max_s) | (
        {"mx": mx} if mx else {}
    )
    small = dict(SHAPES["tiny"], vocab_size=backend.info.vocab_size)
    out = {"ar_tokens": len(ar)}
    drafts = {
        "chain_self_k4": lambda: DraftChain(TorchBackend(model, **kw), k=4),
        "tree_random": lambda: DraftTree(
            TorchBackend(random_model(small, backend.device, dtype, seed=3, head_std=1.0), **kw),
            nodes=min(8, args.max_s - 1),
        ),
    }
    for name, make in drafts.items():
        backend.reset()
        t0 = time.perf_counter()
        res = generate(backend, make(), prompt, max_new_tokens=args.new_tokens, sampling=greedy)
        toks = res.tokens[0]
        same = next((i for i, (a, b) in enumerate(zip(toks, ar, strict=False)) if a != b), min(len(toks), len(ar)))
        out[name] = {
            "equal": toks == ar,
            "first_difference": None if toks == ar else same,
            "tokens_per_call": round(res.stats.tokens_per_target_call, 3),
            "seconds": round(time.perf_counter() - t0, 3),
        }
    return out


def read_slots(backend: TorchBackend, seq: int, args) -> int:
    """Cache slots a call of ``seq`` tokens reads: the visible ones (``context + seq``) where the decode attention
    kernel serves it (one token), else the whole static cache."""
    return args.context + seq if backend.attention_kernels and seq == 1 else args.ctx_len + 1


def build(shape: str, dtype: torch.dtype, args, mx: str, batch: int = 1, model=None, kernels: str = "none"):
    """(model, backend) of one row: a random model of ``shape`` on the device; with ``mx`` its block weights rounded
    to that format (made in bfloat16, which holds MXFP6/MXFP4 values exactly) and kept packed by the backend."""
    dev = resolve_device(args.device)
    if model is None:
        make = torch.bfloat16 if mx and dtype != torch.float32 else dtype
        model = random_model(shape, dev, make, seed=0, head_std=0.2)
        if mx:
            make_mx_exact(model, mx)
    runtime: dict = ({"mx": mx} if mx else {}) | KERNEL_SETS[kernels]
    backend = TorchBackend(
        model,
        ctx_len=args.ctx_len,
        batch_size=batch,
        max_seq_len=args.max_s,
        device=dev,
        dtype=dtype,
        compile=args.compile,
        **runtime,
    )
    if mx and args.mx_rows is not None:
        for m in backend.model.modules():
            if isinstance(m, DeviceMXLinear):
                m.max_rows = args.mx_rows
    return model, backend


def measure(shape: str, dtype_name: str, args, hw: str | None, say, mx: str = "", kernels: str = "none") -> dict:
    """One (shape, dtype[, mx]) row: AR step, the T(S) curve, the simulator's times, the SpD check and (float rows)
    the AR step at each of ``args.batches``."""
    dev, dtype = resolve_device(args.device), resolve_dtype(dtype_name, torch.float32)
    torch._dynamo.reset()  # each row compiles afresh (dynamo's recompile limit counts across rows otherwise)
    model, backend = build(shape, dtype, args, mx, kernels=kernels)
    label = f"{dtype_name}{'+' + mx if mx else ''}{'' if kernels == 'none' else '+' + kernels}"
    if backend.gemv_report is not None or backend.attention_kernels:
        gemv = backend.gemv_report.line() if backend.gemv_report else "no gemv kernel"
        say(f"  {gemv}; attention kernel in {backend.attention_kernels} layers")
    if mx:
        say(f"  {backend.mx_report.line() if backend.mx_report else 'no packed layers'}")
    prompt = np.random.default_rng(0).integers(0, backend.info.vocab_size, (1, args.context))
    prefill(backend, prompt)
    sizes = [s for s in range(1, args.max_s + 1) if args.all_sizes or s in CURVE_POINTS or s % 8 == 0]
    curve = []
    for s in sizes:
        call = time_calls(backend, s, args.context, args.reps)
        devt = time_replay(backend, s, args.reps)
        slots = read_slots(backend, s, args)
        sim = sim_call(shape, hw, dtype, s, args.context, slots, weight_format=mx or None)
        curve.append({"S": s, "call_s": call, "dev_s": devt, "sim_s": sim.seconds, "sim_bound": sim.bound})
        if s in CURVE_POINTS:
            say(f"  {shape} {label} S={s}: call {call * 1e3:.3f} ms, dev {devt * 1e3:.3f} ms")
    packed, floats = mx_bytes(backend.model)
    cache_read = cache_bytes(backend) * read_slots(backend, 1, args) // (args.ctx_len + 1)
    nbytes = packed + floats + cache_read
    row = {
        "shape": shape,
        "dtype": label,
        "weight_bytes": packed + floats,
        "cache_bytes": cache_bytes(backend),
        "cache_read_bytes": cache_read,
        "bytes_per_step": nbytes,
        "curve": curve,
        "spd": spd_check(model, backend, args, dtype, mx),
    }
    if args.profile:
        row["profile"] = profile_step(backend, 1)
        for name, us, share in row["profile"]:
            say(f"    {us:8.1f} us {100 * share:5.1f}%  {name[:110]}")
    if not mx and kernels == "none" and args.batches:
        del backend
        row["batches"] = batch_steps(shape, model, dtype, args, hw, say)
    else:
        del backend
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not np.isfinite(a) or not np.isfinite(b) or b == 0 else a / b


def summarize(row: dict, peak_bw: float | None, copy_bw: float | None) -> dict:
    """The table's numbers of one row: AR times, bandwidth, T(S)/T(1) and the simulator's errors."""
    c = {p["S"]: p for p in row["curve"]}
    t1 = c[1]["dev_s"] if np.isfinite(c[1]["dev_s"]) else c[1]["call_s"]
    bw = row["bytes_per_step"] / t1
    errors = [
        abs(p["sim_s"] / (p["dev_s"] if np.isfinite(p["dev_s"]) else p["call_s"]) - 1)
        for p in row["curve"]
        if p["sim_s"] is not None
    ]
    base = "dev_s" if np.isfinite(c[1]["dev_s"]) else "call_s"
    return {
        "ar_dev_ms": c[1]["dev_s"] * 1e3,
        "ar_call_ms": c[1]["call_s"] * 1e3,
        "achieved_GBps": bw / 1e9,
        "of_peak": _ratio(bw, peak_bw),
        "of_copy": _ratio(bw, copy_bw),
        "sim_ar_ms": None if c[1]["sim_s"] is None else c[1]["sim_s"] * 1e3,
        "ratios": {s: c[s][base] / c[1][base] for s in CURVE_POINTS if s in c},
        "sim_ratios": {s: _ratio(c[s]["sim_s"], c[1]["sim_s"]) for s in CURVE_POINTS if s in c},
        "sim_max_error": max(errors) if errors else None,
        "sim_ar_error": None if c[1]["sim_s"] is None else c[1]["sim_s"] / t1 - 1,  # signed: sim / measured - 1
    }


def _fmt(x, spec: str) -> str:
    """``x`` formatted by ``spec``, or a dash of the same width where it is missing."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-".rjust(int(spec.split(".")[0] or 0))
    return format(x, spec)


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'shape':<15}{'dtype':<9}{'AR dev':>8}{'AR call':>8}{'GB/s':>7}{'%peak':>6}{'%copy':>6}{'sim AR':>8}"
        f"{'sim err':>8}{'max err':>8}  " + " ".join(f"T{s}/T1".rjust(6) for s in CURVE_POINTS) + "  SpD==AR"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        m = r["summary"]
        spd = r["spd"]
        checks = [v for k, v in spd.items() if k != "ar_tokens"]
        eq = "/".join("yes" if v["equal"] else f"no@{v['first_difference']}" for v in checks)
        print(
            f"{r['shape']:<15}{r['dtype']:<9}{_fmt(m['ar_dev_ms'], '8.3f')}{_fmt(m['ar_call_ms'], '8.3f')}"
            f"{_fmt(m['achieved_GBps'], '7.0f')}{_fmt(m['of_peak'] and 100 * m['of_peak'], '6.1f')}"
            f"{_fmt(m['of_copy'] and 100 * m['of_copy'], '6.1f')}{_fmt(m['sim_ar_ms'], '8.3f')}"
            f"{_fmt(m['sim_ar_error'] and 100 * m['sim_ar_error'], '+7.1f')}%"
            f"{_fmt(m['sim_max_error'] and 100 * m['sim_max_error'], '7.1f')}%  "
            + " ".join(_fmt(m["ratios"].get(s), "6.2f") for s in CURVE_POINTS)
            + f"  {eq}"
        )
        sim = " ".join(_fmt(m["sim_ratios"].get(s), "6.2f") for s in CURVE_POINTS)
        print(f"{'':<15}{'sim':<9}{'':>77}  {sim}")


def print_batches(rows: list[dict], peak_bw: float | None) -> None:
    """The AR step at each batch size (float rows measured with --batches)."""
    lines = [(r, b) for r in rows for b in r.get("batches", [])]
    if not lines:
        return
    head = f"{'shape':<15}{'dtype':<9}{'batch':>6}{'AR dev':>9}{'tok/s':>9}{'GB/s':>7}{'%peak':>6}{'sim':>9}{'err':>8}"
    print("\n" + head)
    for r, b in lines:
        t = b["dev_s"] if np.isfinite(b["dev_s"]) else b["call_s"]
        bw = b["bytes_per_step"] / t
        err = None if b["sim_s"] is None else 100 * (b["sim_s"] / t - 1)
        print(
            f"{r['shape']:<15}{r['dtype']:<9}{b['B']:>6}{t * 1e3:>9.3f}{b['B'] / t:>9.0f}{bw / 1e9:>7.0f}"
            f"{_fmt(peak_bw and 100 * bw / peak_bw, '6.1f')}{_fmt(b['sim_s'] and b['sim_s'] * 1e3, '9.3f')}"
            f"{_fmt(err, '+7.1f')}%"
        )


def write_json(args, meta: dict, rows: list[dict]) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "args": vars(args) | {"out": str(args.out)}, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = resolve_device(args.device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU {platform.processor() or 'x86-64'}"
    hw = sim_hardware(gpu) if dev.type == "cuda" else None
    peak = None
    if hw is not None:
        from accel.sim import hardware

        peak = hardware(hw).memory_bandwidth_bytes_per_s
    copy = copy_bandwidth(dev) if dev.type == "cuda" else None
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    say(f"{gpu} (simulator: {hw or 'not in the catalog'}), torch {torch.__version__}; copy bandwidth "
        f"{_fmt(copy and copy / 1e9, '.0f')} GB/s")  # fmt: skip
    rows = []
    t0 = time.perf_counter()
    meta = {"gpu": gpu, "sim_hardware": hw, "torch": torch.__version__, "copy_Bps": copy, "peak_Bps": peak}
    if args.layer:
        meta["layer"] = layer_sweep(args, say)
    if args.gemv_layer:
        meta["gemv_layer"] = gemv_sweep(args, say)
    if args.attention_layer:
        meta["attention_layer"] = attention_sweep(args, say)
    runs = [(shape, dt, mx, k) for shape in args.shapes.split(",") for dt in args.dtypes.split(",")
            for mx in ("", args.mx) if not (args.mx_only and args.mx and not mx)
            for k in args.kernels if k == "none" or not mx]  # fmt: skip
    for shape, dt, mx, k in dict.fromkeys(runs):
        try:
            row = measure(shape, dt, args, hw, say, mx, k)
        except (RuntimeError, AccelError) as exc:  # one failing row (e.g. out of memory) leaves the others
            say(f"{shape} {dt} {mx} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            continue
        row["summary"] = summarize(row, peak, copy)
        rows.append(row)
        if args.out:  # after every row: a run stopped at its time limit keeps what it measured
            write_json(args, meta, rows)
        say(f"{shape} {row['dtype']} done ({time.perf_counter() - t0:.0f} s)")
    sync(dev)
    print(f"# {gpu}; simulator entry {hw}; torch {torch.__version__}; ctx_len {args.ctx_len}, context {args.context}; "
          f"copy {_fmt(copy and copy / 1e9, '.0f')} GB/s; compiled blocks: {args.compile}; times in ms")  # fmt: skip
    print_table(rows)
    print_batches(rows, peak)
    if args.layer:
        print_layer(meta["layer"])
    if args.gemv_layer:
        print_gemv(meta["gemv_layer"])
    if args.out:
        write_json(args, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
