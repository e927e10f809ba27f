"""Pieces of benchmarks/gpu.py: the model shapes, random models built on the device, the timers and the simulator's
prediction of each measured call."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from accel.backends import TorchBackend
from accel.backends.torch_graphs import CallKey
from accel.backends.torch_mx_device import DeviceMXLinear, decode_codes
from accel.formats.constants import DEFAULT_BLOCK_SIZE
from accel.formats.elements import get_format
from accel.formats.torch_ops import quantize_elements_torch
from accel.models import ModelConfig
from accel.models.decoder import Decoder
from accel.sim import CallShape, from_hf_config, step_time

# Hugging Face configs of the measured shapes (random weights: nothing is downloaded)
SHAPES = {
    "llama-2-7b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="float16",
    ),
    "llama-2-13b": dict(
        model_type="llama", hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
        num_key_value_heads=40, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="float16",
    ),
    "tinyllama-1.1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="bfloat16",
    ),
    "tiny": dict(  # the CPU smoke test of the script (--tiny)
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, torch_dtype="float32",
    ),
}  # fmt: skip

SIM_FORMAT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def random_model(shape: str | dict, device: torch.device, dtype: torch.dtype, seed: int, head_std: float) -> Decoder:
    """A random ``Decoder`` of ``shape`` built on ``device`` in ``dtype`` (matrices normal(0, 0.02), the LM head
    normal(0, head_std): a sharp next-token law, so greedy argmaxes are far from ties)."""
    cfg = ModelConfig.from_hf(SHAPES[shape] if isinstance(shape, str) else shape)
    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Decoder(cfg)
    finally:
        torch.set_default_dtype(before)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, head_std if name == "lm_head.weight" else 0.02)
    return model.eval()


def make_mx_exact(model: Decoder, fmt: str) -> int:
    """Round every transformer-block Linear weight of ``model`` to ``fmt`` in place, on its device (what
    ``accel.compress`` stores, decoded: the embedding and LM head stay as they are); returns the layers rounded.
    The model must be in a dtype that holds ``fmt``'s values exactly (float32 or bfloat16 for MXFP6)."""
    count = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if type(module) is torch.nn.Linear and name.startswith("layers."):
                element = get_format(fmt)
                codes, scales, _ = quantize_elements_torch(module.weight, element, -1, DEFAULT_BLOCK_SIZE)
                exact = decode_codes(codes, scales, element, module.in_features)
                module.weight.copy_(exact.to(module.weight.dtype))
                count += 1
    return count


def mx_bytes(model: Decoder) -> tuple[int, int]:
    """(bytes of packed MX layers' planes and scales, bytes of every float parameter)."""
    packed = sum(m.nbytes for m in model.modules() if isinstance(m, DeviceMXLinear))
    return packed, weight_bytes(model)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy rate (bytes read + written per second): the practical bandwidth ceiling."""
    a = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    sync(device)
    return 2 * nbytes * reps / (time.perf_counter() - t0)


def time_layer(fn, x: torch.Tensor, reps: int) -> float:
    """Median device time (seconds) of ``fn(x)`` (CUDA events, after two warm-up calls; wall time on the CPU)."""
    fn(x)
    fn(x)
    times = []
    for _ in range(reps):
        if x.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def time_replay(backend: TorchBackend, seq: int, reps: int) -> float:
    """Median device time (seconds) of the captured call of ``seq`` tokens (all logits): graph replay alone, timed
    with CUDA events (``time_calls`` on the CPU)."""
    calls = backend.static_calls
    if calls is None or backend.device.type != "cuda":
        return float("nan")
    graph = calls.graph(CallKey(seq, seq, False, False))
    if graph is None:
        batch = backend.info.batch_size
        backend.forward(np.zeros((batch, seq), np.int64), np.full((batch, seq), -1))  # captures it
        graph = calls.graph(CallKey(seq, seq, False, False))
    assert graph is not None
    replay = graph.replay
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def profile_step(backend: TorchBackend, seq: int, reps: int = 5, top: int = 14) -> list[tuple[str, float, float]]:
    """The kernels of the captured call of ``seq`` tokens by device time (torch.profiler over ``reps`` replays):
    (kernel name, microseconds per call, share of the call's kernel time), the ``top`` most costly first, then one
    line for the rest. Empty off CUDA or where the profiler sees no kernels."""
    calls = backend.static_calls
    if calls is None or backend.device.type != "cuda":
        return []
    graph = calls.graph(CallKey(seq, seq, False, False))
    if graph is None:
        return []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize(backend.device)
    totals: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] = totals.get(e.name, 0.0) + e.time_range.elapsed_us() / reps
    whole = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    rest = sum(t for _, t in ranked[top:])
    lines = [(name, t, t / whole) for name, t in ranked[:top]]
    return lines + ([(f"({len(ranked) - top} other kernels)", rest, rest / whole)] if rest else [])


def time_calls(backend: TorchBackend, seq: int, context: int, reps: int) -> float:
    """Median wall time (seconds) of ``backend.forward`` of ``seq`` tokens at positions ``context ..`` with every
    logit returned (uploads, the call and the float32 logits' download: what the SpD loop pays)."""
    batch = backend.info.batch_size
    ids = np.random.default_rng(0).integers(0, backend.info.vocab_size, (batch, seq))
    pos = np.repeat(np.arange(context, context + seq)[None], batch, axis=0)
    backend.forward(ids, pos)  # the first call of a signature captures it
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        backend.forward(ids, pos)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def weight_bytes(model: Decoder) -> int:
    """Bytes of every parameter (tied ones once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def cache_bytes(backend: TorchBackend) -> int:
    """Bytes of the whole KV cache (every slot: a static cache is read whole by each call)."""
    return sum(t.numel() * t.element_size() for t in (*backend.keys, *backend.values))


def sim_hardware(name: str) -> str | None:
    """The simulator's catalog entry of a GPU that torch calls ``name`` (e.g. 'NVIDIA H200' -> 'h200'), or None."""
    low = name.lower()
    rules = [
        ("gb200", "gb200"), ("b200", "b200"), ("h200", "h200"), ("mi355x", "mi355x"), ("mi325x", "mi325x"),
        ("mi300x", "mi300x"), ("l40s", "l40s"), ("l4", "l4"),
    ]  # fmt: skip
    for key, hw in rules:
        if key in low:
            return hw
    if "h100" in low:
        return "h100-pcie" if "pcie" in low else "h100-sxm"
    if "a100" in low:
        return "a100-40gb" if "40gb" in low else "a100-80gb"
    return None


@dataclass
class SimCall:
    """The simulator's time (seconds) of one call, None where the GPU is not in its catalog."""

    seconds: float | None
    bound: str = ""


def sim_call(
    shape: str,
    hw: str | None,
    dtype: torch.dtype,
    seq: int,
    context: int,
    slots: int,
    *,
    batch: int = 1,
    weight_format: str | None = None,
) -> SimCall:
    """``accel.sim.step_time`` of a call of ``seq`` tokens after ``context`` cached ones (``batch`` sequences), all
    logits returned, with a static cache of ``slots`` slots read whole (as TorchBackend does); ``weight_format``
    (e.g. ``mxfp6``) prices the block weights so (default: ``dtype``)."""
    if hw is None or shape == "tiny":
        return SimCall(None)
    try:
        spec = from_hf_config(SHAPES[shape], name=shape)
        call = CallShape(
            batch_size=batch, new_tokens=seq, context_len=context, num_logits=seq, kv_slots=max(slots, context + seq)
        )
        st = step_time(spec, hw, call, weight_format=weight_format or SIM_FORMAT[dtype], kv_format=SIM_FORMAT[dtype])
    except Exception as exc:
        print(f"  accel.sim failed on {shape} S={seq}: {type(exc).__name__}: {exc}", flush=True)
        return SimCall(None)
    return SimCall(st.time_s, str(st.bound))
