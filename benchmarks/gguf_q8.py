"""GGUF blocks with int8 activations on this CPU: the stored layout against the blocks interleaved 16 rows at a time.

``GGMLKernel.matmul_q8`` (the stored layout, accel/formats/mxkernel_gq8.c: one block of one row at a time, 8 float
lanes a block) against ``GGMLKernel.matmul_q8_x16`` (accel/formats/mxkernel_gx16.c: 16 rows a register, each block
summed in integers; what ``gguf-kernel-q8`` graphs run), on random blocks of every kernel layout (``Q8_0``, ``Q4_0``,
``Q4_1`` as stored; ``Q4_F32``, ``I8_F32``, ``Q5S_F32``, ``Q5_F32`` for the repacked K-quant and Q5 types) in SmolLM2's
gate+up shape (3072 x 576), for S = 1, 2, 4, 8 activation rows (a decode step and verify calls), on the CPU's best
int8 path, on its AVX2 path with AVX-VNNI where the CPU has it (``set_isa(1)``: what an Alder Lake-class CPU without
AVX-512 runs) and on the AVX2 path without it (``set_isa(1, avx_vnni=False)``: an AVX2-only CPU's code), one kernel
thread (``--threads``). Both layouts on every path are timed round robin, so load drift hits them alike; the time is
the fastest of ``--repeats`` calls. Prints one table per path (microseconds, stored / interleaved, and each layout's
T(S) / T(1)) and writes ``--out`` (default results/gguf_q8.json).

    python benchmarks/gguf_q8.py                    # ~5 seconds on 2 cores (--repeats 200: ~20)
    python benchmarks/gguf_q8.py --quick            # Q4_1 and Q8_0 only, fewer repeats
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_support import json_out, save_results

from accel.formats.ggml import GGML_TYPES, GGMLTensor
from accel.formats.ggml_kernel import GGMLKernel
from accel.formats.mxkernel import set_isa
from accel.formats.mxkernel_build import load_kernel
from accel.formats.mxkernel_q8 import q8_path

ROWS = (1, 2, 4, 8)
#: the int8 paths measured, as ``set_isa`` arguments: the best, AVX2 with AVX-VNNI, AVX2 (each once where they coincide)
SETTINGS = ((3, True), (1, True), (1, False))
SHAPE = (3072, 576)  # SmolLM2's gate+up, one node


def random_blocks(rng: np.random.Generator, name: str, n: int, k: int) -> GGMLTensor:
    """Random codes and modest scales (float16 halves for the stored types, float32 for the repacked ones)."""
    t = GGML_TYPES[name]
    codes = rng.integers(0, 256, (n, k // 32, t.code_bytes)).astype(np.uint8)
    if t.scale_bytes % 8 == 0:  # float32 (d, m) pairs
        scales = (rng.standard_normal((n, k // 32, t.scale_bytes // 4)) * 0.01).astype(np.float32).view(np.uint8)
    else:
        scales = (rng.standard_normal((n, k // 32, t.scale_bytes // 2)) * 0.01).astype(np.float16).view(np.uint8)
    return GGMLTensor(t, (n, k), codes, scales.reshape(n, k // 32, t.scale_bytes))


def fastest(fns: dict, repeats: int) -> dict:
    """Seconds of each function's fastest call, the functions called in turn ``repeats`` times after a warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}


def paths() -> dict[str, tuple[int, bool]]:
    """The distinct int8 paths of ``SETTINGS`` on this CPU: name -> ``set_isa`` arguments."""
    out: dict[str, tuple[int, bool]] = {}
    try:
        for isa, avx_vnni in SETTINGS:
            set_isa(isa, avx_vnni=avx_vnni)
            out.setdefault(q8_path(load_kernel()), (isa, avx_vnni))
    finally:
        set_isa(3)
    return out


def bench(layouts: list[str], settings: dict[str, tuple[int, bool]], threads: int, repeats: int) -> dict[str, list]:
    """Per path of ``settings``, one row per (layout, S): both layouts' fastest call in seconds. Every (path, layout)
    call of one (layout, S) is timed round robin (each call sets its path first: ~1 us of ctypes)."""
    rng = np.random.default_rng(0)
    out: dict[str, list] = {path: [] for path in settings}
    try:
        for name in layouts:
            g = GGMLKernel(random_blocks(rng, name, *SHAPE))
            for s in ROWS:
                x = rng.standard_normal((s, SHAPE[1])).astype(np.float32)
                fns = {}
                for path, (isa, vnni) in settings.items():
                    fns[path, "stored"] = lambda g=g, x=x, i=isa, v=vnni: (
                        set_isa(i, avx_vnni=v),
                        g.matmul_q8(x, threads=threads),
                    )
                    fns[path, "interleaved"] = lambda g=g, x=x, i=isa, v=vnni: (
                        set_isa(i, avx_vnni=v),
                        g.matmul_q8_x16(x, threads=threads),
                    )
                t = fastest(fns, repeats)
                for path in settings:
                    row = {"layout": name, "rows": s, "stored_s": t[path, "stored"]}
                    out[path].append({**row, "interleaved_s": t[path, "interleaved"]})
    finally:
        set_isa(3)
    return out


def table(rows: list[dict], path: str) -> list[str]:
    """The rows as a markdown table (microseconds; stored / interleaved; each layout's T(S) / T(1))."""
    one = {(r["layout"], "stored"): r["stored_s"] for r in rows if r["rows"] == 1}
    one.update({(r["layout"], "interleaved"): r["interleaved_s"] for r in rows if r["rows"] == 1})
    out = [
        f"path {path}",
        "| layout | S | stored us | interleaved us | stored / interleaved | T(S)/T(1) stored | T(S)/T(1) interleaved |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r["stored_s"], r["interleaved_s"]
        ra, rb = a / one[r["layout"], "stored"], b / one[r["layout"], "interleaved"]
        out.append(
            f"| {r['layout']} | {r['rows']} | {a * 1e6:.1f} | {b * 1e6:.1f} | {a / b:.2f} | {ra:.2f} | {rb:.2f} |"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40, help="timed calls per layout and size")
    parser.add_argument("--threads", type=int, default=1, help="kernel threads")
    parser.add_argument("--quick", action="store_true", help="Q4_1 and Q8_0 only, 10 repeats")
    parser.add_argument("--out", type=json_out, default="results/gguf_q8.json", help="JSON output path")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    if load_kernel() is None:
        raise SystemExit("the fused kernel cannot be built here: nothing to measure")
    layouts = ["Q4_1", "Q8_0"] if args.quick else list(GGML_TYPES)
    repeats = 10 if args.quick else args.repeats
    results = bench(layouts, paths(), args.threads, repeats)
    for path, rows in results.items():
        print("\n".join(table(rows, path)), end="\n\n")
    save_results(args.out, {"shape": list(SHAPE), "threads": args.threads, **results}, __file__, argv)


if __name__ == "__main__":
    main()
