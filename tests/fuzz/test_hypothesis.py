"""Property-based fuzzing of the entry points that read untrusted input: damaged accel files, arbitrary
config.json values, arbitrary quantize/decode arguments. Each input ends in the subpackage's named error or in a
correct result; nothing else (no numpy/pydantic/struct exception, no wrong data loaded)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel.errors import FormatError, ModelError
from accel.formats import MXTensor, decode_elements, load_tensors, quantize, save_tensors
from tests.fuzz.cases import CFG

FUZZ = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def accel_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    tensors = {"w": quantize(w, "mxfp6"), "b": rng.standard_normal(8).astype(np.float32)}
    path = tmp_path_factory.mktemp("f") / "t.safetensors"
    save_tensors(path, tensors)
    return path.read_bytes(), tensors


@FUZZ
@given(data=st.data())
def test_damaged_accel_files_are_named_or_loaded_intact(tmp_path, accel_file, data):
    raw, tensors = accel_file
    buf = bytearray(raw)
    kind = data.draw(st.sampled_from(["flip", "truncate", "splice"]))
    if kind == "flip":
        for at in data.draw(st.lists(st.integers(0, len(buf) - 1), min_size=1, max_size=4)):
            buf[at] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        buf = buf[: data.draw(st.integers(0, len(buf) - 1))]
    else:
        at = data.draw(st.integers(0, len(buf)))
        buf[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    path = tmp_path / "d.safetensors"
    path.write_bytes(bytes(buf))
    try:
        loaded = load_tensors(path)
    except FormatError as exc:
        assert str(exc)
        return
    # a change the format tolerates (e.g. header whitespace) must not change any value
    assert set(loaded) == set(tensors)
    np.testing.assert_array_equal(loaded["b"], tensors["b"])
    assert isinstance(loaded["w"], MXTensor)
    np.testing.assert_array_equal(loaded["w"].dequantize(), tensors["w"].dequantize())


@FUZZ
@given(field=st.sampled_from([*CFG, "tie_word_embeddings", "rope_theta", "rope_scaling", "eos_token_id"]), value=JSON)
def test_config_fields_of_any_json_value(field, value):
    from accel.models import ModelConfig

    raw = json.loads(json.dumps({**CFG, field: value}, allow_nan=True))
    try:
        cfg = ModelConfig.from_hf(raw)
    except ModelError as exc:
        assert field in str(exc) or "config" in str(exc)
        return
    if field == "tie_word_embeddings" and value is not None:  # JSON null: the field's default, as an absent field
        assert isinstance(value, bool) and cfg.tie_word_embeddings is value
    if field in ("hidden_size", "vocab_size", "num_hidden_layers"):
        assert type(value) is int and value >= 1


@FUZZ
@given(config=JSON)
def test_config_of_any_json_document(config):
    from accel.models import ModelConfig

    try:
        ModelConfig.from_hf(config)
    except ModelError:
        return
    raise AssertionError(f"accepted {config!r}")  # no random document is a complete, valid config


@FUZZ
@given(
    shape=st.lists(st.integers(0, 70), min_size=0, max_size=3),
    block=st.one_of(st.integers(-3, 2**31), st.floats(allow_nan=True), st.booleans(), st.none()),
    axis=st.integers(-5, 5),
    fmt=st.sampled_from(["mxfp6", "mxfp4", "mxint8", "mxfp8", "fp6", ""]),
)
def test_quantize_arguments(shape, block, axis, fmt):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    try:
        mx = quantize(x, fmt, block_size=block, axis=axis)
    except FormatError as exc:
        assert str(exc)
        return
    assert mx.dequantize().shape == x.shape


@FUZZ
@given(codes=st.lists(st.integers(-(2**40), 2**40), max_size=8), fmt=st.sampled_from(["mxfp6", "mxfp4", "mxfp8"]))
def test_decode_elements_codes(codes, fmt):
    bits = {"mxfp6": 6, "mxfp4": 4, "mxfp8": 8}[fmt]
    try:
        values = decode_elements(np.array(codes, dtype=np.int64), fmt)
    except FormatError:
        assert any(not 0 <= c < 2**bits for c in codes)
        return
    assert all(0 <= c < 2**bits for c in codes) and values.shape == (len(codes),)
