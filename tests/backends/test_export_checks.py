"""export_onnx's settings are checked before anything is built or written (BackendError naming the setting)."""

from __future__ import annotations

import pytest

from accel.backends import export_onnx
from accel.errors import BackendError
from tests.helpers.decoders import random_model


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"ctx_len": 1.5}, "ctx_len must be an int >= 1; got 1.5"),
        ({"ctx_len": True}, "ctx_len must be an int >= 1; got True"),
        ({"ctx_len": "64"}, "ctx_len must be an int"),
        ({"ctx_len": 0}, "ctx_len must be an int >= 1; got 0"),
        ({"batch_size": 2.0}, "batch_size must be an int"),
        ({"batch_size": -1}, "batch_size must be an int"),
        ({"num_logits": 0.5}, "num_logits must be an int"),
        ({"num_logits": False}, "num_logits must be an int"),
        ({"num_logits": 65}, r"num_logits=65 must be in 1\.\.ctx_len"),
        ({"ctx_len": 10**9}, r"ctx_len 1000000000 too large: at most 1048576"),
        ({"batch_size": 10**7}, r"batch_size 10000000 too large: at most 4096"),
    ],
)
def test_export_settings_are_checked(tmp_path, kwargs, needle):
    with pytest.raises(BackendError, match=needle):
        export_onnx(random_model(0), tmp_path / "m.onnx", **{"ctx_len": 64, **kwargs}, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_export_to_a_directory_is_named(tmp_path):
    with pytest.raises(BackendError, match=r"is a directory: give the path of the \.onnx file"):
        export_onnx(random_model(0), tmp_path, ctx_len=16, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"ctx_len": 10**11}, "ctx_len 100000000000 too large: at most 1048576"),
        ({"ctx_len": 0}, "ctx_len must be an int >= 1; got 0"),
        ({"ctx_len": 2.5}, "ctx_len must be an int >= 1; got 2.5"),
        ({"ctx_len": 64, "batch_size": 5000}, "batch_size 5000 too large: at most 4096"),
        ({"ctx_len": 64, "threads": 0}, "threads must be an int >= 1; got 0"),
        ({"ctx_len": 64, "threads": -3}, "threads must be an int >= 1; got -3"),
        ({"ctx_len": 1 << 20, "batch_size": 4096}, r"needs \d+\.\d GiB; this machine has"),
    ],
)
def test_torch_backend_sizes_are_checked_before_allocating(kwargs, needle):
    from accel.backends import TorchBackend

    with pytest.raises(BackendError, match=needle):
        TorchBackend(random_model(0), **kwargs)


def test_torch_backend_needs_a_decoder():
    from accel.backends import TorchBackend

    with pytest.raises(BackendError, match=r"needs an accel\.models\.Decoder; got str"):
        TorchBackend("model.onnx", ctx_len=16)
