"""ExportWeights / WeightFormat: the typed weight spec of export_onnx (no torch needed)."""

from __future__ import annotations

import pytest

from accel.backends import WEIGHT_MODES, ExportWeights, WeightFormat
from accel.errors import BackendError


def test_of_accepts_names_formats_and_specs():
    assert ExportWeights.of("mx-packed") == ExportWeights(WeightFormat.MX_PACKED)
    assert ExportWeights.of(WeightFormat.INT8).format is WeightFormat.INT8
    spec = ExportWeights("mx-rounded", mx_format="mxfp4", float_storage="fp16")
    assert ExportWeights.of(spec) is spec and spec.format is WeightFormat.MX_ROUNDED
    assert spec.float_dtype == "fp16" and ExportWeights("fp16").float_dtype == "fp16"
    assert ExportWeights().float_dtype == "fp32"
    assert WEIGHT_MODES == tuple(f.value for f in WeightFormat)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"format": "fp8"}, "weights='fp8' is not supported; supported: fp32, fp16"),
        ({"format": "mx-packed", "float_storage": "bf16"}, "float_storage='bf16' is not supported"),
        ({"format": "int8", "float_storage": "fp16"}, "float_storage applies to mx-rounded / mx-packed only"),
    ],
)
def test_bad_specs_are_named(kwargs, match):
    with pytest.raises(BackendError, match=match):
        ExportWeights(**kwargs)


def test_of_rejects_other_types():
    with pytest.raises(BackendError, match="weights must be an ExportWeights"):
        ExportWeights.of(8)  # type: ignore[arg-type]
