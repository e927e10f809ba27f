"""Hydra heads (Ankner et al. 2024): sequentially dependent draft heads on the target's hidden states.

- ``build_hydra(target, num_heads=4, mlp_layers=1, prefix=False, head_ids=...)``: new heads for a target (Hydra, or
  Hydra++ with ``prefix=True`` and deeper MLPs); ``save_hydra`` / ``load_hydra(dir, target)``.
- ``train_hydra(heads, batches, out_dir, HydraTrainConfig(...), eval_fn)``: teacher distillation on target-written
  data (``feature_shards``, ``ShardBatches``), checkpointed and resumable.
- ``evaluate_heads(heads, sequences, prompt_lengths, hidden)``: per-head acceptance and tokens per call.
- ``export_hydra(heads, out_dir, ctx_len=...)`` -> ONNX level graphs; ``HydraRuntime(out_dir)`` runs them on
  onnxruntime; ``grow_trees`` / ``TreeShape`` build a token tree from the heads under a node budget;
  ``HydraProposer(runtime, shape)`` plugs them into ``accel.spd.generate`` (exact: greedy == AR, sampled == the
  target's law).

The model, training and export need torch; ``runtime``, ``proposer``, ``tree`` and ``config`` do not (imported lazily).
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.drafts.hydra.config import HeadsEval, HydraConfig, HydraReport, HydraTrainConfig

_LAZY = {
    "HydraHeads": "accel.drafts.hydra.model",
    "build_hydra": "accel.drafts.hydra.model",
    "load_hydra": "accel.drafts.hydra.model",
    "save_hydra": "accel.drafts.hydra.model",
    "train_hydra": "accel.drafts.hydra.train",
    "feature_shards": "accel.drafts.hydra.data",
    "ShardBatches": "accel.drafts.hydra.data",
    "evaluate_heads": "accel.drafts.hydra.evaluate",
    "export_hydra": "accel.drafts.hydra.export",
    "export_hydra_cached": "accel.drafts.hydra.export",
    "HydraRuntime": "accel.drafts.hydra.runtime",
    "HydraProposer": "accel.drafts.hydra.proposer",
    "TreeShape": "accel.drafts.hydra.tree",
    "grow_trees": "accel.drafts.hydra.tree",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "HeadsEval",
    "HydraConfig",
    "HydraHeads",
    "HydraProposer",
    "HydraReport",
    "HydraRuntime",
    "HydraTrainConfig",
    "ShardBatches",
    "TreeShape",
    "build_hydra",
    "evaluate_heads",
    "export_hydra",
    "export_hydra_cached",
    "feature_shards",
    "grow_trees",
    "load_hydra",
    "save_hydra",
    "train_hydra",
]
