"""int8 weights for drafts (``weights="int8"``): per-output-channel symmetric int8 weights with the operators of
onnxruntime's dynamic quantization, written by accel itself so that they stream like every other weight.

The codes are what ``onnxruntime.quantization.quantize_dynamic(weight_type=QInt8, per_channel=True,
op_types_to_quantize=["MatMul"])`` produces for a weight MatMul, bit for bit (the tests compare both):

- per column ``j`` of ``W^T [in, out]``: ``absmax_j = max(|min(W_j, 0)|, max(W_j, 0))``, the scale
  ``s_j = float32(2 absmax_j / 254)`` (computed in float64; 1.0 when below float32's smallest normal), the codes
  ``q = clip(round_half_even(W / s_j), -128, 127)`` (in float32 arithmetic);
- per call, ``DynamicQuantizeLinear`` quantizes the activations to uint8 per tensor (one per input, shared by the
  MatMuls that read it), ``MatMulInteger`` accumulates in int32, ``Cast`` and two ``Mul`` rescale; onnxruntime fuses
  the pattern into ``DynamicQuantizeMatMul`` when the session is created.

How the codes are stored decides whether every x86 CPU computes the same integers (docs/backends.md, "int8 on every
x86 CPU"). onnxruntime's x86 kernels multiply uint8 activations by **int8** weights with ``vpmaddubsw`` on CPUs
without VNNI (AVX2-only, AVX-512 without VNNI): the products of two neighbouring inputs are added into a
*saturating* int16, so an activation code near 255 against weight codes near +-127 clips (255 * 127 * 2 = 64,770 >
32,767) and the int8 draft silently loses its accuracy there; VNNI (``vpdpbusd``) and AMX accumulate in int32 and do
not clip. **uint8** weights run on kernels that widen both operands to int16 and multiply-add into int32
(``vpmovzxbw`` + ``vpmaddwd``) on every x86 path, VNNI CPUs included: exact everywhere. The schemes
(``INT8_SCHEMES``):

- ``"u8u8"`` (default): the codes above stored as ``q + 128`` (uint8) with zero point 128: the same integers as
  int8 codes on a VNNI CPU, on every CPU.
- ``"u8s7"``: reduce-range codes in [-63, 63] (scale ``2 absmax / 126``): a pair stays within 2 * 255 * 63 = 32,130,
  so the int8 kernels (VNNI's included) cannot clip; half the weight resolution.
- ``"u8s8"``: the full-range int8 codes, stored as int8: exact on VNNI/AMX CPUs only. accel's export before the fix;
  kept for comparisons (``benchmarks/int8.py``); ``OrtBackend`` warns when such a graph runs on a CPU without VNNI.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from accel.backends.onnx_builder import GraphBuilder
from accel.backends.weights import INT8_SCHEMES, Int8Scheme
from accel.errors import BackendError

__all__ = [
    "DEFAULT_INT8_SCHEME",
    "INT8_SCHEMES",
    "INT16_MAX",
    "Int8Scheme",
    "int8_matmul",
    "int16_pair_safe",
    "quantize_int8_columns",
    "saturating_u8s8_matmul",
    "to_u8u8",
    "unsafe_int8_weights",
]

DEFAULT_INT8_SCHEME: Int8Scheme = "u8u8"
INT16_MAX = 32767
#: the largest |int8 weight code| that no uint8 activation pair can push past INT16_MAX: 2 * 255 * 64 = 32,640
SAFE_INT8_CODE = 64


def quantize_int8_columns(w_t: np.ndarray, qmax: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """``(codes int8 [in, out], scales float32 [out])`` of ``W^T [in, out]``, symmetric per column (see module);
    ``qmax`` 127 (full range) or 63 (``"u8s7"``)."""
    if qmax not in (63, 127):
        raise BackendError(f"qmax must be 63 or 127; got {qmax!r}")
    w = np.asarray(w_t, np.float32)
    absmax = np.maximum(np.abs(np.minimum(w.min(axis=0), 0)), np.maximum(w.max(axis=0), 0)).astype(np.float64)
    scale64 = (absmax - (-absmax)) / float(2 * qmax)
    scale = scale64.astype(np.float32)
    scale[scale64 < np.finfo(np.float32).tiny] = 1.0
    lo = -128 if qmax == 127 else -qmax
    codes = np.empty(w.shape, np.int8)
    step = max(1, (1 << 22) // max(1, w.shape[1]))  # rows per chunk: float32 temporaries of at most 16 MiB
    for r in range(0, w.shape[0], step):
        q = np.round(w[r : r + step] / scale)
        codes[r : r + step] = np.clip(q, lo, qmax).astype(np.int8)
    return codes, scale


def _weight_codes(w_t: np.ndarray, scheme: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes, scales, zero points)`` of ``W^T`` stored as ``scheme`` (module docstring)."""
    if scheme not in INT8_SCHEMES:
        raise BackendError(f"int8 scheme {scheme!r} is not supported; supported: {', '.join(INT8_SCHEMES)}")
    codes, scale = quantize_int8_columns(w_t, 63 if scheme == "u8s7" else 127)
    if scheme == "u8u8":
        return (codes.view(np.uint8) ^ np.uint8(0x80)), scale, np.full(scale.shape, 128, np.uint8)  # q + 128
    return codes, scale, np.zeros(scale.shape, np.int8)


def int8_matmul(
    g: GraphBuilder,
    xin: str,
    w_t: np.ndarray,
    key: str,
    quantized_inputs: dict[str, list[str]],
    out: str | None,
    scheme: str = DEFAULT_INT8_SCHEME,
) -> str:
    """``xin @ W^T`` with int8 weights ``key_quantized`` / ``key_scale`` / ``key_zero_point`` stored as ``scheme``;
    the activation quantization of ``xin`` is created once and kept in ``quantized_inputs``. Returns the output."""
    codes, scale, zero = _weight_codes(w_t, scheme)
    del w_t
    q = g.init(f"{key}_quantized", codes)
    s = g.init(f"{key}_scale", scale)
    z = g.init(f"{key}_zero_point", zero)
    if xin not in quantized_inputs:
        quantized_inputs[xin] = g.ops("DynamicQuantizeLinear", [xin], 3)
    x_q, x_scale, x_zero = quantized_inputs[xin]
    scales = g.op("Mul", x_scale, s)
    acc = g.op("MatMulInteger", x_q, q, x_zero, z)
    return g.op("Mul", g.op("Cast", acc, to=TensorProto.FLOAT), scales, name=out)


def saturating_u8s8_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w`` (uint8 ``[M, K]`` by int8 ``[K, N]``, int32 out) as x86 CPUs without VNNI compute it:
    ``vpmaddubsw`` adds the products of inputs ``2j`` and ``2j+1`` into an int16 that saturates (to
    -32,768..32,767), then ``vpmaddwd`` / ``vpaddd`` add the pairs in int32 (an odd K is padded with a zero). A numpy
    reference of the arithmetic, for tests and audits; it equals onnxruntime's ``MatMulInteger`` on an AVX2-only
    CPU."""
    a, w = np.asarray(a), np.asarray(w)
    if a.dtype != np.uint8 or w.dtype != np.int8 or a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[0]:
        raise BackendError(
            f"saturating_u8s8_matmul needs uint8 [M, K] and int8 [K, N]; got {a.dtype}{a.shape}, {w.dtype}{w.shape}"
        )
    if a.shape[1] % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        w = np.pad(w, ((0, 1), (0, 0)))
    a32, w32 = a.astype(np.int32), w.astype(np.int32)
    pairs = a32[:, 0::2, None] * w32[None, 0::2, :] + a32[:, 1::2, None] * w32[None, 1::2, :]  # [M, K/2, N]
    return np.clip(pairs, -32768, INT16_MAX).sum(axis=1, dtype=np.int64).astype(np.int32)


def int16_pair_safe(codes: np.ndarray) -> bool:
    """Whether ``codes`` (the weights of a ``MatMulInteger``) give the same integers on every x86 CPU: uint8
    weights run on widening kernels (never clip); int8 weights are safe when no pair of uint8 activations (<= 255)
    times two codes can pass 32,767, i.e. every ``|code| <= 64`` (whatever the kernel's pairing of inputs)."""
    codes = np.asarray(codes)
    if codes.dtype == np.uint8:
        return True
    if codes.dtype != np.int8:
        raise BackendError(f"int16_pair_safe takes int8 or uint8 codes; got {codes.dtype}")
    return codes.size == 0 or int(np.abs(codes.astype(np.int16)).max()) <= SAFE_INT8_CODE


def unsafe_int8_weights(proto: onnx.ModelProto) -> list[str]:
    """The weight initializers of ``proto``'s ``MatMulInteger`` / ``DynamicQuantizeMatMul`` nodes that CPUs without
    VNNI compute differently (``int16_pair_safe`` is False); [] for a graph that is exact on every x86 CPU."""
    inits = {t.name: t for t in proto.graph.initializer}
    bad = []
    for node in proto.graph.node:
        if node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") and node.input[1] in inits:
            if not int16_pair_safe(numpy_helper.to_array(inits[node.input[1]])):
                bad.append(node.input[1])
    return bad


def to_u8u8(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every int8 ``MatMulInteger`` weight (and its int8 zero point) stored as uint8 + 128: the same
    integers, computed exactly on every x86 CPU (module docstring). Changes ``proto`` in place and returns it."""
    inits = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type != "MatMulInteger" or len(node.input) < 4:
            continue
        for name in (node.input[1], node.input[3]):
            t = inits.get(name)
            if t is None or t.data_type != TensorProto.INT8:
                continue  # a weight computed in the graph, or converted already (a shared zero point)
            shifted = numpy_helper.to_array(t).view(np.uint8) ^ np.uint8(0x80)
            t.CopyFrom(numpy_helper.from_array(shifted, name))
    return proto
