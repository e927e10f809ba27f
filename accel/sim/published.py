"""Published decode measurements, and the one-point protocol that validates the simulator against them.

Each point is a whole autoregressive run (``RunObservation``) with its source: URL, table or figure, date (for the
Qualcomm pages: the day the post entered github.com/quic/cloud-ai-sdk-pages). The
protocol (``validate``): per device, calibrate on its first point (``fit=None``: one point determines one term, the
bandwidth efficiency, or the decompression rate where that alone sets the pace), predict every other point of that
device, and report each point's error and the mean absolute error; ``calibrate=False`` predicts every point with the
catalog defaults. ``benchmarks/sim_validation.py`` prints the table; ``tests/sim/test_published.py`` holds the goals.

How the sources' settings map onto the simulator (stated per source below): Qualcomm's tables (Cloud AI 100 SDK
1.12, QEfficient-style compiles) use a fixed KV cache of CL slots that attention reads in full and compress every
MatMul, the LM head included (``-mxfp6-matmul``); gpt-fast and torchao (``generate.py``, batch 1, a ~5-token prompt,
200 new tokens, tokens/s over the whole ``generate`` call) quantize every ``nn.Linear``, the output layer included.

Leave one source out (``validate_leave_one_source_out``) holds each source out of its device's calibration; when
the calibration point's software stack (``STACK_OF``) differs from the held-out source's, the prediction is scaled
by the two stacks' time ratio read off the other sources' points (``stack_factor``), never the held-out source's.
In every protocol a stack's all-reduce library (``STACK_ALLREDUCE``: NCCL for lmdeploy and IBM's stack) is priced
on its multi-GPU points (``at_stack``: NCCL's extra latency over the GPU family's default, ``catalog.py``).

The sets: ``FIRST_SET`` (the points of issue 20, whose goals ``tests/sim/test_published.py`` holds; some catalog
defaults were read off them), ``GPT_FAST_MOE`` and ``GPT_FAST_LLAMA31`` (gpt-fast's Mixtral table and its Llama 3.1
rows, same repository and machine as GPT_FAST, held out) and ``ADDED`` (``published_added.py``: lmdeploy, IBM's
torch.compile blog, TensorRT-LLM's H100-vs-A100 blog, PyTorch/XLA on TPU v4, AMD's and Oracle's MI300X runs; held
out). ``PUBLISHED`` is all of them. Speculative points are apart, in ``published_spd.py``.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import numpy as np

from accel.sim._base import SimModel, SimWarning
from accel.sim.calibration import calibrate
from accel.sim.catalog import NCCL_ALLREDUCE_EXTRA_S
from accel.sim.hardware import Hardware, hardware
from accel.sim.models import ModelSpec
from accel.sim.observations import RunObservation
from accel.sim.presets import preset
from accel.sim.published_added import (
    ADDED,
    AMD_PERF,
    IBM_COMPILE,
    LLAMA_31_405B,
    LMDEPLOY,
    ORACLE_405B,
    TRTLLM_BLOG,
    XLA_LLAMA,
)
from accel.sim.published_base import PublishedPoint

MX_BLOG = (
    "Qualcomm, 'Accelerate Large Language Model Inference by ~2x Using Microscaling (Mx) Formats' (C. Verrilli), "
    "https://quic.github.io/cloud-ai-sdk-pages/latest/blogs/Microscaling/microscaling/ , 2024-03-11"
)
SPD_BLOG = (
    "Qualcomm, 'Quadruple LLM Decoding Performance with Speculative Decoding (SpD) and Microscaling (MX) Formats' "
    "(N. Vaidhyanathan, A. Gokhale), https://quic.github.io/cloud-ai-sdk-pages/latest/blogs/Speculative_Decode/"
    "spec_decode_ai100/ , 2024-03-06"
)
AMBER_BLOG = (
    "Qualcomm, 'Accelerate Inference of Fully Transparent Open-Source LLMs from LLM360 on Qualcomm Cloud AI 100 DL2q "
    "Instances' (R. Sivalingam), https://quic.github.io/cloud-ai-sdk-pages/latest/blogs/AmberChat/ , 2024-03-06"
)
GPT_FAST = (
    "pytorch-labs/gpt-fast README, Benchmarks (8x A100-80GB power-limited to 330 W), "
    "https://github.com/pytorch-labs/gpt-fast , 2023-12 (Llama 2 rows; the README as of 32971d3, 2024-09-15)"
)
TORCHAO = (
    "pytorch/ao torchao/quantization/README.md, Benchmarks (CUDA backend, A100-80GB and H100), "
    "https://github.com/pytorch/ao/blob/main/torchao/quantization/README.md , 2024-2025"
)


def _qc(
    device: str,
    model: str,
    fmt: str,
    tps: float,
    where: str,
    *,
    ctx: int = 2048,
    prompt: int = 1024,
    gen: int = 1024,
    source: str = MX_BLOG,
) -> PublishedPoint:
    run = RunObservation(
        model=preset(model),
        weight_format=fmt,
        prompt_len=prompt,
        gen_len=gen,
        cache="fixed",
        ctx_len=ctx,
        compress_lm_head=fmt != "fp16",
        tokens_per_s=tps,
        label=f"{model} {fmt}",
    )
    return PublishedPoint(device=device, run=run, where=where, source=source)


def _gf(
    device: str, model: str | ModelSpec, fmt: str, tps: float, where: str, source: str, devices: int = 1
) -> PublishedPoint:
    spec = preset(model) if isinstance(model, str) else model
    run = RunObservation(
        model=spec,
        weight_format=fmt,
        prompt_len=5,
        gen_len=200,
        devices=devices,
        compress_lm_head=fmt != "bf16",
        tokens_per_s=tps,
        rate="end_to_end",
        label=f"{spec.name} {fmt}" + (f" TP{devices}" if devices > 1 else ""),
    )
    return PublishedPoint(device=device, run=run, where=where, source=source)


STD, ULTRA, A100, H100 = "cloud-ai-100-standard", "cloud-ai-100-ultra", "a100-80gb", "h100-sxm"
T1, T2 = "Table 1 (Standard; BS 1, PL 1024, GL 1024, CL 2048)", "Table 2 (Ultra; BS 1, PL 1024, GL 1024, CL 2048)"
GF, GF_TP = "Benchmarks table (batch 1, prompt 5)", "Tensor Parallelism table"
GF_TQ = "Tensor Parallelism + Quantization table"
TA, TH = "CUDA backend, NVIDIA-A100-80GB table", "CUDA backend, NVIDIA-H100 table"
FIRST_SET: list[PublishedPoint] = [
    # Cloud AI 100 Standard: the first point of each device is its calibration point
    _qc(STD, "gpt-j-6b", "fp16", 8.08, T1),
    _qc(STD, "gpt-j-6b", "mxfp6", 13.9, T1),
    _qc(STD, "opt-2.7b", "fp16", 15.44, T1),
    _qc(STD, "opt-2.7b", "mxfp6", 27.72, T1),
    _qc(STD, "opt-13b", "mxfp6", 6.98, T1),
    _qc(
        STD,
        "amberchat-7b",
        "mxfp6",
        14.9,
        "performance table (1x STD SKU, BS 1, compiled prompt 128, CL 2048)",
        prompt=128,
        gen=512,
        source=AMBER_BLOG,
    ),
    # Cloud AI 100 Ultra (4 SoCs)
    _qc(ULTRA, "llama-2-7b", "fp16", 26.49, T2),
    _qc(ULTRA, "llama-2-7b", "mxfp6", 43.78, T2),
    _qc(ULTRA, "opt-6.7b", "fp16", 19.49, T2),
    _qc(ULTRA, "opt-6.7b", "mxfp6", 41.29, T2),
    _qc(ULTRA, "xgen-7b", "fp16", 26.5, T2),
    _qc(ULTRA, "xgen-7b", "mxfp6", 43.46, T2),
    _qc(ULTRA, "gpt-j-6b", "fp16", 31.14, T2),
    _qc(ULTRA, "gpt-j-6b", "mxfp6", 50.99, T2),
    _qc(ULTRA, "opt-2.7b", "fp16", 64.17, T2),
    _qc(ULTRA, "opt-2.7b", "mxfp6", 104.25, T2),
    _qc(
        ULTRA,
        "llama-2-7b",
        "fp16",
        22.0,
        "Figure 7, baseline bar (read off the chart, +-1 tok/s; prompt 128, generation 896)",
        ctx=1024,
        prompt=128,
        gen=896,
        source=SPD_BLOG,
    ),
    _qc(
        ULTRA,
        "llama-2-7b",
        "mxfp6",
        40.0,
        "Figure 7, MX6 bar (read off the chart, +-1 tok/s)",
        ctx=1024,
        prompt=128,
        gen=896,
        source=SPD_BLOG,
    ),
    # A100-80GB: gpt-fast (power-limited to 330 W) and torchao
    _gf(A100, "llama-2-7b", "bf16", 104.9, GF, GPT_FAST),
    _gf(A100, "llama-2-7b", "int8", 155.58, GF, GPT_FAST),
    _gf(A100, "llama-2-7b", "int4-g32", 196.80, GF, GPT_FAST),
    _gf(A100, "llama-2-70b", "int8", 19.13, GF, GPT_FAST),
    _gf(A100, "llama-2-70b", "int4-g32", 25.25, GF, GPT_FAST),
    _gf(A100, "llama-2-7b", "bf16", 168.84, GF_TP, GPT_FAST, devices=2),
    _gf(A100, "llama-2-7b", "bf16", 254.02, GF_TP, GPT_FAST, devices=4),
    _gf(A100, "llama-2-7b", "bf16", 328.43, GF_TP, GPT_FAST, devices=8),
    _gf(A100, "llama-2-70b", "bf16", 21.32, GF_TP, GPT_FAST, devices=2),
    _gf(A100, "llama-2-70b", "bf16", 38.01, GF_TP, GPT_FAST, devices=4),
    _gf(A100, "llama-2-70b", "bf16", 62.50, GF_TP, GPT_FAST, devices=8),
    _gf(A100, "llama-2-70b", "int8", 80.44, GF_TQ, GPT_FAST, devices=8),
    _gf(A100, "llama-2-70b", "int4-g32", 90.77, GF_TQ, GPT_FAST, devices=8),
    _gf(A100, "llama-2-7b", "bf16", 107.38, TA, TORCHAO),
    _gf(A100, "llama-2-7b", "int8", 170.83, TA, TORCHAO),
    _gf(A100, "llama-2-7b", "int4-g64", 201.14, TA, TORCHAO),
    _gf(A100, "llama-3-8b", "bf16", 95.64, TA, TORCHAO),
    _gf(A100, "llama-3-8b", "int8", 153.03, TA, TORCHAO),
    _gf(A100, "llama-3-8b", "int4-g64", 180.80, TA, TORCHAO),
    # H100 (torchao; the SXM part assumed: 1.9 TB/s achieved exceeds the PCIe part's 2.0 TB/s spec x efficiency)
    _gf(H100, "llama-3.1-8b", "bf16", 126.90, TH, TORCHAO),
    _gf(H100, "llama-3.1-8b", "int8", 198.85, TH, TORCHAO),
    _gf(H100, "llama-3.1-8b", "int4-g64", 241.39, TH, TORCHAO),
    _gf(H100, "llama-3.1-8b", "fp8", 178.46, TH, TORCHAO),
]
MOE = (
    "mixtral-moe/README.md, Benchmarks table as of 48328fb, 2024-03-08 (batch 1, prompt 5; same 8x A100-80GB 330 W box)"
)
# The table's first figures (89b2502, 2024-02-25: bf16 78.75 / 118.23 / 203.69, int8 56.04 / 99.91 / 149.53 / 218.48)
# measured a w2 stored with its reduction dimension outermost; the authors transposed it ("transposed w2 to have
# reduction dim be innermost dim", 48328fb) and replaced the table with these. The set holds the current table.
GPT_FAST_MOE: list[PublishedPoint] = [  # added for issue 35 (the same repository and machine as GPT_FAST)
    _gf(A100, "mixtral-8x7b", "bf16", 96.67, MOE, GPT_FAST, devices=2),
    _gf(A100, "mixtral-8x7b", "bf16", 155.35, MOE, GPT_FAST, devices=4),
    _gf(A100, "mixtral-8x7b", "bf16", 227.82, MOE, GPT_FAST, devices=8),
    _gf(A100, "mixtral-8x7b", "int8", 97.92, MOE, GPT_FAST),
    _gf(A100, "mixtral-8x7b", "int8", 155.03, MOE, GPT_FAST, devices=2),
    _gf(A100, "mixtral-8x7b", "int8", 216.87, MOE, GPT_FAST, devices=4),
    _gf(A100, "mixtral-8x7b", "int8", 279.35, MOE, GPT_FAST, devices=8),
]
# The README's Llama 3.1 rows (c9f683e, 2024-09-13; 405B: 8354eba, 2024-09-04), the same box and tables as GPT_FAST's
GPT_FAST_LLAMA31: list[PublishedPoint] = [  # added for issue 35, held out: nothing was read off them
    _gf(A100, "llama-3.1-8b", "bf16", 93.89, GF, GPT_FAST),
    _gf(A100, "llama-3.1-8b", "int8", 137.64, GF, GPT_FAST),
    _gf(A100, "llama-3.1-70b", "int8", 18.04, GF, GPT_FAST),
    _gf(A100, "llama-3.1-8b", "bf16", 149.10, GF_TP, GPT_FAST, devices=2),
    _gf(A100, "llama-3.1-8b", "bf16", 217.21, GF_TP, GPT_FAST, devices=4),
    _gf(A100, "llama-3.1-8b", "bf16", 276.01, GF_TP, GPT_FAST, devices=8),
    _gf(A100, "llama-3.1-70b", "bf16", 16.03, GF_TP, GPT_FAST, devices=2),
    _gf(A100, "llama-3.1-70b", "bf16", 37.45, GF_TP, GPT_FAST, devices=4),
    _gf(A100, "llama-3.1-70b", "bf16", 58.78, GF_TP, GPT_FAST, devices=8),
    _gf(A100, "llama-3.1-70b", "int8", 75.58, GF_TQ, GPT_FAST, devices=8),
    _gf(A100, LLAMA_31_405B, "int8", 15.60, GF_TQ, GPT_FAST, devices=8),
]
PUBLISHED: list[PublishedPoint] = FIRST_SET + GPT_FAST_MOE + GPT_FAST_LLAMA31 + ADDED


class ValidationRow(SimModel):
    device: str
    label: str
    measured_tokens_per_s: float
    predicted_tokens_per_s: float
    error: float  # predicted / measured - 1
    calibration_point: bool
    where: str
    source: str


def validate(points: list[PublishedPoint] | None = None, *, calibrate_first: bool = True) -> list[ValidationRow]:
    """The one-point protocol (module docstring); ``calibrate_first=False``: the catalog defaults everywhere."""
    points = PUBLISHED if points is None else points
    rows: list[ValidationRow] = []
    for device in dict.fromkeys(p.device for p in points):
        pts = [p for p in points if p.device == device]
        hw: Hardware = _calibrated(pts[0]) if calibrate_first else hardware(device)
        base = stack_of(pts[0]) if calibrate_first else None  # the stack hw is priced for (None: the catalog's)
        rows += [_row(p, at_stack(hw, stack_of(p), base), calibrate_first and i == 0) for i, p in enumerate(pts)]
    return rows


def _row(p: PublishedPoint, hw: Hardware, calibration_point: bool, time_factor: float = 1.0) -> ValidationRow:
    """The prediction of point ``p`` by ``hw`` (its time scaled by ``time_factor``), as a table row."""
    pred = p.run.predicted_tokens_per_s(hw) / time_factor
    return ValidationRow(
        device=p.device,
        label=p.run.label,
        measured_tokens_per_s=p.run.tokens_per_s,
        predicted_tokens_per_s=pred,
        error=pred / p.run.tokens_per_s - 1.0,
        calibration_point=calibration_point,
        where=p.where,
        source=p.source,
    )


#: the software stack behind each source (a source not listed is its own stack). torchao's README benchmarks run
#: torchao/_models/llama/generate.py, its copy of gpt-fast's batch-1 torch.compile decode loop, so the two are one
#: stack; the three Qualcomm pages are the Cloud AI 100 SDK; AMD's and Oracle's runs are vLLM on ROCm.
STACK_OF: dict[str, str] = {
    MX_BLOG: "cloud-ai-sdk",
    SPD_BLOG: "cloud-ai-sdk",
    AMBER_BLOG: "cloud-ai-sdk",
    GPT_FAST: "gpt-fast",
    TORCHAO: "gpt-fast",
    LMDEPLOY: "lmdeploy-turbomind",
    IBM_COMPILE: "ibm-torch-compile",
    TRTLLM_BLOG: "tensorrt-llm",
    XLA_LLAMA: "pytorch-xla",
    AMD_PERF: "vllm-rocm",
    ORACLE_405B: "vllm-rocm",
}


def stack_of(p: PublishedPoint) -> str:
    """The software stack of a point's source (``STACK_OF``; an unlisted source is its own stack)."""
    return STACK_OF.get(p.source, p.source)


#: the all-reduce library of the stacks that run tensor parallel on GPUs where it is not the GPU family's default
#: (gpt-fast's intra-node one-shot all-reduce, ``catalog.FAMILY_DEFAULTS``): lmdeploy v0.1's TurboMind reduces through
#: NCCL (``ftNcclAllReduceSum`` after the attention output and after the FFN, src/turbomind/models/llama/), IBM's
#: torch.compile stack through torch.distributed, whose GPU backend is NCCL (assumed: the blog names no custom
#: all-reduce). AMD's and Oracle's vLLM runs are one stack (no difference to price); the rest run on one device.
STACK_ALLREDUCE: dict[str, str] = {"lmdeploy-turbomind": "nccl", "ibm-torch-compile": "nccl"}


def allreduce_extra_s(hw: Hardware, stack: str) -> float:
    """Seconds ``stack``'s all-reduce library adds to every all-reduce on ``hw`` over the family's default library
    (``catalog.NCCL_ALLREDUCE_EXTRA_S`` for an NCCL stack on NVLink GPUs; 0 otherwise)."""
    return NCCL_ALLREDUCE_EXTRA_S.get(hw.family, 0.0) if STACK_ALLREDUCE.get(stack) == "nccl" else 0.0


def at_stack(hw: Hardware, stack: str, base: str | None = None) -> Hardware:
    """``hw`` priced for ``base``'s all-reduce library (None: the catalog's default), switched to ``stack``'s."""
    d = allreduce_extra_s(hw, stack) - (allreduce_extra_s(hw, base) if base is not None else 0.0)
    if d == 0.0:
        return hw
    return hw.model_copy(update={"allreduce_latency_s": max(0.0, hw.allreduce_latency_s + d)})


def _calibrated(p: PublishedPoint) -> Hardware:
    """``p``'s device calibrated on ``p`` alone (one term), priced with ``p``'s stack's all-reduce library."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimWarning)
        return calibrate(at_stack(hardware(p.device), stack_of(p)), [p.run])


def stack_factor(pool: list[PublishedPoint], stack: str, reference: str) -> float:
    """Step time of ``stack`` over step time of ``reference`` on the same hardware, read off ``pool`` only: on
    every device where both stacks have points, the device calibrated on the first ``stack`` point predicts the
    ``reference`` points, and the geometric mean of predicted / measured time over them is the factor. 1.0 when the
    stacks are one or no device has both (no information: the stacks are assumed alike)."""
    if stack == reference:
        return 1.0
    logs: list[float] = []
    for device in dict.fromkeys(p.device for p in pool):
        mine = [p for p in pool if p.device == device and stack_of(p) == stack]
        ref = [p for p in pool if p.device == device and stack_of(p) == reference]
        if mine and ref:
            hw = at_stack(_calibrated(mine[0]), reference, stack)
            logs += [float(np.log(p.run.predicted_s(hw) / p.run.measured_s)) for p in ref]
    return float(np.exp(np.mean(logs))) if logs else 1.0


def validate_leave_one_source_out(points: list[PublishedPoint] | None = None) -> list[ValidationRow]:
    """Every point of a device predicted with the device calibrated on one point of *another* source (the first
    point of the device from any other source): the points are held out from the source they share assumptions
    with. When that point's software stack differs from the held-out source's, the prediction is scaled by the two
    stacks' time ratio (``stack_factor``) read off the other sources' points only, never the held-out source's own.
    Devices with one source are left out (no row): nothing else can calibrate them."""
    points = PUBLISHED if points is None else points
    rows: list[ValidationRow] = []
    for device in dict.fromkeys(p.device for p in points):
        pts = [p for p in points if p.device == device]
        for source in dict.fromkeys(p.source for p in pts):
            others = [p for p in pts if p.source != source]
            if not others:
                continue
            hw = _calibrated(others[0])
            held = [p for p in pts if p.source == source]
            pool = [p for p in points if p.source != source]
            factor = stack_factor(pool, stack_of(held[0]), stack_of(others[0]))
            rows += [_row(p, at_stack(hw, stack_of(p), stack_of(others[0])), False, factor) for p in held]
    return rows


def mean_abs_error(rows: list[ValidationRow]) -> float:
    """Mean |error| over the points not used for calibration."""
    errs = [abs(r.error) for r in rows if not r.calibration_point]
    return float(np.mean(errs)) if errs else 0.0


def summary(rows: list[ValidationRow]) -> dict[str, Any]:
    """Mean absolute error overall and per device (calibration points excluded)."""
    out: dict[str, Any] = {"mean_abs_error": mean_abs_error(rows), "points": sum(not r.calibration_point for r in rows)}
    for d in dict.fromkeys(r.device for r in rows):
        out[d] = mean_abs_error([r for r in rows if r.device == d])
    return out


Rate = Literal["decode", "end_to_end"]
