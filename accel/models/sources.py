"""Checkpoint tensors read one at a time: ``open_checkpoint(path)`` gives a model's config and a lazy mapping from
``Decoder`` names to numpy arrays, each read from its file only when asked for.

This is what lets ``export_onnx`` stream a multi-GB checkpoint (docs/backends.md, "Export"): nothing reads a whole
checkpoint into memory, and no torch model is built. Sources:

- a Hugging Face directory: ``model.safetensors`` (sharded or not; F32, F16, BF16) through accel's validated
  memory-mapped reader (``accel.formats.file.SafetensorsFile``); each tensor is copied out of the map and the map's
  pages are released (``madvise(MADV_DONTNEED)``), so resident memory does not grow with the file. accel-compressed
  MX tensors are dequantized one at a time. ``pytorch_model.bin`` is opened with
  ``torch.load(mmap=True, weights_only=True)`` (nothing is unpickled beyond tensors);
- a GGUF file: each tensor's bytes are read from the file and dequantized on access (``gguf_loader``);
- a loaded ``Decoder``: its parameters as numpy views (no copy).

Float tensors come out as float32; integer tensors (a restricted head's token ids) as stored.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import FormatError, ModelError
from accel.formats.constants import CODES_SUFFIX, SCALES_SUFFIX
from accel.formats.file import SafetensorsFile
from accel.models.config import ModelConfig
from accel.models.hf_names import hf_to_accel

__all__ = ["CheckpointTensors", "checkpoint_mx", "open_checkpoint"]

Loader = Callable[[], np.ndarray]


class CheckpointTensors(Mapping[str, np.ndarray]):
    """A read-only mapping ``Decoder`` name -> array that loads each tensor when it is looked up (never cached).

    ``shape(name)`` and ``in`` answer without reading data.
    """

    def __init__(self, loaders: dict[str, Loader], shapes: dict[str, tuple[int, ...]]) -> None:
        self._loaders, self._shapes = loaders, shapes

    def __getitem__(self, name: str) -> np.ndarray:
        return self._loaders[name]()

    def __contains__(self, name: object) -> bool:
        return name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape (``Decoder`` layout), without reading it."""
        return self._shapes[name]

    def num_elements(self) -> int:
        """Total number of elements over all tensors."""
        return int(sum(int(np.prod(s, dtype=np.int64)) for s in self._shapes.values()))


def open_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, CheckpointTensors]:
    """``(config, tensors)`` of a checkpoint directory or ``.gguf`` file, with tensors read lazily (``Decoder``
    names; float32 unless integer). ``ModelError`` names a missing or unreadable file."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        # import cycle: accel.models.gguf_loader returns its tensors as this module's CheckpointTensors
        from accel.models.gguf_loader import open_gguf

        return open_gguf(p)
    if not p.is_dir():
        raise ModelError(f"{p} is neither a checkpoint directory nor a .gguf file")
    method = engine_quant_method(p)
    if method is not None:  # its weights are codes and scales in another engine's layout, not Linear weights
        raise ModelError(
            f"{p} is a {method} MX checkpoint (config.json quantization_config.quant_method = {method!r}): load it "
            "with accel.serving.load_mx_checkpoint(path), or decode it with accel generate --backend torch"
        )
    config = ModelConfig.from_hf(p)
    hf_loaders, hf_shapes = _hf_files(p)
    return config, _rename(config, hf_loaders, hf_shapes)


#: quantization_config.quant_method values of the MX layouts accel.serving reads (AMD Quark, compressed-tensors)
ENGINE_QUANT_METHODS = ("quark", "compressed-tensors")


def engine_quant_method(path: str | os.PathLike) -> str | None:
    """The ``quantization_config.quant_method`` of a checkpoint directory saved in a serving engine's MX layout
    (``ENGINE_QUANT_METHODS``), or None (no such field, another method, no readable config.json)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    return method if method in ENGINE_QUANT_METHODS else None


def checkpoint_mx(path: str | os.PathLike) -> dict[str, Any]:
    """The MX-compressed weights of an accel-compressed checkpoint directory (``accel compress``), by ``Decoder``
    name, as the ``MXTensor`` each file stores (codes and scales as they are, validated; read now, about 6.25 bits a
    weight for MXFP6); {} for an uncompressed directory or a ``.gguf`` file. An export keeps these weights exactly
    instead of re-quantizing their dequantized values (``accel.backends.export``)."""
    p = Path(path)
    if not p.is_dir():
        return {}
    config = ModelConfig.from_hf(p)
    out: dict[str, Any] = {}
    for f in sorted(p.glob("*.safetensors")):
        try:
            sf = SafetensorsFile(f)
            heads = sf.mx_headers
            if not heads:
                continue
            tensors = {name: sf.mx_tensor(name) for name in heads}
        except FormatError as exc:
            raise ModelError(f"cannot read the MX tensors of {f}: {exc}") from exc
        for hf_name, mx in tensors.items():
            name = hf_name[len("model.") :] if hf_name.startswith("model.") else hf_name
            if config.model_type == "gpt2":
                raise ModelError(
                    f"{f}: MX tensor {hf_name!r} has no plain Decoder name; load the checkpoint with "
                    "accel.models.load_checkpoint and export the model"
                )
            out[name] = mx
    return out


def _hf_files(d: Path) -> tuple[dict[str, Loader], dict[str, tuple[int, ...]]]:
    """Loaders and shapes of every tensor of a checkpoint directory, by HF name."""
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = [d / shard for shard in sorted(set(weight_map.values()))]
    else:
        weight_map, files = None, sorted(d.glob("*.safetensors"))
    if not files:
        binf = d / "pytorch_model.bin"
        if binf.is_file():
            return _bin_file(binf)
        raise ModelError(
            f"no weights in {d}: expected model.safetensors, model.safetensors.index.json or pytorch_model.bin"
        )
    loaders: dict[str, Loader] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        _safetensors_file(f, loaders, shapes)
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(loaders))
        if missing:
            raise ModelError(f"{index} lists tensor {missing[0]!r} but its shard does not contain it")
    return loaders, shapes


def _safetensors_file(path: Path, loaders: dict[str, Loader], shapes: dict[str, tuple[int, ...]]) -> None:
    if not path.is_file():
        raise ModelError(f"missing checkpoint shard {path}")
    try:
        sf = SafetensorsFile(path)
        mx = sf.mx_headers
    except FormatError as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    stored = {n + s for n in mx for s in (CODES_SUFFIX, SCALES_SUFFIX)}

    def plain(name: str) -> np.ndarray:
        try:
            sf.verify(name)
            out = _copy_float32(sf.raw(name), sf.entries[name].dtype)  # the map's pages are released below
        except FormatError as exc:
            raise ModelError(f"cannot read tensor {name!r} of {path}: {exc}") from exc
        _release(sf, *sf.offsets[name])
        return out

    def dequantized(name: str) -> np.ndarray:
        try:
            out = sf.mx_tensor(name).dequantize(np.float32)
        except FormatError as exc:
            raise ModelError(f"cannot read tensor {name!r} of {path}: {exc}") from exc
        for suffix in (CODES_SUFFIX, SCALES_SUFFIX):
            _release(sf, *sf.offsets[name + suffix])
        return out

    for name, spec in sf.entries.items():
        if name not in stored:
            loaders[name], shapes[name] = partial(plain, name), tuple(spec.shape)
    for name, head in mx.items():
        loaders[name], shapes[name] = partial(dequantized, name), tuple(head["shape"])


def _release(sf: Any, begin: int, end: int) -> None:
    """Drop the memory-mapped pages of bytes ``[begin, end)`` of a safetensors file's data from this process (they
    stay in the page cache; a later read maps them again). Only a hint: nothing breaks if it is not possible."""
    raw = getattr(getattr(sf, "_map", None), "_mmap", None)
    if raw is None or not hasattr(raw, "madvise"):
        return
    start = (sf.data_start + begin) // mmap.PAGESIZE * mmap.PAGESIZE
    stop = min(sf.data_start + end, len(raw))
    if stop > start:
        try:
            raw.madvise(mmap.MADV_DONTNEED, start, stop - start)
        except (OSError, ValueError):
            pass


def _copy_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 copy of a stored float tensor (BF16 widened exactly, in one allocation), or a plain copy of any
    other tensor: never a view of the memory map."""
    if dtype == "BF16":
        out = raw.astype(np.uint32)
        out <<= 16
        return out.view(np.float32)
    if raw.dtype.kind == "f":
        return raw.astype(np.float32)  # a copy, also for F32
    return np.array(raw)


def _as_float32(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f" and arr.dtype != np.float32:
        return arr.astype(np.float32)
    return arr


def _bin_file(path: Path) -> tuple[dict[str, Loader], dict[str, tuple[int, ...]]]:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise ModelError(f"cannot read {path} with torch.load(weights_only=True): {exc}") from exc

    def load(name: str) -> np.ndarray:
        t = state[name]
        return _as_float32(t.float().numpy().copy() if t.is_floating_point() else t.numpy().copy())

    return {n: partial(load, n) for n in state}, {n: tuple(t.shape) for n, t in state.items()}


def _rename(config: ModelConfig, loaders: dict[str, Loader], shapes: dict[str, tuple[int, ...]]) -> CheckpointTensors:
    """HF names -> ``Decoder`` names, lazily (``accel.models.hf_names.hf_to_accel``). For the Llama family it is a
    rename, worked out on the names alone (no torch); GPT-2's fused ``c_attn`` split and Conv1D transposes are worked
    out once on shape-only (meta) torch tensors and applied to each tensor's data when it is read."""
    out_loaders: dict[str, Loader] = {}
    out_shapes: dict[str, tuple[int, ...]] = {}
    for hf_name, shape in shapes.items():
        produced = hf_to_accel(config, {hf_name: _meta(shape) if config.model_type == "gpt2" else shape})
        for name, meta in produced.items():
            out_shapes[name] = tuple(meta if isinstance(meta, tuple) else meta.shape)
            if name == hf_name or (hf_name.startswith("model.") and name == hf_name[len("model.") :]):
                out_loaders[name] = loaders[hf_name]  # a plain rename: no torch round trip
            else:
                out_loaders[name] = partial(_converted, config, hf_name, name, loaders[hf_name])
    return CheckpointTensors(out_loaders, out_shapes)


def _meta(shape: tuple[int, ...]) -> Any:
    import torch

    return torch.empty(shape, device="meta")


def _converted(config: ModelConfig, hf_name: str, name: str, load: Loader) -> np.ndarray:
    import torch

    t = hf_to_accel(config, {hf_name: torch.from_numpy(load())})[name]
    return t.contiguous().numpy()


def decoder_tensors(model: Any) -> CheckpointTensors:
    """The parameters of a loaded ``Decoder`` (and a restricted head's ``lm_head_token_ids``) as numpy views, float32
    (no copy when the model is float32). A tied ``lm_head.weight`` appears once, as ``embed_tokens.weight``; an
    MX-compressed Linear's weight is not a parameter and is not listed."""
    params = dict(model.named_parameters())  # remove_duplicate: a tied head is listed once
    if getattr(model, "lm_head_token_ids", None) is not None:
        params["lm_head_token_ids"] = model.lm_head_token_ids

    def load(name: str) -> np.ndarray:
        t = params[name].detach().cpu()
        return t.float().numpy() if t.is_floating_point() else t.numpy()

    return CheckpointTensors({n: partial(load, n) for n in params}, {n: tuple(p.shape) for n, p in params.items()})
