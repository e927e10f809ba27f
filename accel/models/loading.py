"""Load a ``Decoder`` from a Hugging Face checkpoint directory, a GGUF file, a live transformers model, or an
accel-compressed checkpoint; save one as a Hugging Face checkpoint (``save_pretrained``).

Every tensor is checked: a missing, unexpected or wrongly shaped weight raises ``ModelError`` naming it. Files are
read with safetensors (or ``torch.load(weights_only=True)`` for ``pytorch_model.bin``): nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accel._io import output_folder
from accel.errors import FormatError, ModelError
from accel.formats import load_tensors
from accel.models.config import ModelConfig
from accel.models.decoder import Decoder
from accel.models.hf_names import HEAD_IDS, accel_to_hf, hf_to_accel
from accel.models.sources import open_checkpoint

__all__ = ["check_head_token_ids", "load_checkpoint", "load_state", "read_checkpoint_tensors", "save_pretrained"]

CHECKPOINT_FILES = ("model.safetensors", "config.json")  # what save_pretrained writes


def load_checkpoint(source: Any, *, dtype: torch.dtype = torch.float32) -> Decoder:
    """Build a ``Decoder`` (eval mode, parameters in ``dtype``) from ``source``.

    ``source`` may be: a checkpoint directory (``config.json`` + ``model.safetensors``, sharded
    ``model.safetensors.index.json``, or ``pytorch_model.bin``; plain or accel-compressed MX tensors, which are
    dequantized), a ``.gguf`` file (llama.cpp; quantized tensors are dequantized to float32), or a live
    ``transformers`` model object (its ``config`` and ``state_dict()``).

    Files are read one tensor at a time (``accel.models.sources``): peak memory is the model plus its largest tensor.
    """
    state: Mapping[str, Any]
    if isinstance(source, (str, os.PathLike)):
        config, state = open_checkpoint(source)  # read one tensor at a time while copying into the model
    elif hasattr(source, "state_dict") and hasattr(source, "config") and hasattr(source.config, "to_dict"):
        config = ModelConfig.from_hf(source.config.to_dict())
        state = hf_to_accel(config, dict(source.state_dict()))
    else:
        raise ModelError(
            f"cannot load a model from {type(source).__name__}; give a checkpoint directory, a .gguf file or a "
            "transformers model"
        )
    model = Decoder(config)
    load_state(model, state)
    return model.to(dtype).eval()


def load_state(model: Decoder, state: Mapping[str, Any]) -> None:
    """Copy ``state`` (``Decoder`` names; torch tensors or numpy arrays) into ``model``, checking names and shapes.

    With tied embeddings an ``lm_head.weight`` in ``state`` is ignored (HF checkpoints sometimes store it).
    Persistent buffers (a restricted head's ``lm_head_token_ids``) are loaded too; the token ids are validated
    (``check_head_token_ids``).
    """
    params: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    params.update(_persistent_buffers(model))
    tied = model.config.tie_word_embeddings
    expected = {n for n in params if not (tied and n == "lm_head.weight")}
    given = set(state) - ({"lm_head.weight"} if tied else set())
    missing = sorted(expected - given)
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ModelError(f"checkpoint is missing weight(s) {', '.join(missing[:5])}{more}")
    extra = sorted(given - expected)
    if extra:
        raise ModelError(
            f"checkpoint has unexpected tensor(s) {', '.join(extra[:5])}"
            + (" ..." if len(extra) > 5 else "")
            + f" for a {model.config.model_type} model with {model.config.num_layers} layers"
        )
    with torch.no_grad():
        for name in sorted(expected):
            value = state[name]
            if isinstance(value, np.ndarray):
                value = np.array(value) if not value.flags.writeable else np.ascontiguousarray(value)
            t = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            p = params[name]
            if tuple(t.shape) != tuple(p.shape):
                raise ModelError(f"weight {name!r} has shape {tuple(t.shape)}; the config implies {tuple(p.shape)}")
            if name == HEAD_IDS:
                check_head_token_ids(t, model.config.vocab_size, model.config.head_vocab)
            p.copy_(t.to(p.dtype))


def _persistent_buffers(model: Decoder) -> dict[str, torch.Tensor]:
    """The buffers that belong in a checkpoint (in the state dict), by name."""
    keys = set(model.state_dict().keys())
    return {n: b for n, b in model.named_buffers() if n in keys}


def check_head_token_ids(ids: torch.Tensor, vocab_size: int, head_vocab: int) -> None:
    """ModelError unless ``ids`` is an integer ``[head_vocab]`` tensor of sorted distinct ids in ``[0, vocab_size)``."""
    name = "lm_head.token_ids"
    if tuple(ids.shape) != (head_vocab,):
        raise ModelError(f"{name} has shape {tuple(ids.shape)}; the config's head_vocab implies ({head_vocab},)")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ModelError(f"{name} must be an integer tensor; got dtype {ids.dtype}")
    ids = ids.to(torch.int64)
    if head_vocab and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ModelError(f"{name} has ids outside [0, {vocab_size}): min {int(ids.min())}, max {int(ids.max())}")
    if head_vocab > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ModelError(f"{name} must be sorted ascending without repeats (strictly increasing)")


# ---------------------------------------------------------------------------------------------- reading files


def read_checkpoint_tensors(directory: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (HF names), float tensors as stored (MX tensors dequantized)."""
    d = Path(directory)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelError(f"{index} is not a valid safetensors index: {exc}") from exc
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(_read_safetensors(d / shard))
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise ModelError(f"{index} lists tensor {missing[0]!r} but its shard does not contain it")
        return tensors
    files = sorted(d.glob("*.safetensors"))
    if files:
        tensors = {}
        for f in files:
            tensors.update(_read_safetensors(f))
        return tensors
    binf = d / "pytorch_model.bin"
    if binf.is_file():
        try:
            return dict(torch.load(binf, map_location="cpu", weights_only=True))
        except Exception as exc:
            raise ModelError(f"cannot read {binf} with torch.load(weights_only=True): {exc}") from exc
    raise ModelError(
        f"no weights in {d}: expected model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )


def _safetensors_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors header; ModelError when the header is truncated or invalid."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{path} is truncated: {len(head)} bytes, no safetensors header")
            (n,) = struct.unpack("<Q", head)
            size = path.stat().st_size
            if n > size - 8:
                raise ModelError(f"{path} is truncated: header says {n} bytes, file has {size - 8} after the length")
            header = json.loads(f.read(n))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path} is not a valid safetensors file: {exc}") from exc
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
        raise ModelError(f"{path} has an invalid safetensors header: {exc!r}") from exc
    if ends and max(ends) > size - 8 - n:
        raise ModelError(f"{path} is truncated: tensors need {max(ends)} data bytes, file has {size - 8 - n}")
    return header.get("__metadata__") or {}


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelError(f"missing checkpoint shard {path}")
    meta = _safetensors_metadata(path)
    if any(k.startswith("accel") for k in meta):  # written by accel.formats (MX-compressed tensors)
        try:
            loaded = load_tensors(path)
        except FormatError as exc:
            raise ModelError(f"cannot read compressed checkpoint {path}: {exc}") from exc
        out = {}
        for name, value in loaded.items():
            arr = np.ascontiguousarray(value.dequantize(np.float32) if hasattr(value, "dequantize") else value)
            out[name] = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        return out
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc


# ---------------------------------------------------------------------------------------------- saving


def save_pretrained(model: Decoder, out_dir: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (HF names, so ``transformers`` loads it too) into ``out_dir``.

    Files are written to temporaries and renamed, so a crash never leaves a half-written checkpoint. Returns the dir.
    """
    from safetensors.torch import save_file

    compressed = [n for n, m in model.named_modules() if hasattr(m, "codes") and hasattr(m, "scales")]
    if compressed:
        raise ModelError(
            f"model has MX-compressed layers ({compressed[0]}, ...): save it with accel.save_compressed, or save the "
            "uncompressed model"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors = accel_to_hf(model.config, state)
    tensors = {k: v.clone() for k, v in tensors.items()}  # no shared storage (safetensors refuses it)
    cfg = json.dumps(model.config.to_hf(), indent=2)
    with output_folder(out_dir, "the checkpoint", ModelError, CHECKPOINT_FILES) as out:
        _atomic_write(out / "model.safetensors", lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
        _atomic_write(out / "config.json", lambda p: Path(p).write_text(cfg))
    return out


def _atomic_write(target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
