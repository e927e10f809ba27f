"""Open Hydra heads for decoding: the checked tree shape and the ``HydraProposer`` on onnxruntime, from typed options.

``hydra_tree_shape`` checks the shape against the heads before anything is exported (a depth beyond the heads, or a
node budget beyond what they can grow at that depth and top-k, is a ``DraftError`` naming the limit, never a silent
clamp); ``open_hydra`` exports the heads once per heads, target and settings (cached under ``$ACCEL_CACHE/onnx``) and
returns the proposer. ``accel.decode.build`` calls them for a ``HydraTreeSpec``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from accel.drafts.hydra.config import KIND
from accel.drafts.hydra.tree import DECODE_BUDGET, KERNEL_DECODE_BUDGET, TreeShape
from accel.errors import DraftError
from accel.models.smollm2 import cache_root

if TYPE_CHECKING:
    from accel.drafts.hydra.proposer import HydraProposer

__all__ = ["hydra_tree_shape", "is_heads_dir", "open_hydra"]


def is_heads_dir(path: str | Path) -> bool:
    """Whether ``path`` is a Hydra heads directory (its config.json says so)."""
    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and json.loads(cfg.read_text()).get("kind") == KIND
    except (ValueError, UnicodeDecodeError):
        return False


def hydra_tree_shape(
    heads: str | Path,
    *,
    nodes: int | None = None,
    top_k: int | None = None,
    depth: int | None = None,
    min_prob: float = 0.0,
    expand_prob: float | None = None,
    kernel_target: bool = False,
) -> TreeShape:
    """The tree grown from the heads at ``heads``: ``nodes`` nodes (default ``DECODE_BUDGET`` = 4, or
    ``KERNEL_DECODE_BUDGET`` = 3 when ``kernel_target``: a ``*-kernel`` target's wide calls are dear), ``top_k``
    children per node (default 4), ``depth`` levels (default: the number of heads, at most 4), thresholds
    ``min_prob`` / ``expand_prob`` (``TreeShape.with_thresholds``). ``DraftError`` for a directory that is not
    heads, a depth beyond the heads, or more nodes than the heads can grow at that depth and top-k."""
    if not is_heads_dir(heads):
        raise DraftError(f"{heads} is not a Hydra heads directory (no config.json of kind accel-hydra-heads)")
    num_heads = int(json.loads((Path(heads) / "config.json").read_text())["num_heads"])
    budget = nodes or (KERNEL_DECODE_BUDGET if kernel_target else DECODE_BUDGET)
    shape = TreeShape.for_decoding(num_heads, budget, top_k or 4)
    if depth is not None:
        if depth > num_heads:
            raise DraftError(
                f"--tree-depth {depth} exceeds the {num_heads} Hydra heads in {heads} (one head per level): give "
                f"--tree-depth 1..{num_heads}"
            )
        shape = TreeShape(depth=depth, top_k=shape.top_k, beam=shape.beam, budget=shape.budget)
    grown = replace(shape, budget=sys.maxsize).max_nodes  # the nodes the heads can grow at this depth and top-k
    if nodes is not None and nodes > grown:
        raise DraftError(
            f"--tree-nodes {nodes} exceeds the {grown} nodes a tree of depth {shape.depth} with --tree-top-k "
            f"{shape.top_k} can hold from these heads: give --tree-nodes 1..{grown}, or a larger --tree-top-k or "
            f"--tree-depth (at most {num_heads})"
        )
    return shape.with_thresholds(min_prob, expand_prob)


def open_hydra(
    heads: str | Path,
    target_dir: Path,
    shape: TreeShape,
    *,
    ctx_len: int,
    weights: str = "int8",
    threads: int = 1,
) -> HydraProposer:
    """A batch-1 ``HydraProposer`` growing ``shape`` from the heads at ``heads`` for the target checkpoint directory
    ``target_dir`` (the heads read its embeddings), exported with ``weights`` (``int8`` or ``fp32``) for a
    ``ctx_len``-token cache and cached under ``$ACCEL_CACHE/onnx``; ``threads`` onnxruntime threads."""
    # torch-optional, start-up: the export needs torch and the runtime onnxruntime; `accel --help` imports this module
    from accel.drafts.hydra.export import export_hydra_cached
    from accel.drafts.hydra.proposer import HydraProposer
    from accel.drafts.hydra.runtime import HydraRuntime

    if not target_dir.is_dir():
        raise DraftError("--hydra needs the target as a checkpoint directory (the heads read its embeddings)")
    out = export_hydra_cached(heads, target_dir, cache_root() / "onnx", ctx_len=ctx_len, weights=weights)
    return HydraProposer(HydraRuntime(out, threads=threads), shape)
