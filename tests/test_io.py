"""``accel._io``: output paths that cannot be written are the caller's named error (one line naming the path, what
was being written and why), checked before any work, and a failed writer leaves nothing behind. Real paths only: a
parent that is a regular file, ``/sys`` (where even root cannot create anything), folders in the way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from accel._io import check_output_path, output_file, output_folder, writing
from accel.errors import BackendError, DraftError, FormatError, ModelError

READ_ONLY = Path("/sys/accel-read-only")
linux_only = pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs sysfs (Linux) for a read-only folder")


def test_a_file_target_that_is_a_directory_or_under_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(BackendError, match=rf"cannot write the ONNX graph to {tmp_path}: it is a directory"):
        check_output_path(tmp_path, "the ONNX graph", BackendError)
    with pytest.raises(BackendError, match=r"notes\.txt/a/m\.onnx: .*notes\.txt is not a directory"):
        check_output_path(tmp_path / "notes.txt" / "a" / "m.onnx", "the ONNX graph", BackendError)
    with pytest.raises(FormatError, match="it exists and is not a directory"):
        check_output_path(tmp_path / "notes.txt", "a checkpoint", FormatError, folder=True)
    assert check_output_path(tmp_path / "new" / "m.onnx", "the ONNX graph", BackendError) == tmp_path / "new" / "m.onnx"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # the write probe left nothing


@linux_only
def test_a_read_only_folder_is_named_before_any_work(tmp_path):
    """Root may write anywhere ``os.access`` is asked about, yet not in /sys: the probe finds it out."""
    with pytest.raises(DraftError, match=r"cannot write the draft to /sys/accel-read-only/d: nothing can be created"):
        check_output_path(READ_ONLY / "d", "the draft", DraftError, folder=True)
    with pytest.raises(ModelError, match=r"^cannot write x to /sys/y: Permission denied$"):
        with writing("/sys/y", "x", ModelError):
            Path("/sys/y").write_text("x")  # the refusal is the point


def test_output_folder_removes_what_it_created_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with output_folder(tmp_path / "a" / "b", "a folder", DraftError) as out:
            (out / "half.bin").write_bytes(b"x")
            raise RuntimeError("the writer failed half way")
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("mine")
    (kept / "model.safetensors").mkdir()
    with pytest.raises(DraftError, match=r"model\.safetensors is a directory"):
        with output_folder(kept, "a checkpoint", DraftError, ("config.json", "model.safetensors")):
            pass
    assert sorted(p.name for p in kept.iterdir()) == ["mine.txt", "model.safetensors"]


def test_output_file_turns_an_oserror_into_the_named_error(tmp_path):
    with pytest.raises(FormatError, match=r"cannot write x to .*f\.bin: Is a directory: .*tmp -> .*f\.bin"):
        with output_file(tmp_path / "sub" / "f.bin", "x", FormatError) as out:
            (out.parent / "tmp").write_bytes(b"x")
            out.mkdir()  # the final rename finds a folder in its way
            (out / "y").write_text("y")
            (out.parent / "tmp").rename(out)
    assert list(tmp_path.iterdir()) == []  # the folder it made is gone with what was in it


def test_save_pretrained_over_a_folder_in_the_way_writes_nothing(tmp_path):
    """Before: model.safetensors was written, then the rename of config.json failed (a raw IsADirectoryError) and
    left a checkpoint folder with weights and no config."""
    from accel.models import save_pretrained
    from tests.helpers.decoders import random_model

    (tmp_path / "ckpt" / "config.json").mkdir(parents=True)
    with pytest.raises(ModelError, match=r"cannot write the checkpoint to .*ckpt: .*config\.json is a directory"):
        save_pretrained(random_model(0), tmp_path / "ckpt")
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["config.json"]


def test_export_hydra_keeps_a_folder_that_is_not_an_export(tmp_path):
    """Before: ``export_hydra`` removed whatever folder ``out_dir`` named and put the export there."""
    from accel.drafts.hydra.export import export_hydra
    from accel.drafts.hydra.model import build_hydra
    from tests.helpers.decoders import random_model

    model = random_model(0)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(DraftError, match=r"holds files but no hydra\.json"):
        export_hydra(build_hydra(model, num_heads=1), tmp_path / "mine", ctx_len=8)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    out = export_hydra(build_hydra(model, num_heads=1), tmp_path / "export", ctx_len=8)
    assert export_hydra(build_hydra(model, num_heads=2), out, ctx_len=8) == out  # an export is replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "mine"]


def test_export_onnx_under_a_file_is_a_backend_error(tmp_path):
    from accel.backends import export_onnx
    from tests.helpers.decoders import random_model

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(BackendError, match="cannot write the ONNX graph"):
        export_onnx(random_model(0), tmp_path / "notes.txt" / "m.onnx", ctx_len=8, progress=False)


def test_save_tensors_names_the_path_and_leaves_no_parent(tmp_path):
    from accel.formats import save_tensors

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FormatError, match=r"cannot write a safetensors file to .*notes\.txt/a/t\.safetensors"):
        save_tensors(tmp_path / "notes.txt" / "a" / "t.safetensors", {"a": np.ones(2, np.float32)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
