"""Bridges to serving engines: accel's MX weights as AMD Quark OCP-MX and compressed-tensors checkpoints (what vLLM
and transformers load), read back bit-exactly. docs/serving.md says which engine takes which file.

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
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["LAYOUTS", "MXExportSummary", "export_mx_checkpoint", "load_mx_checkpoint", "read_mx_checkpoint"]
