"""Lazy package attributes (PEP 562): keep ``import accel.<pkg>`` free of torch and matplotlib."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str,
    attributes: Mapping[str, str],
    modules: Mapping[str, str] | None = None,
    deprecated: Mapping[str, tuple[str, str]] | None = None,
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports on first use.

    ``attributes`` maps a public name to the module defining it; ``modules`` maps a public name to a module that
    is itself the attribute (e.g. ``accel.sim.plots``); ``deprecated`` maps a renamed name to ``(module, new
    name)``: it still resolves, with a ``DeprecationWarning`` naming the replacement (removed in accel 0.2.0); a moved
    module is ``(new module, its name below package)``, e.g. ``"demo": ("accel.apps.demo", "apps.demo")``.
    """
    modules = modules or {}
    deprecated = deprecated or {}

    def __getattr__(name: str) -> Any:
        if name in deprecated:
            module, new = deprecated[name]
            warnings.warn(
                f"{package}.{name} is deprecated and will be removed in accel 0.2.0; use {package}.{new}",
                DeprecationWarning,
                stacklevel=2,
            )
            target = importlib.import_module(module)
            return target if module == f"{package}.{new}" else getattr(target, new)  # a moved module: itself
        if name in attributes:
            return getattr(importlib.import_module(attributes[name]), name)
        if name in modules:
            return importlib.import_module(modules[name])
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
