"""Shared pydantic base: validation failures surface as ``SimError`` (naming the field), not pydantic's error."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from accel.errors import SimError


def _message(cls_name: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "(model)"
        parts.append(f"{loc}: {err.get('msg', '')} (got {err.get('input')!r})"[:300])
    return f"invalid {cls_name}: " + "; ".join(parts)


class SimModel(BaseModel):
    """``BaseModel`` whose constructor raises ``SimError`` on bad input."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise SimError(_message(type(self).__name__, exc)) from None
