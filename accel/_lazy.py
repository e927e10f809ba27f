"""Lazy package attributes (PEP 562): keep ``import accel.<pkg>`` free of torch and matplotlib."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, attributes: Mapping[str, str], modules: Mapping[str, str] | None = None
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports on first use.

    ``attributes`` maps a public name to the module defining it; ``modules`` maps a public name to a module that
    is itself the attribute (e.g. ``accel.sim.plots``).
    """
    modules = modules or {}

    def __getattr__(name: str) -> Any:
        if name in attributes:
            return getattr(importlib.import_module(attributes[name]), name)
        if name in modules:
            return importlib.import_module(modules[name])
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
