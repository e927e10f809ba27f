"""Checkpoint files: round trip, safetensors compatibility, validation of corrupted input, atomic writes."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from accel.errors import FormatError
from accel.formats import load_tensors, quantize, save_tensors
from accel.formats.file import TensorSpec
from accel.formats.writer import SafetensorsWriter


@pytest.fixture
def tensors(rng):
    return {
        "embed.weight": rng.standard_normal((40, 16)).astype(np.float32),
        "layer.weight": quantize(rng.standard_normal((24, 70)).astype(np.float32), "mxfp6", name="layer.weight"),
        "layer4.weight": quantize(rng.standard_normal((8, 64)).astype(np.float32), "mxfp4", axis=0),
        "ids": np.arange(5, dtype=np.int64),
        "half": rng.standard_normal(7).astype(np.float16),
        "scalar": np.array(2.5, np.float64),
        "mask": np.array([True, False, True]),
    }


def test_round_trip_and_safetensors_compatible(tmp_path, tensors):
    path = tmp_path / "ckpt.safetensors"
    save_tensors(path, tensors, metadata={"note": "hi"})
    back = load_tensors(path)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        if isinstance(value, np.ndarray):
            assert back[name].dtype == value.dtype and back[name].shape == value.shape
            np.testing.assert_array_equal(back[name], value)
        else:
            assert back[name] == value
            assert not back[name].codes.flags.writeable  # memory-mapped, read-only
            np.testing.assert_array_equal(back[name].dequantize(), value.dequantize())
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        assert set(f.keys()) == {
            "embed.weight",
            "ids",
            "half",
            "scalar",
            "mask",
            "layer.weight.mx_codes",
            "layer.weight.mx_scales",
            "layer4.weight.mx_codes",
            "layer4.weight.mx_scales",
        }
        assert f.metadata()["note"] == "hi"
        np.testing.assert_array_equal(f.get_tensor("layer.weight.mx_scales"), tensors["layer.weight"].scales)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]  # no temp file left


def test_loads_plain_hf_file_with_bf16(tmp_path, rng):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    w = torch.from_numpy(rng.standard_normal((4, 8)).astype(np.float32)).to(torch.bfloat16)
    save_file({"w": w, "b": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    back = load_tensors(tmp_path / "model.safetensors")
    np.testing.assert_array_equal(back["w"], w.float().numpy())  # bf16 widened to float32 exactly
    np.testing.assert_array_equal(back["b"], np.ones(3, np.float32))


def _header(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return data, n, json.loads(data[8 : 8 + n])


def _rewrite_header(path, head, n, data):
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (n - len(raw))
    assert len(raw) == n
    path.write_bytes(data[:8] + raw + data[8 + n :])


def test_truncated_file(tmp_path, tensors):
    path = tmp_path / "a.safetensors"
    save_tensors(path, tensors)
    data = path.read_bytes()
    for cut in (4, 20, len(data) - 3):
        path.write_bytes(data[:cut])
        with pytest.raises(FormatError, match="truncated"):
            load_tensors(path)


def test_corrupted_bytes_name_the_tensor(tmp_path, tensors):
    path = tmp_path / "a.safetensors"
    save_tensors(path, tensors)
    data, n, head = _header(path)
    for name in ("layer.weight.mx_codes", "embed.weight"):
        b, _ = head[name]["data_offsets"]
        corrupted = bytearray(data)
        corrupted[8 + n + b + 1] ^= 0x01
        path.write_bytes(bytes(corrupted))
        with pytest.raises(FormatError, match=f"{name!r}: checksum mismatch"):
            load_tensors(path)


def test_wrong_shape_in_header(tmp_path, tensors):
    path = tmp_path / "a.safetensors"
    save_tensors(path, tensors)
    data, n, head = _header(path)
    head["embed.weight"]["shape"] = [41, 16]
    _rewrite_header(path, head, n, data)
    with pytest.raises(FormatError, match=r"'embed.weight': shape \[41, 16\] of F32 needs"):
        load_tensors(path)
    # an MX header whose logical shape disagrees with the stored codes/scales
    data, n, head = _header(path)
    head["embed.weight"]["shape"] = [40, 16]
    mx = json.loads(head["__metadata__"]["accel.mx"])
    mx["layer.weight"]["shape"] = [25, 70]
    head["__metadata__"]["accel.mx"] = json.dumps(mx, separators=(",", ":"))
    _rewrite_header(path, head, n, data)
    with pytest.raises(FormatError, match=r"'layer.weight': scales shape"):
        load_tensors(path)
    mx["layer.weight"]["shape"] = [24, 70]
    mx["layer.weight"]["fmt"] = "mxfp9"
    head["__metadata__"]["accel.mx"] = json.dumps(mx, separators=(",", ":"))
    _rewrite_header(path, head, n, data)
    with pytest.raises(FormatError, match="unknown MX format 'mxfp9'"):
        load_tensors(path)


def test_bad_values_and_no_partial_output(tmp_path, rng):
    path = tmp_path / "out.safetensors"
    with pytest.raises(FormatError, match=r"'c'.*complex"):
        save_tensors(path, {"a": np.ones(3, np.float32), "c": np.ones(2, np.complex64)})
    with pytest.raises(FormatError, match=r"'x'.*list"):
        save_tensors(path, {"x": [1.0]})  # type: ignore[dict-item]
    with pytest.raises(FormatError, match="reserved"):
        save_tensors(path, {"a": np.ones(3)}, metadata={"accel.mx": "{}"})
    with pytest.raises(FormatError, match="reserved"):
        save_tensors(path, {"a.mx_codes": np.ones(3)})
    assert list(tmp_path.iterdir()) == []
    # a failure in the middle of a write keeps the old file and leaves no temp file
    save_tensors(path, {"a": np.ones(3, np.float32)})
    before = path.read_bytes()

    specs = [TensorSpec("a", "F32", (3,)), TensorSpec("b", "F32", (2,))]
    with pytest.raises(RuntimeError, match="interrupted"):
        with SafetensorsWriter(path, specs) as writer:
            writer.write("a", np.zeros(3, np.float32))
            raise RuntimeError("interrupted")
    with pytest.raises(FormatError, match=r"never written.*'b'"):
        with SafetensorsWriter(path, specs) as writer:
            writer.write("a", np.zeros(3, np.float32))
    with pytest.raises(FormatError, match="'b': got F64"):
        with SafetensorsWriter(path, specs) as writer:
            writer.write("b", np.zeros(2))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.safetensors"]


def test_written_files_are_readable_by_others(tmp_path):
    """Temp files start as 0600; the renamed file gets the mode a plain open() would give (0666 & ~umask)."""
    import os

    path = tmp_path / "perm.safetensors"
    save_tensors(path, {"a": np.ones(2, np.float32)})
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_accel_files_must_carry_their_checksums(tmp_path, tensors):
    path = tmp_path / "a.safetensors"
    save_tensors(path, tensors)
    data, n, head = _header(path)
    crcs = json.loads(head["__metadata__"].pop("accel.crc32"))
    _rewrite_header(path, head, n, data)  # checksum key removed: never read as "nothing to check"
    with pytest.raises(FormatError, match="accel file without checksums"):
        load_tensors(path)
    del crcs["ids"]
    head["__metadata__"]["accel.crc32"] = json.dumps(crcs, separators=(",", ":"))
    _rewrite_header(path, head, n, data)
    with pytest.raises(FormatError, match=r"no checksum for tensor\(s\) \['ids'\]"):
        load_tensors(path)
    crcs["ids"] = 12345
    head["__metadata__"]["accel.crc32"] = json.dumps(crcs, separators=(",", ":"))
    _rewrite_header(path, head, n, data)
    with pytest.raises(FormatError, match="'ids' is not 8 hex digits"):
        load_tensors(path)
    # with every accel key gone the file declares itself plain safetensors: read without checksums
    save_tensors(path, {"w": np.ones(3, np.float32)})
    data, n, head = _header(path)
    head.pop("__metadata__")
    _rewrite_header(path, head, n, data)
    np.testing.assert_array_equal(load_tensors(path)["w"], np.ones(3, np.float32))


def test_writer_leaves_no_temp_file_when_the_target_is_or_becomes_a_directory(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(FormatError, match="is a directory"):
        save_tensors(tmp_path / "taken", {"a": np.ones(3, np.float32)})
    writer = SafetensorsWriter(tmp_path / "late", [TensorSpec("a", "F32", (3,))])
    writer.write("a", np.ones(3, np.float32))
    (tmp_path / "late").mkdir()  # the final rename fails: a FormatError naming the target (it was a raw OSError)
    (tmp_path / "late" / "x").write_text("x")
    with pytest.raises(FormatError, match=r"cannot write a safetensors file to .*late: Is a directory: .*\.tmp -> "):
        writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late", "taken"]


def test_writer_removes_the_folders_it_created_on_failure(tmp_path):
    with pytest.raises(FormatError, match="never written"):
        with SafetensorsWriter(tmp_path / "a" / "b" / "f.safetensors", [TensorSpec("a", "F32", (3,))]):
            pass
    assert list(tmp_path.iterdir()) == []


def test_save_compressed_to_a_directory_leaks_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    from accel import save_compressed

    (tmp_path / "out").mkdir()
    with pytest.raises(FormatError, match="is a directory"):
        save_compressed(torch.nn.Linear(4, 4), tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("new_key", ["accel.my", "accel_mx", None])
def test_a_renamed_or_removed_mx_header_is_an_error(tmp_path, new_key):
    path = tmp_path / "a.safetensors"
    save_tensors(path, {"w": quantize(np.linspace(-2, 2, 64, dtype=np.float32), "mxfp6"), "b": np.ones(2, np.float32)})
    data, n, head = _header(path)
    mx = head["__metadata__"].pop("accel.mx")
    if new_key:
        head["__metadata__"][new_key] = mx
    _rewrite_header(path, head, n, data)  # the codes and scales would otherwise load as plain uint8 tensors
    needle = "unknown accel metadata key" if new_key == "accel.my" else "'w.mx_codes' has no MX header"
    with pytest.raises(FormatError, match=needle):
        load_tensors(path)
