"""Roofline time of one model call: S new tokens per sequence, past context L, batch B (see docs/sim.md).

Per decoder layer (all layers are identical), and once for the LM head operator:

    t_mem  = (W * g(r) + KV_read + KV_write + A) / (n * BW * e_bw)       r = B*S rows, g(r) = 1 + beta (r-1)^gamma
    t_comp = FLOPs / (n * peak[dtype] * e_comp)
    t_dec  = MX elements / (n * decompress rate)                          (only for MX weights, if the rate is finite)
    t_op   = max(t_mem, t_comp, t_dec)

    T = n_layers * t_layer + t_head + t_comm + call_overhead
    t_comm = n_layers * 2 all-reduces of B*S*d_model fp16 values (ring: 2 (n-1)/n bytes/link + 2 (n-1) latency)

W: the layer's weights (linear layers in the weight format, norms/biases fp16); KV read = B*L*2*kv_dim, written
B*S*2*kv_dim (KV format); A: activations in and out of each matmul (fp16), attention assumed fused (scores on chip).
FLOPs: 2 * rows * linear params + attention 4 * B * S * heads * head_dim * (L + (S+1)/2) (causal within the chunk).
LM head: the full head matrix (tied = the embedding table) + logits written as fp32 for the ``num_logits`` positions
actually returned, FLOPs 2 * B * num_logits * d * vocab; the embedding gather reads B*S rows.
Prefill (TTFT), decode (TPOT) and K+1 scoring are all this one function with different (S, L, num_logits).
Exact: the byte and FLOP counts. Approximate: the efficiency terms, the max() overlap model, ignoring norms' FLOPs.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.formats import bytes_per_element, compute_dtype, is_mx, kv_bytes_per_element
from accel.sim.hardware import Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.models import ModelSpec, resolve_model

ACT_BYTES = 2.0  # activations and all-reduce payloads in fp16
LOGIT_BYTES = 4.0  # logits returned as fp32
BOUNDS = ("memory", "compute", "overhead")


class StepTime(SimModel):
    """Time of one model call (seconds) with its breakdown. ``time_s = memory_bound_s + compute_bound_s + comm_s +
    overhead_s``: the first two are the time of operators limited by memory / by compute (or MX decompression)."""

    time_s: float
    memory_bound_s: float
    compute_bound_s: float
    comm_s: float
    overhead_s: float
    memory_s: float  # memory time of all operators (whether or not they were memory bound)
    compute_s: float  # compute time of all operators
    decompress_s: float  # MX decompression time of all operators
    weight_bytes: float  # bytes of weights streamed (before the multi-token factor)
    kv_read_bytes: float
    kv_write_bytes: float
    activation_bytes: float
    flops: float
    bound: Literal["memory", "compute", "overhead"]
    batch_size: int
    new_tokens: int
    context_len: int
    num_logits: int


def _check_sizes(batch, new_tokens, context_len, num_logits) -> None:
    for name, v, lo in (
        ("batch_size", batch, 1),
        ("new_tokens", new_tokens, 1),
        ("context_len", context_len, 0),
        ("num_logits", num_logits, 1),
    ):
        a = np.asarray(v)
        if not np.issubdtype(a.dtype, np.number) or np.any(~np.isfinite(a)) or np.any(a < lo):
            raise SimError(f"{name} must be a finite number >= {lo}, got {v!r}")
    if np.any(np.asarray(num_logits) > np.asarray(new_tokens)):
        raise SimError(f"num_logits ({num_logits!r}) cannot exceed new_tokens ({new_tokens!r})")


def resolve_devices(hw: Hardware, devices: int | None) -> int:
    """Number of devices used (tensor parallel); default: all of ``hw.num_devices``."""
    if devices is None:
        return hw.num_devices
    if not isinstance(devices, (int, np.integer)) or not 1 <= devices <= hw.num_devices:
        raise SimError(f"devices must be an integer in [1, {hw.num_devices}] for {hw.name!r}, got {devices!r}")
    return int(devices)


def step_arrays(
    model: ModelSpec,
    hw: Hardware,
    *,
    weight_bpe,
    weight_mx,
    peak_flops,
    kv_bpe,
    batch,
    new_tokens,
    context_len,
    num_logits,
    devices: int,
    compress_lm_head: bool = False,
) -> dict[str, np.ndarray]:
    """Vectorized core of :func:`step_time`: every numeric argument broadcasts (numpy arrays). Returns seconds/bytes.

    ``weight_bpe``: bytes per element of the linear weights; ``weight_mx``: 1 where that format is MX (decompression
    applies); ``peak_flops``: peak FLOP/s of the compute dtype. No validation here (the callers validate)."""
    m = model
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    bpe, mx, peak, kvb = f(weight_bpe), f(weight_mx), f(peak_flops), f(kv_bpe)
    B, S, L, NL = f(batch), f(new_tokens), f(context_len), f(num_logits)
    n = float(devices)
    bw = n * hw.memory_bandwidth_bytes_per_s * hw.bandwidth_efficiency
    fl = n * peak * hw.compute_efficiency
    dec_rate = None if hw.mx_decompress_elements_per_s is None else n * hw.mx_decompress_elements_per_s

    def g(rows):  # multi-token weight-streaming factor (hardware.py)
        return 1.0 + hw.multi_token_penalty * np.maximum(rows - 1.0, 0.0) ** hw.multi_token_exponent

    rows = B * S
    # --- one decoder layer
    w_layer = m.linear_params_per_layer * bpe + m.small_params_per_layer * 2.0
    kv_read = B * L * 2.0 * m.kv_dim * kvb
    kv_write = B * S * 2.0 * m.kv_dim * kvb
    act_elems = 4 * m.d_model + 2 * m.q_dim + 2 * m.kv_dim + (3 if m.ffn_type == "gated" else 2) * m.ffn_dim
    act = rows * act_elems * ACT_BYTES
    flops_layer = 2.0 * rows * m.linear_params_per_layer + 4.0 * B * S * m.q_dim * (L + (S + 1.0) / 2.0)
    mem_l = (w_layer * g(rows) + kv_read + kv_write + act) / bw
    comp_l = flops_layer / fl
    dec_l = 0.0 * mx if dec_rate is None else mx * m.linear_params_per_layer / dec_rate
    # --- LM head (+ final norm, embedding gather, logits out)
    head_params = m.head_rows * m.d_model  # a restricted head (head_vocab) scores fewer rows; logits stay full
    head_bpe = bpe if compress_lm_head else np.float64(bytes_per_element("fp16"))
    head_mx = mx if compress_lm_head else 0.0 * mx
    fc = m.input_proj_params  # a feature draft's input layer: read like a layer matrix, applied to every token
    w_head = head_params * head_bpe + m.final_norm_params * 2.0 + fc * bpe
    act_head = (
        B * S * (m.embed_dim or m.d_model) * ACT_BYTES  # embedding rows gathered
        + B * S * m.feature_dim * ACT_BYTES  # target features in (feature drafts)
        + B * NL * m.vocab_size * LOGIT_BYTES
    )
    flops_head = 2.0 * B * NL * head_params + 2.0 * rows * fc
    mem_h = (w_head * g(B * NL) + act_head) / bw
    comp_h = flops_head / fl
    dec_h = 0.0 * head_mx if dec_rate is None else (head_mx * head_params + mx * fc) / dec_rate
    # --- combine: each operator runs at its slowest resource
    nl = m.n_layers
    t_l = np.maximum(np.maximum(mem_l, comp_l), dec_l)
    t_h = np.maximum(np.maximum(mem_h, comp_h), dec_h)
    mem_bound = nl * np.where(mem_l >= np.maximum(comp_l, dec_l), t_l, 0.0) + np.where(
        mem_h >= np.maximum(comp_h, dec_h), t_h, 0.0
    )
    compute_bound = nl * t_l + t_h - mem_bound
    if n > 1:
        ar_bytes = rows * m.d_model * ACT_BYTES
        t_ar = 2.0 * (n - 1.0) / n * ar_bytes / hw.link_bandwidth_bytes_per_s + 2.0 * (n - 1.0) * hw.link_latency_s
        comm = nl * 2.0 * t_ar
    else:
        comm = 0.0 * rows
    overhead = hw.call_overhead_s + 0.0 * rows
    total = nl * t_l + t_h + comm + overhead
    out = {
        "time_s": total,
        "memory_bound_s": mem_bound,
        "compute_bound_s": compute_bound,
        "comm_s": comm,
        "overhead_s": overhead,
        "memory_s": nl * mem_l + mem_h,
        "compute_s": nl * comp_l + comp_h,
        "decompress_s": nl * dec_l + dec_h,
        "weight_bytes": nl * w_layer + w_head + 0.0 * rows,
        "kv_read_bytes": nl * kv_read,
        "kv_write_bytes": nl * kv_write,
        "activation_bytes": nl * act + act_head,
        "flops": nl * flops_layer + flops_head,
    }
    shape = np.broadcast_shapes(*(np.shape(v) for v in out.values()))
    return {k: np.broadcast_to(np.asarray(v, dtype=np.float64), shape) for k, v in out.items()}


def bound_of(memory_bound_s, compute_bound_s, other_s):
    """Index into ``BOUNDS`` of the largest share (vectorized)."""
    return np.argmax(np.stack(np.broadcast_arrays(memory_bound_s, compute_bound_s, other_s)), axis=0)


def format_arrays(hw: Hardware, weight_format: str) -> tuple[float, float, float]:
    """(bytes per element, is MX, peak FLOP/s) for a weight format on ``hw``."""
    return bytes_per_element(weight_format), float(is_mx(weight_format)), hw.peak_flops(compute_dtype(weight_format))


def step_time(
    model: ModelSpec | str | dict,
    hardware: Hardware | str,
    *,
    weight_format: str = "fp16",
    kv_format: str = "fp16",
    batch_size: int = 1,
    new_tokens: int = 1,
    context_len: int = 0,
    num_logits: int | None = None,
    devices: int | None = None,
    compress_lm_head: bool = False,
) -> StepTime:
    """Roofline time (seconds) of one call of ``model`` with ``new_tokens`` per sequence after ``context_len`` cached
    tokens, at ``batch_size``. ``num_logits`` (default: 1) = positions whose logits are returned: 1 for prefill and
    decode, K+1 for speculative scoring. ``devices`` = devices used in tensor parallel (default: all)."""
    spec = resolve_model(model)
    hw = _hardware(hardware)
    num_logits = 1 if num_logits is None else num_logits
    _check_sizes(batch_size, new_tokens, context_len, num_logits)
    n = resolve_devices(hw, devices)
    bpe, mx, peak = format_arrays(hw, weight_format)
    r = step_arrays(
        spec,
        hw,
        weight_bpe=bpe,
        weight_mx=mx,
        peak_flops=peak,
        kv_bpe=kv_bytes_per_element(kv_format),
        batch=batch_size,
        new_tokens=new_tokens,
        context_len=context_len,
        num_logits=num_logits,
        devices=n,
        compress_lm_head=compress_lm_head,
    )
    vals = {k: float(v) for k, v in r.items()}
    b = BOUNDS[int(bound_of(vals["memory_bound_s"], vals["compute_bound_s"], vals["comm_s"] + vals["overhead_s"]))]
    return StepTime(
        **vals,
        bound=b,
        batch_size=int(batch_size),
        new_tokens=int(new_tokens),
        context_len=int(context_len),
        num_logits=int(num_logits),
    )
