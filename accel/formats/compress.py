"""Model-level workflow: ``accel.compress`` swaps nn.Linear weights for MX; ``accel.save_compressed`` /
``accel.load_compressed`` round-trip a compressed model through an accel safetensors file.

(``accel.models.load_checkpoint`` is the other loader: it reads a Hugging Face directory or a GGUF file into a
``Decoder``, dequantizing any MX tensors.)

Shaped like gpt-fast's two-step quantization handler: pick the Linear layers, quantize their weights (blocked along
in_features, the reduction axis, as an MX matmul does), then swap each for an ``MXLinear``. By default every Linear
except the LM head and any Linear whose weight is tied to an embedding is compressed; embeddings are never Linear.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from accel.errors import FormatError
from accel.formats.constants import DEFAULT_BLOCK_SIZE, FILE_TIED_KEY
from accel.formats.elements import get_format
from accel.formats.file import SafetensorsFile, TensorSpec, dtype_code, json_meta, mx_specs
from accel.formats.mx_tensor import check_block_size
from accel.formats.report import CompressionReport, check_nonfinite, check_policy, layer_report
from accel.formats.torch_ops import MXLinear, quantize_torch
from accel.formats.writer import SafetensorsWriter

ModuleT = TypeVar("ModuleT", bound=nn.Module)

_MX_BUFFERS = ("codes", "scales")


def _patterns(value: str | list[str] | tuple[str, ...] | None, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not all(isinstance(p, str) for p in value):
        raise FormatError(f"{what} must be glob patterns (str), got {value!r}")
    return list(value)


def select_linear_layers(
    model: nn.Module, include: str | list[str] | None = None, exclude: str | list[str] | None = None
) -> tuple[list[str], list[str]]:
    """(names of nn.Linear modules to compress, names left alone). Patterns are fnmatch globs over module names.

    Without ``include`` the LM head (a module named ``lm_head``) and Linears whose weight is an embedding's weight
    (tied) are left alone; with ``include`` exactly the matching Linears are taken. ``exclude`` always wins.
    """
    include, exclude = _patterns(include, "include"), _patterns(exclude, "exclude")
    embedding_ptrs = {m.weight.data_ptr() for m in model.modules() if isinstance(m, nn.Embedding)}
    chosen: list[str] = []
    skipped: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if include is None:
            keep = name.split(".")[-1] != "lm_head" and module.weight.data_ptr() not in embedding_ptrs
        else:
            keep = any(fnmatch.fnmatchcase(name, p) for p in include)
        if exclude and any(fnmatch.fnmatchcase(name, p) for p in exclude):
            keep = False
        (chosen if keep else skipped).append(name)
    return chosen, skipped


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


@torch.no_grad()
def compress(
    model: ModuleT,
    fmt: str = "mxfp6",
    include: str | list[str] | None = None,
    exclude: str | list[str] | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    progress: bool = False,
    nonfinite: str = "error",
) -> tuple[ModuleT, CompressionReport]:
    """Replace the weights of the selected nn.Linear layers by MX (in place) and report what that cost.

    Returns the same model object and a CompressionReport (bytes before/after per layer, SQNR in dB, max abs
    error; savings vs FP16 and FP32 over the compressed layers). ``nonfinite`` is the policy for NaN/Inf weights
    (``accel.formats.report``): ``"error"`` (default) or ``"keep"``. Every layer is quantized before any is swapped,
    so an error leaves the model as it was.
    """
    if not isinstance(model, nn.Module):
        raise FormatError(f"compress needs a torch.nn.Module, got {type(model).__name__}")
    element = get_format(fmt)
    block_size = check_block_size(block_size)
    chosen, skipped = select_linear_layers(model, include, exclude)
    report = CompressionReport(
        fmt=element.name, block_size=block_size, skipped=skipped, nonfinite=check_policy(nonfinite)
    )
    swaps: list[tuple[str, MXLinear]] = []
    for name in tqdm(chosen, desc=f"compress to {element.name}", disable=not progress):
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear)  # select_linear_layers picks Linears only
        weight = linear.weight
        count = int((~torch.isfinite(weight)).sum())
        check_nonfinite(f"{name}.weight", count, weight.numel(), nonfinite)
        mx = quantize_torch(weight, element, axis=1, block_size=block_size, name=f"{name}.weight")
        original = weight.detach().to(torch.float64 if weight.dtype == torch.float64 else torch.float32)
        restored = mx.dequantize(np.float64 if weight.dtype == torch.float64 else np.float32)
        nbytes = weight.numel() * weight.element_size()
        report.layers.append(
            layer_report(f"{name}.weight", original.cpu().numpy(), restored, element.name, nbytes, mx.nbytes, count)
        )
        swaps.append((name, MXLinear(mx, linear.bias).to(weight.device)))
    for name, layer in swaps:
        _set_module(model, name, layer)
    return model, report


def _numpy_of(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def save_compressed(model: nn.Module, path: str | os.PathLike) -> None:
    """Write a (compressed) model's state to a safetensors file: MX weights as codes/scales, the rest as is.

    Tensors that share storage (tied embeddings) are written once; the others are recorded as aliases.
    """
    if not isinstance(model, nn.Module):
        raise FormatError(f"save needs a torch.nn.Module, got {type(model).__name__}")
    specs: list[TensorSpec] = []
    data: dict[str, np.ndarray] = {}
    mx_heads: dict[str, dict] = {}
    mx_buffer_names: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, MXLinear):
            key = f"{name}.weight" if name else "weight"
            mx = module.mx_weight()
            specs += mx_specs(key, mx)
            mx_heads[key] = mx.header()
            data[specs[-2].name], data[specs[-1].name] = mx.codes, mx.scales
            mx_buffer_names |= {f"{name}.{b}" if name else b for b in _MX_BUFFERS}
    seen: dict[tuple, str] = {}
    tied: dict[str, str] = {}
    for name, tensor in model.state_dict(keep_vars=False).items():
        if name in mx_buffer_names:
            continue
        ident = (
            (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype) if tensor.numel() else None
        )
        if ident is not None and ident in seen:
            tied[name] = seen[ident]
            continue
        if ident is not None:
            seen[ident] = name
        array = _numpy_of(tensor)
        code = "BF16" if tensor.dtype == torch.bfloat16 else dtype_code(array, name)
        specs.append(TensorSpec(name, code, tuple(array.shape)))
        data[name] = array
    with SafetensorsWriter(path, specs, mx=mx_heads, internal={FILE_TIED_KEY: json.dumps(tied, sort_keys=True)}) as w:
        for name, array in data.items():
            w.write(name, array)


@torch.no_grad()
def load_compressed(path: str | os.PathLike, model: nn.Module) -> nn.Module:
    """Load a file written by ``save`` into ``model``, an uncompressed skeleton of the same architecture.

    The Linear layers stored as MX become MXLinear (weights bit-exact); every other tensor is copied into the model.
    Everything is checked before the model is touched: missing or unexpected tensors, shape mismatches and corrupted
    data raise FormatError and leave ``model`` as it was.
    """
    if not isinstance(model, nn.Module):
        raise FormatError(f"load needs a torch.nn.Module skeleton, got {type(model).__name__}")
    f = SafetensorsFile(Path(path))
    tied = json_meta(f.path, f.metadata, FILE_TIED_KEY)
    swaps: list[tuple[str, MXLinear, torch.device]] = []
    for key in f.mx_headers:
        mod_name = key[: -len(".weight")] if key.endswith(".weight") else ""
        try:
            module = model.get_submodule(mod_name) if mod_name else None
        except AttributeError:
            module = None
        if not isinstance(module, (nn.Linear, MXLinear)):
            raise FormatError(f"{path}: MX tensor {key!r} does not belong to a Linear layer of the model")
        mx = f.mx_tensor(key)  # validated and checksummed
        expected = (module.out_features, module.in_features)
        if mx.shape != expected:
            raise FormatError(f"{path}: tensor {key!r}: shape {mx.shape} != model's {expected}")
        device = module.codes.device if isinstance(module, MXLinear) else module.weight.device
        swaps.append((mod_name, MXLinear(mx, module.bias), device))
    state = model.state_dict(keep_vars=True)
    replaced = {f"{m}.{b}" for m, _, _ in swaps for b in ("weight", *_MX_BUFFERS)}
    expected_names = set(state) - replaced
    stored = {n for n in f.entries if not n.endswith((".mx_codes", ".mx_scales"))}
    unexpected = sorted(stored - expected_names)
    missing = sorted(expected_names - stored - set(tied))
    if unexpected or missing:
        raise FormatError(f"{path}: tensors do not match the model: missing {missing[:8]}, unexpected {unexpected[:8]}")
    copies: list[tuple[str, str]] = []
    for name in sorted(expected_names):
        source = name if name in stored else tied.get(name)
        if not isinstance(source, str) or source not in stored:
            raise FormatError(f"{path}: tied tensor {name!r} points to {source!r}, which is not stored")
        spec = f.entries[source]
        if tuple(spec.shape) != tuple(state[name].shape):
            model_shape = tuple(state[name].shape)
            raise FormatError(f"{path}: tensor {name!r}: shape {tuple(spec.shape)} != model's {model_shape}")
        f.verify(source)
        copies.append((name, source))
    for mod_name, layer, device in swaps:
        _set_module(model, mod_name, layer.to(device))
    for name, source in copies:
        target = state[name]
        target.data.copy_(torch.from_numpy(np.array(f.array(source))).to(target.dtype))
    return model
