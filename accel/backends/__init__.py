"""Runtimes behind one ``Backend`` protocol (see ``accel.backends.base``).

``TorchBackend`` needs torch and is imported lazily; the protocol and the onnxruntime backend do not.
"""

from __future__ import annotations

import importlib
from typing import Any

from accel.backends.base import Backend, BackendInfo, check_step_inputs, prefill
from accel.errors import BackendError

_LAZY = {
    "TorchBackend": "accel.backends.torch_backend",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'accel.backends' has no attribute {name!r}")


__all__ = ["Backend", "BackendError", "BackendInfo", "TorchBackend", "check_step_inputs", "prefill"]
