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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from accel._io import output_file, writing
from accel.errors import AccelError, DraftError, ModelError
from accel.models.decoder import Decoder
from accel.models.loading import load_checkpoint, save_pretrained

__all__ = [
    "TOKENIZER_FILES",
    "check_finite",
    "check_pair",
    "copy_tokenizer",
    "describe",
    "load_model",
    "load_text_tokenizer",
    "load_torch_state",
    "restoring",
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
    its weights are missing, when the files are corrupted or do not match the config, or when a weight holds NaN or
    ±Inf (a damaged or diverged checkpoint: its drafts would be accepted never, or checked against NaN).
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
    try:
        loaded = load_checkpoint(path).eval()
    except AccelError as exc:
        raise DraftError(f"{role} checkpoint {path} cannot be loaded: {exc}") from exc
    except Exception as exc:  # safetensors/json/struct errors from a corrupted file
        raise DraftError(f"{role} checkpoint {path} is corrupted or unreadable: {type(exc).__name__}: {exc}") from exc
    check_finite(loaded.state_dict(), f"{role} checkpoint {path}")
    return loaded


def check_finite(tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """``DraftError`` naming ``source`` and the first tensor unless every floating-point tensor is finite."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise DraftError(
            f"{source}: {bad[0]} holds NaN or infinite weights ({len(bad)} tensor(s) do): the checkpoint is damaged"
        )


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
    """Write ``model`` as a checkpoint directory (config.json + model.safetensors, atomically); returns the dir.
    ``DraftError`` naming ``out_dir`` when it cannot be written (``accel.models.save_pretrained``'s checks)."""
    try:
        return Path(save_pretrained(model, out_dir))
    except ModelError as exc:
        raise DraftError(str(exc)) from exc


def copy_tokenizer(src: str | Path | None, dst: str | Path) -> list[str]:
    """Copy the tokenizer files present in ``src`` to ``dst`` (each through a temp file and a rename); returns their
    names (none if ``src`` is None). ``DraftError`` naming ``dst`` when it cannot be written."""
    if src is None:
        return []
    copied = []
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            tmp = Path(dst) / f".{name}.tmp"
            with writing(dst, f"the tokenizer file {name}", DraftError):
                try:
                    shutil.copyfile(f, tmp)
                    os.replace(tmp, Path(dst) / name)
                finally:
                    tmp.unlink(missing_ok=True)
            copied.append(name)
    return copied


def save_torch_state(state: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` to a temp file in the same directory, then rename (never a half-written file); ``DraftError``
    naming ``path`` when it cannot be written."""
    with output_file(path, "the training state", DraftError) as out:
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        os.close(fd)
        try:
            torch.save(state, tmp)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def load_torch_state(path: str | Path) -> dict[str, Any]:
    """Load a state written by ``save_torch_state`` (``weights_only=True``: nothing is unpickled); ``DraftError``
    when it is unreadable or not a dict of named entries."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DraftError(f"training state {path} is corrupted or unreadable: {exc}") from exc
    if not isinstance(state, dict):
        raise DraftError(f"training state {path} holds a {type(state).__name__}, not a training state")
    return state


@contextmanager
def restoring(path: str | Path) -> Iterator[None]:
    """Within the block (a trainer restoring the state at ``path``), a missing entry or one of the wrong shape,
    type or value is ``DraftError`` naming the file, never a bare ``KeyError``/``RuntimeError`` from torch."""
    try:
        yield
    except AccelError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as exc:
        raise DraftError(
            f"training state {path} does not fit this run ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            "start without resume"
        ) from exc
