"""EAGLE-3 heads in the speculators format as a proposer of a ``DecodeSpec`` (``kind: eagle3`` / ``eagle3_tree``):
the target exported with the head's aux hidden states and the head's draft graph (``accel.serving``), each exported
once and cached under ``$ACCEL_CACHE/onnx``, and the draft chain or tree over the head (docs/serving.md)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from accel.decode.proposers import Eagle3ChainSpec, Eagle3Spec, Eagle3TreeSpec
from accel.decode.spec import DecodeSpec, TargetSpec
from accel.errors import DraftError, SpdError
from accel.models.sources import open_checkpoint
from accel.spd import DraftChain, DraftTree, Proposer

__all__ = ["eagle3_proposer", "eagle3_target"]


def eagle3_proposer(p: Eagle3Spec, target: TargetSpec) -> Proposer:
    """The chain or tree of an EAGLE-3 head (``accel.serving``): its draft graph (exported once and cached,
    ``_eagle3_graphs``) on onnxruntime with the target's threads unless told otherwise."""
    from accel.backends import OrtBackend

    _, draft_path = _eagle3_graphs(p, target)
    draft = OrtBackend(draft_path, batch_size=1, threads=p.threads if p.threads is not None else target.threads)
    if isinstance(p, Eagle3TreeSpec):
        return DraftTree(
            draft, nodes=p.nodes, top_k=p.top_k, depth=p.depth, min_prob=p.min_prob, expand_prob=p.expand_prob
        )
    return DraftChain(draft, k=p.k, min_draft_prob=p.min_draft_prob)


def eagle3_target(spec: DecodeSpec) -> Path | None:
    """The target graph an EAGLE-3 head of ``spec`` reads (cached, ``_eagle3_graphs``); None without such a head."""
    for part in spec.model_parts():
        if isinstance(part, Eagle3ChainSpec | Eagle3TreeSpec):
            return _eagle3_graphs(part, spec.target)[0]
    return None


def _eagle3_graphs(p: Eagle3Spec, t: TargetSpec) -> tuple[Path, Path]:
    """``(target, draft)`` ONNX files of an EAGLE-3 head, each exported once and cached under ``$ACCEL_CACHE/onnx``:
    the target (``export_eagle3_target``: ``hidden_states`` = the head's aux layers) keyed as ``export_cached`` keys
    its exports (``GraphSpec.cache_key`` of the target's files) plus the head's layer ids and the rewrite's code; the
    head (``export_eagle3_draft``) on its own and the target's files and the graph code. The head is read only when
    one is missing (``read_speculators``, with the target's embeddings when it has none)."""
    from accel.backends.export import checkpoint_files
    from accel.backends.graph_spec import GraphSpec
    from accel.models.smollm2 import cache_root
    from accel.serving import aux_target, eagle3_graph, speculators_format

    if not p.head.is_dir():
        raise DraftError(f"no EAGLE-3 head folder at {p.head}: give a speculators checkpoint folder (--eagle3)")
    if not t.path.exists():
        raise SpdError(f"no model at {t.path}: give the head's target as a checkpoint directory or a .gguf file")
    tree = isinstance(p, Eagle3TreeSpec)
    root, label = cache_root() / "onnx", t.path.stem if t.path.is_file() else t.path.name
    target_files = checkpoint_files(t.path)
    graph = GraphSpec.of(None, {"ctx_len": t.ctx_len, "weights": t.weights.value, "hidden_output": True, "tree": tree})
    target_key = _key(graph.cache_key(target_files), repr(_aux_layer_ids(p.head)), aux_target.__file__)
    head_files = [f for f in sorted(p.head.iterdir()) if f.suffix in (".json", ".safetensors")]
    draft_graph = GraphSpec.of(None, {"ctx_len": t.ctx_len, "hidden_output": True, "tree": tree})
    draft_key = _key(
        draft_graph.cache_key([*head_files, *target_files]), eagle3_graph.__file__, speculators_format.__file__
    )
    head = cache(lambda: _read_eagle3_head(p.head, t.path))
    options = {"ctx_len": t.ctx_len, "weights": t.weights.value, "tree": tree, "progress": True}
    target_onnx = _cached_graph(
        root / f"eagle3-target-{label}-{target_key[:12]}",
        lambda out: aux_target.export_eagle3_target(t.path, out, head(), **options),
    )
    draft_onnx = _cached_graph(
        root / f"eagle3-{p.head.name}-{draft_key[:12]}",
        lambda out: eagle3_graph.export_eagle3_draft(head(), out, ctx_len=t.ctx_len, tree=tree),
    )
    return target_onnx, draft_onnx


def _key(digest: str, *parts: str) -> str:
    """SHA-256 of ``digest`` and ``parts`` (text, or a module's ``__file__``: its source)."""
    key = hashlib.sha256(digest.encode())
    for part in parts:
        key.update(Path(part).read_bytes() if part.endswith(".py") else part.encode())
    return key.hexdigest()


def _aux_layer_ids(head: Path) -> object:
    """The head's ``eagle_aux_hidden_state_layer_ids`` as its config.json writes them (validated when the head is
    read; here only a cache key)."""
    try:
        raw = json.loads((head / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw.get("eagle_aux_hidden_state_layer_ids") if isinstance(raw, dict) else None


def _read_eagle3_head(head: Path, target: Path) -> Any:
    """``read_speculators(head)``, given the target's token embedding when the head's files hold none."""
    from accel.serving.speculators_format import read_speculators, weight_files

    embed = None
    if "embed_tokens.weight" not in weight_files(head):
        embed = np.asarray(open_checkpoint(target)[1]["embed_tokens.weight"], dtype=np.float32)
    print(f"EAGLE-3 head {head.name}: exporting its graphs, once", file=sys.stderr, flush=True)
    return read_speculators(head, embed_tokens=embed)


def _cached_graph(folder: Path, write: Callable[[Path], object]) -> Path:
    """``folder/model.onnx``, written once by ``write(path)`` in a temporary folder beside it that is renamed into
    place when complete: an interrupted export leaves nothing that looks cached."""
    out = folder / "model.onnx"
    if out.is_file():
        return out
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        write(tmp / "model.onnx")
        shutil.rmtree(folder, ignore_errors=True)  # a leftover without model.onnx
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
