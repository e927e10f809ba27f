"""Bridges to serving engines: accel's MX weights as AMD Quark OCP-MX and compressed-tensors checkpoints (what vLLM
and transformers load), read back bit-exactly. docs/serving.md says which engine takes which file.

EAGLE-3 draft heads in the ``speculators`` format (vLLM's draft library) run in accel on onnxruntime:
``accel.serving.speculators_format`` (``read_speculators``), ``accel.serving.eagle3_graph`` (the draft graph) and
``accel.serving.aux_target`` (the target graph with the head's aux hidden states); ``accel.serving.speculators_write``
writes a head accel trained (``accel.drafts.eagle3``) in that format.

``import accel.serving`` needs no torch; ``load_mx_checkpoint`` imports it when called.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr

_LAZY = {
    "MXExportSummary": "accel.serving.mx_checkpoint",
    "export_mx_checkpoint": "accel.serving.mx_checkpoint",
    "load_mx_checkpoint": "accel.serving.mx_checkpoint",
    "read_mx_checkpoint": "accel.serving.mx_checkpoint",
    "LAYOUTS": "accel.serving.mx_layouts",
    "Eagle3Head": "accel.serving.speculators_format",
    "read_speculators": "accel.serving.speculators_format",
    "vllm_speculative_config": "accel.serving.speculators_format",
    "write_speculators": "accel.serving.speculators_write",
    "export_eagle3_draft": "accel.serving.eagle3_graph",
    "export_eagle3_target": "accel.serving.aux_target",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "LAYOUTS",
    "Eagle3Head",
    "MXExportSummary",
    "export_eagle3_draft",
    "export_eagle3_target",
    "export_mx_checkpoint",
    "load_mx_checkpoint",
    "read_mx_checkpoint",
    "read_speculators",
    "vllm_speculative_config",
    "write_speculators",
]
