"""Draft models for speculative decoding, trained by distillation from a target.

- ``distill(target, out_dir, DistillConfig(...)) -> DistillReport``: build a small Llama-family decoder with the
  target's vocabulary and train it on the target's top-k next-token distributions (text files and/or continuations the
  target generates itself); writes a normal checkpoint directory that every part of accel loads.
- ``evaluate_draft(target, draft, data, temperature=...) -> DraftEval``: greedy agreement, per-position greedy SpD
  acceptance for K up to 8, and alpha = E[sum_x min(p, q)] at a temperature (what ``accel.sim`` needs).
- Feature drafts (EAGLE-style, ``accel.drafts.feature``): ``build_feature_draft``, ``train_feature_draft``
  (``FeatureTrainConfig``), ``greedy_acceptance`` -- a one-layer draft that reads the target's hidden states.
- EAGLE-3 heads (``accel.drafts.eagle3``): ``distill_eagle3`` (``Eagle3TrainConfig``) -- the speculators format's
  architecture, written by ``accel.serving.speculators_write.write_speculators``.

Needs torch (the ``[torch]`` extra); submodules are imported lazily so ``import accel.drafts`` alone is cheap.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.drafts.config import DistillConfig, DistillReport, DraftEval, HistoryPoint

_LAZY = {
    "distill": "accel.drafts.training",
    "evaluate_draft": "accel.drafts.evaluate",
    "build_draft": "accel.drafts.architecture",
    "restrict_head": "accel.drafts.architecture",
    "chat_prompt": "accel.drafts.data",
    "DEFAULT_PROMPTS": "accel.drafts.prompts",
    "build_feature_draft": "accel.drafts.feature",
    "train_feature_draft": "accel.drafts.feature",
    "FeatureTrainConfig": "accel.drafts.feature",
    "FeatureLoss": "accel.drafts.feature",
    "greedy_acceptance": "accel.drafts.feature",
    "distill_eagle3": "accel.drafts.eagle3",
    "Eagle3TrainConfig": "accel.drafts.eagle3",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "DEFAULT_PROMPTS",
    "DistillConfig",
    "DistillReport",
    "DraftEval",
    "Eagle3TrainConfig",
    "FeatureLoss",
    "FeatureTrainConfig",
    "HistoryPoint",
    "build_draft",
    "build_feature_draft",
    "chat_prompt",
    "distill",
    "distill_eagle3",
    "evaluate_draft",
    "greedy_acceptance",
    "restrict_head",
    "train_feature_draft",
]
