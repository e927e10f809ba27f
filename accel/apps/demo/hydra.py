"""The demo's Hydra rows: the shipped Hydra++ heads (``accel/demo_data/smollm2-hydra``) as a tree proposer.

They run when the demo uses the default target and its target graph has hidden states (the shipped feature draft
is on): the heads read the target's final-norm states, and their token trees are verified exactly like the feature
draft's (greedy output == AR, checked with the other greedy rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accel.apps.demo.settings import SHIPPED

__all__ = ["HYDRA_NODES", "default_hydra_dir", "hydra_drafters"]

HYDRA_NODES = 4  # node budget of the heads' trees (TreeShape.for_decoding: top-4 children, depth <= 4)


def default_hydra_dir() -> Path:
    """The shipped Hydra++ heads for SmolLM2-135M-Instruct (``accel/demo_data/smollm2-hydra``)."""
    return SHIPPED / "smollm2-hydra"


def hydra_drafters(target_dir: Path, onnx_dir: Path, ctx_len: int, temperature: float) -> list[tuple[str, Any, Any]]:
    """``(mode, proposer factory, sampling)`` of the Hydra rows (greedy and sampled at ``temperature``), or none
    when no heads are shipped. The heads are exported once (int8 level graphs: approximate heads, exact SpD) under
    ``onnx_dir``."""
    from accel.drafts.hydra import HydraProposer, HydraRuntime, TreeShape
    from accel.drafts.hydra.export import export_hydra_cached
    from accel.spd import GREEDY, Sampling

    heads_dir = default_hydra_dir()
    if not (heads_dir / "config.json").is_file():
        return []
    runtime = HydraRuntime(
        export_hydra_cached(heads_dir, target_dir, onnx_dir, ctx_len=ctx_len, weights="int8"), threads=1
    )
    shape = TreeShape.for_decoding(runtime.num_heads, HYDRA_NODES)
    name = f"Hydra++ tree({HYDRA_NODES})"
    return [
        (f"{name} greedy", lambda: HydraProposer(runtime, shape), GREEDY),
        (f"{name} T={temperature:g}", lambda: HydraProposer(runtime, shape), Sampling(temperature=temperature)),
    ]
