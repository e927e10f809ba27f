"""What every part of a ``DecodeSpec`` shares: ``Part``, a frozen pydantic model that refuses unknown fields and
names what a misplaced one would need, and ``refuse``, the one-line validation error of the spec's rules."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

__all__ = ["Part", "probability_below_1", "refuse"]

#: fields of the proposer kinds, with what they need: a misplaced one is named, not just "extra"
_NEEDS = {
    "draft": "a draft model (kind chain or tree)",
    "heads": "Hydra heads (kind hydra)",
    "head": "an EAGLE-3 head (kind eagle3 or eagle3_tree)",
    "k": "a chain (kind chain or eagle3), lookup, early_exit or superposed",
    "min_draft_prob": "a chain (kind chain or eagle3)",
    "n": "lookup (kind lookup, or its part of first_of / merge)",
    "nodes": "a tree (kind tree, hydra or eagle3_tree)",
    "top_k": "a tree (kind tree, hydra or eagle3_tree)",
    "depth": "a tree (kind tree, hydra or eagle3_tree) or superposed drafts (kind superposed)",
    "min_prob": "a tree (kind tree, hydra or eagle3_tree)",
    "expand_prob": "a tree (kind tree, hydra or eagle3_tree)",
    "weights": "a draft model or Hydra heads (kind chain, tree, superposed or hydra; an EAGLE-3 head runs float32)",
    "threads": "a draft model, heads or an exit stage (kind chain, tree, superposed, hydra, eagle3, eagle3_tree or "
    "early_exit)",
    "exit_layer": "an early exit (kind early_exit)",
    "exit_head": "an early exit (kind early_exit)",
    "store": "superposed drafts (kind superposed)",
}


def refuse(kind: str, text: str) -> PydanticCustomError:
    """A validation error of type ``kind`` whose message is ``text`` (passed as context: paths may hold braces)."""
    return PydanticCustomError(kind, "{text}", {"text": text})


class Part(BaseModel):
    """A frozen part of a spec that refuses unknown fields, naming what a misplaced field would need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _misplaced_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                if name not in cls.model_fields and name in _NEEDS:
                    raise refuse("ignored_field", f"{name} {value!r} would be ignored: it needs {_NEEDS[name]}")
        return data


def probability_below_1(name: str, value: float | None) -> float | None:
    """``value`` if it is None or in [0, 1) (``DraftTree``'s rule and message), else a named error."""
    if value is not None and not 0.0 <= value < 1.0:
        raise refuse("probability", f"{name} must be a probability in [0, 1); got {value!r}")
    return value
