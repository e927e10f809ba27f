"""accel: fast LLM decoding on memory-bound accelerators.

- ``accel.formats``: OCP Microscaling (MX) formats; ``accel.compress(model, fmt="mxfp6")``.
- ``accel.models`` / ``accel.backends``: reference decoders, ONNX export with a KV cache, runtimes.
- ``accel.spd``: the speculative decoding loop; ``accel.drafts``: draft models; ``accel.superposed``: Superposed
  Decoding.
- ``accel.sim``: roofline simulator for capacity planning.

Subpackages are imported on first use: ``import accel`` needs neither torch nor matplotlib; they load when a function
that needs them is called. The public API (every package's ``__all__``) is listed in docs/api.md.
"""

from __future__ import annotations

from accel._lazy import lazy_getattr
from accel.errors import (
    AccelError,
    BackendError,
    CpuWarning,
    DraftError,
    FormatError,
    ModelError,
    NgramError,
    NonFiniteWarning,
    SimError,
    SpdError,
    SuperposedError,
    TokenizerWarning,
)

__version__ = "0.1.0"

_LAZY_SUBMODULES = {"formats", "models", "backends", "spd", "sim", "drafts", "superposed"}
_LAZY_FUNCTIONS = {
    "compress": "accel.formats.compress",
    "save_compressed": "accel.formats.compress",
    "load_compressed": "accel.formats.compress",
}
#: renamed public names, kept for one release (removed in 0.2.0): old name -> (module, new name); docs/api.md
_DEPRECATED = {
    "save": ("accel.formats.compress", "save_compressed"),
    "load": ("accel.formats.compress", "load_compressed"),
    "demo": ("accel.apps.demo", "apps.demo"),  # the demo application moved with the command line (accel.apps)
}

__getattr__ = lazy_getattr(__name__, _LAZY_FUNCTIONS, {name: f"accel.{name}" for name in _LAZY_SUBMODULES}, _DEPRECATED)


__all__ = [
    "AccelError",
    "BackendError",
    "CpuWarning",
    "DraftError",
    "FormatError",
    "ModelError",
    "NgramError",
    "NonFiniteWarning",
    "SimError",
    "SpdError",
    "SuperposedError",
    "TokenizerWarning",
    "__version__",
    "compress",
    "load_compressed",
    "save_compressed",
]
