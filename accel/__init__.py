"""accel: fast LLM decoding on memory-bound accelerators.

- ``accel.formats``: OCP Microscaling (MX) formats; ``accel.compress(model, fmt="mxfp6")``.
- ``accel.models`` / ``accel.backends``: reference decoders, ONNX export with a KV cache, runtimes.
- ``accel.spd``: the speculative decoding loop.
- ``accel.sim``: roofline simulator for capacity planning (imported lazily).

``import accel`` needs neither torch nor matplotlib; they load when a function that needs them is called.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.errors import (
    AccelError,
    BackendError,
    DraftError,
    FormatError,
    ModelError,
    SimError,
    SpdError,
)

__version__ = "0.1.0"

_LAZY_SUBMODULES = {"formats", "models", "backends", "spd", "sim", "drafts"}
_LAZY_FUNCTIONS = {
    "compress": "accel.formats.compress",
    "save_compressed": "accel.formats.compress",
    "load_compressed": "accel.formats.compress",
}


__getattr__ = lazy_getattr(__name__, _LAZY_FUNCTIONS, {name: f"accel.{name}" for name in _LAZY_SUBMODULES})


__all__ = [
    "AccelError",
    "BackendError",
    "DraftError",
    "FormatError",
    "ModelError",
    "SimError",
    "SpdError",
    "__version__",
    "compress",
    "load_compressed",
    "save_compressed",
]
