"""Export Hydra heads for onnxruntime: a directory with one level graph per head (``head{i}.onnx``), the LM head
they share (``lm_head.onnx``), the Hydra++ prefix layer's graph (``prefix.onnx``), the target's input embedding
table (``embed.npy``, float32, memory-mapped at run time) and ``hydra.json`` (what ``HydraRuntime`` needs to know).
See ``accel.drafts.hydra.graph``.

``weights="int8"`` applies onnxruntime's dynamic int8 quantization to every weight MatMul of every graph (the LM
head and the prefix layer included): approximate heads, like the feature draft's int8 export, ~4x fewer weight
bytes per round; speculative decoding stays exact (verification does not depend on the draft's numerics). The codes are
stored as uint8 + 128 (``int8_scheme="u8u8"``), which every x86 CPU computes exactly (``accel.backends.onnx_int8``);
``hydra.json`` records the scheme.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from accel import __version__
from accel._io import check_output_path, output_file
from accel.backends.export import _quantize_int8
from accel.backends.weights import INT8_SCHEMES
from accel.drafts.hydra.graph import head_graph, lm_head_graph, prefix_graph
from accel.drafts.hydra.model import HydraHeads, load_hydra
from accel.drafts.hydra.runtime import EMBED, HYDRA_WEIGHTS, META, ExportMeta
from accel.errors import DraftError
from accel.models.decoder import Decoder
from accel.models.loading import load_checkpoint

__all__ = ["HYDRA_WEIGHTS", "export_hydra", "export_hydra_cached"]

_WHAT = "the Hydra export"  # what export_hydra's errors say it was writing


def _tensors(heads: HydraHeads) -> dict[str, np.ndarray]:
    out = {k: v.detach().float().cpu().numpy() for k, v in heads.state_dict().items() if k != "token_ids"}
    out["token_ids"] = heads.token_ids.cpu().numpy().astype(np.int64)
    out["lm_weight"] = heads.lm_weight.detach().float().cpu().numpy()
    return out


def export_hydra(
    heads: HydraHeads,
    out_dir: str | Path,
    *,
    ctx_len: int,
    batch_size: int = 1,
    weights: str = "fp32",
    int8_scheme: str = "u8u8",
) -> Path:
    """Write the export directory of ``heads`` (module docstring) to ``out_dir`` (built in a temporary sibling and
    renamed into place: an earlier export there is replaced whole, a failure leaves nothing); returns it.

    ``ctx_len``: the prefix layer's cache length in tokens (the target's context); ``batch_size``: rows per call;
    ``int8_scheme``: how ``weights="int8"`` stores its codes (``accel.backends.onnx_int8.INT8_SCHEMES``).
    ``DraftError`` for bad settings, or an ``out_dir`` that cannot be written or holds files but no export.
    """
    _check_export_args(ctx_len, batch_size, weights, int8_scheme)
    heads._check_attached()
    out = check_output_path(out_dir, _WHAT, DraftError, folder=True)
    if out.is_dir() and any(out.iterdir()) and not (out / META).is_file():
        raise DraftError(
            f"cannot write {_WHAT} to {out}: it holds files but no {META}; refusing to replace a folder that is not "
            "a Hydra export"
        )
    with output_file(out, _WHAT, DraftError, folder=True):
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            _write_export(heads, tmp, ctx_len, batch_size, weights, int8_scheme)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_export(heads: HydraHeads, tmp: Path, ctx_len: int, batch_size: int, weights: str, int8_scheme: str) -> None:
    """Every file of the export of ``heads`` into the folder ``tmp``."""
    import onnx

    c = heads.config
    tensors = _tensors(heads)
    graphs = {
        f"head{i}": head_graph(i, c.mlp_layers, c.hidden_size, tensors, batch_size) for i in range(1, c.num_heads + 1)
    }
    graphs["lm_head"] = lm_head_graph(c.hidden_size, tensors, batch_size)
    if heads.prefix is not None:
        layer = {f"layers.0.{k[len('prefix.') :]}": v for k, v in tensors.items() if k.startswith("prefix.")}
        graphs["prefix"] = prefix_graph(heads.target_config, layer, ctx_len, batch_size)
    for name, proto in graphs.items():
        if weights == "int8":
            proto = _quantize_int8(proto, int8_scheme)
        onnx.checker.check_model(proto)
        onnx.save_model(proto, str(tmp / f"{name}.onnx"))
    np.save(tmp / EMBED, heads.embed.detach().float().cpu().numpy())
    meta = _export_meta(heads, ctx_len, batch_size, weights, int8_scheme)
    (tmp / META).write_text(json.dumps(meta, indent=2))


def _check_export_args(ctx_len: int, batch_size: int, weights: str, int8_scheme: str) -> None:
    """``DraftError`` unless the export settings are valid."""
    if weights not in HYDRA_WEIGHTS:
        raise DraftError(f"weights must be one of {HYDRA_WEIGHTS}; got {weights!r}")
    if int8_scheme not in INT8_SCHEMES:
        raise DraftError(f"int8_scheme must be one of {INT8_SCHEMES}; got {int8_scheme!r}")
    if ctx_len < 2 or batch_size < 1:
        raise DraftError(f"ctx_len must be >= 2 and batch_size >= 1; got {ctx_len}, {batch_size}")


def _export_meta(heads: HydraHeads, ctx_len: int, batch_size: int, weights: str, int8_scheme: str) -> dict:
    """The contents of ``hydra.json`` for ``heads`` exported with these settings (checked as the runtime reads it,
    ``accel.drafts.hydra.runtime.ExportMeta``)."""
    c = heads.config
    tc = heads.target_config
    meta = ExportMeta(
        num_heads=c.num_heads,
        prefix=c.prefix,
        hidden_size=c.hidden_size,
        vocab_size=c.vocab_size,
        head_vocab=len(heads.token_ids),
        ctx_len=ctx_len,
        batch_size=batch_size,
        weights=weights,  # type: ignore[arg-type]  # checked by _check_export_args
        int8=int8_scheme if weights == "int8" else None,
        kv_shape=(batch_size, tc.num_kv_heads, ctx_len, tc.head_dim),
        target_fingerprint=c.target_fingerprint,
    )
    return meta.model_dump(mode="json", exclude_none=True)


def export_hydra_cached(
    heads_dir: str | Path,
    target: Decoder | str | Path,
    onnx_dir: str | Path,
    *,
    ctx_len: int,
    batch_size: int = 1,
    weights: str = "fp32",
) -> Path:
    """The export directory of the heads in ``heads_dir`` for ``target`` (a ``Decoder``, or a checkpoint directory,
    loaded only when the export is missing), made once per (heads files, target files when ``target`` is a
    directory, settings, exporter source) under ``onnx_dir`` and reused afterwards."""
    src = Path(heads_dir)
    if not src.is_dir():
        raise DraftError(f"Hydra heads directory {src} does not exist")
    key = hashlib.sha256()
    target_dir = None if isinstance(target, Decoder) else Path(target)
    for d in (src, target_dir):
        if d is None:
            continue
        if not d.is_dir():
            raise DraftError(f"target checkpoint directory {d} does not exist")
        for f in sorted(d.iterdir()):
            if f.suffix in (".json", ".safetensors"):
                st = f.stat()
                key.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    key.update(f"{ctx_len}:{batch_size}:{weights}:{__version__}".encode())
    backends = Path(__file__).parents[2] / "backends"
    for path in [Path(__file__).with_name(n) for n in ("export.py", "graph.py", "model.py")] + [
        backends / "export.py",
        backends / "onnx_int8.py",
    ]:  # the exporter's code, the int8 quantization included
        key.update(path.read_bytes())
    out = Path(onnx_dir) / f"hydra-{src.name}-{key.hexdigest()[:12]}"
    if (out / META).is_file():
        return out
    check_output_path(out, _WHAT, DraftError, folder=True)  # before the target is read
    if not isinstance(target, Decoder):
        target = load_checkpoint(target).eval()
    return export_hydra(load_hydra(src, target), out, ctx_len=ctx_len, batch_size=batch_size, weights=weights)
