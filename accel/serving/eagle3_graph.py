"""An EAGLE-3 head (``accel.serving.speculators_format``) as an ONNX draft graph with accel's KV-cache contract
(docs/reference.md §2), so ``OrtBackend`` runs it and ``DraftChain`` / ``DraftTree`` propose with it.

The graph is built by accel's decoder-graph builder (``accel.backends.onnx_graph``) with three pieces replaced:

- the first layer: ``g = fc(f[:, :, :n H]) + f[:, :, n H:]`` from the ``features`` input ``f`` (width ``(n + 1) H``:
  the target's n aux states, then the head's own state), attention over
  ``concat(input_layernorm(embed(x)), hidden_norm(g))``, residual ``g`` (or ``hidden_norm(g)``);
- the output ``hidden_states`` is ``concat(0_{n H}, h)`` with ``h`` the head's last-layer output (pre-norm, or normed
  with ``norm_output``): fed back as the next drafting step's features it makes ``g = fc(0) + h = h`` exactly, as
  EAGLE-3 feeds its own state back past ``fc``. A target column carries ``[a, 0_H]`` (``accel.serving.aux_target``),
  so ``g = fc(a) + 0 = fc(a)``, also exactly;
- the attention mask: positions >= 1 never see slot 0. EAGLE-3 reads its first token ``x_1`` with the target's state
  at 0; the loop also feeds ``x_0`` (with zero features) at slot 0, which the head must not see.

Everything else (RoPE, grouped-query attention, the cache write, Llama MLP, the restricted head scattered to the
target vocabulary with ``MASKED_LOGIT`` elsewhere) is the builder's own code, so the numerics are those of every
accel export (float32 weights, standard ONNX operators).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from accel import __version__
from accel.backends.export import _Output
from accel.backends.graph_spec import GraphSpec
from accel.backends.onnx_graph import _assemble
from accel.backends.onnx_layers import DecoderGraph
from accel.errors import BackendError, DraftError
from accel.serving.speculators_format import Eagle3Head

__all__ = ["export_eagle3_draft"]


def export_eagle3_draft(
    head: Eagle3Head, path: str | Path, *, ctx_len: int, batch_size: int = 1, tree: bool = False
) -> Path:
    """Write ``head`` as an ONNX draft at ``path`` (float32 weights, external data above 64 MiB); returns the path.

    ``ctx_len``: KV-cache length in tokens; ``batch_size``: rows per call; ``tree``: add the tree inputs
    (``DraftTree``). The graph's ``features`` input and ``hidden_states`` output are ``head.feature_width`` wide; its
    metadata records ``accel.draft_format = speculators-eagle3`` and ``accel.aux_layer_ids``.
    """
    if not isinstance(head, Eagle3Head):
        raise DraftError(f"export_eagle3_draft needs an Eagle3Head (read_speculators); got {type(head).__name__}")
    try:
        spec = GraphSpec(ctx_len=ctx_len, batch_size=batch_size, hidden_output=True, tree=tree)
    except BackendError as exc:
        raise DraftError(f"bad graph settings for the EAGLE-3 draft: {exc}") from exc
    path = Path(path)
    if path.is_dir():
        raise DraftError(f"{path} is a directory: give the path of the .onnx file to write")
    external = sum(t.nbytes for t in head.tensors.values()) > 64 * 1024 * 1024
    with _Output(path, external) as out:
        proto = _assemble(_Eagle3Graph(head, spec, out.external), None, None)
        helper.set_model_props(proto, _metadata(head, spec))
        out.save(proto)
    return path


def _metadata(head: Eagle3Head, spec: GraphSpec) -> dict[str, str]:
    """The ``accel.*`` metadata of an accel export (``GraphSpec.metadata`` and the model's keys) and the head's."""

    return {
        "accel.version": __version__,
        "accel.mx_format": "",
        "accel.model_config": json.dumps(head.config.to_hf()),
        "accel.attention_rows": "grouped",  # the G query heads of a KV head as G * S rows (OrtBackend.min_rows)
        **spec.metadata(),
        "accel.draft_format": "speculators-eagle3",
        "accel.aux_layer_ids": ",".join(str(i) for i in head.layer_ids),
    }


class _Eagle3Graph(DecoderGraph):
    """accel's decoder graph with EAGLE-3's first layer, feature feedback and mask (module docstring)."""

    def __init__(self, head: Eagle3Head, spec: GraphSpec, external: Any) -> None:
        super().__init__(head.config, head.tensors, spec, external)
        self.head_info = head
        self.aux_width = len(head.layer_ids) * head.hidden_size

    def io_spec(self, num_logits: int | None) -> tuple[list, list]:
        """The feature draft's inputs and outputs, with ``hidden_states`` as wide as ``features``."""
        inputs, outputs = super().io_spec(num_logits)
        shape = [self.batch_size, "seq_len", self.feature_size]
        outputs = [
            helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, shape) if o.name == "hidden_states" else o
            for o in outputs
        ]
        return inputs, outputs

    def embed(self) -> str:
        """The token embedding alone (``fc`` reads only the features here)."""
        return self.g.op("Gather", self.w.plain("embed_tokens.weight"), "input_ids", axis=0)

    def attention_mask(self) -> str:
        """The builder's mask (slot <= position, or the tree's visible slots), and slot 0 hidden from positions >= 1:
        additive ``[B, 1, G * S, ctx]``, 0 where visible, float32 min elsewhere."""
        g, ctx = self.g, self.ctx_len
        slots = g.const(np.arange(ctx).reshape(1, 1, 1, 1, ctx))
        pos = g.op("Unsqueeze", "position_ids", g.const([1, 2, 4]))  # [B, 1, 1, S, 1]
        if self.tree:
            visible = g.op("Unsqueeze", "tree_mask", g.const([1, 2]))
        else:
            visible = g.op("LessOrEqual", slots, pos)
        first = g.op("Or", g.op("GreaterOrEqual", slots, g.const(1)), g.op("Equal", pos, g.const(0)))
        visible = g.op("And", visible, first)
        mask = g.op("Where", visible, self.f32(0.0), self.f32(np.finfo(np.float32).min))
        groups = self.c.num_heads // self.c.num_kv_heads
        if groups > 1:
            mask = g.op("Expand", mask, g.const([1, 1, groups, 1, 1]))
        return g.op("Reshape", mask, g.const([0, 1, -1, ctx]))

    def layer(self, i: int, x: str, delta: str | None, mask: str) -> tuple[str, str]:
        """Layer ``i``; the first reads the features (``first_layer``)."""
        return self.first_layer(x, mask) if i == 0 else super().layer(i, x, delta, mask)

    def fused_features(self) -> str:
        """``g = fc(norms(f[:, :, :n H])) + f[:, :, n H:]`` ``[B, S, H]``."""
        g, flags, n = self.g, self.head_info.flags, len(self.head_info.layer_ids)
        aux = g.op("Slice", "features", g.const([0]), g.const([self.aux_width]), g.const([2]))
        own = g.op("Slice", "features", g.const([self.aux_width]), g.const([self.feature_size]), g.const([2]))
        if flags["norm_before_fc"]:
            aux = self.norm(aux, "input_norm")
        elif flags["fc_norm"]:
            parts = g.ops("Split", [aux], n, axis=-1, num_outputs=n) if n > 1 else [aux]
            aux = g.op("Concat", *[self.norm(p, f"fc_norm.{j}") for j, p in enumerate(parts)], axis=-1)
        return g.op("Add", self.linear(aux, "fc", False), own)

    def first_layer(self, e: str, mask: str) -> tuple[str, str]:
        """EAGLE-3's first layer on token embeddings ``e``; returns ``(residual, mlp output)`` as ``layer`` does."""
        g = self.g
        fused = self.fused_features()
        normed = self.norm(fused, "layers.0.hidden_norm")
        residual = normed if self.head_info.flags["norm_before_residual"] else fused
        h = g.op("Concat", self.norm(e, "layers.0.input_layernorm"), normed, axis=-1)  # [B, S, 2 H]
        h2, x = self.add_norm(residual, self.attention(0, h, mask), "layers.0.post_attention_layernorm")
        return x, self.mlp(h2, "layers.0.mlp")

    def head(self, x: str, delta: str | None, num_logits: int | None) -> None:
        """Final norm and LM head; ``hidden_states = concat(0_{n H}, own state)`` (module docstring)."""
        g = self.g
        out = g.op("Add", x, delta) if delta else x
        normed = self.norm(out, "norm")
        own = normed if self.head_info.flags["norm_output"] else out
        lead = g.op("Slice", g.op("Shape", out), g.const([0]), g.const([2]))  # [B, S]
        zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
        zeros = g.op("ConstantOfShape", g.op("Concat", lead, g.const([self.aux_width]), axis=0), value=zero)
        g.op("Identity", g.op("Concat", zeros, own, axis=-1), name="hidden_states")
        if num_logits:
            normed = g.op("Slice", normed, g.const([-num_logits]), g.const([np.iinfo(np.int64).max]), g.const([1]))
        self.lm_head(normed)
