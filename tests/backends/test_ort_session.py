"""The optimized-graph cache of ``OrtBackend`` (``accel.backends.ort_session``): a session opened from the cached
copy computes the same logits bit for bit as one that optimizes the source, through a multi-call decode (the in-place
KV cache included); the copy is keyed by the file, and a bad file is still a BackendError."""

from __future__ import annotations

import os

import numpy as np
import pytest

from accel.backends import OrtBackend, export_onnx
from accel.backends.ort_session import optimized_key
from accel.errors import BackendError
from accel.models import Decoder, ModelConfig

CTX = 32


def _model() -> Decoder:
    cfg = ModelConfig(vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96)
    return Decoder(cfg).init_weights(4, std=0.1)


def _decode(backend: OrtBackend) -> list[np.ndarray]:
    """A prefill, single steps and a 3-token call: every call's logits."""
    backend.reset()
    out = [backend.forward(np.array([[3, 1, 4, 1, 5]]), np.arange(5)[None])]
    for i, t in enumerate((9, 2, 6)):
        out.append(backend.forward(np.array([[t]]), np.array([[5 + i]])))
    out.append(backend.forward(np.array([[5, 3, 5]]), np.arange(8, 11)[None]))
    return out


@pytest.mark.parametrize("weights", ["fp32", "mx-packed", "mxint8-nbits"])
def test_cached_optimized_graph_gives_the_same_logits(tmp_path, weights):
    path = export_onnx(_model(), tmp_path / "m.onnx", ctx_len=CTX, weights=weights, progress=False, external_data=True)
    cache = tmp_path / "opt"
    reference = _decode(OrtBackend(path, threads=1))
    first = _decode(OrtBackend(path, threads=1, optimized_dir=cache))  # optimizes and writes the copy
    entries = sorted(p.name for p in cache.iterdir())
    assert entries == [f"m-{optimized_key(path, ['CPUExecutionProvider'])}"]  # no temporary left
    assert sorted(p.name for p in (cache / entries[0]).iterdir()) == ["model.onnx", "model.onnx.data"]
    second = _decode(OrtBackend(path, threads=1, optimized_dir=cache))  # opens the copy, optimizations off
    assert sorted(p.name for p in cache.iterdir()) == entries
    for a, b, c in zip(reference, first, second, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_key_follows_the_file(tmp_path):
    path = export_onnx(_model(), tmp_path / "m.onnx", ctx_len=CTX, progress=False, external_data=True)
    key = optimized_key(path, ["CPUExecutionProvider"])
    data = path.with_name(path.name + ".data")
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the weights changed
    assert optimized_key(path, ["CPUExecutionProvider"]) != key
    OrtBackend(path, optimized_dir=tmp_path / "opt")
    assert len(list((tmp_path / "opt").iterdir())) == 1


def test_bad_file_is_a_backend_error_with_a_cache(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(BackendError, match="onnxruntime cannot load"):
        OrtBackend(bad, optimized_dir=tmp_path / "opt")
    assert not any((tmp_path / "opt").iterdir())
