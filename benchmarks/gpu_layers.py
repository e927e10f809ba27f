"""benchmarks/gpu.py's MX layer sweep (``--layer``): each Llama-2-7B projection alone, float16 ``F.linear`` against
the MX matmul kernel at several launch configs and against decode + ``F.linear``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from accel.backends import mx_triton
from accel.backends.torch_graphs import resolve_device
from accel.backends.torch_mx_device import DeviceMXLinear, mx_decode
from accel.formats.elements import get_format
from accel.formats.torch_ops import quantize_elements_torch
from benchmarks.gpu_support import time_layer

#: Llama-2-7B's projections (out, in features) after fusion, the layers a decode step streams
LAYER_SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}
#: (BLOCK_N, num_warps, target programs) tried for the MX matmul kernel
KERNEL_CONFIGS = (
    (8, 2, 1024), (16, 4, 1024), (16, 4, 2048), (32, 4, 1024), (32, 8, 1024), (16, 8, 512), (8, 4, 2048), (64, 8, 1024),
)  # fmt: skip
LAYER_ROWS = (1, 2, 4, 8, 16)


def layer_sweep(args, say) -> dict:
    """Each 7B projection alone, ``--mx`` weights (default mxfp6): float16 ``F.linear`` on the decoded weight, the MX
    matmul kernel at each of ``KERNEL_CONFIGS`` (its error against float32 math on the same values), and decode +
    ``F.linear``, for each row count of ``LAYER_ROWS``; device seconds. Fills ``mx_triton.TUNED`` with the config of
    least total time per row count, which the model rows of the same run then use."""
    dev = resolve_device(args.device)
    fmt = get_format(args.mx or "mxfp6")
    shapes = {"tiny": (256, 128)} if args.tiny else LAYER_SHAPES
    rows: list[dict] = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, (n, k) in shapes.items():
            w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
            codes, scales, _ = quantize_elements_torch(w, fmt, -1, 32)
            for m in LAYER_ROWS[: 2 if args.tiny else None]:
                row = time_projection(DeviceMXLinear(codes, scales, fmt), m, args)
                rows.append(row | {"layer": name})
                best = min(row["kernel"].items(), key=lambda kv: kv[1]["s"], default=None)
                mx_text = (
                    ""
                    if best is None
                    else f", kernel {best[0]} {best[1]['s'] * 1e6:.1f} us (rel err {best[1]['rel_err']:.1e})"
                )
                say(f"  layer {name} S={m}: float {row['float'] * 1e6:.1f} us, decode+mm "
                    f"{row['decode_mm'] * 1e6:.1f} us{mx_text}")  # fmt: skip
    totals: dict[tuple[int, str], float] = {}
    for r in rows:
        for cfg, t in r["kernel"].items():
            key = (mx_triton.padded_rows(r["S"]), cfg)
            totals[key] = totals.get(key, 0.0) + t["s"]
    for mp in sorted({mp for mp, _ in totals}):
        cfg = min((c for p, c in totals if p == mp), key=lambda c: totals[(mp, c)])
        block, warps, target = cfg.split("x")
        mx_triton.TUNED[mp] = (int(block), int(warps), int(target))
    say(f"  tuned kernel configs (rows -> BLOCK_N, warps, programs): {mx_triton.TUNED}")
    return {"rows": rows, "tuned": {str(k): v for k, v in mx_triton.TUNED.items()}}


def time_projection(layer: DeviceMXLinear, m: int, args) -> dict:
    """One projection at ``m`` rows: float ``F.linear`` on the decoded weight, MX decode + ``F.linear``, and the MX
    kernel at each launch config (seconds and relative error against float32 math on the same values)."""
    dev = layer.lo.device
    dtype = torch.float32 if dev.type == "cpu" else torch.float16
    n, k, fmt = layer.out_features, layer.in_features, layer.fmt
    exact = layer.weight_float()
    dense = exact.to(dtype)
    x = torch.randn(m, k, device=dev, dtype=dtype)
    ref = x.float() @ exact.T
    row: dict = {"N": n, "K": k, "S": m, "bytes_float": dense.numel() * dense.element_size(), "bytes_mx": layer.nbytes}
    row["float"] = time_layer(lambda x: F.linear(x, dense), x, args.reps)
    decode = lambda: mx_decode(layer.lo, layer.hi, layer.scales, fmt.name, n, k, dtype)  # noqa: E731
    row["decode_mm"] = time_layer(lambda x: F.linear(x, decode()), x, args.reps)
    row["kernel"] = {}
    if mx_triton.available(dev):
        for cfg in KERNEL_CONFIGS[: 2 if args.tiny else None]:

            def run(x: torch.Tensor, cfg: tuple[int, int, int] = cfg) -> torch.Tensor:
                return mx_triton.matmul(x, layer.lo, layer.hi, layer.scales, fmt, n, cfg)

            err = float((run(x).float() - ref).abs().max() / ref.abs().max())
            row["kernel"]["x".join(map(str, cfg))] = {"s": time_layer(run, x, args.reps), "rel_err": err}
    return row


def print_layer(layer: dict) -> None:
    """Each projection alone: float F.linear against the MX kernel (its best config) and decode + F.linear."""
    print(f"\n{'layer':<8}{'S':>4}{'float us':>10}{'mx kernel':>10}{'config':>12}{'dec+mm':>9}{'kernel GB/s':>12}"
          f"{'float GB/s':>11}{'x float':>8}{'rel err':>9}")  # fmt: skip
    for r in layer["rows"]:
        if not r["kernel"]:
            continue
        cfg, best = min(r["kernel"].items(), key=lambda kv: kv[1]["s"])
        print(
            f"{r['layer']:<8}{r['S']:>4}{r['float'] * 1e6:>10.1f}{best['s'] * 1e6:>10.1f}{cfg:>12}"
            f"{r['decode_mm'] * 1e6:>9.1f}{r['bytes_mx'] / best['s'] / 1e9:>12.0f}"
            f"{r['bytes_float'] / r['float'] / 1e9:>11.0f}"
            f"{r['float'] / best['s']:>8.2f}{best['rel_err']:>9.1e}"
        )
