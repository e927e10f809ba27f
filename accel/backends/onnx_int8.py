"""int8 weights for drafts (``weights="int8"``): per-output-channel symmetric int8 weights with the operators of
onnxruntime's dynamic quantization, written by accel itself so that they stream like every other weight.

The weights and the graph are what ``onnxruntime.quantization.quantize_dynamic(weight_type=QInt8, per_channel=True,
op_types_to_quantize=["MatMul"])`` produces for a weight MatMul, bit for bit (the tests compare both):

- per column ``j`` of ``W^T [in, out]``: ``absmax_j = max(|min(W_j, 0)|, max(W_j, 0))``, the scale
  ``s_j = float32(2 absmax_j / 254)`` (computed in float64; 1.0 when below float32's smallest normal), the codes
  ``q = clip(round_half_even(W / s_j), -128, 127)`` as int8 (in float32 arithmetic), zero points 0;
- per call, ``DynamicQuantizeLinear`` quantizes the activations to uint8 per tensor (one per input, shared by the
  MatMuls that read it), ``MatMulInteger`` accumulates in int32, ``Cast`` and two ``Mul`` rescale; onnxruntime fuses
  the pattern into ``DynamicQuantizeMatMul`` when the session is created.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from accel.backends.onnx_builder import GraphBuilder

__all__ = ["int8_matmul", "quantize_int8_columns"]


def quantize_int8_columns(w_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes int8 [in, out], scales float32 [out])`` of ``W^T [in, out]``, symmetric per column (see module)."""
    w = np.asarray(w_t, np.float32)
    absmax = np.maximum(np.abs(np.minimum(w.min(axis=0), 0)), np.maximum(w.max(axis=0), 0))
    scale64 = (absmax.astype(np.float64) - (-absmax.astype(np.float64))) / 254.0
    scale = scale64.astype(np.float32)
    scale[scale64 < np.finfo(np.float32).tiny] = 1.0
    codes = np.empty(w.shape, np.int8)
    step = max(1, (1 << 22) // max(1, w.shape[1]))  # rows per chunk: float32 temporaries of at most 16 MiB
    for r in range(0, w.shape[0], step):
        q = np.round(w[r : r + step] / scale)
        codes[r : r + step] = np.clip(q, -128, 127).astype(np.int8)
    return codes, scale


def int8_matmul(
    g: GraphBuilder, xin: str, w_t: np.ndarray, key: str, quantized_inputs: dict[str, list[str]], out: str | None
) -> str:
    """``xin @ W^T`` with int8 weights ``key_quantized`` / ``key_scale`` / ``key_zero_point``; the activation
    quantization of ``xin`` is created once and kept in ``quantized_inputs``. Returns the output name."""
    codes, scale = quantize_int8_columns(w_t)
    del w_t
    q = g.init(f"{key}_quantized", codes)
    s = g.init(f"{key}_scale", scale)
    z = g.init(f"{key}_zero_point", np.zeros(scale.shape, np.int8))
    if xin not in quantized_inputs:
        quantized_inputs[xin] = g.ops("DynamicQuantizeLinear", [xin], 3)
    x_q, x_scale, x_zero = quantized_inputs[xin]
    scales = g.op("Mul", x_scale, s)
    acc = g.op("MatMulInteger", x_q, q, x_zero, z)
    return g.op("Mul", g.op("Cast", acc, to=TensorProto.FLOAT), scales, name=out)
