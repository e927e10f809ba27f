"""What a model path holds: its HF config (directory, ``.gguf`` or the config recorded in an exported ``.onnx``), its
ONNX metadata, and its tokenizer (``tokenizer.json`` beside it, or the ``.gguf`` file's own)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from accel.errors import BackendError, SpdError

__all__ = ["find_tokenizer", "is_gguf", "model_config", "onnx_inputs", "onnx_metadata"]


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a llama.cpp ``.gguf`` file."""
    return path.is_file() and path.suffix == ".gguf"


@functools.lru_cache(maxsize=4)
def model_config(path: Path) -> dict[str, Any]:
    """The HF config of a checkpoint directory or ``.gguf`` file, or the one recorded in an exported ONNX file ({}
    when there is none); ``SpdError`` / ``BackendError`` naming a file that is not valid JSON or ONNX."""
    if is_gguf(path):
        from accel.models.gguf_loader import open_gguf

        return open_gguf(path)[0].to_hf()
    if path.is_dir():
        cfg = path / "config.json"
        text, where = (cfg.read_text(errors="replace"), str(cfg)) if cfg.is_file() else ("{}", "")
    elif path.suffix == ".onnx" and path.is_file():
        try:
            meta = _onnx_header(path)[0]
        except Exception as exc:  # protobuf DecodeError: a corrupt or truncated file
            raise BackendError(f"{path} is not a readable ONNX file: {type(exc).__name__}: {exc}") from exc
        text, where = meta.get("accel.model_config", "{}"), f"{path} (metadata accel.model_config)"
    else:
        return {}
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise SpdError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise SpdError(f"{where}: must hold a JSON object, got {type(cfg).__name__}")
    return cfg


def onnx_metadata(path: Path) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file ({} when unreadable: OrtBackend then reports the file)."""
    try:
        return dict(_onnx_header(path)[0])
    except Exception:  # protobuf DecodeError, a missing file
        return {}


def onnx_inputs(path: Path) -> set[str]:
    """The input names of an ONNX file's graph (empty when unreadable: OrtBackend then reports the file)."""
    try:
        return set(_onnx_header(path)[1])
    except Exception:  # protobuf DecodeError, a missing file
        return set()


def _onnx_header(path: Path) -> tuple[dict[str, str], frozenset[str]]:
    """An ONNX file's metadata and graph input names, parsed once per file version (name, mtime, size): building a
    decode asks for its config, metadata and inputs separately. Raises what ``onnx.load`` raises."""
    stat = path.stat()
    return _read_onnx_header(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read_onnx_header(path: str, mtime_ns: int, size: int) -> tuple[dict[str, str], frozenset[str]]:
    import onnx

    model = onnx.load(path, load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}, frozenset(i.name for i in model.graph.input)


def find_tokenizer(tokenizer: Path | None, model: Path):
    """The tokenizer at ``tokenizer`` (a ``tokenizer.json``, its directory or a ``.gguf``), or else ``model``'s own
    (an exported graph's ``NAME.tokenizer.json``, a ``tokenizer.json`` in or beside it, or the ``.gguf`` file's);
    None when ``model`` has none. ``SpdError`` when
    a given ``tokenizer`` holds none."""
    candidates = [tokenizer] if tokenizer else [model if model.is_dir() else model.parent]
    beside = model.with_name(model.stem + ".tokenizer.json")  # what accel export writes beside a graph
    if not tokenizer and model.suffix == ".onnx" and beside.is_file():
        candidates = [beside]
    if is_gguf(candidates[0]):  # the tokenizer stored in the GGUF file
        from accel.models.smollm2 import load_tokenizer

        return load_tokenizer(candidates[0])
    if not tokenizer and is_gguf(model):
        from accel.models.smollm2 import load_tokenizer

        return load_tokenizer(model)
    for c in candidates:
        if (c / "tokenizer.json").is_file() or (c.is_file() and c.suffix == ".json"):
            try:
                from accel.models.smollm2 import load_tokenizer
            except ImportError:  # accel.models needs torch; fall back to tokenizers directly
                from tokenizers import Tokenizer

                return Tokenizer.from_file(str(c / "tokenizer.json" if c.is_dir() else c))
            return load_tokenizer(c)
    if tokenizer:
        raise SpdError(f"no tokenizer.json at {tokenizer} (give a tokenizer.json, its directory or a .gguf)")
    return None
