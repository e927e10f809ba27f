"""Build the ONNX graph of a decoder with the position-indexed KV-cache contract (REFERENCE.md §2), from numpy weights.

The graph computes what ``accel.models.decoder.Decoder.forward`` computes (same masking, same RoPE, same op order in
the layers), so ORT and torch agree to fp32 rounding; the cache write is an exact ScatterND of each new row at its
slot (in place under ``OrtBackend``). No torch is needed here: weights arrive as float32 numpy arrays or ``MXTensor``
objects, keyed by ``Decoder`` state-dict names.

Weight storage per tensor:
- ``np.ndarray``: stored as float32, or float16 when ``float_dtype="fp16"`` (with an in-graph Cast to float32);
- ``MXTensor`` (2-D ``[out, in]``, blocked along ``in``): packed codes + E8M0 scales as uint8 initializers, decoded in
  the graph with standard ops (BitShift/BitwiseAnd/BitwiseOr on uint8, a 2**bits-entry Gather LUT for the elements, a
  256-entry LUT for the scales, Mul, Reshape, Slice, Transpose). onnxruntime constant-folds the decode at load time.
  With ``matmul_nbits=True`` an MXINT8 weight instead feeds onnxruntime's ``com.microsoft.MatMulNBits`` (8 bits,
  blocks of 32): its uint8 codes are the MXINT8 codes + 128 and its float32 scales the block scales times 2^-6, which
  represent the MXINT8 values exactly; onnxruntime (only) runs it on int8 activations quantized per block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from accel.errors import BackendError

__all__ = ["IR_VERSION", "OPSET", "build_decoder_graph"]

OPSET = 18  # BitwiseAnd/Or need 18; LayerNormalization 17
IR_VERSION = 8  # the IR of opset 18; stock onnxruntime rejects IR 14 (REFERENCE.md §1)
_E8M0_BIAS, _E8M0_NAN = 127, 0xFF  # OCP MX v1.0 §5.4 (REFERENCE.md §1)


class _G:
    """Accumulates nodes and initializers; ``op`` returns the output name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[tuple, str] = {}
        self._n = 0
        self.opsets: set[str] = set()  # non-standard domains used (com.microsoft for MatMulNBits)

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs: Any) -> str:
        self._n += 1
        out = name or f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"n{self._n}_{op_type}", **attrs))
        return out

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs: Any) -> list[str]:
        self._n += 1
        outs = [f"{op_type.lower()}_{self._n}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"n{self._n}_{op_type}", **attrs))
        return outs

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        """A small shared constant initializer."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", arr)
        return self._consts[key]


# ---------------------------------------------------------------------------------------------- weights


def _decode_mx(g: _G, name: str, mx: Any) -> str:
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
    elif bits == 4:  # two per byte, first element in the low nibble (REFERENCE.md §1)
        b = g.op("Unsqueeze", codes, g.const([1]))
        elems = g.op("Concat", band(b, 0x0F), shr(b, 4), axis=1)
    elif bits == 6:  # 4 codes in 3 bytes, LSB-first stream (onnx.proto FP6 packing, REFERENCE.md §1)
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


class _Weights:
    """Hands out graph names for weights, storing each once (tied embeddings share one initializer)."""

    def __init__(self, g: _G, tensors: Mapping[str, Any], float_dtype: str, tied: bool, nbits: bool = False) -> None:
        self.g, self.tensors, self.fp16, self.tied, self.nbits = g, tensors, float_dtype == "fp16", tied, nbits
        self._done: dict[str, str] = {}

    def linear(self, xin: str, *names: str, out: str | None = None) -> str:
        """``xin @ W^T`` for the Linear weight ``names[0]``, or for several weights with the same input features
        concatenated along their outputs (one MatMul for q/k/v; each output column is the same dot product as in
        separate MatMuls). A MatMul, or (``nbits``) a MatMulNBits on MXINT8 codes."""
        ts = [None if (n == "lm_head.weight" and self.tied) else self._get(n) for n in names]
        if self.nbits and all(hasattr(t, "codes") for t in ts):
            return self._matmul_nbits(xin, names, ts, out)
        if len(names) == 1:
            return self.g.op("MatMul", xin, self.matmul_t(names[0]), name=out)
        if any(hasattr(t, "codes") for t in ts):  # MX-packed: decoded separately, joined (folded at session creation)
            return self.g.op("MatMul", xin, self.g.op("Concat", *[self.matmul_t(n) for n in names], axis=1), name=out)
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
            if t.fmt.name != "mxint8" or len(t.shape) != 2 or t.axis != 1 or t.block_size != 32:
                raise BackendError(
                    f"MatMulNBits weight {name!r}: need a 2-D MXINT8 [out, in] tensor in blocks of 32 "
                    f"along in; got {t.fmt.name} {t.shape} axis {t.axis} blocks of {t.block_size}"
                )
            c = t.unpacked_codes().view(np.int8).astype(np.int16) + 128  # MXINT8 two's complement -> zero point 128
            sc = np.ldexp(1.0, t.scales.astype(np.int64) - _E8M0_BIAS - 6)  # element step 2^-6 (REFERENCE.md §1)
            sc[t.scales == _E8M0_NAN] = np.nan
            codes.append(c.astype(np.uint8).reshape(t.shape[0], t.nblocks, 32))
            scales.append(sc.astype(np.float32).reshape(t.shape[0], t.nblocks))
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
            accuracy_level=4,
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

    def matmul_t(self, name: str) -> str:
        """``W^T [in, out]`` of a Linear weight ``[out, in]`` (decoded in-graph when it is an MXTensor)."""
        key = name + ":T"
        if key in self._done:
            return self._done[key]
        t = None if (name == "lm_head.weight" and self.tied) else self._get(name)
        if hasattr(t, "codes") and hasattr(t, "scales"):
            out = _decode_mx(self.g, name, t)
        elif name == "lm_head.weight" and self.tied:
            out = self.g.op("Transpose", self.plain("embed_tokens.weight"), perm=[1, 0])  # tied: one initializer
        elif self.fp16:
            out = self.g.op("Cast", self.g.init(name, np.asarray(t, np.float16).T), to=TensorProto.FLOAT)
        else:
            out = self.g.init(name, np.asarray(t, np.float32).T)
        self._done[key] = out
        return out


def _restricted_logits(g: _G, scored: str, tensors: Mapping[str, Any], vocab: int) -> str:
    """``logits [B, N, vocab]``: ``MASKED_LOGIT`` everywhere, the head's ``scored [B, N, head_vocab]`` scattered at
    the ``lm_head_token_ids`` initializer (ScatterElements on axis 2 into an Expand of the constant)."""
    from accel.models.config import MASKED_LOGIT  # numpy only

    if "lm_head_token_ids" not in tensors:
        raise BackendError("weight 'lm_head_token_ids' is missing from the model (config has head_vocab > 0)")
    ids = np.asarray(tensors["lm_head_token_ids"], np.int64)
    shape = g.op("Shape", scored)  # [B, N, head_vocab]
    full_shape = g.op("Concat", g.op("Slice", shape, g.const([0]), g.const([2])), g.const([vocab]), axis=0)
    base = g.op("Expand", g.const([MASKED_LOGIT], np.float32), full_shape)
    index = g.op("Expand", g.init("lm_head_token_ids", ids), shape)
    return g.op("ScatterElements", base, index, scored, axis=2, name="logits")


# ---------------------------------------------------------------------------------------------- graph


def build_decoder_graph(
    config: Any,
    tensors: Mapping[str, Any],
    *,
    ctx_len: int,
    batch_size: int,
    num_logits: int | None = None,
    float_dtype: str = "fp32",
    progress: Callable[[int], None] | None = None,
    hidden_output: bool = False,
    matmul_nbits: bool = False,
) -> onnx.ModelProto:
    """The ONNX model of a ``Decoder`` with ``config`` (an ``accel.models.ModelConfig``) and weights ``tensors``.

    Inputs ``input_ids``/``position_ids`` int64 ``[batch_size, seq_len]`` (``seq_len`` dynamic), ``past_key.{i}`` /
    ``past_value.{i}`` float32 ``[batch_size, H_kv, ctx_len, head_dim]``. Outputs ``logits`` float32
    ``[batch_size, seq_len or num_logits, vocab]`` and ``past_key.{i}_RetainedState`` /
    ``past_value.{i}_RetainedState``.
    ``hidden_output`` (always on for a feature draft, ``config.feature_size > 0``) adds the output ``hidden_states``
    float32 ``[batch_size, seq_len, hidden]``: the final-norm hidden state of every column. A feature draft also has
    the input ``features`` float32 ``[batch_size, seq_len, feature_size]`` (see ``Decoder.embed``).
    ``progress(1)`` is called once per layer. ``matmul_nbits``: MXINT8 weights as onnxruntime ``MatMulNBits`` nodes
    (see the module docstring).
    """
    c = config
    g = _G()
    w = _Weights(
        g, tensors, float_dtype, tied=c.tie_word_embeddings and "lm_head.weight" not in tensors, nbits=matmul_nbits
    )
    B, H, Hkv, D = batch_size, c.num_heads, c.num_kv_heads, c.head_dim
    groups = H // Hkv
    kv_shape = [B, Hkv, ctx_len, D]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, "seq_len"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [B, "seq_len"]),
    ]
    outputs = [
        helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, [B, num_logits if num_logits else "seq_len", c.vocab_size]
        )
    ]
    fs = getattr(c, "feature_size", 0)
    hidden_output = hidden_output or bool(fs)
    if fs:
        inputs.append(helper.make_tensor_value_info("features", TensorProto.FLOAT, [B, "seq_len", fs]))
    if hidden_output:
        outputs.append(helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [B, "seq_len", c.hidden_size]))
    for i in range(c.num_layers):
        inputs += [
            helper.make_tensor_value_info(f"past_{kv}.{i}", TensorProto.FLOAT, kv_shape) for kv in ("key", "value")
        ]
    for i in range(c.num_layers):
        outputs += [
            helper.make_tensor_value_info(f"past_{kv}.{i}_RetainedState", TensorProto.FLOAT, kv_shape)
            for kv in ("key", "value")
        ]

    f32 = lambda v: g.const(v, np.float32)  # noqa: E731
    pos = "position_ids"
    # embeddings (GPT-2 adds learned positions; padding positions -1 are clamped to 0 as in Decoder.embed)
    x = g.op("Gather", w.plain("embed_tokens.weight"), "input_ids", axis=0)
    if c.positions == "learned":
        pos0 = g.op("Max", pos, g.const(0))
        x = g.op("Add", x, g.op("Gather", w.plain("embed_positions.weight"), pos0, axis=0))
    if fs:  # feature draft: fc(concat(embed(token), feature))
        x = g.op("MatMul", g.op("Concat", x, "features", axis=-1), w.matmul_t("fc.weight"))
    # additive mask [B, 1, 1, S, ctx]: 0 where slot <= position, float32 min elsewhere (padding sees nothing)
    visible = g.op(
        "LessOrEqual",
        g.const(np.arange(ctx_len).reshape(1, 1, 1, 1, ctx_len)),
        g.op("Unsqueeze", pos, g.const([1, 2, 4])),
    )
    mask = g.op("Where", visible, f32(0.0), f32(np.finfo(np.float32).min))
    # cache write (REFERENCE.md §2): ScatterND of each token's K/V row at its slot. A padding column
    # (position -1) must write nothing; it is sent to a slot q that no real token of its row writes in this call
    # (min valid position - 1, else max valid position + 1) with that slot's current value, a no-op. Rows that are
    # all padding use q = ctx - 1. (OrtBackend rejects the one layout with no free slot: a padded row whose valid
    # positions include both 0 and ctx - 1.)
    valid = g.op("GreaterOrEqual", pos, g.const(0))
    lo = g.op("ReduceMin", g.op("Where", valid, pos, g.const(ctx_len)), g.const([1]), keepdims=1)  # [B, 1]
    hi = g.op("ReduceMax", g.op("Where", valid, pos, g.const(-1)), g.const([1]), keepdims=1)
    free = g.op(
        "Where", g.op("GreaterOrEqual", lo, g.const(1)), g.op("Sub", lo, g.const(1)), g.op("Add", hi, g.const(1))
    )
    free = g.op("Min", free, g.const(ctx_len - 1))
    slot = g.op("Where", valid, pos, free)  # [B, S]
    # ScatterND indices [B, Hkv, S, 3] = (batch, head, slot): each update is one contiguous head_dim row
    seq_shape = g.op("Shape", pos)  # [B, S]
    grid_shape = g.op(
        "Concat", g.const([B, Hkv]), g.op("Slice", seq_shape, g.const([1]), g.const([2])), g.const([1]), axis=0
    )
    b_idx = g.op("Expand", g.const(np.arange(B).reshape(B, 1, 1, 1)), grid_shape)
    h_idx = g.op("Expand", g.const(np.arange(Hkv).reshape(1, Hkv, 1, 1)), grid_shape)
    s_idx = g.op("Expand", g.op("Unsqueeze", slot, g.const([1, 3])), grid_shape)
    slot_idx = g.op("Concat", b_idx, h_idx, s_idx, axis=3)
    valid4 = g.op("Unsqueeze", valid, g.const([1, 3]))  # [B, 1, S, 1]

    def write_cache(cache: str, new: str, out: str) -> str:
        old = g.op("GatherND", cache, slot_idx)
        return g.op("ScatterND", cache, slot_idx, g.op("Where", valid4, new, old), name=out)

    rope = None
    if c.positions == "rope":
        from accel.models.config import rope_inv_freq  # numpy only (shared with the torch decoder)

        inv_freq = rope_inv_freq(c)
        freqs = g.op("Mul", g.op("Unsqueeze", g.op("Cast", pos, to=TensorProto.FLOAT), g.const([2])), f32(inv_freq))
        emb = g.op("Unsqueeze", g.op("Concat", freqs, freqs, axis=-1), g.const([1]))  # [B, 1, S, D]
        # [D, D]: +1 at (j, j + D/2) (out[j + D/2] = t[j]), -1 at (j + D/2, j) (out[j] = -t[j + D/2]); built from two
        # shifted identities rather than stored (onnxruntime folds it when the session is created)
        zeros = g.op("ConstantOfShape", g.const([D, D]), value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))
        half_turn = g.op(
            "Sub", g.op("EyeLike", zeros, k=D // 2), g.op("EyeLike", zeros, k=-(D // 2)), name="rope_half_turn"
        )
        rope = (g.op("Cos", emb), g.op("Sin", emb), half_turn)

    def linear(xin: str, prefix: str, bias: bool, *more: str) -> str:
        """``prefix``'s Linear (and the ``more`` prefixes', joined along the outputs) on ``xin``, + biases."""
        prefixes = (prefix, *more)
        y = w.linear(xin, *[f"{q}.weight" for q in prefixes])
        return g.op("Add", y, w.bias(*[f"{q}.bias" for q in prefixes])) if bias else y

    def norm(xin: str, prefix: str) -> str:
        if c.norm == "layer":
            return g.op(
                "LayerNormalization",
                xin,
                w.plain(f"{prefix}.weight"),
                w.plain(f"{prefix}.bias"),
                axis=-1,
                epsilon=float(c.norm_eps),
            )
        # x / sqrt(mean(x^2) + eps) * w, in the exact form onnxruntime fuses into one SimplifiedLayerNormalization
        # kernel (Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul); standard ONNX for every other runtime
        ms = g.op("ReduceMean", g.op("Pow", xin, f32(2.0)), g.const([-1]), keepdims=1)
        rms = g.op("Sqrt", g.op("Add", ms, f32(c.norm_eps)))
        return g.op("Mul", g.op("Div", xin, rms), w.plain(f"{prefix}.weight"))

    def apply_rope(t: str) -> str:
        assert rope is not None
        cos, sin, half_turn = rope
        # rotate_half(t) = concat(-t[D/2:], t[:D/2]) as one MatMul by a signed permutation: each output is one
        # input times +-1 plus exact zeros, so it is bit-exact, in one node instead of Split + Neg + Concat
        return g.op("Add", g.op("Mul", t, cos), g.op("Mul", g.op("MatMul", t, half_turn), sin))

    def heads(t: str, n: int) -> str:  # [B, S, n*D] -> [B, n, S, D]
        return g.op("Transpose", g.op("Reshape", t, g.const([0, 0, n, D])), perm=[0, 2, 1, 3])

    def act(t: str) -> str:
        if c.activation == "silu":
            return g.op("Mul", t, g.op("Sigmoid", t))
        inner = g.op(
            "Mul",
            f32(math.sqrt(2.0 / math.pi)),
            g.op("Add", t, g.op("Mul", f32(0.044715), g.op("Mul", t, g.op("Mul", t, t)))),
        )
        return g.op("Mul", g.op("Mul", f32(0.5), t), g.op("Add", f32(1.0), g.op("Tanh", inner)))

    scale = f32(1.0 / math.sqrt(D))
    for i in range(c.num_layers):
        p = f"layers.{i}"
        h = norm(x, f"{p}.input_layernorm")
        # q, k and v in one MatMul, one Reshape + Transpose to [B, H + 2 Hkv, S, D], RoPE on the q and k heads at once
        # (elementwise per head, so the same values as separately): 9 nodes per layer instead of 17
        qkv = heads(
            linear(h, f"{p}.self_attn.q_proj", c.qkv_bias, f"{p}.self_attn.k_proj", f"{p}.self_attn.v_proj"),
            H + 2 * Hkv,
        )
        if rope is not None:
            qk, v = g.ops("Split", [qkv, g.const([H + Hkv, Hkv])], 2, axis=1)
            q, k = g.ops("Split", [apply_rope(qk), g.const([H, Hkv])], 2, axis=1)
        else:
            q, k, v = g.ops("Split", [qkv, g.const([H, Hkv, Hkv])], 3, axis=1)
        kc = write_cache(f"past_key.{i}", k, f"past_key.{i}_RetainedState")
        vc = write_cache(f"past_value.{i}", v, f"past_value.{i}_RetainedState")
        qg = g.op("Reshape", q, g.const([0, Hkv, groups, -1, D]))  # [B, Hkv, G, S, D]: no repeat of the cache
        kt = g.op("Transpose", g.op("Unsqueeze", kc, g.const([2])), perm=[0, 1, 2, 4, 3])  # [B, Hkv, 1, D, ctx]
        scores = g.op("Add", g.op("Mul", g.op("MatMul", qg, kt), scale), mask)
        probs = g.op("Softmax", scores, axis=-1)
        o = g.op("MatMul", probs, g.op("Unsqueeze", vc, g.const([2])))  # [B, Hkv, G, S, D]
        o = g.op("Reshape", g.op("Transpose", o, perm=[0, 3, 1, 2, 4]), g.const([0, 0, H * D]))  # [B, S, H*D]
        x = g.op("Add", x, linear(o, f"{p}.self_attn.o_proj", c.o_bias))
        h = norm(x, f"{p}.post_attention_layernorm")
        if c.mlp == "gated":
            m = g.op("Mul", act(linear(h, f"{p}.mlp.gate_proj", c.mlp_bias)), linear(h, f"{p}.mlp.up_proj", c.mlp_bias))
        else:
            m = act(linear(h, f"{p}.mlp.up_proj", c.mlp_bias))
        x = g.op("Add", x, linear(m, f"{p}.mlp.down_proj", c.mlp_bias))
        if progress:
            progress(1)
    if hidden_output:  # every column's final-norm state is an output; the head reads the last num_logits of it
        head = norm(x, "norm")
        g.op("Identity", head, name="hidden_states")
        if num_logits:
            head = g.op("Slice", head, g.const([-num_logits]), g.const([np.iinfo(np.int64).max]), g.const([1]))
    else:
        if num_logits:
            x = g.op("Slice", x, g.const([-num_logits]), g.const([np.iinfo(np.int64).max]), g.const([1]))
        head = norm(x, "norm")
    if getattr(c, "head_vocab", 0):
        _restricted_logits(g, w.linear(head, "lm_head.weight"), tensors, c.vocab_size)
    else:
        w.linear(head, "lm_head.weight", out="logits")
    graph = helper.make_graph(g.nodes, "accel_decoder", inputs, outputs, g.inits)
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in sorted(g.opsets)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="accel")
    model.ir_version = IR_VERSION
    return model
