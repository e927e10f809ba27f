"""``DecoderGraph``: the pieces of a decoder's ONNX graph (inputs/outputs, embeddings, the attention mask, the
cache-write slots, RoPE, one block per layer, the final norm and the LM head), assembled by
``accel.backends.onnx_graph.build_decoder_graph`` and by Hydra++'s prefix layer (``accel.drafts.hydra.graph``).

The graph computes what ``accel.models.decoder.Decoder.forward`` computes (same masking, same RoPE, same op order in
the layers), so ORT and torch agree to fp32 rounding; the cache write is an exact ScatterND of each new row at its
slot (in place under ``OrtBackend``; docs/reference.md §2). No torch is needed here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from accel.backends.graph_spec import GraphSpec
from accel.backends.onnx_builder import ExternalData, GraphBuilder
from accel.backends.onnx_weights import GraphWeights, restricted_logits
from accel.backends.stages import StageSpec
from accel.backends.weights import WeightFormat
from accel.models.config import rope_inv_freq

__all__ = ["DecoderGraph"]


class DecoderGraph:
    """The state of one graph being built: the builder, the weights, the model's shapes and shared tensors."""

    def __init__(
        self, config: Any, tensors: Mapping[str, Any], spec: GraphSpec, external: ExternalData | None = None
    ) -> None:
        """The graph of ``spec`` for ``config`` (a ``ModelConfig``) and ``tensors``, writing initializers to
        ``external`` (an ``ExternalData``, or None: kept in the graph)."""
        c = self.c = config
        self.spec, self.fused, self.tree, self.mix_inputs = spec, bool(spec.ort_ops), spec.tree, spec.mix_inputs
        self.stage = spec.stage or StageSpec.whole(c.num_layers)
        self.g = g = GraphBuilder(external)
        tied = c.tie_word_embeddings and "lm_head.weight" not in tensors
        w = spec.export_weights
        self.w = GraphWeights(
            g,
            tensors,
            w.float_dtype,
            tied=tied,
            nbits_accuracy=w.accuracy_level if w.format.is_nbits else 0,
            int8=w.int8_scheme if w.format == WeightFormat.INT8 else None,
            mx_kernel=w.format.kernel_act_bits,
        )
        self.tensors, self.ctx_len, self.batch_size = tensors, spec.ctx_len, spec.batch_size
        self.feature_size = getattr(c, "feature_size", 0)
        self.hidden_output = spec.hidden_output or bool(self.feature_size)
        self.slot_idx = self.valid4 = ""
        self.rope_tables: tuple[str, str, str] | None = None

    def f32(self, value: Any) -> str:
        return self.g.const(value, np.float32)

    # ------------------------------------------------------------------ interface

    def io_spec(self, num_logits: int | None) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
        """Graph inputs and outputs (the cache contract, plus ``features`` / ``hidden_states`` where present)."""
        c, B, st = self.c, self.batch_size, self.stage
        kv_shape = [B, c.num_kv_heads, self.ctx_len, c.head_dim]
        value = helper.make_tensor_value_info
        first = value("input_ids", TensorProto.INT64, [B, "seq_len"])
        if not st.is_first:  # a later pipeline stage reads the previous stage's residual stream
            first = value("hidden_in", TensorProto.FLOAT, [B, "seq_len", c.hidden_size])
        inputs = [first, value("position_ids", TensorProto.INT64, [B, "seq_len"])]
        if self.spec.logits_input:  # the call's own count of last tokens with logits
            inputs.append(value("num_logits", TensorProto.INT64, [1]))
        rows = num_logits or ("num_logits" if self.spec.logits_input else "seq_len")
        logits = value("logits", TensorProto.FLOAT, [B, rows, c.vocab_size])
        outputs = [logits] if st.has_logits else []
        if not st.is_last:
            outputs.append(value("hidden_out", TensorProto.FLOAT, [B, "seq_len", c.hidden_size]))
        if self.feature_size and st.is_first:
            inputs.append(value("features", TensorProto.FLOAT, [B, "seq_len", self.feature_size]))
        if self.tree:
            inputs.append(value("slot_ids", TensorProto.INT64, [B, "seq_len"]))
            inputs.append(value("tree_mask", TensorProto.BOOL, [B, "seq_len", self.ctx_len]))
        if self.mix_inputs:
            inputs.append(value("mix_ids", TensorProto.INT64, [B, "seq_len", "mix"]))
            inputs.append(value("mix_weights", TensorProto.FLOAT, [B, "seq_len", "mix"]))
        if self.hidden_output and st.is_last:
            outputs.append(value("hidden_states", TensorProto.FLOAT, [B, "seq_len", c.hidden_size]))
        for i in range(st.num_layers):
            inputs += [value(f"past_{kv}.{i}", TensorProto.FLOAT, kv_shape) for kv in ("key", "value")]
        for i in range(st.num_layers):
            outputs += [value(f"past_{kv}.{i}_RetainedState", TensorProto.FLOAT, kv_shape) for kv in ("key", "value")]
        return inputs, outputs

    # ------------------------------------------------------------------ shared tensors

    def embed(self) -> str:
        """Token embeddings, or mixed ones (+ learned positions; a feature draft's fc over [embedding, feature])."""
        g, w, c = self.g, self.w, self.c
        # GPT-2 adds learned positions; padding positions -1 are clamped to 0 as in Decoder.embed
        if self.mix_inputs:  # sum_m w_m E[id_m] over the last axis of [B, S, M, H]
            mixed = g.op("Gather", w.plain("embed_tokens.weight"), "mix_ids", axis=0)
            mixed = g.op("Mul", mixed, g.op("Unsqueeze", "mix_weights", g.const([-1])))
            x = g.op("ReduceSum", mixed, g.const([2]), keepdims=0)
        else:
            x = g.op("Gather", w.plain("embed_tokens.weight"), "input_ids", axis=0)
        if c.positions == "learned":
            pos0 = g.op("Max", "position_ids", g.const(0))
            x = g.op("Add", x, g.op("Gather", w.plain("embed_positions.weight"), pos0, axis=0))
        if self.feature_size:  # feature draft: fc(concat(embed(token), feature))
            x = g.op("MatMul", g.op("Concat", x, "features", axis=-1), w.matmul_t("fc.weight"))
        return x

    def attention_mask(self) -> str:
        """Additive mask ``[B, 1, G * S, ctx]`` (G = query heads per KV head; row ``g * S + s`` is token s's): 0
        where slot <= position, float32 min elsewhere (padding sees nothing); a tree graph takes the visible slots
        from its ``tree_mask`` input instead."""
        g, ctx = self.g, self.ctx_len
        if self.tree:
            visible = g.op("Unsqueeze", "tree_mask", g.const([1, 2]))
        else:
            slots = g.const(np.arange(ctx).reshape(1, 1, 1, 1, ctx))
            visible = g.op("LessOrEqual", slots, g.op("Unsqueeze", "position_ids", g.const([1, 2, 4])))
        mask = g.op("Where", visible, self.f32(0.0), self.f32(np.finfo(np.float32).min))  # [B, 1, 1, S, ctx]
        groups = self.c.num_heads // self.c.num_kv_heads
        if groups > 1:
            mask = g.op("Expand", mask, g.const([1, 1, groups, 1, 1]))
        return g.op("Reshape", mask, g.const([0, 1, -1, ctx]))

    def cache_slots(self) -> None:
        """ScatterND indices of the cache write (docs/reference.md §2) and the validity mask of the written rows.

        Each token's K/V row is scattered at its slot. A padding column (position -1) must write nothing; it is sent
        to a slot q that no real token of its row writes in this call (min valid position - 1, else max valid
        position + 1) with that slot's current value, a no-op. Rows that are all padding use q = ctx - 1.
        (OrtBackend rejects the one layout with no free slot: a padded row whose valid positions include both 0 and
        ctx - 1.) A tree graph writes at ``slot_ids`` instead of the positions, with the same padding rule.
        """
        g, ctx, B, Hkv = self.g, self.ctx_len, self.batch_size, self.c.num_kv_heads
        valid = g.op("GreaterOrEqual", "position_ids", g.const(0))
        pos = "slot_ids" if self.tree else "position_ids"
        lo = g.op("ReduceMin", g.op("Where", valid, pos, g.const(ctx)), g.const([1]), keepdims=1)  # [B, 1]
        hi = g.op("ReduceMax", g.op("Where", valid, pos, g.const(-1)), g.const([1]), keepdims=1)
        free = g.op(
            "Where", g.op("GreaterOrEqual", lo, g.const(1)), g.op("Sub", lo, g.const(1)), g.op("Add", hi, g.const(1))
        )
        free = g.op("Min", free, g.const(ctx - 1))
        slot = g.op("Where", valid, pos, free)  # [B, S]
        # ScatterND indices [B, Hkv, S, 3] = (batch, head, slot): each update is one contiguous head_dim row
        seq_shape = g.op("Shape", pos)  # [B, S]
        seq_len = g.op("Slice", seq_shape, g.const([1]), g.const([2]))
        grid_shape = g.op("Concat", g.const([B, Hkv]), seq_len, g.const([1]), axis=0)
        b_idx = g.op("Expand", g.const(np.arange(B).reshape(B, 1, 1, 1)), grid_shape)
        h_idx = g.op("Expand", g.const(np.arange(Hkv).reshape(1, Hkv, 1, 1)), grid_shape)
        s_idx = g.op("Expand", g.op("Unsqueeze", slot, g.const([1, 3])), grid_shape)
        self.slot_idx = g.op("Concat", b_idx, h_idx, s_idx, axis=3)
        self.valid4 = g.op("Unsqueeze", valid, g.const([1, 3]))  # [B, 1, S, 1]

    def rope(self) -> None:
        """RoPE ``cos``/``sin`` tables ``[B, 1, S, D]`` of the positions and the half-turn matrix (RoPE models)."""
        if self.c.positions != "rope":
            return
        g, D = self.g, self.c.head_dim
        if self.fused:
            return self.rope_cache(rope_inv_freq(self.c))
        pos_f = g.op("Cast", "position_ids", to=TensorProto.FLOAT)
        freqs = g.op("Mul", g.op("Unsqueeze", pos_f, g.const([2])), self.f32(rope_inv_freq(self.c)))
        emb = g.op("Unsqueeze", g.op("Concat", freqs, freqs, axis=-1), g.const([1]))  # [B, 1, S, D]
        # [D, D]: +1 at (j, j + D/2) (out[j + D/2] = t[j]), -1 at (j + D/2, j) (out[j] = -t[j + D/2]); built from two
        # shifted identities rather than stored (onnxruntime folds it when the session is created)
        zeros = g.op("ConstantOfShape", g.const([D, D]), value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))
        half_turn = g.op(
            "Sub", g.op("EyeLike", zeros, k=D // 2), g.op("EyeLike", zeros, k=-(D // 2)), name="rope_half_turn"
        )
        self.rope_tables = (g.op("Cos", emb), g.op("Sin", emb), half_turn)

    def rope_cache(self, inv_freq: np.ndarray) -> None:
        """``RotaryEmbedding``'s inputs: ``cos``/``sin`` caches ``[ctx, D/2]`` of every slot's position, computed by
        the same float32 Mul and Cos nodes as the tables of the standard graph (so the same values; onnxruntime folds
        them at session start), and the positions with padding (-1) clamped to 0 (its rows are never used)."""
        g, ctx = self.g, self.ctx_len
        freqs = g.op("Mul", self.f32(np.arange(ctx, dtype=np.float32).reshape(ctx, 1)), self.f32(inv_freq))
        pos = g.op("Max", "position_ids", g.const(0))
        self.rope_tables = (g.op("Cos", freqs), g.op("Sin", freqs), pos)

    # ------------------------------------------------------------------ pieces of a layer

    def linear(self, xin: str, prefix: str, bias: bool, *more: str) -> str:
        """``prefix``'s Linear (and the ``more`` prefixes', joined along the outputs) on ``xin``, + biases."""
        prefixes = (prefix, *more)
        y = self.w.linear(xin, *[f"{q}.weight" for q in prefixes])
        return self.g.op("Add", y, self.w.bias(*[f"{q}.bias" for q in prefixes])) if bias else y

    def add_norm(self, x: str, delta: str | None, prefix: str) -> tuple[str, str]:
        """``(norm(x + delta), x + delta)`` (``delta`` None: ``x`` as it is): one
        ``SkipSimplifiedLayerNormalization`` node for an RMSNorm of a ``fused`` graph, else Add and ``norm``."""
        g, c = self.g, self.c
        if delta is None:
            return self.norm(x, prefix), x
        if not (self.fused and c.norm == "rms"):
            x = g.op("Add", x, delta)
            return self.norm(x, prefix), x
        g.opsets.add("com.microsoft")
        normed, _, _, total = g.ops(
            "SkipSimplifiedLayerNormalization", [x, delta, self.w.plain(f"{prefix}.weight")], 4, unused=(1, 2),
            domain="com.microsoft", epsilon=float(c.norm_eps),
        )  # fmt: skip
        return normed, total

    def norm(self, xin: str, prefix: str) -> str:
        g, w, c = self.g, self.w, self.c
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
        ms = g.op("ReduceMean", g.op("Pow", xin, self.f32(2.0)), g.const([-1]), keepdims=1)
        rms = g.op("Sqrt", g.op("Add", ms, self.f32(c.norm_eps)))
        return g.op("Mul", g.op("Div", xin, rms), w.plain(f"{prefix}.weight"))

    def apply_rope(self, t: str) -> str:
        """RoPE on ``t`` ``[B, n, S, D]`` (n heads)."""
        assert self.rope_tables is not None
        g = self.g
        if self.fused:  # out[:D/2] = t1 cos - t2 sin, out[D/2:] = t2 cos + t1 sin (interleaved=0: rotate_half)
            cos, sin, pos = self.rope_tables
            g.opsets.add("com.microsoft")
            return g.op("RotaryEmbedding", t, pos, cos, sin, domain="com.microsoft", interleaved=0)
        cos, sin, half_turn = self.rope_tables
        # rotate_half(t) = concat(-t[D/2:], t[:D/2]) as one MatMul by a signed permutation: each output is one
        # input times +-1 plus exact zeros, so it is bit-exact, in one node instead of Split + Neg + Concat
        return g.op("Add", g.op("Mul", t, cos), g.op("Mul", g.op("MatMul", t, half_turn), sin))

    def heads(self, t: str, n: int) -> str:
        """``[B, S, n*D] -> [B, n, S, D]``."""
        return self.g.op(
            "Transpose", self.g.op("Reshape", t, self.g.const([0, 0, n, self.c.head_dim])), perm=[0, 2, 1, 3]
        )

    def act(self, t: str) -> str:
        g = self.g
        if self.c.activation == "silu":
            return g.op("Mul", t, g.op("Sigmoid", t))
        cube = g.op("Mul", self.f32(0.044715), g.op("Mul", t, g.op("Mul", t, t)))
        inner = g.op("Mul", self.f32(math.sqrt(2.0 / math.pi)), g.op("Add", t, cube))
        return g.op("Mul", g.op("Mul", self.f32(0.5), t), g.op("Add", self.f32(1.0), g.op("Tanh", inner)))

    def write_cache(self, cache: str, new: str, out: str) -> str:
        old = self.g.op("GatherND", cache, self.slot_idx)
        return self.g.op("ScatterND", cache, self.slot_idx, self.g.op("Where", self.valid4, new, old), name=out)

    # ------------------------------------------------------------------ a block, the head

    def cache_attention(self, i: int, h: str) -> str:
        """``attention`` as one ``ai.accel::CacheAttention`` node (``spec.accel_attention``): the joined q/k/v
        projection in, RoPE (the ``rope_cache`` tables), the cache write at the call's slots and the attention over
        the slots each token sees inside it (``accel/formats/mxkernel_attn.c``); returns o_proj's output."""
        g, c = self.g, self.c
        p, j = f"layers.{i}.self_attn", i - self.stage.start
        qkv = self.linear(h, f"{p}.q_proj", c.qkv_bias, f"{p}.k_proj", f"{p}.v_proj")
        if self.rope_tables is not None:
            cos, sin, _ = self.rope_tables
        else:
            cos = sin = g.const(np.zeros(0, np.float32), np.float32)
        mask = "tree_mask" if self.tree else g.const(np.zeros(0, bool), bool)
        slots = "slot_ids" if self.tree else "position_ids"
        g.opsets.add("ai.accel")
        inputs = [qkv, f"past_key.{j}", f"past_value.{j}", "position_ids", slots, cos, sin, mask]
        names = {1: f"past_key.{j}_RetainedState", 2: f"past_value.{j}_RetainedState"}
        o, _, _ = g.ops("CacheAttention", inputs, 3, names=names, domain="ai.accel", num_heads=c.num_heads,
                        num_kv_heads=c.num_kv_heads)  # fmt: skip
        return self.linear(o, f"{p}.o_proj", c.o_bias)

    def attention(self, i: int, h: str, mask: str) -> str:
        """Self-attention of layer ``i`` on normed input ``h``; writes the layer's cache; returns o_proj's output."""
        g, c = self.g, self.c
        if self.spec.accel_attention:
            return self.cache_attention(i, h)
        p, H, Hkv, D = f"layers.{i}.self_attn", c.num_heads, c.num_kv_heads, c.head_dim
        # q, k and v in one MatMul, one Reshape + Transpose to [B, H + 2 Hkv, S, D], RoPE on the q and k heads at once
        # (elementwise per head, so the same values as separately): 9 nodes per layer instead of 17
        qkv = self.heads(self.linear(h, f"{p}.q_proj", c.qkv_bias, f"{p}.k_proj", f"{p}.v_proj"), H + 2 * Hkv)
        if self.rope_tables is not None:
            qk, v = g.ops("Split", [qkv, g.const([H + Hkv, Hkv])], 2, axis=1)
            q, k = g.ops("Split", [self.apply_rope(qk), g.const([H, Hkv])], 2, axis=1)
        else:
            q, k, v = g.ops("Split", [qkv, g.const([H, Hkv, Hkv])], 3, axis=1)
        j = i - self.stage.start  # a stage's cache inputs are numbered from 0
        kc = self.write_cache(f"past_key.{j}", k, f"past_key.{j}_RetainedState")
        vc = self.write_cache(f"past_value.{j}", v, f"past_value.{j}_RetainedState")
        # the G = H / Hkv query heads of a KV head as G * S rows of one product with that head's cache (no repeat of
        # the cache, no broadcast axis): [B, Hkv, G * S, D] x [B, Hkv, D, ctx] (the Transpose folds into the MatMul)
        qg = g.op("Reshape", q, g.const([0, Hkv, -1, D]))
        kt = g.op("Transpose", kc, perm=[0, 1, 3, 2])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", qg, kt), self.f32(1.0 / math.sqrt(D))), mask)
        probs = g.op("Softmax", scores, axis=-1)
        o = g.op("Reshape", g.op("MatMul", probs, vc), g.const([0, H, -1, D]))  # [B, H, S, D]
        o = g.op("Reshape", g.op("Transpose", o, perm=[0, 2, 1, 3]), g.const([0, 0, H * D]))  # [B, S, H*D]
        return self.linear(o, f"{p}.o_proj", c.o_bias)

    def block(self, i: int, x: str, mask: str) -> str:
        """Pre-norm transformer block ``i``: ``x + attn(norm(x))``, then ``+ mlp(norm(.))``."""
        x, delta = self.layer(i, x, None, mask)
        return self.g.op("Add", x, delta)

    def layer(self, i: int, x: str, delta: str | None, mask: str) -> tuple[str, str]:
        """Block ``i`` on the residual stream ``x + delta`` (``delta`` None: ``x``), as ``(x', mlp output)``: the
        block's last residual add is left to the next norm (``add_norm``) or to the caller."""
        p = f"layers.{i}"
        h, x = self.add_norm(x, delta, f"{p}.input_layernorm")
        h, x = self.add_norm(x, self.attention(i, h, mask), f"{p}.post_attention_layernorm")
        return x, self.mlp(h, f"{p}.mlp")

    def mlp(self, h: str, p: str) -> str:
        """The MLP with weights ``{p}.gate_proj/up_proj/down_proj`` on normed input ``h``."""
        g, c = self.g, self.c
        fused = None
        if c.mlp == "gated" and c.activation == "silu" and not c.mlp_bias:  # one node: product, SiLU and gating
            fused = self.w.gated(h, f"{p}.gate_proj.weight", f"{p}.up_proj.weight")
        if fused is not None:
            m = fused
        elif c.mlp == "gated" and (self.w.nbits or self.w.kernel):  # one MatMulNBits / MXLinear for gate and up
            gate, up = g.ops("Split", [self.linear(h, f"{p}.gate_proj", c.mlp_bias, f"{p}.up_proj")], 2, axis=-1,
                             num_outputs=2)  # fmt: skip
            m = g.op("Mul", self.act(gate), up)
        elif c.mlp == "gated":
            gate = self.act(self.linear(h, f"{p}.gate_proj", c.mlp_bias))
            m = g.op("Mul", gate, self.linear(h, f"{p}.up_proj", c.mlp_bias))
        else:
            m = self.act(self.linear(h, f"{p}.up_proj", c.mlp_bias))
        return self.linear(m, f"{p}.down_proj", c.mlp_bias)

    def head(self, x: str, delta: str | None, num_logits: int | None) -> None:
        """Final norm of ``x + delta`` (and the ``hidden_states`` output) and the LM head into ``logits``."""
        g = self.g
        last = self._last_tokens(num_logits)
        if self.hidden_output:  # every column's final-norm state is an output; the head reads the last num_logits
            head, _ = self.add_norm(x, delta, "norm")
            g.op("Identity", head, name="hidden_states")
            if last:
                head = g.op("Slice", head, *last)
        else:
            if last:
                x, delta = g.op("Slice", x, *last), g.op("Slice", delta, *last) if delta else None
            head, _ = self.add_norm(x, delta, "norm")
        self.lm_head(head)

    def _last_tokens(self, num_logits: int | None) -> tuple[str, str, str] | None:
        """The ``Slice`` starts, ends and axes (sequence axis 1) of the last tokens that get logits: the fixed
        ``num_logits``, the input ``num_logits`` (``logits_input``), or None (every token)."""
        g = self.g
        if num_logits:
            start = g.const([-num_logits])
        elif self.spec.logits_input:
            start = g.op("Neg", "num_logits")
        else:
            return None
        return start, g.const([np.iinfo(np.int64).max]), g.const([1])

    def lm_head(self, head: str) -> None:
        """The LM head on normed states ``head`` into ``logits`` (a restricted head scattered to the vocabulary)."""
        if getattr(self.c, "head_vocab", 0):
            restricted_logits(self.g, self.w.linear(head, "lm_head.weight"), self.tensors, self.c.vocab_size)
        else:
            self.w.linear(head, "lm_head.weight", out="logits")

    def exit_head(self, x: str, num_logits: int | None) -> None:
        """Early-exit ``logits`` of residual states ``x`` (``accel.drafts.early_exit.ExitHead``): ``x + mlp(norm(x))``
        with the ``exit.*`` adapter when present, then ``exit.norm`` (else the final norm) and the LM head."""
        g = self.g
        last = self._last_tokens(num_logits)
        if last:
            x = g.op("Slice", x, *last)
        if "exit.mlp.down_proj.weight" in self.tensors:
            x = g.op("Add", x, self.mlp(self.norm(x, "exit.input_layernorm"), "exit.mlp"))
        self.lm_head(self.norm(x, "exit.norm" if "exit.norm.weight" in self.tensors else "norm"))
