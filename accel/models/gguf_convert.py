"""``checkpoint_dir``: a checkpoint directory for what the user has -- the directory itself, or for a llama.cpp
``.gguf`` file an HF-style directory converted once and cached, so that every command taking a directory (``compress``,
``distill``, ``eval-draft``, ``demo``, ``benchmarks/spd.py``) also takes a ``.gguf``.

The converted directory holds ``config.json``, ``model.safetensors`` (float32, HF names: the GGUF's tensors
dequantized exactly, written one tensor at a time, so memory stays at one tensor) and ``tokenizer.json`` (the GGUF's
tokenizer, ``accel.models.gguf_tokenizer``; left out, with a note, when the file's tokenizer is not supported). It
lives in ``$ACCEL_CACHE/gguf/<name>-<key>`` (key: the file's name, size and modification time), takes 4 bytes per
parameter on disk, and is built in a temporary sibling and renamed. ``accel export`` and ``accel generate`` read
``.gguf`` files directly and need no conversion.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from accel._io import output_folder, writing
from accel.errors import ModelError
from accel.formats.file import TensorSpec
from accel.formats.writer import SafetensorsWriter
from accel.models.gguf_loader import open_gguf
from accel.models.gguf_tokenizer import gguf_tokenizer
from accel.models.hf_names import accel_to_hf
from accel.models.smollm2 import cache_root

__all__ = ["checkpoint_dir", "gguf_to_checkpoint"]

_FILES = ("config.json", "model.safetensors")


def checkpoint_dir(path: str | os.PathLike, *, say: Callable[[str], None] | None = None) -> Path:
    """For a ``.gguf`` file, its converted directory (converted on first use); any other path as it is (a directory,
    or something the caller's own checks report with the caller's words).

    ``say``: optional callable receiving a status line when a conversion starts and ends.
    """
    p = Path(path)
    if not (p.is_file() and p.suffix == ".gguf"):
        return p
    st = p.stat()
    key = hashlib.sha256(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_root() / "gguf" / f"{p.stem}-{key}"
    if all((target / f).is_file() for f in _FILES):
        return target
    if say:
        say(f"converting {p.name} to a float32 checkpoint directory (once): {target}")
    with writing(target, f"the converted checkpoint of {p.name}", ModelError):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            note = gguf_to_checkpoint(p, tmp)
            tmp.chmod(0o755)  # mkdtemp creates 0700
            if target.exists():
                shutil.rmtree(target)  # an incomplete leftover
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if say:
        say(f"converted {p.name}" + (f" ({note})" if note else ""))
    return target


def gguf_to_checkpoint(gguf: str | os.PathLike, out_dir: str | os.PathLike) -> str:
    """Write ``gguf`` as ``config.json`` + float32 ``model.safetensors`` (+ ``tokenizer.json``) in ``out_dir``, one
    tensor at a time. Returns a note ("" or why there is no tokenizer.json)."""
    import json

    gguf = Path(gguf)
    config, tensors = open_gguf(gguf)
    hf_names = accel_to_hf(config, {name: name for name in tensors})  # HF name -> Decoder name (renaming only)
    specs = [TensorSpec(hf, "F32", tensors.shape(name)) for hf, name in hf_names.items()]
    with output_folder(out_dir, "the converted checkpoint", ModelError, (*_FILES, "tokenizer.json")) as out:
        with SafetensorsWriter(out / "model.safetensors", specs, metadata={"format": "pt"}) as w:
            for hf, name in hf_names.items():
                w.write(hf, tensors[name])
        (out / "model.safetensors").chmod(0o644)
        (out / "config.json").write_text(json.dumps(config.to_hf(), indent=2))
        try:
            gguf_tokenizer(gguf).save(str(out / "tokenizer.json"))
        except ModelError as exc:
            return f"no tokenizer.json: {exc}"
    return ""
