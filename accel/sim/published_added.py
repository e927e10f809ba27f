"""Published decode points added for issue 35: sources the first set (``published.py``) did not use, TPU v4 and MI300X
among the devices, most of them multi-device. Every figure below was read in the source named with it; nothing is
estimated. Held out: no catalog constant was read off these points.

How each source's settings map onto the simulator:

- lmdeploy (TurboMind, v0.1.0a1) on A100-80G, FP16, static benchmark: batch 1, the table's prompt and output
  lengths, tensor parallel as given; ``throughput(out tok/s)`` = generated tokens / total time, prefill included
  (docs/en/benchmark/profile_generation.md: "Total time includes prefill time") -> ``rate="end_to_end"``, a growing
  fp16 KV cache. The 8-GPU box is taken as SXM (the file says "A100-80G").
- IBM's torch.compile Llama 2 70B on 8 x A100 80 GB: "single user" (batch 1), 512-token input, 50 generated, median
  latency per token 29 ms -> ``rate="decode"`` at 1 / 29 ms; "half precision" -> fp16.
- PyTorch/XLA LLaMA on TPU v4: bf16 weights and activations, ``max_seq_len=256`` and ``max_batch_size=1`` (the
  blog's stated configuration) with a KV cache of fixed shape written by index ops -> ``cache="fixed"``,
  ``ctx_len=256`` (prompt 128 + 128 generated: with a fixed cache the split does not change a decode step);
  per-token latency -> ``rate="decode"``. ``v4-N`` counts TensorCores, two per chip (cloud.google.com/tpu/docs/v4;
  the Llama 2 blog heads that row "TPU NumCores"): v4-8 = 4 chips, v4-16 = 8, v4-32 = 16. LLaMA 7B has Llama 2 7B's
  shapes (the blog's Table 1: 4096 wide, 32 heads, 32 layers); LLaMA 65B: Table 1 (8192, 64 heads, 80 layers) with
  the HF llama-65b config's FFN 22016 and vocabulary 32000.
- TensorRT-LLM v0.5.0 (H100 vs A100 blog): GPT-J 6B, batch 1, input 128, TP 1, "FP8 H100, FP16 A100, SXM 80GB";
  the batch-1 row gives throughput with no output length ("-") -> ``rate="decode"`` with 128 generated tokens (the
  other rows' length). H100 FP8 is W8A8 with the FP8 KV cache of that release's H100 builds
  (``--enable_fp8 --fp8_kv_cache`` in docs/source/performance.md v0.5) -> ``weight_format="fp8"``,
  ``kv_format="fp8"``; the LM head stays 16-bit.
- AMD ROCm performance results (MI300X, vLLM 0.9.1 container of 2025-07-15): Llama 3.1 70B
  (amd/Llama-3.1-70B-Instruct-FP8-KV), FP8, TP 8, batch 1, input 128, output 2048, latency 17.236 s for the whole
  run (vLLM ``benchmark_latency.py``) -> ``rate="end_to_end"`` at 2048 / 17.236 s; FP8 weights and KV cache,
  ``--dtype float16`` for the rest (ROCm/vllm dev-docker README).
- Oracle OCI (MI300X, vLLM ``benchmark_latency.py``): Llama 3.1 405B FP8 on all 8 GPUs, batch 1, input 128,
  output 128, average latency 3.530 s -> ``rate="end_to_end"`` at 128 / 3.530 s (the table rounds it to 36 TPS); the
  KV-cache dtype is not stated: fp16 assumed (at 256 tokens its reads are under 1 % of a step's bytes).
"""

from __future__ import annotations

from typing import Any

from accel.sim.models import ModelSpec
from accel.sim.presets import preset
from accel.sim.published_base import PublishedPoint, point

LMDEPLOY = (
    "InternLM/lmdeploy docs/en/benchmark/a100_fp16.md, 'Benchmark on A100 (FP16)' (lmdeploy v0.1.0a1 TurboMind, "
    "(x8) A100-80G, CUDA 11.8), https://github.com/InternLM/lmdeploy/blob/ebe90bc943eeace841b33fa54fbf1726311b63db/"
    "docs/en/benchmark/a100_fp16.md , 2023-12-06"
)
IBM_COMPILE = (
    "PyTorch blog, 'PyTorch compile to speed up inference on Llama 2' (IBM Research and Meta), "
    "https://pytorch.org/blog/pytorch-compile-to-speed-up-inference/ , 2023"
)
XLA_LLAMA = (
    "PyTorch blog, 'The Path to Achieve Ultra-Low Inference Latency With LLaMA 65B on PyTorch/XLA' (M. Mohammadi et "
    "al.), https://pytorch.org/blog/path-achieve-low-inference-latency/ , 2023 (torch-xla nightly 2023-04-22)"
)
TRTLLM_BLOG = (
    "NVIDIA/TensorRT-LLM docs/source/blogs/H100vsA100.md, 'H100 has 4.6x A100 Performance in TensorRT-LLM' "
    "(TensorRT-LLM v0.5.0, TensorRT 9.1), https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/blogs/"
    "H100vsA100.md , 2023-10 (v0.5.0: the first public release, NVIDIA/TensorRT-LLM#41, 2023-10-20)"
)
AMD_PERF = (
    "AMD ROCm hub, 'Performance results', AI Inference, Latency Measurements (MI300X, container rocm/vllm "
    "rocm6.4.1_vllm_0.9.1_20250715), https://www.amd.com/en/developer/resources/rocm-hub/dev-ai/performance-results.html"
    " , 2025-07-16"
)
ORACLE_405B = (
    "Oracle Cloud Infrastructure blog, 'Serving Llama 3.1 405B model with AMD Instinct MI300X Accelerators' (A. Gowda, "
    "S. Srinivasa Raghavan, S. Padgaonkar), https://blogs.oracle.com/cloud-infrastructure/post/"
    "serving-llama-31-405b-model-with-amd-mi300x-gpus , 2024-10-10"
)

LLAMA_31_405B = ModelSpec(
    name="llama-3.1-405b",
    n_layers=126,
    d_model=16384,
    n_heads=128,
    n_kv_heads=8,
    ffn_dim=53248,
    vocab_size=128256,
    dtype="bf16",
    max_context=131072,
    note="HF meta-llama/Llama-3.1-405B config: 126 layers, hidden 16384, 128 heads / 8 KV, FFN 53248, vocab 128256",
)
LLAMA_65B = ModelSpec(
    name="llama-65b",
    n_layers=80,
    d_model=8192,
    n_heads=64,
    ffn_dim=22016,
    vocab_size=32000,
    max_context=2048,
    note="LLaMA 65B: PyTorch/XLA blog Table 1 (8192, 64 heads, 80 layers); HF llama-65b config: FFN 22016, vocab 32000",
)
LLAMA_7B = preset("llama-2-7b").model_copy(
    update={"name": "llama-7b", "max_context": 2048, "note": "LLaMA 7B: the shapes of Llama 2 7B (blog Table 1)"}
)

A100, H100, TPU4, MI300X = "a100-80gb", "h100-sxm", "tpu-v4", "mi300x"
_LM = "Static Inference Benchmark, {} table (batch 1, TP {}; prompt {}, output {})"
# (model, tensor parallel, [(prompt tokens, output tokens, throughput out tok/s)]), the batch-1 rows of each table
_LMDEPLOY_ROWS: list[tuple[str, int, list[tuple[int, int, float]]]] = [
    (
        "llama-2-7b",
        1,
        [(1, 128, 100.02), (128, 128, 102.21), (128, 2048, 98.92), (2048, 128, 86.1), (2048, 2048, 93.78)],
    ),
    (
        "llama-2-13b",
        1,
        [(1, 128, 57.49), (128, 128, 56.58), (128, 2048, 55.29), (2048, 128, 48.99), (2048, 2048, 52.12)],
    ),
    (
        "llama-2-70b",
        4,
        [(1, 128, 33.94), (128, 128, 33.63), (128, 2048, 32.38), (2048, 128, 28.32), (2048, 2048, 31.9)],
    ),
]


def _lmdeploy() -> list[PublishedPoint]:
    out = []
    for model, tp, rows in _LMDEPLOY_ROWS:
        for p, g, tps in rows:
            where = _LM.format(model.replace("llama-2-", "llama2-"), tp, p, g)
            label = f"{model} fp16" + (f" TP{tp}" if tp > 1 else "") + f" {p}/{g}"
            run: dict[str, Any] = dict(model=preset(model), weight_format="fp16", prompt_len=p, gen_len=g)
            out.append(point(A100, label, tps, where, LMDEPLOY, devices=tp, rate="end_to_end", **run))
    return out


def _tpu_v4(model: ModelSpec, chips: int, ms_per_token: float, slice_name: str) -> PublishedPoint:
    where = f"Results, text on Figure 1 (batch 1, max_seq_len 256, bf16; {slice_name} = {chips} chips)"
    label = f"{model.name} bf16 {slice_name}"
    run: dict[str, Any] = dict(model=model, weight_format="bf16", prompt_len=128, gen_len=128, cache="fixed")
    return point(TPU4, label, 1e3 / ms_per_token, where, XLA_LLAMA, ctx_len=256, devices=chips, **run)


_TRT = "Max Throughput & Min Latency table, batch-1 row (input 128, output '-', TP 1)"
_AMD = "Latency Measurements table: Llama 3.1 70B FP8, TP 8, batch 1, input 128, output 2048, latency 17.236 s"
_ORACLE = "Latency measurements table: batch 1 (input 128, output 128), average latency 3.530 s (36 TPS)"
ADDED: list[PublishedPoint] = [
    *_lmdeploy(),
    point(
        A100,
        "llama-2-70b fp16 TP8 512/50",
        1 / 29e-3,
        "Experiments and Measurements, Figure 1 text: 70B at 29 ms/token on 8 A100 80 GB, compile + SDPA, "
        "input 512, 50 generated, single user",
        IBM_COMPILE,
        model=preset("llama-2-70b"),
        weight_format="fp16",
        prompt_len=512,
        gen_len=50,
        devices=8,
    ),
    point(A100, "gpt-j-6b fp16", 111.0, _TRT, TRTLLM_BLOG, model="gpt-j-6b", prompt_len=128, gen_len=128),
    point(
        H100,
        "gpt-j-6b fp8 (W8A8, fp8 KV)",
        185.0,
        _TRT,
        TRTLLM_BLOG,
        model="gpt-j-6b",
        weight_format="fp8",
        kv_format="fp8",
        prompt_len=128,
        gen_len=128,
    ),
    # TPU v4 (the first point is the device's calibration point in ``published.validate``)
    _tpu_v4(LLAMA_7B, 4, 4.7, "v4-8"),
    _tpu_v4(LLAMA_7B, 8, 3.8, "v4-16"),
    _tpu_v4(LLAMA_65B, 16, 14.5, "v4-32"),
    # MI300X: FP8 weights (vLLM fp8 GEMMs), 8 GPUs
    point(
        MI300X,
        "llama-3.1-70b fp8 TP8 128/2048",
        2048 / 17.236,
        _AMD,
        AMD_PERF,
        model="llama-3.1-70b",
        dtype="fp16",
        weight_format="fp8",
        kv_format="fp8",
        prompt_len=128,
        gen_len=2048,
        devices=8,
        rate="end_to_end",
    ),
    point(
        MI300X,
        "llama-3.1-405b fp8 TP8 128/128",
        128 / 3.530,
        _ORACLE,
        ORACLE_405B,
        model=LLAMA_31_405B,
        weight_format="fp8",
        prompt_len=128,
        gen_len=128,
        devices=8,
        rate="end_to_end",
    ),
]
