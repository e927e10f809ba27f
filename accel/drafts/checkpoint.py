"""Reading and writing the checkpoints ``accel.drafts`` works with, with ``DraftError`` for every bad input.

A target or draft is a ``Decoder`` or a checkpoint directory that ``accel.models.load`` reads (``config.json`` +
weights, plain or accel-compressed). A distilled draft is written as a normal checkpoint directory
(``accel.models.save_pretrained``) with the target's tokenizer files copied next to it, so every part of accel loads it.
Training state (optimizer, step, data order) lives in ``<out_dir>/.distill/`` and is written atomically.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from accel.errors import AccelError, DraftError
from accel.models.decoder import Decoder

__all__ = [
    "TOKENIZER_FILES",
    "check_pair",
    "copy_tokenizer",
    "describe",
    "load_model",
    "load_text_tokenizer",
    "load_torch_state",
    "save_model",
    "save_torch_state",
]

# files of a Hugging Face tokenizer that travel with a checkpoint
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def describe(model: Decoder | str | Path) -> str:
    """A short name for messages: the path, or ``Decoder(<layers>x<hidden>, vocab V)``."""
    if isinstance(model, Decoder):
        c = model.config
        return f"Decoder({c.num_layers}x{c.hidden_size}, vocab {c.vocab_size})"
    return str(model)


def load_model(model: Decoder | str | Path, role: str = "model") -> Decoder:
    """Return ``model`` as an eval-mode float32 ``Decoder``, loading a checkpoint directory with ``accel.models.load``.

    Raises ``DraftError`` naming ``role`` ("target"/"draft") and the path when the directory, its ``config.json`` or
    its weights are missing, or when the files are corrupted or do not match the config.
    """
    if isinstance(model, Decoder):
        return model.eval()
    if not isinstance(model, (str, os.PathLike)):
        raise DraftError(f"{role} must be a Decoder or a checkpoint directory; got {type(model).__name__}")
    path = Path(model)
    if not path.is_dir():
        raise DraftError(f"{role} checkpoint {path} does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise DraftError(f"{role} checkpoint {path} has no config.json")
    if not any((path / f).is_file() for f in _WEIGHT_FILES):
        raise DraftError(f"{role} checkpoint {path} has no weights (expected one of {', '.join(_WEIGHT_FILES)})")
    from accel.models.loading import load_checkpoint

    try:
        return load_checkpoint(path).eval()
    except AccelError as exc:
        raise DraftError(f"{role} checkpoint {path} cannot be loaded: {exc}") from exc
    except Exception as exc:  # safetensors/json/struct errors from a corrupted file
        raise DraftError(f"{role} checkpoint {path} is corrupted or unreadable: {type(exc).__name__}: {exc}") from exc


def check_pair(target: Decoder, draft: Decoder, target_name: str = "target", draft_name: str = "draft") -> None:
    """Raise ``DraftError`` unless ``draft`` can draft for ``target`` (same vocabulary size)."""
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise DraftError(
            f"draft {draft_name} has vocab_size {vd} but target {target_name} has {vt}: a draft must share the "
            "target's vocabulary (distill one with `accel distill`)"
        )


def load_text_tokenizer(checkpoint: str | Path):
    """The ``tokenizers.Tokenizer`` of a checkpoint directory (its ``tokenizer.json``); ``DraftError`` if absent."""
    path = Path(checkpoint) / "tokenizer.json"
    if not path.is_file():
        raise DraftError(f"{checkpoint} has no tokenizer.json: text needs the target's tokenizer (or pass token ids)")
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError as exc:  # pragma: no cover - demo extra
        raise DraftError("tokenizing text needs the `tokenizers` package (pip install accel[demo])") from exc
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        raise DraftError(f"{path} is not a valid tokenizer file: {exc}") from exc


def save_model(model: Decoder, out_dir: str | Path) -> Path:
    """Write ``model`` as a checkpoint directory (config.json + model.safetensors, atomically); returns the dir."""
    from accel.models.loading import save_pretrained

    return Path(save_pretrained(model, out_dir))


def copy_tokenizer(src: str | Path | None, dst: str | Path) -> list[str]:
    """Copy the tokenizer files present in ``src`` to ``dst``; returns their names (none if ``src`` is None)."""
    if src is None:
        return []
    copied = []
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            tmp = Path(dst) / f".{name}.tmp"
            shutil.copyfile(f, tmp)
            os.replace(tmp, Path(dst) / name)
            copied.append(name)
    return copied


def save_torch_state(state: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` to a temp file in the same directory, then rename (never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_torch_state(path: str | Path) -> dict[str, Any]:
    """Load a state written by ``save_torch_state`` (``weights_only=True``: nothing is unpickled)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DraftError(f"training state {path} is corrupted or unreadable: {exc}") from exc
