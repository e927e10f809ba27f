"""Qualcomm Cloud AI 100 adapter: compile files for an exported decoder, and a ``Backend`` over Qualcomm's runtime.

NOT VERIFIED ON HARDWARE: no Cloud AI 100 card or SDK was available; the files follow the formats QEfficient
(quic/efficient-transformers, ``QEfficient/compile/compile_helper.py`` and its custom-IO generator) writes, and the
tests check them byte for byte against golden files.

- ``specializations.json``: one fixed-shape graph per call shape -- prefill (``seq_len = prompt_len``) and decode /
  scoring (``seq_len = K + 1``), both at ``ctx_len`` and ``batch_size`` (docs/reference.md §2); with ``tree_nodes``
  a third for token-tree calls (``seq_len = tree_nodes``: the root and the nodes below it) of a graph exported with
  ``tree=True`` (its ``slot_ids``/``tree_mask`` inputs take that ``seq_len`` too).
- ``custom_io.yaml``: the KV buffers (``past_key.{i}`` and ``past_key.{i}_RetainedState``, same for values) kept in
  ``float16`` on the device, or ``mxint8`` with ``mxint8_kv``.
- ``compile.sh``: the ``qaic-exec`` command (``-retained-state`` keeps the cache on the card; ``-convert-to-fp16``;
  ``-mxfp6-matmul`` lets the compiler store MatMul weights as MXFP6).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accel._io import check_output_path, output_file
from accel._legacy import Replaced, legacy_keywords
from accel.backends.base import BackendInfo, legacy_forward
from accel.backends.calls import check_step_inputs
from accel.errors import BackendError

__all__ = ["NO_TREE_REASON", "QAIC_EXEC", "QaicBackend", "QaicCompileSpec", "QaicOptions", "write_qaic_files"]

QAIC_EXEC = "/opt/qti-aic/exec/qaic-exec"  # the compiler driver QEfficient calls (``-compile-only``)
SPEC_FILE = "accel_qaic.json"
_WHAT = "the Cloud AI 100 files"  # what write_qaic_files's errors say it was writing
_PAST = re.compile(r"^past_(key|value)\.(\d+)$")


class QaicCompileSpec(BaseModel):
    """Everything needed to compile (and later run) one exported decoder on Cloud AI 100."""

    model_config = ConfigDict(frozen=True)

    onnx_path: str = Field(description="ONNX file, relative to out_dir")
    prompt_len: int = Field(gt=0, description="tokens per prefill call")
    k: int = Field(gt=0, description="draft tokens per speculative round; decode calls score K+1 tokens")
    ctx_len: int = Field(gt=0, description="KV-cache length in tokens")
    batch_size: int = Field(gt=0)
    num_cores: int = Field(gt=0, description="AI cores per device")
    num_devices: int = Field(gt=0)
    mxfp6: bool = Field(description="compiler stores MatMul weights as MXFP6")
    mxint8_kv: bool = Field(description="KV cache kept as MXINT8 on the device (else float16)")
    num_layers: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    num_logits: int | None = Field(default=None, description="logits per call if baked at export, else all seq_len")
    binary_dir: str = "qpc"
    tree_nodes: int | None = Field(
        default=None, gt=0, description="tokens per token-tree call (root included), a tree graph only; None: no tree"
    )

    @property
    def seq_lens(self) -> tuple[int, ...]:
        """Compiled call lengths, ascending (prefill, K+1 and the tree size if any)."""
        return tuple(sorted({self.prompt_len, self.k + 1, *([self.tree_nodes] if self.tree_nodes else [])}))

    def command(self) -> list[str]:
        """The compiler command line (run inside the output directory)."""
        cmd = [
            QAIC_EXEC,
            f"-m={self.onnx_path}",
            "-aic-hw",
            "-aic-hw-version=2.0",
            "-network-specialization-config=specializations.json",
            "-convert-to-fp16",
            "-retained-state",
            f"-aic-num-cores={self.num_cores}",
            "-custom-IO-list-file=custom_io.yaml",
            "-compile-only",
            f"-aic-binary-dir={self.binary_dir}",
        ]
        if self.mxfp6:
            cmd.append("-mxfp6-matmul")
        if self.num_devices > 1:
            cmd.append("-mdp-load-partition-config=mdp_ts_config.json")
        return cmd

    def specializations(self) -> dict[str, Any]:
        """QEfficient's ``specializations.json`` content (values are strings)."""
        b, c = str(self.batch_size), str(self.ctx_len)
        lens = (self.prompt_len, self.k + 1, *([self.tree_nodes] if self.tree_nodes else []))
        return {"specializations": [{"batch_size": b, "seq_len": str(s), "ctx_len": c} for s in lens]}

    def to_json(self) -> str:
        """The spec file's content (``tree_nodes`` only when set, so chain specs read as before)."""
        return self.model_dump_json(indent=2, exclude={"tree_nodes"} if self.tree_nodes is None else None) + "\n"

    def custom_io(self) -> str:
        """QEfficient's ``custom_io.yaml`` content: each retained-state buffer and its device precision."""
        dtype = "mxint8" if self.mxint8_kv else "float16"
        lines = []
        for i in range(self.num_layers):
            for kv in ("key", "value"):
                for name in (f"past_{kv}.{i}", f"past_{kv}.{i}_RetainedState"):
                    lines.append(f" - IOName: {name}\n   Precision: {dtype}\n\n")
        return "".join(lines)


def _graph_facts(onnx_path: Path) -> tuple[int, int, int, int | None, int | None, bool]:
    """(num_layers, ctx_len, batch_size, vocab, baked num_logits, has tree inputs) of an exported graph, read
    without its weights."""
    import onnx

    try:
        proto = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:
        raise BackendError(f"{onnx_path} is not a readable ONNX file: {exc}") from exc
    contrib = sorted({n.domain for n in proto.graph.node if n.domain not in ("", "ai.onnx")})
    if contrib:
        raise BackendError(
            f"{onnx_path} uses operators of {', '.join(contrib)} (an onnxruntime-only export: weights='mxint8-nbits' "
            "or ort_ops=True); export with fp32, fp16 or mx-rounded for Cloud AI 100 (ort_ops=False)"
        )
    dims = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    outs = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in proto.graph.output}
    for name in ("input_ids", "position_ids"):
        if name not in dims:
            raise BackendError(f"{onnx_path}: input {name!r} is missing")
    layers = sorted({int(m.group(2)) for n in dims if (m := _PAST.match(n))})
    if not layers or "past_key.0" not in dims:
        raise BackendError(f"{onnx_path}: no past_key.{{i}} / past_value.{{i}} cache inputs")
    for i in range(layers[-1] + 1):
        for kv in ("key", "value"):
            if f"past_{kv}.{i}_RetainedState" not in outs:
                raise BackendError(f"{onnx_path}: output 'past_{kv}.{i}_RetainedState' is missing")
    batch, _, ctx, _ = dims["past_key.0"]
    if "logits" not in outs or len(outs["logits"]) != 3:
        raise BackendError(f"{onnx_path}: output 'logits' [batch, seq, vocab] is missing")
    _, n_logits, vocab = outs["logits"]
    return (
        layers[-1] + 1,
        int(ctx),
        int(batch),
        vocab if isinstance(vocab, int) else None,
        n_logits if isinstance(n_logits, int) else None,
        "slot_ids" in dims and "tree_mask" in dims,
    )


@dataclass(frozen=True)
class QaicOptions:
    """How ``write_qaic_files`` compiles a graph: ``batch_size`` rows (the graph's), ``num_cores`` AI cores per device,
    ``num_devices`` devices (tensor-parallel), MatMul weights as MXFP6 (``mxfp6``), the KV cache as MXINT8
    (``mxint8_kv``; else float16), and ``tree_nodes`` tokens per token-tree call (root included; None: no tree
    calls)."""

    batch_size: int = 1
    num_cores: int = 16
    num_devices: int = 1
    mxfp6: bool = True
    mxint8_kv: bool = False
    tree_nodes: int | None = None


#: ``write_qaic_files``'s keywords before ``QaicOptions`` (deprecated; removed in accel 0.2.0)
_OPTIONS = Replaced("options", QaicOptions, {f.name: f.name for f in dataclasses.fields(QaicOptions)})


def write_qaic_files(
    onnx_path: str | Path,
    out_dir: str | Path,
    *,
    prompt_len: int,
    k: int,
    ctx_len: int,
    options: QaicOptions | None = None,
    **legacy: Any,
) -> QaicCompileSpec:
    """Write ``specializations.json``, ``custom_io.yaml``, ``compile.sh`` (+ ``mdp_ts_config.json`` for several
    devices) and ``accel_qaic.json`` into ``out_dir`` for the exported decoder at ``onnx_path``: prefill calls of
    ``prompt_len`` tokens, decode calls of ``k + 1`` tokens, a ``ctx_len``-token cache, compiled as ``options`` says
    (default ``QaicOptions()``; its fields as keywords are deprecated).

    ``ctx_len`` and ``options.batch_size`` must match the graph (export with the same values). ``tree_nodes``: also
    compile token-tree calls of that many tokens (root included); the graph must have been exported with
    ``tree=True``. ``QaicBackend`` does not run tree calls yet (the compaction after a tree round must move K/V on the
    card: not implemented). Returns the spec; run ``compile.sh`` on a machine with the Cloud AI 100 Platform SDK to
    get ``out_dir/qpc``.
    """
    objects, _ = legacy_keywords("write_qaic_files", legacy, [_OPTIONS], {"options": options}, keep=())
    opt: QaicOptions = objects["options"] or QaicOptions()
    onnx_path, out = Path(onnx_path), Path(out_dir)
    num_layers, vocab, num_logits, tree = _checked_graph(onnx_path, out, ctx_len, opt.batch_size)
    with _settings_errors():
        spec = QaicCompileSpec(
            onnx_path=os.path.relpath(onnx_path.resolve(), out.resolve()),
            prompt_len=prompt_len,
            k=k,
            ctx_len=ctx_len,
            num_layers=num_layers,
            vocab_size=vocab,
            num_logits=num_logits,
            **dataclasses.asdict(opt),
        )
    _check_call_lengths(onnx_path, prompt_len, k, ctx_len, opt.tree_nodes, tree)
    _write_files_atomic(out, _compile_files(spec))
    return spec


def _checked_graph(onnx_path: Path, out: Path, ctx_len: int, batch_size: int) -> tuple[int, int, int | None, bool]:
    """(num_layers, vocab, baked num_logits, has tree inputs) of the graph, checked against the asked settings."""
    if not onnx_path.is_file():
        raise BackendError(f"no ONNX file at {onnx_path}")
    check_output_path(out, _WHAT, BackendError, folder=True)
    num_layers, graph_ctx, graph_batch, vocab, num_logits, tree = _graph_facts(onnx_path)
    if graph_ctx != ctx_len or graph_batch != batch_size:
        raise BackendError(
            f"{onnx_path} was exported with ctx_len={graph_ctx}, batch_size={graph_batch}; asked for "
            f"ctx_len={ctx_len}, batch_size={batch_size} (re-export with the same values)"
        )
    if vocab is None:
        raise BackendError(f"{onnx_path}: the logits output has no fixed vocabulary dimension")
    return num_layers, vocab, num_logits, tree


@contextlib.contextmanager
def _settings_errors() -> Iterator[None]:
    """Turn a ``QaicCompileSpec`` validation error in the block into a BackendError listing every problem."""
    try:
        yield
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise BackendError(f"invalid Cloud AI 100 compile settings: {problems}") from None


def _check_call_lengths(
    onnx_path: Path, prompt_len: int, k: int, ctx_len: int, tree_nodes: int | None, tree: bool
) -> None:
    """BackendError unless the compiled call lengths fit ``ctx_len`` (and a tree size has a tree graph)."""
    if prompt_len > ctx_len or k + 1 > ctx_len:
        raise BackendError(f"prompt_len {prompt_len} and K+1 {k + 1} must not exceed ctx_len {ctx_len}")
    if tree_nodes is not None:
        if not tree:
            raise BackendError(f"{onnx_path} has no tree inputs (slot_ids, tree_mask): export it with tree=True")
        if not 1 <= tree_nodes <= ctx_len:
            raise BackendError(f"tree_nodes {tree_nodes} must be in 1..ctx_len {ctx_len}")


def _compile_files(spec: QaicCompileSpec) -> dict[str, str]:
    """Name -> text of every file ``write_qaic_files`` writes."""
    files = {
        "specializations.json": json.dumps(spec.specializations(), indent=4) + "\n",
        "custom_io.yaml": spec.custom_io(),
        "compile.sh": '#!/bin/sh\n# Cloud AI 100 compile (not verified on hardware)\nset -e\ncd "$(dirname "$0")"\n'
        + " ".join(shlex.quote(a) for a in spec.command())
        + "\n",
        SPEC_FILE: spec.to_json(),
    }
    if spec.num_devices > 1:  # QEfficient's multi-device partition config
        devices = [{"deviceId": d, "numCores": spec.num_cores} for d in range(spec.num_devices)]
        mdp = {
            "connections": [{"devices": list(range(spec.num_devices)), "type": "p2p"}],
            "partitions": [{"name": "Partition0", "devices": devices}],
        }
        files["mdp_ts_config.json"] = json.dumps(mdp, indent=4) + "\n"
    return files


def _write_files_atomic(out: Path, files: dict[str, str]) -> None:
    """Write ``files`` into a temp folder beside ``out``, then move them in (a new ``out`` appears complete; on a
    failure nothing is left: no temp folder, no empty ``out``, no parent folder made for it)."""
    with output_file(out, _WHAT, BackendError, folder=True):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            for name, text in files.items():
                (tmp / name).write_text(text)
            (tmp / "compile.sh").chmod(0o755)
            tmp.chmod(0o777 & ~_umask())
            if not out.exists():
                os.rename(tmp, out)
                return
            for name in files:
                if (out / name).is_dir():
                    raise BackendError(f"cannot write {_WHAT} to {out}: {out / name} is a directory")
            for name in files:
                os.replace(tmp / name, out / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _session_class():
    """Qualcomm's Python runtime session class, or BackendError when the SDK is not installed."""
    try:
        from QEfficient.generation.cloud_infer import QAICInferenceSession  # QEfficient wrapper over qaicrt
    except ImportError as missing:
        try:
            import qaicrt  # noqa: F401 - the bare runtime is present but without the session wrapper
        except ImportError as exc:
            raise BackendError(
                "the Qualcomm Cloud AI 100 runtime is not installed (neither QEfficient nor qaicrt can be imported); "
                "install the Cloud AI 100 Platform SDK and QEfficient (pip install QEfficient) on a machine with a card"
            ) from exc
        raise BackendError(
            "qaicrt is installed but QEfficient (QAICInferenceSession) is not: pip install QEfficient"
        ) from missing
    return QAICInferenceSession


NO_TREE_REASON = (
    "after a tree round the accepted path's K/V must move to contiguous cache slots, and the Cloud AI 100 cache is "
    "retained on the card (in-graph compaction is not implemented); write_qaic_files(tree_nodes=...) compiles the "
    "tree specialization for when it is. Run trees on OrtBackend or TorchBackend, or use a chain proposer"
)
"""Why ``QaicBackend`` refuses token trees (``forward`` with tree inputs, ``move_cache``, ``generate`` with a
branching proposer)."""


class QaicBackend:
    """A compiled decoder (a ``qpc`` directory from ``compile.sh``) on Cloud AI 100, behind the ``Backend`` protocol.

    The KV cache stays on the card (``-retained-state``); calls send ``input_ids``/``position_ids`` and read
    ``logits``. A call of S tokens runs the smallest compiled specialization >= S, left-padded with position -1
    (padding is free in the cache contract). ``reset`` is a no-op: slots beyond a position are masked and every slot
    a new sequence reads is written first. NOT VERIFIED ON HARDWARE.

    Args:
        qpc_path: the compiled binary directory (``out_dir/qpc``); ``accel_qaic.json`` is read from it or its parent.
        device_ids: card ids (default: the runtime's choice).
    """

    no_tree_reason = NO_TREE_REASON  # read by accel.spd.generate's error for a branching proposer

    def __init__(self, qpc_path: str | Path, device_ids: list[int] | None = None) -> None:
        qpc = Path(qpc_path)
        spec_file = next((p for p in (qpc / SPEC_FILE, qpc.parent / SPEC_FILE) if p.is_file()), None)
        session_cls = _session_class()
        if spec_file is None:
            raise BackendError(f"no {SPEC_FILE} next to {qpc}: write it with write_qaic_files")
        self.spec = QaicCompileSpec.model_validate_json(spec_file.read_text())
        self.session = session_cls(str(qpc), device_ids)
        past = [n for n in self.session.input_names + self.session.output_names if n.startswith("past_")]
        self.session.skip_buffers(past)  # retained on the device
        s = self.spec
        self._info = BackendInfo(
            name="qaic",
            vocab_size=s.vocab_size,
            ctx_len=s.ctx_len,
            batch_size=s.batch_size,
            max_seq_len=max(s.seq_lens),
            num_layers=s.num_layers,
        )

    @property
    def info(self) -> BackendInfo:
        return self._info

    def forward(
        self, input_ids: np.ndarray, position_ids: np.ndarray, *, num_logits: int | None = None, **legacy: Any
    ) -> np.ndarray:
        """Score tokens at positions; returns float32 logits ``[B, N, V]`` (see ``accel.backends.base``). No
        capabilities: token-tree calls are a ``BackendError`` (``NO_TREE_REASON``, through ``legacy_forward``),
        raised before the card is touched."""
        if legacy:
            return legacy_forward(self, input_ids, position_ids, legacy, num_logits=num_logits)
        ids, pos = check_step_inputs(self._info, input_ids, position_ids, num_logits)
        seq = ids.shape[1]
        target = min(s for s in self.spec.seq_lens if s >= seq)
        if target > seq:  # left-pad to the compiled length
            pad = target - seq
            ids = np.concatenate([np.zeros((ids.shape[0], pad), np.int64), ids], axis=1)
            pos = np.concatenate([np.full((pos.shape[0], pad), -1, np.int64), pos], axis=1)
        baked = self.spec.num_logits
        if baked is not None and (num_logits or seq) > baked:
            raise BackendError(
                f"the compiled graph returns only the last {baked} logits; asked for {num_logits or seq}"
            )
        n_out = min(baked, target) if baked is not None else target
        self.session.set_buffers({"logits": np.zeros((ids.shape[0], n_out, self.spec.vocab_size), np.float32)})
        logits = self.session.run({"input_ids": ids, "position_ids": pos})["logits"]
        return np.ascontiguousarray(logits[:, -(num_logits or seq) :, :], dtype=np.float32)

    def move_cache(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Not supported: ``BackendError`` (``NO_TREE_REASON``)."""
        raise BackendError(f"QaicBackend cannot move cache slots: {NO_TREE_REASON}")

    def reset(self) -> None:
        """No-op (see the class docstring)."""
