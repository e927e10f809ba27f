"""``TorchBackend``: the reference decoder (``accel.models.Decoder``) in eager torch behind the ``Backend`` protocol."""

from __future__ import annotations

import numpy as np
import torch

from accel.backends.base import (
    BackendInfo,
    check_extensions,
    check_mix,
    check_moves,
    check_step_inputs,
    check_tree_inputs,
)
from accel.backends.limits import check_sizes
from accel.backends.stages import StageOutput, StageSpec, check_hidden_in
from accel.errors import BackendError
from accel.models.decoder import Decoder, new_cache

__all__ = ["TorchBackend"]


class TorchBackend:
    """Run a ``Decoder`` with a KV cache of ``ctx_len`` positions kept in torch tensors (written in place).

    Args:
        model: the decoder (put in eval mode; not copied).
        ctx_len: KV-cache length in tokens.
        batch_size: rows per call.
        max_seq_len: most tokens per call (default ``ctx_len``).
        dtype: cache/compute dtype (default: the model's parameter dtype).
        threads: torch intra-op threads (default: leave torch's setting).
        stage: run only layers ``[stage.start, stage.stop)`` as a pipeline stage (``accel.backends.stages``), with
            the cache of those layers; calls go through ``forward_stage``. Default: the whole model.
        exit_head: for a stage with ``exit_logits``: a callable from residual states ``[B, N, hidden]`` to logits
            ``[B, N, V]`` (``accel.drafts.early_exit.ExitHead``); default: the model's final norm and LM head.
    """

    def __init__(
        self,
        model: Decoder,
        *,
        ctx_len: int,
        batch_size: int = 1,
        max_seq_len: int | None = None,
        dtype: torch.dtype | None = None,
        threads: int | None = None,
        stage: StageSpec | None = None,
        exit_head=None,
    ) -> None:
        if not hasattr(getattr(model, "config", None), "num_kv_heads"):
            raise BackendError(f"TorchBackend needs an accel.models.Decoder; got {type(model).__name__}")
        cfg = model.config
        self.dtype = dtype or next(model.parameters()).dtype
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        check_sizes(ctx_len, batch_size, threads, 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize)
        if threads is not None:
            torch.set_num_threads(threads)
        self.model = model.eval()
        if cfg.positions == "learned" and ctx_len > cfg.max_position_embeddings:
            raise BackendError(f"ctx_len {ctx_len} exceeds the model's {cfg.max_position_embeddings} learned positions")
        self._info = BackendInfo(
            name="torch",
            vocab_size=cfg.vocab_size,
            ctx_len=ctx_len,
            batch_size=batch_size,
            max_seq_len=min(max_seq_len or ctx_len, ctx_len),
            num_layers=cfg.num_layers,
            capabilities=frozenset({"hidden_states", "tree", "mix"} | ({"features"} if cfg.feature_size else set())),
            hidden_size=cfg.hidden_size,
            feature_size=cfg.feature_size,
        )
        self._stage = stage or StageSpec.whole(cfg.num_layers)
        if self._stage.total != cfg.num_layers:
            raise BackendError(f"stage {self._stage} is not a layer range of this {cfg.num_layers}-layer model")
        if exit_head is not None and not self._stage.exit_logits:
            raise BackendError("exit_head given for a stage without exit_logits")
        self.exit_head = exit_head
        if not self._stage.is_whole:
            self._info = BackendInfo(
                name="torch",
                vocab_size=cfg.vocab_size,
                ctx_len=ctx_len,
                batch_size=batch_size,
                max_seq_len=self._info.max_seq_len,
                num_layers=self._stage.num_layers,
                hidden_size=cfg.hidden_size,
            )
        self.keys, self.values = new_cache(
            cfg.with_(num_layers=self._stage.num_layers), batch_size, ctx_len, self.dtype
        )

    @property
    def info(self) -> BackendInfo:
        """Static facts about this backend."""
        return self._info

    def forward(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        *,
        num_logits: int | None = None,
        features: np.ndarray | None = None,
        return_hidden: bool = False,
        slot_ids: np.ndarray | None = None,
        tree_mask: np.ndarray | None = None,
        mix_ids: np.ndarray | None = None,
        mix_weights: np.ndarray | None = None,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Score tokens at positions; returns float32 logits ``[B, N, V]`` (``(logits, hidden [B, S, H])`` with
        ``return_hidden``); ``slot_ids``/``tree_mask``: a tree call; ``mix_ids``/``mix_weights``: superposed inputs.
        See ``accel.backends.base``."""
        if not self._stage.is_whole:
            raise BackendError("this TorchBackend runs a pipeline stage: call forward_stage (or use a Pipeline)")
        ids, pos = check_step_inputs(self._info, input_ids, position_ids, num_logits)
        feats = check_extensions(self._info, ids, features, return_hidden)
        tree = check_tree_inputs(self._info, pos, slot_ids, tree_mask)
        mix = check_mix(self._info, ids, pos, mix_ids, mix_weights)
        with torch.inference_mode():
            hidden, self.keys, self.values = self.model.hidden_forward(
                torch.from_numpy(ids),
                torch.from_numpy(pos),
                self.keys,
                self.values,
                inplace=True,
                features=None if feats is None else torch.from_numpy(feats).to(self.dtype),
                slot_ids=None if tree is None else torch.from_numpy(tree[0]),
                tree_mask=None if tree is None else torch.from_numpy(tree[1]),
                mix=None if mix is None else (torch.from_numpy(mix[0]), torch.from_numpy(mix[1])),
            )
            head_in = hidden if num_logits is None else hidden[:, -num_logits:, :]
            logits = self.model.logits(head_in).float().numpy()
        return (logits, hidden.float().numpy()) if return_hidden else logits

    @property
    def stage(self) -> StageSpec:
        """The layers this backend runs (``StageSpec.whole`` unless built with ``stage=``)."""
        return self._stage

    def forward_stage(
        self,
        position_ids: np.ndarray,
        *,
        input_ids: np.ndarray | None = None,
        hidden_in: np.ndarray | None = None,
        num_logits: int | None = None,
    ) -> StageOutput:
        """Run the stage's layers (``accel.backends.stages.StageBackend``): logits of the last ``num_logits`` columns
        (last stage, or exit stage) and the residual states after the stage (all but the last stage)."""
        st = self._stage
        ids = check_hidden_in(self._info, st, position_ids, input_ids, hidden_in)
        ids, pos = check_step_inputs(self._info, ids, position_ids, num_logits)
        model = self.model
        with torch.inference_mode():
            x, self.keys, self.values = model.stage_forward(
                torch.from_numpy(pos),
                self.keys,
                self.values,
                layers=(st.start, st.stop),
                input_ids=torch.from_numpy(ids) if st.is_first else None,
                hidden_in=None if st.is_first else torch.from_numpy(np.asarray(hidden_in, np.float32)).to(self.dtype),
                inplace=True,
            )
            head_in = x if num_logits is None else x[:, -num_logits:, :]
            logits = None
            if st.is_last:
                logits = model.logits(model.norm(head_in)).float().numpy()
            elif st.exit_logits:
                head = self.exit_head or (lambda h: model.logits(model.norm(h)))
                logits = head(head_in).float().numpy()
        return StageOutput(logits, None if st.is_last else x.float().numpy())

    def reset(self) -> None:
        """Zero the KV cache."""
        for t in (*self.keys, *self.values):
            t.zero_()

    def move_cache(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy every layer's K/V from slots ``src`` to ``dst`` (int ``[B, M]``, -1 = none; ``check_moves``)."""
        s, d = check_moves(self._info, src, dst)
        for b in np.flatnonzero((s >= 0).any(axis=1)):
            keep = s[b] >= 0
            fro, to = torch.from_numpy(s[b, keep]), torch.from_numpy(d[b, keep])
            for t in (*self.keys, *self.values):
                t[b, :, to] = t[b, :, fro]  # the right side is gathered (a copy) before the write
