"""The demo's Hydra rows: the shipped Hydra++ heads (``accel/demo_data/smollm2-hydra``) as a tree proposer.

They run when the demo uses the default target and its target graph has hidden states (the shipped feature draft
is on): the heads read the target's final-norm states, and their token trees are verified exactly like the feature
draft's (greedy output == AR, checked with the other greedy rows). Their modes are ``HydraTreeSpec`` recipes
(``accel.apps.demo.modes``): int8 heads (approximate heads, exact SpD), one thread.
"""

from __future__ import annotations

from pathlib import Path

from accel.apps.demo.settings import SHIPPED

__all__ = ["HYDRA_NODES", "default_hydra_dir"]

HYDRA_NODES = 4  # node budget of the heads' trees (TreeShape.for_decoding: top-4 children, depth <= 4)


def default_hydra_dir() -> Path:
    """The shipped Hydra++ heads for SmolLM2-135M-Instruct (``accel/demo_data/smollm2-hydra``)."""
    return SHIPPED / "smollm2-hydra"
