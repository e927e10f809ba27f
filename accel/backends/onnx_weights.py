"""Weights in an accel ONNX graph: float initializers, MX-packed weights decoded in the graph, MatMulNBits.

Weight storage per tensor:
- ``np.ndarray``: stored as float32, or float16 when ``float_dtype="fp16"`` (with an in-graph Cast to float32);
- ``MXTensor`` (2-D ``[out, in]``, blocked along ``in``): packed codes + E8M0 scales as uint8 initializers, decoded in
  the graph with standard ops (BitShift/BitwiseAnd/BitwiseOr on uint8, a 2**bits-entry Gather LUT for the elements, a
  256-entry LUT for the scales, Mul, Reshape, Slice, Transpose). onnxruntime constant-folds the decode at load time.
  With ``nbits_accuracy`` set, an MXINT8, MXFP6 (E2M3) or MXFP4 (E2M1) weight instead feeds onnxruntime's
  ``com.microsoft.MatMulNBits`` (8 bits, blocks of 32, zero point 128): every element of these formats is an integer
  multiple of the format's smallest step (2^-6, 2^-3, 2^-1) that fits in int8 (at most 127, 60, 12 steps), so the
  uint8 code is ``value / step + 128`` and the float32 block scale ``2^(E - 127) * step``: the MX values exactly.
  onnxruntime (only) runs it on int8 activations quantized per block (``accuracy_level=4``) or float32 activations
  (``accuracy_level=1``). The 4-bit MatMulNBits cannot hold E2M1 (its 15 magnitudes x 2 need 25 integer levels
  from -12 to 12, a uint4 code has 16), nor can 8 bits hold E3M2 (28 / 2^-4 = 448 steps).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from onnx import TensorProto

from accel.backends.onnx_builder import GraphBuilder
from accel.backends.onnx_int8 import int8_matmul
from accel.backends.onnx_mxlinear import mx_linear
from accel.errors import BackendError
from accel.formats.ggml import GGMLTensor
from accel.models.config import MASKED_LOGIT

__all__ = ["GraphWeights", "decode_mx", "nbits_blocks", "nbits_step", "restricted_logits"]

_E8M0_BIAS, _E8M0_NAN = 127, 0xFF  # OCP MX v1.0 §5.4 (docs/reference.md §1)


def decode_mx(g: GraphBuilder, name: str, mx: Any) -> str:
    """In-graph decode of an MXTensor ``[out, in]`` blocked on axis 1; returns the name of W^T ``[in, out]`` fp32."""
    if len(mx.shape) != 2 or mx.axis != 1:
        raise BackendError(
            f"MX weight {name!r}: need a 2-D [out, in] tensor blocked along axis 1; got {mx.shape} axis {mx.axis}"
        )
    out_f, in_f = mx.shape
    bits, bs, nblocks = mx.fmt.bits, mx.block_size, mx.nblocks
    codes = g.init(f"{name}.codes", mx.codes)
    scales = g.init(f"{name}.scales", mx.scales)
    u8 = lambda v: g.const([v], np.uint8)  # noqa: E731
    shr = lambda x, k: g.op("BitShift", x, u8(k), direction="RIGHT")  # noqa: E731
    shl = lambda x, k: g.op("BitShift", x, u8(k), direction="LEFT")  # noqa: E731
    band = lambda x, m: g.op("BitwiseAnd", x, u8(m))  # noqa: E731
    bor = lambda a, b: g.op("BitwiseOr", a, b)  # noqa: E731
    if bits == 8:
        elems = codes
    elif bits == 4:  # two per byte, first element in the low nibble (docs/reference.md §1)
        b = g.op("Unsqueeze", codes, g.const([1]))
        elems = g.op("Concat", band(b, 0x0F), shr(b, 4), axis=1)
    elif bits == 6:  # 4 codes in 3 bytes, LSB-first stream (onnx.proto FP6 packing, docs/reference.md §1)
        b = g.op("Reshape", codes, g.const([-1, 3]))
        b0, b1, b2 = g.ops("Split", [b, g.const([1, 1, 1])], 3, axis=1)
        x0 = band(b0, 0x3F)
        x1 = bor(shr(b0, 6), shl(band(b1, 0x0F), 2))
        x2 = bor(shr(b1, 4), shl(band(b2, 0x03), 4))
        x3 = shr(b2, 2)
        elems = g.op("Concat", x0, x1, x2, x3, axis=1)
    else:
        raise BackendError(f"MX weight {name!r}: {bits}-bit elements cannot be decoded in the graph (4, 6, 8 allowed)")
    lut = g.const(mx.fmt.code_values().astype(np.float32), np.float32)
    values = g.op("Gather", lut, g.op("Cast", elems, to=TensorProto.INT32), axis=0)
    values = g.op("Reshape", values, g.const([out_f, nblocks, bs]))
    scale_lut = np.ldexp(1.0, np.arange(256) - _E8M0_BIAS)  # float64: 2**128 (code 255) is NaN anyway
    scale_lut[_E8M0_NAN] = np.nan
    scale_lut = scale_lut.astype(np.float32)
    scale = g.op("Gather", g.const(scale_lut, np.float32), g.op("Cast", scales, to=TensorProto.INT32), axis=0)
    w = g.op("Mul", values, g.op("Unsqueeze", scale, g.const([2])))
    w = g.op("Reshape", w, g.const([out_f, nblocks * bs]))
    if nblocks * bs != in_f:
        w = g.op("Slice", w, g.const([0]), g.const([in_f]), g.const([1]))
    return g.op("Transpose", w, perm=[1, 0], name=f"{name}.T")


class GraphWeights:
    """Hands out graph names for weights, storing each once (tied embeddings share one initializer)."""

    def __init__(
        self,
        g: GraphBuilder,
        tensors: Mapping[str, Any],
        float_dtype: str,
        tied: bool,
        nbits_accuracy: int = 0,
        int8: str | None = None,
        mx_kernel: int = 0,
    ) -> None:
        """``nbits_accuracy``: 0 (MX weights as MatMul on in-graph decodes) or the ``MatMulNBits`` ``accuracy_level``
        (1: float32 activations, 4: int8 activations per block) that runs every MX Linear weight. ``int8``: None, or
        every Linear as int8 weights stored as this scheme, with dynamic activation quantization
        (``accel.backends.onnx_int8``). ``mx_kernel``: 0, or
        every MX Linear weight packed, on accel's fused kernel (``ai.accel::MXLinear``) with float32 activations
        (32, or True) or int8 activations per block (8)."""
        self.g, self.tensors, self.fp16, self.tied = g, tensors, float_dtype == "fp16", tied
        self.nbits = nbits_accuracy
        self.int8 = int8
        self.kernel = mx_kernel
        self._done: dict[str, str] = {}
        self._quantized_inputs: dict[str, list[str]] = {}

    def gated(self, xin: str, gate: str, up: str) -> str | None:
        """``silu(xin @ gate^T) * (xin @ up^T)`` as one gated ``ai.accel::MXLinear`` (``mx_linear``'s ``glu``) where
        both weights run on the kernel in one node (``mx_kernel``, one layout, one shape); None otherwise (the caller
        writes the MatMuls, the activation and the product)."""
        if not self.kernel or self.nbits or self.int8 is not None:
            return None
        ts = [self._get(gate), self._get(up)]
        if not kernel_runs(ts) or ts[0].shape != ts[1].shape:
            return None
        return mx_linear(self.g, xin, [gate, up], ts, None, act_bits=8 if self.kernel == 8 else 32, glu=True)

    def linear(self, xin: str, *names: str, out: str | None = None) -> str:
        """``xin @ W^T`` for the Linear weight ``names[0]``, or for several weights with the same input features
        concatenated along their outputs (one MatMul for q/k/v; each output column is the same dot product as in
        separate MatMuls). A MatMul, or (``nbits_accuracy``) a MatMulNBits on the MX codes, or (``mx_kernel``) an
        ``ai.accel::MXLinear`` on the packed codes, or (``int8``) int8 weights with dynamic activation quantization."""
        if self.int8 is not None:
            parts = [np.asarray(self._get(n), np.float32).T for n in names]
            w_t = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)  # one weight: no copy
            return int8_matmul(self.g, xin, w_t, "+".join(names), self._quantized_inputs, out, self.int8)
        ts = [None if (n == "lm_head.weight" and self.tied) else self._get(n) for n in names]
        if self.nbits and all(hasattr(t, "codes") for t in ts):
            return self._matmul_nbits(xin, names, ts, out)
        bits = 8 if self.kernel == 8 else 32  # the kernel's activations
        if self.kernel and kernel_runs(ts):
            return mx_linear(self.g, xin, names, ts, out, act_bits=bits)
        if self.kernel and len(ts) > 1 and all(isinstance(t, GGMLTensor) for t in ts):
            # a group of llama.cpp blocks of several types (a GGUF's Q5_0 q/k beside a Q8_0 v): one MXLinear a
            # weight, outputs joined (each column the same dot product as in the weight's own node)
            parts = [mx_linear(self.g, xin, [n], [t], None, act_bits=bits) for n, t in zip(names, ts, strict=True)]
            return self.g.op("Concat", *parts, axis=-1, name=out)
        if len(names) == 1:  # the loaded tensor is passed on: each weight is read (and converted) once
            return self.g.op("MatMul", xin, self.matmul_t(names[0], ts[0]), name=out)
        if any(hasattr(t, "codes") for t in ts):  # MX-packed: decoded separately, joined (folded at session creation)
            parts = [self.matmul_t(n, t) for n, t in zip(names, ts, strict=True)]
            return self.g.op("MatMul", xin, self.g.op("Concat", *parts, axis=1), name=out)
        joined = np.concatenate([np.asarray(t, np.float32).T for t in ts], axis=1)  # one initializer [in, sum(out)]
        key = "+".join(names)
        if self.fp16:
            w = self.g.op("Cast", self.g.init(key, joined.astype(np.float16)), to=TensorProto.FLOAT)
        else:
            w = self.g.init(key, joined)
        return self.g.op("MatMul", xin, w, name=out)

    def bias(self, *names: str) -> str:
        """The biases of ``names`` concatenated (one Add after a joined ``linear``)."""
        if len(names) == 1:
            return self.plain(names[0])
        joined = np.concatenate([np.asarray(self._get(n), np.float32) for n in names])
        if self.fp16:
            return self.g.op("Cast", self.g.init("+".join(names), joined.astype(np.float16)), to=TensorProto.FLOAT)
        return self.g.init("+".join(names), joined)

    def _matmul_nbits(self, xin: str, names: tuple[str, ...], ts: list[Any], out: str | None) -> str:
        codes, scales = [], []
        for name, t in zip(names, ts, strict=True):
            c, sc = nbits_blocks(name, t)
            codes.append(c)
            scales.append(sc)
        if len({t.shape[1] for t in ts}) != 1:
            raise BackendError(f"weights {names} have different input features; they cannot share one MatMulNBits")
        key = "+".join(names)
        self.g.init(f"{key}.q", np.concatenate(codes))
        self.g.init(f"{key}.block_scales", np.concatenate(scales).reshape(-1))
        self.g.opsets.add("com.microsoft")
        return self.g.op(
            "MatMulNBits",
            xin,
            f"{key}.q",
            f"{key}.block_scales",
            name=out,
            domain="com.microsoft",
            K=ts[0].shape[1],
            N=sum(t.shape[0] for t in ts),
            bits=8,
            block_size=32,
            accuracy_level=self.nbits,
        )

    def _get(self, name: str) -> Any:
        if name not in self.tensors:
            raise BackendError(f"weight {name!r} is missing from the model")
        return self.tensors[name]

    def plain(self, name: str) -> str:
        """A float tensor as stored (fp32, or fp16 + Cast)."""
        if name in self._done:
            return self._done[name]
        t = self._get(name)
        if hasattr(t, "dequantize"):
            t = t.dequantize(np.float32)
        if self.fp16:
            out = self.g.op("Cast", self.g.init(name, np.asarray(t, np.float16)), to=TensorProto.FLOAT)
        else:
            out = self.g.init(name, np.asarray(t, np.float32))
        self._done[name] = out
        return out

    def matmul_t(self, name: str, loaded: Any = None) -> str:
        """``W^T [in, out]`` of a Linear weight ``[out, in]`` (decoded in-graph when it is an MXTensor); ``loaded``:
        the tensor if the caller already has it."""
        key = name + ":T"
        if key in self._done:
            return self._done[key]
        if name == "lm_head.weight" and self.tied:
            t = None
        else:
            t = loaded if loaded is not None else self._get(name)
        if isinstance(t, GGMLTensor):  # llama.cpp blocks outside the kernel: their exact values, stored float32
            t = t.dequantize(np.float32)
        if hasattr(t, "codes") and hasattr(t, "scales"):
            out = decode_mx(self.g, name, t)
        elif name == "lm_head.weight" and self.tied:
            out = self.g.op("Transpose", self.plain("embed_tokens.weight"), perm=[1, 0])  # tied: one initializer
        elif self.fp16:
            out = self.g.op("Cast", self.g.init(name, np.asarray(t, np.float16).T), to=TensorProto.FLOAT)
        else:
            out = self.g.init(name, np.asarray(t, np.float32).T)
        self._done[key] = out
        return out


def kernel_runs(ts: list[Any]) -> bool:
    """Whether one ``MXLinear`` runs the weights ``ts`` joined: all MX tensors, or all llama.cpp blocks of one kernel
    layout (``GGMLTensor``; a group that mixes layouts, as GGUF files often do, runs one ``MXLinear`` a weight)."""
    if all(isinstance(t, GGMLTensor) for t in ts):
        return len({t.qtype.name for t in ts}) == 1
    return all(hasattr(t, "codes") and not isinstance(t, GGMLTensor) for t in ts)


def nbits_step(fmt: Any) -> float | None:
    """The element step (a power of two) that makes every finite value of the MX element format ``fmt`` an integer in
    [-128, 127], so that 8-bit ``MatMulNBits`` codes (zero point 128) hold it exactly; None if there is none (E3M2,
    the FP8 formats). MXINT8: 2^-6, MXFP6 E2M3: 2^-3, MXFP4 E2M1: 2^-1 (docs/reference.md §1)."""
    values = fmt.code_values().astype(np.float64)
    finite = values[np.isfinite(values)]
    step = float(np.min(np.abs(finite[finite != 0])))
    ints = finite / step
    if len(finite) != len(values) or np.any(ints != np.round(ints)) or ints.min() < -128 or ints.max() > 127:
        return None
    return step


def nbits_blocks(name: str, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """The 8-bit ``MatMulNBits`` form of the MX weight ``t`` ``[out, in]`` (blocks of 32 along ``in``): uint8 codes
    ``[out, blocks, 32]`` (value / step + 128) and float32 scales ``[out, blocks]`` (2^(E - 127) * step, NaN for the
    NaN scale code), which represent the MX values exactly."""
    step = nbits_step(t.fmt) if t.fmt.bits <= 8 else None
    if step is None or len(t.shape) != 2 or t.axis != 1 or t.block_size != 32:
        raise BackendError(
            f"MatMulNBits weight {name!r}: need a 2-D MXINT8, MXFP6 (E2M3) or MXFP4 (E2M1) [out, in] tensor in "
            f"blocks of 32 along in; got {t.fmt.name} {t.shape} axis {t.axis} blocks of {t.block_size}"
        )
    lut = np.round(t.fmt.code_values().astype(np.float64) / step).astype(np.int16) + 128  # code -> uint8 level
    c = lut[t.unpacked_codes()].astype(np.uint8).reshape(t.shape[0], t.nblocks, 32)
    sc = np.ldexp(step, t.scales.astype(np.int64) - _E8M0_BIAS)  # exact in float64; in float32 down to 2^-149
    sc[t.scales == _E8M0_NAN] = np.nan
    return c, sc.astype(np.float32).reshape(t.shape[0], t.nblocks)


def restricted_logits(g: GraphBuilder, scored: str, tensors: Mapping[str, Any], vocab: int) -> str:
    """``logits [B, N, vocab]``: ``MASKED_LOGIT`` everywhere, the head's ``scored [B, N, head_vocab]`` scattered at
    the ``lm_head_token_ids`` initializer (ScatterElements on axis 2 into an Expand of the constant)."""
    if "lm_head_token_ids" not in tensors:
        raise BackendError("weight 'lm_head_token_ids' is missing from the model (config has head_vocab > 0)")
    ids = np.asarray(tensors["lm_head_token_ids"], np.int64)
    shape = g.op("Shape", scored)  # [B, N, head_vocab]
    full_shape = g.op("Concat", g.op("Slice", shape, g.const([0]), g.const([2])), g.const([vocab]), axis=0)
    base = g.op("Expand", g.const([MASKED_LOGIT], np.float32), full_shape)
    index = g.op("Expand", g.init("lm_head_token_ids", ids), shape)
    return g.op("ScatterElements", base, index, scored, axis=2, name="logits")
