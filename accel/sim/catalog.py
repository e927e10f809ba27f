"""Built-in device catalog. Spec-sheet numbers from docs/reference.md §5 (dense FP16, no sparsity), per device.

Units: GB/s and GB are decimal (1e9); GPU "80 GB" is taken as 80e9 bytes (conservative: the parts hold 80 GiB).
Cloud AI 100 Ultra is 4 SoCs: the card totals (548 GB/s, 128 GB, 290 TFLOPS, 576 MB SRAM) are split per SoC.

ASSUMPTIONS (not from spec sheets; override with ``load_hardware`` or fit with ``calibrate``):
- ``AI100_BANDWIDTH_EFFICIENCY = 0.6``: docs/reference.md §5 says published decode rates reach roughly 40–70% of the
  bandwidth roofline; 0.6 is inside that range.
- ``GPU_BANDWIDTH_EFFICIENCY = 0.8``: memory-bound GEMV kernels on HBM/GDDR GPUs typically reach 70–90% of spec.
- ``COMPUTE_EFFICIENCY = 0.6`` (GPU/TPU) and 0.5 (AI 100): achieved fraction of dense peak in large matmuls.
- ``AI100_CALL_OVERHEAD_S = 200e-6`` and ``GPU_CALL_OVERHEAD_S = 30e-6``: fixed per-call time (host round trip,
  launch; CUDA-graph style launch on GPUs). Unpublished; calibrate on real runs.
- MX decompression: Cloud AI 100 compiles MatMul weights to MXFP6 (``-mxfp6-matmul``, docs/reference.md §2) and we
  assume the expansion is hidden behind the weight stream (``None``). Devices without native MX run a software
  dequantizer: assumed ``peak_fp16 / MX_DECOMPRESS_FLOP_RATIO`` elements/s with ``MX_DECOMPRESS_FLOP_RATIO = 64``.
- Links: Cloud AI 100 Ultra SoCs sit behind a PCIe switch, each Gen4 x8 (docs/reference.md §5) = 16 GB/s per direction;
  NVLink/IF/ICI figures are vendor numbers per GPU quoted for completeness (catalog GPUs have ``num_devices = 1``).
  ``LINK_LATENCY_S = 10e-6`` per all-reduce hop is an assumption.
"""

from __future__ import annotations

from accel.sim.hardware import Hardware

GB = 1e9
TERA = 1e12
AI100_BANDWIDTH_EFFICIENCY = 0.6
GPU_BANDWIDTH_EFFICIENCY = 0.8
COMPUTE_EFFICIENCY = 0.6
AI100_COMPUTE_EFFICIENCY = 0.5
AI100_CALL_OVERHEAD_S = 200e-6
GPU_CALL_OVERHEAD_S = 30e-6
MX_DECOMPRESS_FLOP_RATIO = 64
LINK_LATENCY_S = 10e-6

_AI100_SRC = "quic.github.io/cloud-ai-sdk-pages, Architecture (docs/reference.md §5)"
_AI100_NOTE = (
    "efficiency terms assumed (see accel/sim/catalog.py): bandwidth 0.6 of spec (docs/reference.md §5: 40-70%), "
    "compute 0.5, 200 us per call; MX decompression assumed hidden."
)
_GPU_NOTE = (
    "efficiency terms assumed (see accel/sim/catalog.py): bandwidth 0.8, compute 0.6, 30 us per call; "
    "software MX dequantizer at peak_fp16/64 elements/s."
)


def _ai100(
    name: str,
    socs: int,
    card_gbs: float,
    card_gb: float,
    fp16_tflops: float,
    int8_tops: float,
    sram_mb: float,
    tdp: float,
) -> Hardware:
    return Hardware(
        name=name,
        memory_bandwidth_bytes_per_s=card_gbs * GB / socs,
        memory_capacity_bytes=card_gb * GB / socs,
        peak_flops_per_s={"fp16": fp16_tflops * TERA / socs, "int8": int8_tops * TERA / socs},
        sram_bytes=sram_mb * 1e6 / socs,
        num_devices=socs,
        link_bandwidth_bytes_per_s=16 * GB,
        link_latency_s=LINK_LATENCY_S,
        bandwidth_efficiency=AI100_BANDWIDTH_EFFICIENCY,
        compute_efficiency=AI100_COMPUTE_EFFICIENCY,
        call_overhead_s=AI100_CALL_OVERHEAD_S,
        mx_decompress_elements_per_s=None,
        tdp_w=tdp,
        source=_AI100_SRC,
        notes=f"{socs} SoC(s); per SoC 4 x 64-bit LPDDR4X (~136 GB/s), 8 MB VTCM per AI core; "
        f"SoCs linked by PCIe Gen4 x8 behind a switch. " + _AI100_NOTE,
    )


def _gpu(
    name: str,
    gbs: float,
    gb: float,
    fp16_tflops: float,
    int8_tops: float,
    sram_mb: float,
    tdp: float,
    source: str,
    link_gbs: float,
    mem: str,
) -> Hardware:
    return Hardware(
        name=name,
        memory_bandwidth_bytes_per_s=gbs * GB,
        memory_capacity_bytes=gb * GB,
        peak_flops_per_s={"fp16": fp16_tflops * TERA, "bf16": fp16_tflops * TERA, "int8": int8_tops * TERA},
        sram_bytes=sram_mb * 1e6,
        num_devices=1,
        link_bandwidth_bytes_per_s=link_gbs * GB,
        link_latency_s=LINK_LATENCY_S,
        bandwidth_efficiency=GPU_BANDWIDTH_EFFICIENCY,
        compute_efficiency=COMPUTE_EFFICIENCY,
        call_overhead_s=GPU_CALL_OVERHEAD_S,
        mx_decompress_elements_per_s=fp16_tflops * TERA / MX_DECOMPRESS_FLOP_RATIO,
        tdp_w=tdp,
        source=source,
        notes=f"{mem}; " + _GPU_NOTE,
    )


_NV = "NVIDIA datasheet (docs/reference.md §5)"
CATALOG: dict[str, Hardware] = {
    h.name: h
    for h in [
        _ai100("cloud-ai-100-standard", 1, 137, 16, 110, 325, 126, 75),
        _ai100("cloud-ai-100-pro", 1, 137, 32, 125, 375, 144, 75),
        _ai100("cloud-ai-100-ultra", 4, 548, 128, 290, 870, 576, 150),
        _gpu("a100-40gb", 1555, 40, 312, 624, 40, 400, _NV, 600, "HBM2, 40 MB L2, NVLink 600 GB/s"),
        _gpu("a100-80gb", 2039, 80, 312, 624, 40, 400, _NV, 600, "HBM2e, 40 MB L2, NVLink 600 GB/s"),
        _gpu("h100-sxm", 3350, 80, 989, 1979, 50, 700, _NV, 900, "HBM3, 50 MB L2, NVLink 900 GB/s"),
        _gpu("h100-pcie", 2000, 80, 756, 1513, 50, 350, _NV, 64, "HBM2e, 50 MB L2, PCIe Gen5 x16"),
        _gpu("h200", 4800, 141, 989, 1979, 50, 700, _NV, 900, "HBM3e, 50 MB L2, NVLink 900 GB/s"),
        _gpu("l4", 300, 24, 121, 242, 48, 72, _NV, 32, "GDDR6, 48 MB L2, PCIe Gen4 x16"),
        _gpu("l40s", 864, 48, 362, 733, 96, 350, _NV, 32, "GDDR6, 96 MB L2, PCIe Gen4 x16"),
        _gpu(
            "mi300x",
            5300,
            192,
            1307,
            2615,
            256,
            750,
            "AMD datasheet (docs/reference.md §5)",
            896,
            "HBM3, 256 MB Infinity Cache, Infinity Fabric 896 GB/s",
        ),
        _gpu(
            "tpu-v4",
            1200,
            32 * 2**30 / GB,
            275,
            275,
            0,
            170,
            "cloud.google.com/tpu/docs/v4 (docs/reference.md §5)",
            300,
            "32 GiB HBM2, 275 TFLOPS bf16, ~170 W measured mean, ICI link assumed 300 GB/s",
        ),
    ]
}
ALIASES: dict[str, str] = {
    "ai100-standard": "cloud-ai-100-standard",
    "ai100-pro": "cloud-ai-100-pro",
    "ai100-ultra": "cloud-ai-100-ultra",
    "cloud-ai-100": "cloud-ai-100-standard",
    "a100-40": "a100-40gb",
    "a100-80": "a100-80gb",
    "a100-sxm-80gb": "a100-80gb",
    "a100-sxm-40gb": "a100-40gb",
    "h100": "h100-sxm",
    "h200-sxm": "h200",
    "mi300": "mi300x",
    "tpuv4": "tpu-v4",
}
