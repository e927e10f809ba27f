"""Roofline time of one model call: S new tokens per sequence, past context L, batch B (see docs/sim.md).

Per decoder layer (all layers are identical), on each of n tensor-parallel devices, and once for the LM head:

    t_mem  = (W * g(r) + KV_read + KV_write + A) / (n * BW * e_bw)       r = B*S rows, g(r) = 1 + beta (r-1)^gamma
    t_comp = FLOPs / (n * peak[dtype] * e_comp)
    t_dec  = compressed weight elements * g_dec(r) / (n * decompress rate[format])  (0 when stored as computed)
             g_dec: g with the decompression path's own (beta, gamma) where the device gives them (hardware.py)
    t_op   = max(t_mem, t_comp, t_dec)   if the device overlaps decompression with the weight stream,
             max(t_mem, t_comp) + t_dec  otherwise

    T = n_layers * (t_layer + layer_overhead + row_overhead * (r - 1) + t_comm) + t_head + call_overhead
    t_comm = all-reduces per layer (2, or 1 for a parallel block) of B*S*d_model fp16 values:
             allreduce_latency + link_latency * ceil(log2 n) + 2 (n-1)/n * bytes / link_BW

W: the layer's weights (linear layers in the weight format - for a mixture of experts, the experts the r rows touch -
norms/biases in the model's dtype); KV read = B * slots * 2 * kv_dim, slots = the past L (at most the window of a
sliding layer) for a growing cache, or every ``kv_slots`` of a fixed-size cache (QEfficient-style compiles attend
over all ctx_len slots, masked); KV written = B*S*2*kv_dim; A: activations in and out of each matmul (fp16),
attention assumed fused (scores on chip). FLOPs: 2 * rows * active linear params + attention 4 * B * S * q_dim *
(keys per query). LM head: the full head matrix (tied = the embedding table) + logits written as fp32 for the
``num_logits`` positions returned, FLOPs 2 * B * num_logits * d * vocab; the embedding gather reads B*S rows.
Exact: the byte and FLOP counts. Approximate: the efficiency terms, the max() overlap, ignoring norms' FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from accel._legacy import Replaced, legacy_keywords
from accel.sim._base import MAX_BATCH, MAX_DEVICES, MAX_TOKENS, SimModel, check_int
from accel.sim.formats import bytes_per_element, compute_dtype, kv_bytes_per_element, normalize_format
from accel.sim.hardware import Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.hf_config import resolve_model
from accel.sim.models import ModelSpec

ACT_BYTES = 2.0  # activations and all-reduce payloads in fp16
LOGIT_BYTES = 4.0  # logits returned as fp32
BOUNDS = ("memory", "compute", "decompress", "communication", "overhead")
Bound = Literal["memory", "compute", "decompress", "communication", "overhead"]
FormatArrays = tuple[Any, Any, Any]  # (bytes per element, decompress rate per device (inf = free), peak FLOP/s)


@dataclass(frozen=True)
class CallShape:
    """The shape of one model call: ``batch_size`` sequences each feed ``new_tokens`` tokens after ``context_len``
    cached ones, and ``num_logits`` positions' logits come back (1 for prefill and decode, K+1 for speculative
    scoring); ``kv_slots``: a fixed-size cache of that many slots, every one read (``None``: a growing cache, the past
    ``context_len`` read). Sizes in tokens. :func:`step_time` checks them (integers); :func:`step_arrays` takes them
    unchecked, as numbers or arrays that broadcast together."""

    batch_size: Any = 1
    new_tokens: Any = 1
    context_len: Any = 0
    num_logits: Any = 1
    kv_slots: Any = None


#: the keywords ``step_time`` took before ``CallShape`` (deprecated; ``step_arrays`` called the batch ``batch``)
CALL_KEYWORDS = {k: k for k in ("batch_size", "new_tokens", "context_len", "num_logits", "kv_slots")}
_STEP_TIME_LEGACY = (Replaced("call", CallShape, CALL_KEYWORDS),)
_STEP_ARRAYS_LEGACY = (Replaced("call", CallShape, {**CALL_KEYWORDS, "batch": "batch_size"}),)


class StepTime(SimModel):
    """Time of one model call (seconds) with its breakdown. ``time_s = memory_bound_s + compute_bound_s + comm_s +
    overhead_s``: the first two are the time of operators limited by memory / by compute or decompression; comm the
    tensor-parallel all-reduces; overhead the fixed per-call and per-layer costs. ``bound`` names the largest
    share ("decompress" when the compute-bound share is mostly weight decompression)."""

    time_s: float
    memory_bound_s: float
    compute_bound_s: float
    comm_s: float
    overhead_s: float
    memory_s: float  # memory time of all operators (whether or not they were memory bound)
    compute_s: float  # compute time of all operators
    decompress_s: float  # weight decompression time of all operators
    weight_bytes: float  # bytes of weights streamed (before the multi-token factor)
    kv_read_bytes: float
    kv_write_bytes: float
    activation_bytes: float
    flops: float
    bound: Bound
    batch_size: int
    new_tokens: int
    context_len: int
    num_logits: int
    devices: int


def format_arrays(hw: Hardware, weight_format: str) -> tuple[float, float, float]:
    """(bytes per element, decompression rate per device or ``inf`` when free, peak FLOP/s) of a weight format."""
    rate = hw.decompress_rate(weight_format)
    return (
        bytes_per_element(weight_format),
        float("inf") if rate is None else rate,
        hw.peak_flops(compute_dtype(weight_format)),
    )


def allreduce_s(hw: Hardware, nbytes: Any, devices: int) -> Any:
    """Seconds of one all-reduce of ``nbytes`` over ``devices`` (0 on one device)."""
    n = float(devices)
    if n <= 1:
        return 0.0 * np.asarray(nbytes)
    steps = float(np.ceil(np.log2(n)))
    return (
        hw.allreduce_latency_s
        + hw.link_latency_s * steps
        + 2.0 * (n - 1.0) / n * np.asarray(nbytes) / hw.link_bandwidth_bytes_per_s
    )


def _layer(m: ModelSpec, bpe: Any, small_bpe: float, kv_bpe: float, B: Any, S: Any, L: Any, kv_slots: Any) -> dict:
    """Bytes, FLOPs and decompressed elements of one decoder layer (per call, all devices together)."""
    rows = B * S
    linear = m.attn_params_per_layer + m.router_params + m.expected_experts(rows) * m.expert_params  # experts touched
    if kv_slots is None:
        past = np.asarray(m.attended_tokens(L), dtype=np.float64)
        keys = past + (S + 1.0) / 2.0  # causal within the chunk
        kv_read = B * past * 2.0 * m.kv_dim * kv_bpe
    else:  # a fixed cache: attention reads (masked) every slot
        keys = np.asarray(kv_slots, dtype=np.float64)
        kv_read = B * keys * 2.0 * m.kv_dim * kv_bpe
    act_elems = 4 * m.d_model + 2 * m.q_dim + 2 * m.kv_dim + (3 if m.ffn_type == "gated" else 2) * m.ffn_dim
    return {
        "weights": linear * bpe + m.small_params_per_layer * small_bpe,
        "kv_read": kv_read,
        "kv_write": B * S * 2.0 * m.kv_dim * kv_bpe,
        "act": rows * act_elems * ACT_BYTES,
        "flops": 2.0 * rows * m.active_linear_params_per_layer + 4.0 * B * S * m.q_dim * keys,
        "decompress": linear,
    }


def _head(m: ModelSpec, bpe: Any, small_bpe: float, B: Any, S: Any, NL: Any, compress_lm_head: bool) -> dict:
    """The LM head with the final norm, the embedding gather, the logits out and a feature draft's input layer."""
    head_params = m.head_rows * m.d_model  # a restricted head (head_vocab) scores fewer rows; logits stay full
    fc = m.input_proj_params  # a feature draft's input layer: read like a layer matrix, applied to every token
    head_bpe = bpe if compress_lm_head else np.float64(small_bpe)
    return {
        "weights": head_params * head_bpe + m.final_norm_params * small_bpe + fc * bpe,
        "act": B * S * (m.embed_dim or m.d_model) * ACT_BYTES  # embedding rows gathered
        + B * S * m.feature_dim * ACT_BYTES  # target features in (feature drafts)
        + B * NL * m.vocab_size * LOGIT_BYTES,
        "flops": 2.0 * B * NL * head_params + 2.0 * B * S * fc,
        "decompress": (head_params if compress_lm_head else 0.0) + fc,
    }


def _op_time(hw: Hardware, mem: Any, comp: Any, dec: Any) -> tuple[Any, Any]:
    """(time, memory-bound part) of one operator: its slowest resource, decompression beside or after the stream."""
    if hw.decompress_overlap:
        t = np.maximum(np.maximum(mem, comp), dec)
        return t, np.where(mem >= np.maximum(comp, dec), t, 0.0)
    return np.maximum(mem, comp) + dec, np.where(mem >= comp, mem, 0.0)


def _resource_times(
    hw: Hardware, lay: dict, head: dict, rows_l: Any, rows_h: Any, bw: float, fl: Any, dec_rate: Any
) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(mem_l, mem_h, comp_l, comp_h, dec_l, dec_h): a layer's and the head's seconds of each resource; the KV cache
    is read at ``kv_bandwidth_efficiency`` where the device has one (``bw`` is the weights' rate)."""

    def g(rows: np.ndarray, beta: float = hw.multi_token_penalty, gamma: float = hw.multi_token_exponent) -> np.ndarray:
        return 1.0 + beta * np.maximum(rows - 1.0, 0.0) ** gamma  # multi-token factor (hardware.py)

    # the decompression (kernel-bound) path's own (beta, gamma) where the device gives them, else the memory terms'
    beta_dec, gamma_dec = hw.decompress_multi_token_penalty, hw.decompress_multi_token_exponent
    beta_dec = hw.multi_token_penalty if beta_dec is None else beta_dec
    gamma_dec = hw.multi_token_exponent if gamma_dec is None else gamma_dec

    kv_bw = bw if hw.kv_bandwidth_efficiency is None else bw * hw.kv_bandwidth_efficiency / hw.bandwidth_efficiency
    mem_l = (lay["weights"] * g(rows_l) + lay["kv_write"] + lay["act"]) / bw + lay["kv_read"] / kv_bw
    mem_h = (head["weights"] * g(rows_h) + head["act"]) / bw
    comp_l, comp_h = lay["flops"] / fl, head["flops"] / fl
    # a multi-row call slows the weight-streaming kernel (GEMV -> GEMM), whichever bound it: memory or decompression
    dec_l = lay["decompress"] * g(rows_l, beta_dec, gamma_dec) / dec_rate
    dec_h = head["decompress"] * g(rows_h, beta_dec, gamma_dec) / dec_rate
    return mem_l, mem_h, comp_l, comp_h, dec_l, dec_h


def step_arrays(
    model: ModelSpec,
    hw: Hardware,
    call: CallShape | None = None,
    *,
    fmt: FormatArrays,
    kv_bpe: float,
    devices: int,
    compress_lm_head: bool = False,
    **legacy: Any,
) -> dict[str, np.ndarray]:
    """Vectorized core of :func:`step_time`: every number of ``call`` broadcasts (``None``: one decode step, batch 1,
    no past). ``fmt`` = :func:`format_arrays` (each entry broadcastable); ``kv_bpe``: KV-cache bytes per element.
    Returns seconds / bytes / FLOPs. No validation here (the callers validate). Deprecated: ``batch``,
    ``new_tokens``, ``context_len``, ``num_logits``, ``kv_slots`` as keywords (use ``call=CallShape(...)``)."""
    call = legacy_keywords("step_arrays", legacy, _STEP_ARRAYS_LEGACY, {"call": call})[0]["call"] or CallShape()
    m = model
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    bpe, rate, peak = f(fmt[0]), f(fmt[1]), f(fmt[2])
    B, S, L, NL = f(call.batch_size), f(call.new_tokens), f(call.context_len), f(call.num_logits)
    n = float(devices)
    bw = n * hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency
    fl = n * peak * hw.compute_efficiency
    small_bpe = bytes_per_element(m.dtype)
    lay = _layer(m, bpe, small_bpe, kv_bpe, B, S, L, call.kv_slots)
    head = _head(m, bpe, small_bpe, B, S, NL, compress_lm_head)
    mem_l, mem_h, comp_l, comp_h, dec_l, dec_h = _resource_times(hw, lay, head, B * S, B * NL, bw, fl, n * rate)
    (t_l, mb_l), (t_h, mb_h) = _op_time(hw, mem_l, comp_l, dec_l), _op_time(hw, mem_h, comp_h, dec_h)
    nl = m.n_layers
    comm = nl * m.allreduces_per_layer * allreduce_s(hw, B * S * m.d_model * ACT_BYTES, devices)
    # fixed costs: per call, per layer, and per layer for each row beyond the first (hardware.py, docs/sim.md §2)
    overhead = hw.call_overhead_s + nl * (hw.layer_overhead_s + hw.row_overhead_s * (B * S - 1.0))
    out = {
        "time_s": nl * t_l + t_h + comm + overhead,
        "memory_bound_s": nl * mb_l + mb_h,
        "compute_bound_s": nl * (t_l - mb_l) + t_h - mb_h,
        "comm_s": comm,
        "overhead_s": overhead,
        "memory_s": nl * mem_l + mem_h,
        "compute_s": nl * comp_l + comp_h,
        "decompress_s": nl * dec_l + dec_h,
        "weight_bytes": nl * lay["weights"] + head["weights"],
        "kv_read_bytes": nl * lay["kv_read"],
        "kv_write_bytes": nl * lay["kv_write"],
        "activation_bytes": nl * lay["act"] + head["act"],
        "flops": nl * lay["flops"] + head["flops"],
    }
    shape = np.broadcast_shapes(*(np.shape(v) for v in out.values()), np.shape(L), np.shape(B), np.shape(S))
    return {k: np.broadcast_to(np.asarray(v, dtype=np.float64), shape) for k, v in out.items()}


def bound_of(arrays: dict[str, Any], i: Any = ...) -> Bound:
    """The largest share of ``step_arrays`` output (at index ``i`` of its arrays)."""
    v = {k: float(np.asarray(arrays[k])[i]) for k in ("memory_bound_s", "compute_bound_s", "comm_s", "overhead_s",
                                                      "decompress_s", "compute_s")}  # fmt: skip
    shares = [v["memory_bound_s"], v["compute_bound_s"], v["comm_s"], v["overhead_s"]]
    j = int(np.argmax(shares))
    names: tuple[Bound, ...] = ("memory", "compute", "communication", "overhead")
    if j == 1 and v["decompress_s"] >= v["compute_s"]:
        return "decompress"
    return names[j]


def resolve_devices(hw: Hardware, devices: int | None) -> int:
    """Devices used in tensor parallel: ``devices`` (1 .. 4096, more than one card allowed), default the card's."""
    return hw.num_devices if devices is None else check_int("devices", devices, 1, MAX_DEVICES)


def step_time(
    model: ModelSpec | str | dict[str, Any],
    hardware: Hardware | str,
    call: CallShape | None = None,
    *,
    weight_format: str | None = None,
    kv_format: str = "fp16",
    devices: int | None = None,
    compress_lm_head: bool = False,
    **legacy: Any,
) -> StepTime:
    """Roofline time (seconds) of one ``call`` of ``model`` (a ``CallShape``; default: one decode step, batch 1, no
    past). ``weight_format`` defaults to the model's dtype; ``kv_format``: the KV cache's; ``devices`` = devices in
    tensor parallel (default: the card's); ``compress_lm_head``: the LM head in ``weight_format`` too. Deprecated:
    ``batch_size``, ``new_tokens``, ``context_len``, ``num_logits``, ``kv_slots`` as keywords (use
    ``call=CallShape(...)``; ``num_logits=None`` meant 1)."""
    call = legacy_keywords("step_time", legacy, _STEP_TIME_LEGACY, {"call": call})[0]["call"] or CallShape()
    spec, hw = resolve_model(model), _hardware(hardware)
    batch = check_int("batch_size", call.batch_size, 1, MAX_BATCH)
    S = check_int("new_tokens", call.new_tokens, 1, MAX_TOKENS)
    L = check_int("context_len", call.context_len, 0, MAX_TOKENS)
    nl = check_int("num_logits", 1 if call.num_logits is None else call.num_logits, 1, S)
    slots = None if call.kv_slots is None else check_int("kv_slots", call.kv_slots, L + S, MAX_TOKENS)
    n = resolve_devices(hw, devices)
    fmt = normalize_format(weight_format or spec.dtype)
    r = step_arrays(
        spec,
        hw,
        CallShape(batch, S, L, nl, slots),
        fmt=format_arrays(hw, fmt),
        kv_bpe=kv_bytes_per_element(kv_format),
        devices=n,
        compress_lm_head=compress_lm_head,
    )
    vals = {k: float(v) for k, v in r.items()}
    b = bound_of(r)
    return StepTime(**vals, bound=b, batch_size=batch, new_tokens=S, context_len=L, num_logits=nl, devices=n)
