"""The fused MX kernel (``accel.formats.mxkernel``) on this CPU: GEMV weight bandwidth and a SmolLM2-135M decode step.

1. GEMV ``y = W x`` (one activation row) for W of shape [N, K]: 4096 x 8192 (134 MB of float32, far over the caches)
   and SmolLM2-135M's layer shapes. float32: ``torch.mv`` with ``torch.set_num_threads(t)``; MX: ``PackedMX.matmul``
   with ``threads=t`` on the kernel's best path (and its AVX2 path for comparison), MXFP6 and MXFP4, and the same
   weights with int8 activations (``*-q8``: ``accel.formats.mxkernel_q8.matmul_q8``, integer dot products). Effective
   bandwidth = bytes of the stored weight (float32: 4 a weight; MX: packed codes + scales) / time; ``%fp32`` =
   the kernel's effective bandwidth as a share of the float32 GEMV's (the issue's goal: >= 60%), ``x`` = speedup.
   Every configuration is timed round robin with its float32 reference, so load drift hits both alike, each call
   after 10 ms of rest (``PAUSE_S``: no call starts beside the previous one's spinning OpenMP workers); the time is
   the fastest call (the least disturbed one on a shared machine), ``--median`` reports medians instead.
2. Decode step: SmolLM2-135M through ``TorchBackend``, S = 1 (decode) and S = 4 (verify) after a 128-token past:
   float32 weights vs the same model with MXFP6 weights packed (``accel.backends.torch_mx.pack_decoder``; the tied
   LM head stays float32 as in a compressed checkpoint), and with the tied LM head packed too (its embedding
   MX-rounded: a different model, for what a fully packed step costs), torch threads 1 and 2 (the kernel takes the
   cores torch leaves idle: ``kernel_threads_beside_torch``). Also the largest logit
   difference between the packed model and the float32 model of the same MXFP6 weights (float32 summation order).

The SmolLM2 GEMV rows call one weight over and over, so its float32 copy (0.4 to 3.5 MB) stays in the caches; in a
decode step the model's 540 MB stream from memory. Those rows compare the kernel's compute rate with cache-resident
float32; the 4096 x 8192 row and the decode step are the memory-bound comparisons. Prints tables and writes
``--out`` (default results/mx_kernel.json; not with ``--quick``).

    python benchmarks/mx_kernel.py                                          # ~3 minutes on 2 cores
    python benchmarks/mx_kernel.py --quick                                  # fewer repeats, no SmolLM2 step
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np
import torch
from bench_support import json_out, save_results
from torch import nn

from accel.backends import TorchBackend
from accel.backends.torch_mx import kernel_threads_beside_torch, pack_decoder
from accel.formats import quantize
from accel.formats.mxkernel import PackedMX, kernel_status, set_isa
from accel.formats.mxkernel_q8 import matmul_q8, q8_kernel_path

SHAPES = {
    "4096x8192": (4096, 8192),
    "smollm2 q/o 576x576": (576, 576),
    "smollm2 gate/up 1536x576": (1536, 576),
    "smollm2 down 576x1536": (576, 1536),
    "smollm2 lm_head 49152x576": (49152, 576),
}
PAST = 128
#: the statistic of the timed calls: the fastest (the least disturbed on a shared machine; ``--median`` for medians)
STAT: Callable[[list[float]], float] = min
#: seconds of rest before each timed call: torch's OpenMP workers spin for a while after a parallel op, and a kernel
#: call timed in that window shares a core with a spinning worker (measured: a 2-thread MXFP6 GEMV right after a
#: 2-thread torch.mv ran at the 1-thread speed; 5 ms later at 1.9x it)
PAUSE_S = 0.01


def _round_robin(fns: Mapping[str, Callable[..., object]], repeats: int) -> dict[str, float]:
    """Seconds of each function's fastest call (``STAT``), called in turn ``repeats`` times after one warm-up each,
    each timed call after ``PAUSE_S`` of rest (so it never starts beside the previous call's spinning workers)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(PAUSE_S)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: STAT(v) for k, v in times.items()}


def bench_gemv(repeats: int, shapes: dict[str, tuple[int, int]]) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    for label, (n, k) in shapes.items():
        w = rng.standard_normal((n, k), dtype=np.float32)
        x = rng.standard_normal(k, dtype=np.float32)
        wt, xt = torch.from_numpy(w), torch.from_numpy(x)
        packed = {fmt: PackedMX(quantize(w, fmt, axis=1)) for fmt in ("mxfp6", "mxfp4")}
        reps = repeats if n * k >= 1 << 22 else repeats * 20
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for isa in (3, 1):
                set_isa(isa)
                fns = {"fp32": lambda wt=wt, xt=xt: torch.mv(wt, xt)}
                for fmt, p in packed.items():
                    fns[fmt] = lambda p=p, t=threads, x=x: p.matmul(x, threads=t)
                    fns[f"{fmt}-q8"] = lambda p=p, t=threads, x=x: matmul_q8(p, x, threads=t)
                t = _round_robin(fns, reps)
                fp32_bw = w.nbytes / t["fp32"]
                for fmt, p in [*packed.items(), *((f"{f}-q8", p) for f, p in packed.items())]:
                    rows.append(
                        dict(
                            shape=label,
                            threads=threads,
                            fmt=fmt,
                            path=q8_kernel_path(p) if fmt.endswith("-q8") else p.kernel_path,
                            fp32_ms=t["fp32"] * 1e3,
                            mx_ms=t[fmt] * 1e3,
                            fp32_gbs=fp32_bw / 1e9,
                            mx_gbs=p.nbytes / t[fmt] / 1e9,
                            pct=100 * p.nbytes / t[fmt] / fp32_bw,
                            speedup=t["fp32"] / t[fmt],
                        )
                    )
        set_isa(3)
    return rows


def _mx_rounded(model: nn.Module, head: bool = False) -> nn.Module:
    """A copy whose Linear weights are replaced by their MXFP6 values (what a compressed checkpoint loads to); the
    tied LM head (and with it the embedding) too when ``head``."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, mod in out.named_modules():
            if type(mod) is nn.Linear and (head or name != "lm_head"):
                w = mod.weight.detach().numpy()
                mod.weight.copy_(torch.from_numpy(quantize(w, "mxfp6", axis=1).dequantize(np.float32)))
    return out


STEP_MODELS = ("fp32", "mxfp6 packed", "mxfp6 packed + head")


def bench_step(repeats: int) -> tuple[list[dict], float]:
    """Median ms of S = 1 and S = 4 steps: float32, MXFP6 packed (LM head float32, as in a compressed checkpoint),
    and MXFP6 packed with the tied LM head packed too (its embedding MX-rounded: a different model)."""
    from accel.models import load_checkpoint, smollm2_checkpoint

    source = load_checkpoint(smollm2_checkpoint())
    base = _mx_rounded(source)
    packed = copy.deepcopy(base)
    print(pack_decoder(packed, [("mxfp6", 32)]).line())
    with_head = _mx_rounded(source, head=True)
    del source
    print(pack_decoder(with_head, [("mxfp6", 32)]).line())
    models = dict(zip(STEP_MODELS, (base, packed, with_head), strict=True))
    rows, diff = [], 0.0
    ids = np.random.default_rng(0).integers(0, base.config.vocab_size, (1, PAST + 4))
    for threads in (1, 2):
        backends = {k: TorchBackend(m, ctx_len=PAST + 8, threads=threads) for k, m in models.items()}
        for b in backends.values():
            b.forward(ids[:, :PAST], np.arange(PAST)[None])
        for seq in (1, 4):
            pos = np.arange(PAST, PAST + seq)[None]
            fns = {
                k: (lambda b=b, s=seq, pos=pos: b.forward(ids[:, PAST : PAST + s], pos)) for k, b in backends.items()
            }
            t = _round_robin(fns, repeats)
            kernel = kernel_threads_beside_torch()
            rows.append(dict(threads=threads, kernel=kernel, seq=seq, **{k: v * 1e3 for k, v in t.items()}))
            diff = max(diff, float(np.abs(fns["fp32"]() - fns["mxfp6 packed"]()).max()))
    return rows, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per configuration (GEMV 4096x8192, step)")
    parser.add_argument("--quick", action="store_true", help="5 repeats, no SmolLM2 decode step")
    parser.add_argument("--median", action="store_true", help="report median times instead of the fastest call")
    parser.add_argument("--no-gemv", action="store_true", help="only the SmolLM2 decode step")
    parser.add_argument("--out", type=json_out, default="results/mx_kernel.json", help="JSON output path")
    args = parser.parse_args()
    global STAT
    STAT = statistics.median if args.median else min
    stat = "median" if args.median else "fastest"
    repeats = 5 if args.quick else args.repeats
    status = kernel_status()
    if not status.available:
        raise SystemExit(f"the fused kernel is not available here ({status.reason}): nothing to measure")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; torch {torch.__version__}; "
        f"kernel {status.library}"
    )
    print(
        f"\nGEMV y = W x, one activation row ({stat} of round-robin calls; effective bandwidth = stored bytes / time)"
    )
    print(
        f"{'shape':<27} {'thr':>3} {'fmt':<6} {'path':<12} {'fp32 ms':>8} {'MX ms':>8} {'fp32 GB/s':>9} "
        f"{'MX GB/s':>8} {'%fp32':>6} {'x':>6}"
    )
    gemv = [] if args.no_gemv else bench_gemv(repeats, SHAPES)
    for r in gemv:
        print(
            f"{r['shape']:<27} {r['threads']:>3} {r['fmt']:<6} {r['path']:<12} {r['fp32_ms']:>8.3f} "
            f"{r['mx_ms']:>8.3f} {r['fp32_gbs']:>9.1f} {r['mx_gbs']:>8.1f} {r['pct']:>5.0f}% {r['speedup']:>6.2f}"
        )
    if args.quick:
        return
    rows, diff = bench_step(repeats)
    print(f"\nSmolLM2-135M decode step through TorchBackend after {PAST} tokens ({stat} ms; x = fp32 / it)")
    print(
        f"{'torch thr':>9} {'kernel thr':>10} {'S':>3} {'fp32':>8} {'MXFP6 packed':>13} {'x':>6} "
        f"{'+ LM head':>10} {'x':>6}"
    )
    for r in rows:
        a, b, c = (r[k] for k in STEP_MODELS)
        print(
            f"{r['threads']:>9} {r['kernel']:>10} {r['seq']:>3} {a:>8.2f} {b:>13.2f} {a / b:>6.2f} {c:>10.2f} "
            f"{a / c:>6.2f}"
        )
    print(f"max |logit difference| packed vs float32 of the same MXFP6 weights: {diff:.2e}")
    out = save_results(args.out, dict(gemv=gemv, step=rows, max_logit_diff=diff, kernel=status.library), __file__)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
