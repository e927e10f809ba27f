"""Built-in device catalog. Spec-sheet numbers from docs/reference.md §5 (dense FP16, no sparsity), per device.

Units: GB/s and GB are decimal (1e9); GPU "80 GB" is taken as 80e9 bytes (conservative: the parts hold 80 GiB).
Cloud AI 100 Ultra is 4 SoCs: the card totals (548 GB/s, 128 GB, 290 TFLOPS, 576 MB SRAM) are split per SoC.

Default efficiency terms. They are *defaults*, read off published decode measurements where we have them
(``benchmarks/sim_validation.py`` lists every point with its source) and assumptions otherwise; calibrate them
(``accel.sim.calibrate``) or override them (``load_hardware``) for your stack:
- Cloud AI 100 (per SoC): ``bandwidth_efficiency = 0.70`` and MXFP6 decompression at ``7.5e10`` elements/s per SoC,
  overlapped with the weight stream. Qualcomm's MX blog (Standard and Ultra, FP16 and MXFP6 of five models, 2K
  context) shows FP16 decode at ~70 % of the bandwidth roofline and MXFP6 gaining 1.6-1.8x where the bytes promise
  2.3x: the on-chip decompression (a software kernel on the vector engines, "mostly hidden" per the blog) sets the
  pace. The same rate is assumed for the other compressed formats (no published figures). 200 us per call and 0 per
  layer (the blog's FP16 points leave no room for a per-layer cost); SoCs of an Ultra card talk over PCIe Gen4 x8
  behind a switch (16 GB/s), 5 us per all-reduce + 2 us per log2 step (assumed; the FP16 points again bound it).
- GPUs (A100 / H100 / H200 / L4 / L40S / MI300X / TPU v4): ``bandwidth_efficiency`` 0.78 on A100 (gpt-fast and
  torchao Llama 2 7B bf16), 0.65 on H100 (torchao Llama 3.1 8B bf16 on H100; the newer HBM3e parts assumed alike;
  the H200 entry is calibrated on accel's own measurements instead: ``H200_MEASURED``), 0.60 on
  MI300X and 0.80 on GDDR6 parts and the TPU (assumptions), ``layer_overhead_s =
  30e-6`` and ``call_overhead_s = 30e-6`` (compiled, CUDA-graph style decode: gpt-fast's published 1/2/4/8-GPU
  Llama 2 7B/70B rates imply ~35 us per layer that more GPUs do not remove), weight-only dequantization that adds
  to the weight stream (not overlapped) at ``1e13`` (int8), ``6e12`` (fp8, MXFP8, MXINT8), ``5e12`` (int4, MXFP4)
  and ``4e12`` (MXFP6) elements/s on an A100-class part, scaled by peak FP16 / 312 TFLOPS up to 1 (torchao's and
  gpt-fast's int8/int4 rates on A100 and H100 reach 1.4-1.9x of bf16, not the 2-3.5x of the bytes). Links: vendor
  NVLink / Infinity Fabric / PCIe figures, 7 us per all-reduce + 2.3 us per log2 step (gpt-fast's TP scaling).
- ``usable_memory_fraction = 0.9`` everywhere (runtime, activations, fragmentation).

Families (``FAMILY_DEFAULTS``): the fixed costs and all-reduce latencies follow the device family, not one GPU profile
for all (docs/sim.md §6 gives each value's source or says it is assumed): ``gpu-nvlink`` (SXM/OAM parts: NVLink,
Infinity Fabric), ``gpu-pcie`` (PCIe-only cards: L4, L40S, H100 PCIe), ``tpu-ici`` (TPU chips: one compiled program
per step, all-reduces over ICI), ``gaudi-roce`` (Gaudi 3: all-reduces over its on-die RoCE ports), ``cloud-ai-100``.
The newer parts (B200, GB200 per GPU, MI325X, MI355X, TPU v5e/v6e, Gaudi 3) take datasheet bandwidth, capacity and
dense peaks (NVIDIA and AMD quote sparse peaks first: the dense figure is half) and the efficiency of the nearest
part with published runs (HBM3/HBM3e GPUs 0.65, AMD 0.60, TPUs 0.80: assumptions until calibrated).
"""

from __future__ import annotations

from typing import Any

from accel.sim.hardware import Hardware

GB = 1e9
TERA = 1e12
AI100_BANDWIDTH_EFFICIENCY = 0.70
AI100_COMPUTE_EFFICIENCY = 0.5
AI100_CALL_OVERHEAD_S = 200e-6
AI100_DECOMPRESS_ELEMENTS_PER_S = 7.5e10  # per SoC, every compressed format (MXFP6 measured, others assumed)
GPU_BANDWIDTH_EFFICIENCY = 0.80  # GDDR6 parts and the TPU (assumed); per part below where published runs say
A100_BANDWIDTH_EFFICIENCY = 0.78  # gpt-fast / torchao Llama 2 7B bf16 on A100-80GB: 1.39-1.42 TB/s of 2.04 incl. fixed
HBM3_BANDWIDTH_EFFICIENCY = 0.65  # torchao Llama 3.1 8B bf16 on H100: 1.90 TB/s of 3.35 (H200: H200_MEASURED)
MI300X_BANDWIDTH_EFFICIENCY = 0.60  # assumed (HBM3, no published batch-1 figure collected)
GPU_COMPUTE_EFFICIENCY = 0.6
GPU_CALL_OVERHEAD_S = 30e-6
GPU_LAYER_OVERHEAD_S = 30e-6
A100_FP16_FLOPS = 312e12  # GPU dequantization rates below are for this class of part, scaled by peak / this
GPU_DECOMPRESS_ELEMENTS_PER_S = {
    "int8": 1e13,
    "fp8": 6e12,
    "mxfp8": 6e12,
    "mxint8": 6e12,
    "int4": 5e12,
    "mxfp4": 5e12,
    "mxfp6": 4e12,
}

# fixed costs and links per family (docs/sim.md §6): call_overhead_s, layer_overhead_s, allreduce_latency_s and
# link_latency_s (per log2 step of an all-reduce)
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # gpt-fast's 1/2/4/8-GPU Llama 2 rates on NVLink A100s (accel/sim/published.py)
    "gpu-nvlink": dict(
        call_overhead_s=GPU_CALL_OVERHEAD_S,
        layer_overhead_s=GPU_LAYER_OVERHEAD_S,
        allreduce_latency_s=7e-6,
        link_latency_s=2.3e-6,
    ),
    # no published multi-card PCIe point: NVLink's latencies kept (an assumption; the link bandwidth is PCIe's)
    "gpu-pcie": dict(
        call_overhead_s=GPU_CALL_OVERHEAD_S,
        layer_overhead_s=GPU_LAYER_OVERHEAD_S,
        allreduce_latency_s=7e-6,
        link_latency_s=2.3e-6,
    ),
    # assumed: one XLA program per step (no per-kernel launches), all-reduce in the ICI fabric
    "tpu-ici": dict(call_overhead_s=100e-6, layer_overhead_s=5e-6, allreduce_latency_s=5e-6, link_latency_s=1e-6),
    # assumed: Gaudi 3 reduces over its on-die 200 GbE RoCE ports (RDMA, no host hop)
    "gaudi-roce": dict(call_overhead_s=30e-6, layer_overhead_s=30e-6, allreduce_latency_s=10e-6, link_latency_s=3e-6),
    # the Qualcomm MX blog's FP16 points (200 us per call, no room for a per-layer cost); link latency assumed
    "cloud-ai-100": dict(
        call_overhead_s=AI100_CALL_OVERHEAD_S, layer_overhead_s=0.0, allreduce_latency_s=5e-6, link_latency_s=2e-6
    ),
}

# all-reduce libraries on NVLink GPUs: the family's 7 us + 2.3 us per log2 step is gpt-fast's intra-node one-shot
# all-reduce (ENABLE_INTRA_NODE_COMM=1), 13.9 us on 8 GPUs. NCCL's small-message all-reduce is slower: 20.71 us at
# 16 KB on 8 H100s over NVLink (ByteDance-Seed/Triton-distributed#57, torch.distributed on NCCL; 19.19 us at 128 B,
# so latency, not bytes). A stack that reduces through NCCL pays the difference on every all-reduce
# (docs/sim.md §6; accel/sim/published.py maps the published stacks to their library).
NCCL_ALLREDUCE_EXTRA_S: dict[str, float] = {"gpu-nvlink": 20.71e-6 - (7e-6 + 3 * 2.3e-6)}

_AI100_SRC = "quic.github.io/cloud-ai-sdk-pages, Architecture (docs/reference.md §5)"
_AI100_NOTE = (
    "efficiency terms are defaults (accel/sim/catalog.py): bandwidth 0.70 of spec and MX decompression 7.5e10 "
    "elements/s per SoC (read off Qualcomm's published MX decode rates), compute 0.5, 200 us per call; "
    "link latency assumed."
)
_GPU_NOTE = (
    "efficiency terms are defaults (accel/sim/catalog.py): bandwidth 0.6-0.8 by part, compute 0.6, 30 us per call "
    "and per layer, weight-only dequantization serial to the weight stream; link latency assumed from gpt-fast's "
    "TP scaling."
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
        family="cloud-ai-100",
        link_bandwidth_bytes_per_s=16 * GB,
        **FAMILY_DEFAULTS["cloud-ai-100"],
        bandwidth_efficiency=AI100_BANDWIDTH_EFFICIENCY,
        compute_efficiency=AI100_COMPUTE_EFFICIENCY,
        decompress_elements_per_s={f: AI100_DECOMPRESS_ELEMENTS_PER_S for f in GPU_DECOMPRESS_ELEMENTS_PER_S},
        decompress_overlap=True,
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
    tdp: float | None,
    source: str,
    link_gbs: float,
    mem: str,
    efficiency: float = GPU_BANDWIDTH_EFFICIENCY,
    family: str = "gpu-nvlink",
    peaks: dict[str, float] | None = None,
) -> Hardware:
    """A GPU-like device (GPUs, TPU chips, Gaudi): per-device datasheet figures, ``family``'s fixed costs and links;
    ``peaks``: dense TFLOPS per dtype instead of fp16 = bf16 = ``fp16_tflops`` and int8 = ``int8_tops``."""
    scale = min(1.0, fp16_tflops * TERA / A100_FP16_FLOPS)
    tflops = peaks or {"fp16": fp16_tflops, "bf16": fp16_tflops, "int8": int8_tops}
    return Hardware(
        name=name,
        family=family,
        memory_bandwidth_bytes_per_s=gbs * GB,
        memory_capacity_bytes=gb * GB,
        peak_flops_per_s={k: v * TERA for k, v in tflops.items()},
        sram_bytes=sram_mb * 1e6,
        num_devices=1,
        link_bandwidth_bytes_per_s=link_gbs * GB,
        **FAMILY_DEFAULTS[family],
        bandwidth_efficiency=efficiency,
        compute_efficiency=GPU_COMPUTE_EFFICIENCY,
        decompress_elements_per_s={f: r * scale for f, r in GPU_DECOMPRESS_ELEMENTS_PER_S.items()},
        decompress_overlap=False,
        tdp_w=tdp,
        source=source,
        notes=f"{mem}; " + _GPU_NOTE,
    )


_NV = "NVIDIA datasheet (docs/reference.md §5)"
_BW = "NVIDIA Blackwell datasheet: DGX/HGX B200 and GB200 NVL72, per-GPU table (docs/sim.md §6)"
_AMD325 = "AMD Instinct MI325X datasheet (docs/sim.md §6)"
_AMD355 = "AMD Instinct MI355X datasheet (docs/sim.md §6)"
_TPU = "cloud.google.com/tpu/docs/"
_GAUDI = "Intel Gaudi 3 AI accelerator white paper / Hot Chips 2024 spec table (docs/sim.md §6)"
PCIE = "gpu-pcie"
A100_EFF, HBM3_EFF = A100_BANDWIDTH_EFFICIENCY, HBM3_BANDWIDTH_EFFICIENCY
CATALOG: dict[str, Hardware] = {
    h.name: h
    for h in [
        _ai100("cloud-ai-100-standard", 1, 137, 16, 110, 325, 126, 75),
        _ai100("cloud-ai-100-pro", 1, 137, 32, 125, 375, 144, 75),
        _ai100("cloud-ai-100-ultra", 4, 548, 128, 290, 870, 576, 150),
        _gpu("a100-40gb", 1555, 40, 312, 624, 40, 400, _NV, 600, "HBM2, 40 MB L2, NVLink 600 GB/s", A100_EFF),
        _gpu("a100-80gb", 2039, 80, 312, 624, 40, 400, _NV, 600, "HBM2e, 40 MB L2, NVLink 600 GB/s", A100_EFF),
        _gpu("h100-sxm", 3350, 80, 989, 1979, 50, 700, _NV, 900, "HBM3, 50 MB L2, NVLink 900 GB/s", HBM3_EFF),
        _gpu("h100-pcie", 2000, 80, 756, 1513, 50, 350, _NV, 64, "HBM2e, 50 MB L2, PCIe Gen5 x16", A100_EFF, PCIE),
        _gpu("h200", 4800, 141, 989, 1979, 50, 700, _NV, 900, "HBM3e, 50 MB L2, NVLink 900 GB/s", HBM3_EFF),
        _gpu("l4", 300, 24, 121, 242, 48, 72, _NV, 32, "GDDR6, 48 MB L2, PCIe Gen4 x16", family=PCIE),
        _gpu("l40s", 864, 48, 362, 733, 96, 350, _NV, 32, "GDDR6, 96 MB L2, PCIe Gen4 x16", family=PCIE),
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
            MI300X_BANDWIDTH_EFFICIENCY,
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
            family="tpu-ici",
        ),
        # newer parts (docs/sim.md §6: the datasheet of each); NVIDIA/AMD peaks are dense (half the sparse figure)
        _gpu("b200", 7700, 180, 2250, 4500, 0, 1000, _BW, 1800, "HGX B200: HBM3e, NVLink 5 1.8 TB/s", HBM3_EFF,
             peaks={"fp16": 2250, "bf16": 2250, "fp8": 4500, "int8": 4500}),
        _gpu("gb200", 8000, 186, 2500, 5000, 0, 1200, _BW, 1800, "GB200 NVL72, per GPU: HBM3e, NVLink 5 1.8 TB/s",
             HBM3_EFF, peaks={"fp16": 2500, "bf16": 2500, "fp8": 5000, "int8": 5000}),
        _gpu("mi325x", 6000, 256, 1307.4, 2614.9, 256, 1000, _AMD325, 896, "HBM3E, 256 MB Infinity Cache, "
             "Infinity Fabric 896 GB/s", MI300X_BANDWIDTH_EFFICIENCY,
             peaks={"fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9, "int8": 2614.9}),
        _gpu("mi355x", 8000, 288, 2516.6, 5033.2, 256, 1400, _AMD355, 1075.2, "HBM3E, 256 MB Infinity Cache, "
             "Infinity Fabric 1075 GB/s", MI300X_BANDWIDTH_EFFICIENCY,
             peaks={"fp16": 2516.6, "bf16": 2516.6, "fp8": 5033.2, "int8": 5033.2}),
        _gpu("tpu-v5e", 819, 16, 197, 393, 0, None, _TPU + "v5e (docs/sim.md §6)", 400,
             "16 GB HBM2, ICI 400 GB/s bidirectional", family="tpu-ici", peaks={"bf16": 197, "int8": 393}),
        _gpu("tpu-v6e", 1638, 32, 918, 1836, 0, None, _TPU + "v6e (docs/sim.md §6)", 800,
             "32 GB HBM, ICI 800 GB/s bidirectional", family="tpu-ici", peaks={"bf16": 918, "int8": 1836}),
        _gpu("gaudi3", 3670, 128, 1835, 1835, 96, 900, _GAUDI, 1200, "HBM2e, 96 MB SRAM, 24 x 200 GbE RoCE "
             "(1.2 TB/s bidirectional)", HBM3_EFF, family="gaudi-roce", peaks={"bf16": 1835, "fp8": 1835}),
    ]
}  # fmt: skip

# float32 matrix products without TF32 run on the CUDA cores: the datasheets' non-tensor FP32 peak (dense TFLOPS; A100
# and H100 datasheets, H200 product brief, L4 and L40S datasheets). PyTorch's default (allow_tf32 False for matmuls)
# is that path; without an entry a float32 product was priced at the FP16 tensor-core peak (docs/sim.md §6).
FP32_TFLOPS = {"a100-40gb": 19.5, "a100-80gb": 19.5, "h100-sxm": 67, "h100-pcie": 51, "h200": 67, "l4": 30.3,
               "l40s": 91.6}  # fmt: skip
for _name, _tf in FP32_TFLOPS.items():
    CATALOG[_name] = CATALOG[_name].with_(peak_flops_per_s={**CATALOG[_name].peak_flops_per_s, "fp32": _tf * TERA})

# The H200 entry is calibrated on accel's own H200 measurements (accel/sim/measured.py; docs/sim.md §6 and §8), not
# assumed from H100 reports: the weights stream at the card's measured device-to-device copy rate (4.19-4.24 TB/s of
# 4.8, benchmarks/RESULTS.md "GPU decode"), and the fixed costs, the multi-token terms and the KV cache's read rate are
# a least-squares fit to the two float16 curves (Llama-2-7B and TinyLlama-1.1B shapes, S = 1..64) and the Llama-2-7B
# batched AR steps (B = 4, 16, 64); bfloat16, float32, the Llama-2-13B curve and its batched steps are held out.
# Published points have no H200 row, so this changes no published-point validation.
H200_MEASURED: dict[str, Any] = dict(
    bandwidth_efficiency=0.875,  # 4.2 / 4.8 TB/s: the measured copy rate
    kv_bandwidth_efficiency=0.55,  # attention reads the cache at ~2.6 TB/s (batched matrix-vector products per head)
    call_overhead_s=550e-6,  # per CUDA-graph replay: embedding, rotary tables, mask, final norm, logits out
    layer_overhead_s=27.5e-6,  # per layer: its small kernels' fixed time and the gaps between them
    row_overhead_s=0.42e-6,  # per layer per row beyond the first: the layer's small kernels at S rows
    multi_token_penalty=0.080,  # GEMV (one row) -> GEMM (2+ rows): the weights stream 8 % (2 rows) to 17 % (64) slower
    multi_token_exponent=0.18,
)
#: the H200 as the datasheet and the GPU family's assumed terms describe it (the entry before accel measured one)
H200_DATASHEET = CATALOG["h200"]
CATALOG["h200"] = H200_DATASHEET.with_(
    **H200_MEASURED,
    notes=CATALOG["h200"].notes.split("; ")[0] + "; calibrated on accel's own H200 measurements "
    "(accel/sim/measured.py, the float16 curves and 7B batched steps; H200_MEASURED in accel/sim/catalog.py): "
    "bandwidth 0.875 (the measured copy rate), KV-cache reads 0.55, 550 us per call, 27.5 us per layer, 0.42 us per "
    "layer per extra row, multi-token 0.080 (r-1)^0.18; compute efficiency 0.6, dequantization rates and link "
    "latency assumed as for the other GPUs.",
)
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
    "tpuv5e": "tpu-v5e",
    "tpuv6e": "tpu-v6e",
    "trillium": "tpu-v6e",
    "hgx-b200": "b200",
    "b200-sxm": "b200",
    "gb200-nvl72": "gb200",
    "gaudi-3": "gaudi3",
    "intel-gaudi3": "gaudi3",
}
