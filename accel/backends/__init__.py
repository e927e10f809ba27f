"""Runtimes behind one ``Backend`` protocol and its capability protocols (see ``accel.backends.base``).

``OrtBackend`` and the qaic file writers need no torch. ``TorchBackend`` and ``export_onnx`` import torch and load
lazily on first use.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.backends.base import (
    Backend,
    BackendInfo,
    FeatureBackend,
    HiddenBackend,
    MixBackend,
    MixInputs,
    TreeBackend,
    TreeInputs,
    prefill,
    require,
)
from accel.backends.calls import check_step_inputs
from accel.backends.weights import WEIGHT_MODES, ExportWeights, WeightFormat
from accel.errors import BackendError

_LAZY = {
    "TorchBackend": "accel.backends.torch_backend",
    "export_onnx": "accel.backends.export",
    "export_cached": "accel.backends.export",
    "GraphSpec": "accel.backends.graph_spec",
    "OrtBackend": "accel.backends.ort_backend",
    "QaicBackend": "accel.backends.qaic",
    "QaicCompileSpec": "accel.backends.qaic",
    "QaicOptions": "accel.backends.qaic",
    "write_qaic_files": "accel.backends.qaic",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "WEIGHT_MODES",
    "Backend",
    "BackendError",
    "BackendInfo",
    "ExportWeights",
    "FeatureBackend",
    "GraphSpec",
    "HiddenBackend",
    "MixBackend",
    "MixInputs",
    "OrtBackend",
    "QaicBackend",
    "QaicCompileSpec",
    "QaicOptions",
    "TorchBackend",
    "TreeBackend",
    "TreeInputs",
    "WeightFormat",
    "check_step_inputs",
    "export_cached",
    "export_onnx",
    "prefill",
    "require",
    "write_qaic_files",
]
