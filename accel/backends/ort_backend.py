"""``OrtBackend``: an exported decoder (``export_onnx``, or any graph with the docs/reference.md §2 contract) on
onnxruntime.

The KV cache never crosses to numpy: one buffer per cache tensor (a numpy array wrapped as an OrtValue without a copy)
is bound as both the ``past_*`` input and the ``*_RetainedState`` output, so the graph's ScatterND updates it in place
(``check_inplace_cache`` verifies the graph allows it). The IO binding is prepared once; a call rebinds only
``input_ids``, ``position_ids`` and ``logits``, and runs. Only the logits are copied out (and the ``hidden_states``
output when asked for: graphs exported with ``hidden_output=True`` or feature drafts, whose ``features`` input is
bound per call too).

A graph exported with ``tree=True`` has the inputs ``slot_ids`` and ``tree_mask`` (the ``"tree"`` capability:
token-tree calls); chain calls to it get the equivalent chain inputs. All cache buffers are views of one array
``[2 x layers, B, H_kv, ctx, D]``, so ``move_cache`` (the compaction after a tree round) moves every layer's K/V with
one numpy assignment on the host.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from accel.backends.base import BackendInfo, ScoringBackend
from accel.backends.calls import (
    chain_tree_inputs,
    check_extensions,
    check_mix,
    check_moves,
    check_step_inputs,
    check_tree_inputs,
)
from accel.backends.cpu import int8_warning
from accel.backends.graph_spec import GraphSpec
from accel.backends.ort_graph import GraphContract, check_inplace_cache, inspect_graph
from accel.backends.ort_padding import check_free_slot, check_padding_slot, left_pad, resolve_min_rows
from accel.backends.ort_session import SessionOptions, configured_session
from accel.backends.stages import StageOutput, StageSpec, check_hidden_in
from accel.errors import BackendError, CpuWarning

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["GraphContract", "OrtBackend", "SessionOptions", "check_inplace_cache", "inspect_graph"]


def bound_outputs(io: ort.IOBinding, n: int) -> list[np.ndarray]:
    """The first ``n`` outputs of a run binding as numpy arrays. onnxruntime's ``IOBinding.get_outputs`` wraps every
    bound output in a Python ``OrtValue``, the cache outputs too (61 on SmolLM2: ~0.3 ms a call, 2% of a
    ``gguf-kernel`` step); the binding's own vector (``_iobinding``, where this onnxruntime has it) is read instead."""
    raw = getattr(io, "_iobinding", None)
    values = raw.get_outputs() if raw is not None and hasattr(raw, "get_outputs") else io.get_outputs()
    return [values[i].numpy() for i in range(n)]


class OrtBackend(ScoringBackend):
    """Run an exported decoder on onnxruntime, keeping the KV cache in runtime buffers between calls.

    Args:
        path: the ``.onnx`` file.
        batch_size: expected rows per call; BackendError if the graph was exported for another batch size.
        max_seq_len: most tokens per call (default: ctx_len; a graph exported with ``num_logits`` still accepts
            longer calls but then needs ``num_logits`` <= that value).
        min_rows: a call with fewer rows (batch x tokens) gets padding columns (position -1) up to this many. Default:
            2 for a graph with ``com.microsoft.MatMulNBits`` (``export_onnx(weights="mxint8-nbits")``), else 1; 1
            also for such a graph whose attention runs every query head of a KV head as rows of one product
            (metadata ``accel.attention_rows = grouped``) when it has G >= 2 query heads per KV head: its one-token
            call already has G rows in every attention product and equals the multi-row calls bit for bit (tested;
            SmolLM2-135M, G = 3, included), so it needs no padding (``default_min_rows``).
            onnxruntime computes a one-row call slightly differently from a multi-row one (3e-5 of a 27-logit spread
            on SmolLM2-135M in fp32; multi-row calls agree bit for bit whatever their size), and int8 activation
            quantization turns such differences into whole quantization steps (0.57 of the spread with MatMulNBits).
            A single-token step (autoregressive decoding) and a K+1-token verification would then compute two
            different models. Padded, every call takes the multi-row path and a row's result does not depend on the
            call's shape (tested bit for bit); a one-token step costs about one more row.

    The session settings (``SessionOptions``, keywords; an unknown one is a BackendError naming it):
        threads: onnxruntime intra-op threads (default: onnxruntime's choice, all cores).
        providers: execution providers (default ``["CPUExecutionProvider"]``). The cache buffers live in host memory,
            so with a device provider (CUDA) onnxruntime copies them each call; only the CPU path is tested here.
        spin: let idle intra-op threads busy-wait for work (onnxruntime's default). Off by default: in speculative
            decoding two sessions alternate on the same cores, and a spinning idle pool slows the other model's
            calls (measured here: the target's K+1-token calls ran 1.7-2x slower beside a spinning draft session).
            Alone (autoregressive decoding) a spinning pool is faster: ``accel.decode`` turns it on there.
        profile: a file prefix: onnxruntime records every node's time (its profiler) from the first call; the JSON
            is written by ``session.end_profiling()`` (``benchmarks/mx.py --profile`` sums it per operator).
        optimized_dir: keep the optimized graph there and open it directly next time (``accel.backends.ort_session``:
            skips onnxruntime's graph optimization, most of the creation time of an ``mx-packed`` graph).

    ``graph_spec`` reports the graph's ``GraphSpec`` (recorded by ``export_onnx``; None for other graphs).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        batch_size: int | None = None,
        max_seq_len: int | None = None,
        min_rows: int | None = None,
        **session: Unpack[SessionOptions],
    ) -> None:
        path = Path(path)
        if not path.is_file():
            raise BackendError(f"no ONNX file at {path}")
        self.session = configured_session(path, session)
        c = inspect_graph(self.session, str(path))
        if c.metadata.get("accel.weights") == "int8":
            _warn_int8(path, c.metadata.get("accel.int8"))
        if batch_size is not None and batch_size != c.batch_size:
            raise BackendError(f"{path} was exported for batch size {c.batch_size}, not {batch_size}")
        self.contract = c
        self.graph_num_logits = c.num_logits
        self._info = self._backend_info(c, max_seq_len)
        self.min_rows = resolve_min_rows(min_rows, c, check_inplace_cache(path, c.num_layers))
        self._bind_cache(c)

    @classmethod
    def _backend_info(cls, c: GraphContract, max_seq_len: int | None) -> BackendInfo:
        """The ``info`` of a graph with contract ``c`` (capabilities: its optional inputs and outputs)."""
        return BackendInfo(
            name="onnxruntime",
            vocab_size=c.vocab_size,
            ctx_len=c.ctx_len,
            batch_size=c.batch_size,
            max_seq_len=min(max_seq_len or c.ctx_len, c.ctx_len),
            num_layers=c.num_layers,
            capabilities=frozenset(
                name
                for name, have in (
                    ("hidden_states", c.hidden_size),
                    ("features", c.feature_size),
                    ("tree", c.tree and not cls._int8_activations(c)),
                    ("mix", c.mix_inputs),
                )
                if have
            ),
            hidden_size=c.hidden_size or c.stage_width,
            feature_size=c.feature_size,
        )

    def _bind_cache(self, c: GraphContract) -> None:
        """Allocate the cache buffers and prepare the IO binding (outputs, and each buffer as input and output)."""
        self._names = [f"past_{kv}.{i}" for i in range(c.num_layers) for kv in ("key", "value")]
        # One buffer per cache tensor, bound as both the input past_* and the output *_RetainedState, so ScatterND
        # updates it in place. Double buffering (two sets, flipped per call) made onnxruntime copy the whole cache
        # every call: 4.5 ms of a 37 ms SmolLM2-135M step at ctx 256. A failed call may leave some layers' slots at
        # its positions written; the position-indexed cache masks those slots until a later call writes them again.
        self._kv = np.zeros((len(self._names), *c.kv_shape), np.float32)  # one array: move_cache is one assignment
        self._buffers = [self._kv[i] for i in range(len(self._names))]  # contiguous views, bound without copies
        self._high = -1  # the highest slot a call or move may have written since the cache was last all zeros
        io = self.session.io_binding()
        if c.stage.has_logits:
            io.bind_output("logits")  # bound first: get_outputs()[0] is the logits, [1] hidden_states if any
        if c.hidden_size:
            io.bind_output("hidden_states")
        if not c.stage.is_last:  # bound before the cache: get_outputs() lists the stage outputs first
            io.bind_output("hidden_out")
        for name, buf in zip(self._names, self._buffers, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(name, value)
            io.bind_ortvalue_output(f"{name}_RetainedState", value)
        self._binding = io

    @staticmethod
    def _int8_activations(c: GraphContract) -> bool:
        """Whether the graph quantizes its Linear activations to int8 (metadata ``accel.int8_activations``; exports
        older than it: a ``*-nbits`` or ``*-q8`` weight name). Such a target scores no token trees: their float
        rounding moves int8 codes, so a tree's verdict could differ from the target's own decoding (docs/spd.md)."""
        flag = c.metadata.get("accel.int8_activations")
        if flag is not None:
            return flag == "1"
        weights = c.metadata.get("accel.weights", "")
        return weights.endswith(("-nbits", "-q8"))

    @property
    def no_tree_reason(self) -> str | None:
        """Why this target scores no token trees although its graph has tree inputs (None: it scores them, or has
        no tree inputs)."""
        if self.contract.tree and self._int8_activations(self.contract):
            return (
                f"its Linear activations are int8 ({self.contract.metadata.get('accel.weights')}): a tree call's float "
                "rounding moves their codes, so the verdict could differ from the target's own decoding; use a chain "
                "or lookup (docs/spd.md, Token trees)"
            )
        return None

    @property
    def info(self) -> BackendInfo:
        """Static facts read from the graph (vocab, ctx_len, batch size, layers)."""
        return self._info

    @property
    def graph_spec(self) -> GraphSpec | None:
        """The graph's ``GraphSpec`` (its ``accel.graph_spec`` metadata, checked against the graph when the backend
        was created); None for a graph exported without one (by another tool or an older accel)."""
        return self.contract.graph_spec

    @property
    def metadata(self) -> dict[str, str]:
        """The graph's ``metadata_props`` (``accel.*`` export settings)."""
        return self.contract.metadata

    def _score(
        self, input_ids, position_ids, num_logits: int | None, features, tree, mix, *, hidden: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One validated whole-model call: logits of the last ``num_logits`` columns and, with ``hidden``, the hidden
        states of every column (else None)."""
        if not self.contract.stage.is_whole:
            raise BackendError("this graph is a pipeline stage: call forward_stage (or use accel.backends.Pipeline)")
        ids, pos = check_step_inputs(self._info, input_ids, position_ids, num_logits)
        feats = check_extensions(self._info, ids, features, hidden)
        slots_mask = check_tree_inputs(self._info, pos, tree)
        if slots_mask is None and self.contract.tree:
            slots_mask = chain_tree_inputs(pos, self._info.ctx_len)
        mixed = check_mix(self._info, ids, pos, mix)
        if mixed is None and self.contract.mix_inputs:
            mixed = (ids[:, :, None], np.ones((*ids.shape, 1), np.float32))
        seq = ids.shape[1]
        extra = -(-self.min_rows // ids.shape[0]) - seq  # padding columns for min_rows (left: logits stay last)
        if extra > 0:
            ids, pos, feats, slots_mask, mixed = left_pad(extra, self._info.ctx_len, ids, pos, feats, slots_mask, mixed)
        baked = self.graph_num_logits
        if baked is not None and seq > baked and (num_logits is None or num_logits > baked):
            raise BackendError(
                f"this graph returns only the last {baked} logits (exported with num_logits={baked}); "
                f"a call with {seq} tokens needs num_logits <= {baked}"
            )
        check_padding_slot(pos, slots_mask, self._info.ctx_len)
        want = num_logits if num_logits is not None else seq
        outs = bound_outputs(self._run(ids, pos, feats, slots_mask, mixed, want), 2 if hidden else 1)
        logits = outs[0]
        if logits.shape[1] != want:
            logits = logits[:, -want:, :]
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        if not hidden:
            return logits, None
        states = outs[1]
        return logits, (states[:, -seq:] if extra > 0 else states)

    def _bind_logits_count(self, io: ort.IOBinding, want: int) -> None:
        """Feed a graph with the ``num_logits`` input (``GraphSpec.logits_input``) the call's count of last tokens
        that need logits; other graphs have no such input."""
        if self.contract.logits_input:
            io.bind_cpu_input("num_logits", np.array([want], np.int64))

    def _run(self, ids, pos, feats, tree, mix, want: int) -> ort.IOBinding:
        """Bind a whole-model call's inputs and outputs and run it (the binding holds the outputs); ``want``: the
        last tokens that need logits (fed to a graph with the ``num_logits`` input)."""
        io = self._binding
        self._note_writes(tree[0] if tree is not None else pos)
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", pos)
        self._bind_logits_count(io, want)
        if feats is not None:
            io.bind_cpu_input("features", feats)
        if tree is not None:
            io.bind_cpu_input("slot_ids", tree[0])
            io.bind_cpu_input("tree_mask", tree[1])
        if mix is not None:
            io.bind_cpu_input("mix_ids", np.ascontiguousarray(mix[0]))
            io.bind_cpu_input("mix_weights", np.ascontiguousarray(mix[1]))
        io.bind_output("logits")
        if self._info.hidden_size:
            io.bind_output("hidden_states")
        try:
            self.session.run_with_iobinding(io)
        except Exception as exc:
            raise BackendError(f"onnxruntime failed on a call with input shape {ids.shape}: {exc}") from exc
        return io

    @property
    def stage(self) -> StageSpec:
        """The layers the graph runs (``StageSpec.whole`` for an ordinary model; see ``accel.backends.stages``)."""
        return self.contract.stage

    def forward_stage(
        self,
        position_ids: np.ndarray,
        *,
        input_ids: np.ndarray | None = None,
        hidden_in: np.ndarray | None = None,
        num_logits: int | None = None,
    ) -> StageOutput:
        """Run a stage graph (``accel.backends.stages.StageBackend``): logits of the last ``num_logits`` columns (last
        or exit stage) and ``hidden_out`` (every stage but the last). The first stage takes ``input_ids``, a later one
        ``hidden_in [B, S, hidden]``; the cache is updated in place as in ``forward``."""
        st = self.contract.stage
        ids = check_hidden_in(self._info, st, position_ids, input_ids, hidden_in)
        ids, pos = check_step_inputs(self._info, ids, position_ids, num_logits)
        seq = ids.shape[1]
        feed = np.require(hidden_in, np.float32, ["C_CONTIGUOUS"]) if not st.is_first else ids
        extra = -(-self.min_rows // ids.shape[0]) - seq  # min_rows padding (left), as in forward
        if extra > 0:
            pad_shape = (ids.shape[0], extra, *feed.shape[2:])
            feed = np.concatenate([np.zeros(pad_shape, feed.dtype), feed], axis=1)
            pos = np.concatenate([np.full((pos.shape[0], extra), -1, pos.dtype), pos], axis=1)
        if (pos < 0).any():
            check_free_slot(pos, self._info.ctx_len)
        io = self._binding
        self._note_writes(pos)
        io.bind_cpu_input("input_ids" if st.is_first else "hidden_in", feed)
        io.bind_cpu_input("position_ids", pos)
        want = num_logits if num_logits is not None else seq
        self._bind_logits_count(io, want)
        names = (["logits"] if st.has_logits else []) + ([] if st.is_last else ["hidden_out"])
        for name in names:
            io.bind_output(name)
        try:
            self.session.run_with_iobinding(io)
        except Exception as exc:
            raise BackendError(f"onnxruntime failed on a stage call with input shape {feed.shape}: {exc}") from exc
        outs = dict(zip(names, bound_outputs(io, len(names)), strict=True))
        logits = outs.get("logits")
        if logits is not None:
            logits = np.ascontiguousarray(logits[:, -want:, :], dtype=np.float32)
        hidden = outs.get("hidden_out")
        return StageOutput(logits, None if hidden is None else hidden[:, -seq:])

    def reset(self) -> None:
        """Zero the KV cache: its slots up to the highest one written since the last reset (the others still hold
        zeros: a call writes only its tokens' slots, padding none), not all ``ctx_len`` of them (after a 140-token run
        at ctx_len 512 on SmolLM2: 0.8 ms, not 2.8 ms)."""
        if self._high >= 0:
            self._kv[:, :, :, : self._high + 1, :] = 0.0
        self._high = -1

    def _note_writes(self, slots: np.ndarray) -> None:
        """Record that a call or move may write the cache at ``slots`` (ints; -1: padding, which writes nothing)."""
        if slots.size:
            self._high = max(self._high, int(slots.max()))

    def move_cache(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy every layer's K/V from slots ``src`` to ``dst`` (int ``[B, M]``, -1 = none; ``check_moves``) in the
        host buffers: one numpy assignment per row (the right side is gathered, a copy, before the write)."""
        s, d = check_moves(self._info, src, dst)
        self._note_writes(np.where(s >= 0, d, -1))
        for b in np.flatnonzero((s >= 0).any(axis=1)):
            keep = s[b] >= 0
            self._kv[:, b, :, d[b, keep], :] = self._kv[:, b, :, s[b, keep], :]

    def cache(self) -> list[np.ndarray]:
        """The live cache buffers ``[past_key.0, past_value.0, past_key.1, ...]`` (views, for inspection)."""
        return self._buffers


def session_feeds(backend: OrtBackend, input_ids: np.ndarray, position_ids: np.ndarray) -> dict[str, Any]:
    """Feeds for a bare ``session.run`` equivalent to one ``backend.forward`` (for overhead benchmarks)."""
    feeds: dict[str, Any] = {"input_ids": input_ids, "position_ids": position_ids}
    feeds.update(zip(backend._names, backend.cache(), strict=True))
    return feeds


def _warn_int8(path: Path, scheme: str | None) -> None:
    """One ``CpuWarning`` line when the int8 graph at ``path`` is less accurate on this CPU (``int8_warning``)."""
    msg = int8_warning(scheme)
    if msg is not None:
        warnings.warn(f"{path.name}: {msg}", CpuWarning, stacklevel=3)
