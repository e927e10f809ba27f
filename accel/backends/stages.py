"""Pipeline stages: a decoder split by layer ranges, each stage with its own layers' KV cache.

A stage runs layers ``[start, stop)`` of a model with ``total`` layers. The first stage (``start == 0``) reads token
ids; later stages read ``hidden_in``, the residual stream ``[B, S, hidden]`` the previous stage wrote to its
``hidden_out`` (before any norm). The last stage (``stop == total``) applies the final norm and the LM head and
returns ``logits``; an earlier stage returns ``hidden_out`` and, with ``exit_logits``, also next-token logits of its
last hidden state through an early-exit head (the target's final norm and LM head, optionally after a trained adapter:
``accel.drafts.early_exit``). Every stage keeps the KV cache of its own layers on the position-indexed contract of
docs/reference.md §2 (in the ONNX graph its cache inputs are ``past_key.{j}`` for its local layer ``j = i - start``),
so chained stages compute what the whole model computes, call for call.

The split serves pipeline-parallel deployment (one stage per device) and Predictive Pipelined Decoding
(``accel.spd.ppd``: an exit stage ``[0, d)`` and the rest ``[d, L)`` running concurrently on different tokens).

- ``StageSpec(start, stop, total, exit_logits)``: which layers, validated; recorded in an ONNX stage graph's metadata
  (``accel.layers`` = ``"start,stop,total"``, ``accel.exit_logits``).
- ``StageBackend``: the protocol of a stage runtime (``OrtBackend`` on a stage graph, ``TorchBackend`` with
  ``stage=``): ``forward_stage(position_ids, input_ids=... | hidden_in=...) -> StageOutput(logits, hidden)``.
- ``Pipeline(stages)``: chained stages behind the ordinary ``Backend`` protocol.
- ``split_layers(total, boundaries)``: the ``StageSpec`` of each stage.

No torch is imported here.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from accel.backends.base import BackendInfo, legacy_forward
from accel.backends.calls import check_float_rows, check_step_inputs
from accel.errors import BackendError

__all__ = [
    "Pipeline",
    "StageBackend",
    "StageOutput",
    "StageSpec",
    "check_hidden_in",
    "split_layers",
]


@dataclass(frozen=True)
class StageSpec:
    """Layers ``[start, stop)`` of a model with ``total`` layers; ``exit_logits``: a non-final stage also returns
    early-exit logits of its last layer's output (a final stage always returns the model's logits)."""

    start: int
    stop: int
    total: int
    exit_logits: bool = False

    def __post_init__(self) -> None:
        for name in ("start", "stop", "total"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise BackendError(f"stage {name} must be an int; got {v!r}")
        if not 0 <= self.start < self.stop <= self.total:
            raise BackendError(
                f"stage layers [{self.start}, {self.stop}) must satisfy 0 <= start < stop <= total ({self.total})"
            )
        if self.exit_logits and self.is_last:
            raise BackendError("exit_logits is for a stage that ends before the last layer (the last has the logits)")

    @classmethod
    def whole(cls, total: int) -> StageSpec:
        """All ``total`` layers (an ordinary model)."""
        return cls(0, total, total)

    @property
    def is_first(self) -> bool:
        """Reads token ids (``start == 0``); otherwise reads ``hidden_in``."""
        return self.start == 0

    @property
    def is_last(self) -> bool:
        """Applies the final norm and the LM head (``stop == total``); otherwise writes ``hidden_out``."""
        return self.stop == self.total

    @property
    def is_whole(self) -> bool:
        """All layers: an ordinary model."""
        return self.is_first and self.is_last

    @property
    def num_layers(self) -> int:
        """Layers in this stage (and KV-cache layers it holds)."""
        return self.stop - self.start

    @property
    def has_logits(self) -> bool:
        """Whether the stage returns logits (the last stage, or an exit stage)."""
        return self.is_last or self.exit_logits

    def metadata(self) -> dict[str, str]:
        """ONNX ``metadata_props`` entries describing the stage."""
        return {
            "accel.layers": f"{self.start},{self.stop},{self.total}",
            "accel.exit_logits": str(int(self.exit_logits)),
        }

    @classmethod
    def from_metadata(cls, meta: dict[str, str], num_layers: int, source: str = "graph") -> StageSpec:
        """The stage a graph's metadata records; a graph without it is the whole model of ``num_layers`` layers."""
        text = meta.get("accel.layers")
        if not text:
            return cls.whole(num_layers)
        try:
            start, stop, total = (int(v) for v in text.split(","))
        except ValueError as exc:
            raise BackendError(f"{source}: bad accel.layers metadata {text!r} (want 'start,stop,total')") from exc
        spec = cls(start, stop, total, meta.get("accel.exit_logits", "0") == "1")
        if spec.num_layers != num_layers:
            raise BackendError(
                f"{source}: accel.layers {text!r} names {spec.num_layers} layers; the graph has {num_layers}"
            )
        return spec


def split_layers(total: int, boundaries: Sequence[int], *, exit_logits: bool = False) -> list[StageSpec]:
    """The stages of ``total`` layers cut at ``boundaries`` (increasing, inside ``1 .. total - 1``).

    ``split_layers(30, [15])`` = ``[StageSpec(0, 15, 30), StageSpec(15, 30, 30)]``. ``exit_logits`` gives every stage
    but the last an early-exit head.
    """
    cuts = [int(b) for b in boundaries]
    if any(b <= a for a, b in zip([0, *cuts], [*cuts, total], strict=True)):
        raise BackendError(f"stage boundaries {list(boundaries)} must increase strictly inside 1..{total - 1}")
    edges = [0, *cuts, total]
    return [StageSpec(a, b, total, exit_logits and b < total) for a, b in itertools.pairwise(edges)]


class StageOutput(NamedTuple):
    """One stage call's outputs: ``logits`` float32 ``[B, N, V]`` (last stage or exit stage, else None) and ``hidden``
    float32 ``[B, S, hidden]``, the residual stream after the stage's last layer (None for the last stage)."""

    logits: np.ndarray | None
    hidden: np.ndarray | None


@runtime_checkable
class StageBackend(Protocol):
    """A runtime of one pipeline stage with its layers' KV cache."""

    @property
    def info(self) -> BackendInfo:
        """Static facts; ``num_layers`` counts the stage's layers, ``hidden_size`` the residual width."""
        ...

    @property
    def stage(self) -> StageSpec:
        """Which layers the stage runs."""
        ...

    def forward_stage(
        self,
        position_ids: np.ndarray,
        *,
        input_ids: np.ndarray | None = None,
        hidden_in: np.ndarray | None = None,
        num_logits: int | None = None,
    ) -> StageOutput:
        """Run the stage's layers on the tokens (first stage: ``input_ids``) or residual states (``hidden_in``) at
        ``position_ids``, writing their K/V; see ``StageOutput``."""
        ...

    def reset(self) -> None:
        """Zero the stage's KV cache."""
        ...


def check_hidden_in(info: BackendInfo, stage: StageSpec, position_ids: np.ndarray, input_ids, hidden_in) -> np.ndarray:
    """Validate a ``forward_stage`` call's inputs; returns the token ids to feed (zeros for a ``hidden_in`` stage,
    which only validate the positions). ``BackendError`` names the problem: ids given to a later stage or missing for
    the first, ``hidden_in`` of the wrong shape, dtype or with NaN/inf."""
    pos = np.asarray(position_ids)
    if stage.is_first:
        if hidden_in is not None or input_ids is None:
            raise BackendError(
                f"stage [{stage.start}, {stage.stop}) is a first stage: it takes input_ids, not hidden_in"
            )
        return np.asarray(input_ids)
    if input_ids is not None or hidden_in is None:
        raise BackendError(f"stage [{stage.start}, {stage.stop}) reads hidden_in [B, S, hidden], not input_ids")
    check_float_rows(hidden_in, (*pos.shape, info.hidden_size), "hidden_in", "[batch, seq, hidden]")
    return np.zeros(pos.shape, np.int64)


class Pipeline:
    """Stages chained into one ``Backend``: ``forward`` runs each stage in turn, passing the hidden states on.

    The stages must cover ``[0, total)`` contiguously, with one batch size, context and residual width. The stages
    may live on different runtimes or devices; this object runs them one after another (no overlap: a schedule that
    overlaps stages on different tokens is ``accel.spd.ppd``'s).
    """

    def __init__(self, stages: Sequence[StageBackend]) -> None:
        if not stages:
            raise BackendError("a pipeline needs at least one stage")
        specs = [s.stage for s in stages]
        if specs[0].start != 0 or not specs[-1].is_last:
            raise BackendError(f"the stages must start at layer 0 and end at the last layer; got {_ranges(specs)}")
        for a, b in itertools.pairwise(specs):
            if a.stop != b.start or a.total != b.total:
                raise BackendError(f"the stages must be contiguous layer ranges of one model; got {_ranges(specs)}")
        infos = [s.info for s in stages]
        for i in infos[1:]:
            if (i.batch_size, i.ctx_len, i.hidden_size) != (
                infos[0].batch_size,
                infos[0].ctx_len,
                infos[0].hidden_size,
            ):
                raise BackendError("the stages differ in batch size, ctx_len or hidden size")
        self.stages = list(stages)
        last = infos[-1]
        self._info = BackendInfo(
            name="pipeline(" + ",".join(i.name for i in infos) + ")",
            vocab_size=last.vocab_size,
            ctx_len=last.ctx_len,
            batch_size=last.batch_size,
            max_seq_len=min(i.max_seq_len for i in infos),
            num_layers=specs[-1].total,
            hidden_size=last.hidden_size,
        )

    @property
    def info(self) -> BackendInfo:
        """The whole model's facts (vocabulary of the last stage, all layers)."""
        return self._info

    def forward(
        self, input_ids: np.ndarray, position_ids: np.ndarray, *, num_logits: int | None = None, **legacy: Any
    ) -> np.ndarray:
        """Logits ``[B, N, V]`` of the last stage after every stage has run on the tokens (``Backend.forward``; a
        pipeline has no capabilities: ``legacy_forward`` refuses their keywords)."""
        if legacy:
            return legacy_forward(self, input_ids, position_ids, legacy, num_logits=num_logits)
        ids, pos = check_step_inputs(self._info, input_ids, position_ids, num_logits)
        out = self.stages[0].forward_stage(pos, input_ids=ids, num_logits=num_logits)
        for stage in self.stages[1:]:
            out = stage.forward_stage(pos, hidden_in=out.hidden, num_logits=num_logits)
        assert out.logits is not None
        return out.logits

    def reset(self) -> None:
        """Zero every stage's cache."""
        for stage in self.stages:
            stage.reset()


def _ranges(specs: Sequence[StageSpec]) -> str:
    return " ".join(f"[{s.start}, {s.stop})/{s.total}" for s in specs)
