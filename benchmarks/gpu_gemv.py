"""benchmarks/gpu.py's GEMV sweep (``--gemv-layer``): each Llama-2-7B projection and the LM head alone, half-precision
``F.linear`` (cuBLAS) against accel's Triton GEMV kernel (``accel.backends.gemv_triton``) at several launch configs.

Each timing streams enough distinct copies of the weight (>= 512 MiB together) that the GPU's L2 cache holds none
of them between calls, inside one captured CUDA graph (no launch gaps), as the layers run inside a model's step;
median of ``reps`` replays, divided by the copies. Fills ``gemv_triton.TUNED`` with each shape's best config, which
the model rows of the same run then use."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from accel.backends import attention_triton, gemv_triton
from accel.backends.torch_graphs import resolve_device
from accel.models.decoder import attend

#: Llama-2-7B's projections (out, in features) after fusion, and its LM head
GEMV_SHAPES = {
    "qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008), "head": (32000, 4096),
}  # fmt: skip
#: (BLOCK_N, BLOCK_K, num_warps, target programs; 0: no split) tried per padded row count
GEMV_CONFIGS = {
    1: ((2, 1024, 4, 0), (4, 1024, 4, 0), (8, 512, 4, 0), (4, 512, 4, 0), (2, 2048, 4, 0), (8, 1024, 8, 0),
        (16, 512, 8, 0), (4, 2048, 8, 0), (4, 1024, 4, 4096), (2, 1024, 4, 4096), (8, 512, 4, 4096)),
    2: ((4, 512, 4, 0), (2, 1024, 4, 0), (8, 256, 4, 0), (4, 512, 4, 4096), (8, 512, 8, 0)),
    4: ((4, 256, 4, 0), (2, 512, 4, 0), (8, 128, 4, 0), (4, 256, 4, 4096), (8, 256, 8, 0)),
    8: ((4, 128, 4, 0), (2, 256, 4, 0), (8, 128, 8, 0), (4, 128, 4, 4096), (2, 512, 8, 0)),
}  # fmt: skip
STREAM_BYTES = 512 << 20
#: decode attention shapes (query heads, KV heads, head size) of Llama-2-7B and TinyLlama, and splits tried
ATTENTION_SHAPES = {"llama-2-7b": (32, 32, 128), "tinyllama-1.1b": (32, 4, 64)}
ATTENTION_SPLITS = (1, 2, 4, 8, 16, 32, 64)


def stream_time(fn, x: torch.Tensor, weights: list[torch.Tensor], reps: int) -> float:
    """Median device seconds of one ``fn(x, w)``, over calls streaming every weight of ``weights`` in turn inside one
    CUDA graph (wall time of eager calls on the CPU)."""
    for w in weights[:2]:
        fn(x, w)
    if x.device.type != "cuda":
        t0 = time.perf_counter()
        for w in weights:
            fn(x, w)
        return (time.perf_counter() - t0) / len(weights)
    torch.cuda.synchronize(x.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(x, w)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(weights))
    del graph
    return float(np.median(times))


def gemv_sweep(args, say) -> dict:
    """Each shape of ``GEMV_SHAPES`` at 1, 2, 4, 8 rows: float16 ``F.linear`` and the kernel at each config of
    ``GEMV_CONFIGS`` (seconds, relative error against float32 math); fills ``gemv_triton.TUNED``."""
    dev = resolve_device(args.device)
    dtype = torch.float32 if dev.type == "cpu" else torch.float16
    shapes = {"tiny": (256, 128)} if args.tiny else GEMV_SHAPES
    rows: list[dict] = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, (n, k) in shapes.items():
            copies = max(2, -(-STREAM_BYTES // (n * k * 2)))
            weights = [(torch.randn(n, k, device=dev) * 0.02).to(dtype) for _ in range(copies)]
            for m in (1, 2) if args.tiny else (1, 2, 4, 8):
                row = time_gemv(weights, m, args)
                rows.append(row | {"layer": name})
                best = min(row["kernel"].items(), key=lambda kv: kv[1]["s"], default=None)
                if best is not None:
                    gemv_triton.TUNED[(m, n, k)] = tuple(int(v) for v in best[0].split("x"))  # type: ignore[assignment]
                text = "" if best is None else f", kernel {best[0]} {best[1]['s'] * 1e6:.1f} us"
                say(f"  gemv {name} S={m}: F.linear {row['float'] * 1e6:.1f} us{text}")
            del weights
    return {"rows": rows, "tuned": {"x".join(map(str, k)): v for k, v in gemv_triton.TUNED.items()}}


def time_gemv(weights: list[torch.Tensor], m: int, args) -> dict:
    """One shape at ``m`` rows: ``F.linear`` and the kernel at each config (seconds; the kernel's relative error)."""
    w0 = weights[0]
    n, k = w0.shape
    x = torch.randn(m, k, device=w0.device, dtype=w0.dtype)
    ref = x.float() @ w0.float().T
    row: dict = {"N": n, "K": k, "S": m, "bytes": n * k * w0.element_size()}
    row["float"] = stream_time(lambda x, w: F.linear(x, w), x, weights, args.reps)
    row["kernel"] = {}
    if gemv_triton.available(w0.device) and w0.dtype in gemv_triton.HALF:
        for cfg in GEMV_CONFIGS[m]:

            def run(x: torch.Tensor, w: torch.Tensor, cfg: tuple[int, int, int, int] = cfg) -> torch.Tensor:
                return gemv_triton.matmul(x, w, cfg)

            err = float((run(x, w0).float() - ref).abs().max() / ref.abs().max())
            row["kernel"]["x".join(map(str, cfg))] = {"s": stream_time(run, x, weights, args.reps), "rel_err": err}
    return row


def print_gemv(sweep: dict) -> None:
    """Each shape alone: F.linear against the kernel's best config, in us and GB/s of weight bytes."""
    print(f"\n{'layer':<8}{'S':>4}{'F.linear us':>12}{'GB/s':>7}{'gemv us':>9}{'GB/s':>7}{'config':>16}"
          f"{'x F.linear':>11}{'rel err':>9}")  # fmt: skip
    for r in sweep["rows"]:
        if not r["kernel"]:
            continue
        cfg, best = min(r["kernel"].items(), key=lambda kv: kv[1]["s"])
        print(
            f"{r['layer']:<8}{r['S']:>4}{r['float'] * 1e6:>12.1f}{r['bytes'] / r['float'] / 1e9:>7.0f}"
            f"{best['s'] * 1e6:>9.1f}{r['bytes'] / best['s'] / 1e9:>7.0f}{cfg:>16}{r['float'] / best['s']:>11.2f}"
            f"{best['rel_err']:>9.1e}"
        )


def attention_sweep(args, say) -> dict:
    """One decode call's attention per shape of ``ATTENTION_SHAPES`` over ``ctx_len + 1`` slots with ``context + 1``
    visible: the torch path against the kernel at each of ``ATTENTION_SPLITS`` (seconds; streaming distinct caches
    of >= 512 MiB together, as a step's layers do); fills ``attention_triton.TUNED_SPLITS``."""
    dev = resolve_device(args.device)
    dtype = torch.float32 if dev.type == "cpu" else torch.float16
    slots, seen = args.ctx_len + 1, args.context + 1
    shapes = {"tiny": (4, 2, 16)} if args.tiny else ATTENTION_SHAPES
    rows = []
    visible = (torch.arange(slots, device=dev) < seen).view(1, 1, 1, 1, slots)
    with torch.inference_mode():
        for name, (hq, hkv, dim) in shapes.items():
            one = 2 * hkv * slots * dim * 2
            caches = [torch.randn(2, 1, hkv, slots, dim, device=dev, dtype=dtype)
                      for _ in range(2 if args.tiny else max(2, -(-STREAM_BYTES // one)))]  # fmt: skip
            q = torch.randn(1, hq, 1, dim, device=dev, dtype=dtype)
            ref = attend(q.float(), caches[0][0].float(), caches[0][1].float(), visible)
            row = {
                "shape": name,
                "torch": stream_time(lambda q, c: attend(q, c[0], c[1], visible), q, caches, args.reps),
            }
            row["kernel"] = {}
            if attention_triton.available(dev) and dtype in gemv_triton.HALF:
                for splits in ATTENTION_SPLITS:

                    def run(q: torch.Tensor, c: torch.Tensor, splits: int = splits) -> torch.Tensor:
                        return attention_triton.decode_attention(q, c[0], c[1], visible, splits)

                    err = float((run(q, caches[0]).float() - ref).abs().max())
                    row["kernel"][splits] = {"s": stream_time(run, q, caches, args.reps), "abs_err": err}
                best = min(row["kernel"], key=lambda sp: row["kernel"][sp]["s"])
                attention_triton.TUNED_SPLITS[(hkv, slots)] = best
            text = " ".join(f"{sp}:{t['s'] * 1e6:.1f}" for sp, t in row["kernel"].items())
            say(f"  attention {name}: torch {row['torch'] * 1e6:.1f} us; kernel by splits (us) {text}")
            rows.append(row)
            del caches
    return {"rows": rows, "tuned": {f"{h}x{s}": v for (h, s), v in attention_triton.TUNED_SPLITS.items()}}
