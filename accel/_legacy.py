"""Deprecated keywords of accel's public functions, kept for one release (removed in accel 0.2.0).

Functions whose keywords were grouped into typed objects (``accel.sim``'s ``CallShape``, ``PPDRun``, ``SweepAxes``,
``HostProbe``, ``RooflinePoints``; ``accel.backends.QaicOptions``) take the old keywords through one ``**legacy``
parameter and hand it to :func:`legacy_keywords`:
each deprecated keyword still works, folded into the object that replaced it, with one ``DeprecationWarning`` naming
the keywords and their replacement; giving the object and its deprecated keywords together is ambiguous and refused;
any other unexpected keyword is a ``TypeError`` naming it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Replaced:
    """Deprecated keywords replaced by the parameter ``param``: ``fields`` maps each keyword to its field in the
    object ``build(**fields)`` takes; ``hint`` says how the replacement reads (default ``param=Build(field=...)``,
    ``Build`` = ``label`` or ``build``'s name)."""

    param: str
    build: Callable[..., Any]
    fields: Mapping[str, str]
    hint: str = ""
    label: str = ""  # the replacement's class name when ``build`` is a helper around it

    def replacement(self, given: Sequence[str]) -> str:
        if self.hint:
            return self.hint
        name = self.label or getattr(self.build, "__name__", "")
        return f"{self.param}={name}({', '.join(f'{self.fields[k]}=...' for k in given)})"


def legacy_keywords(
    func: str,
    legacy: Mapping[str, Any],
    replaced: Sequence[Replaced],
    given: Mapping[str, Any],
    keep: Collection[str] | None = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(objects, kept)`` from the ``**legacy`` keywords of ``func``.

    ``objects``: for each ``Replaced`` parameter, the object its deprecated keywords build, or ``given[param]`` (the
    value the caller passed for it, ``None`` when absent) when none of them was given. ``kept``: the keywords of
    ``keep`` (``None``: every keyword that is not deprecated, for a caller that validates them itself, such as
    ``Deployment`` fields). Anything else is a ``TypeError`` naming it."""
    owner = {old: r for r in replaced for old in r.fields}
    unknown = sorted(k for k in legacy if k not in owner and keep is not None and k not in keep)
    if unknown:
        raise TypeError(f"{func}() got unexpected keyword argument(s) {', '.join(unknown)}")
    objects, notes = dict(given), []
    for r in replaced:
        old = [k for k in legacy if k in r.fields]
        if not old:
            objects.setdefault(r.param, None)
            continue
        if given.get(r.param) is not None:
            raise TypeError(f"{func}() got {r.param}= and the deprecated {', '.join(old)}: give {r.param} alone")
        objects[r.param] = r.build(**{r.fields[k]: legacy[k] for k in old})
        notes.append(f"{', '.join(f'{k}=' for k in old)} -> {r.replacement(old)}")
    if notes:
        warnings.warn(
            f"{func}(): deprecated keyword(s), removed in accel 0.2.0: {'; '.join(notes)}",
            DeprecationWarning,
            stacklevel=3,
        )
    kept = {k: v for k, v in legacy.items() if k not in owner}
    return objects, kept
