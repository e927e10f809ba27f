"""Packed MX weights in the torch backend: Linear layers that keep MX bytes and run the fused kernel for decode.

``pack_decoder(model, formats)`` swaps every ``nn.Linear`` of a ``Decoder`` whose float32 weight is *exactly* an MX
weight of one of ``formats`` (re-quantizing it gives back the same values bit for bit, which holds for every weight
of an accel-compressed checkpoint once ``load_checkpoint`` has decoded it) for a ``PackedLinear``: the packed codes
and scales replace the float weight, so the model holds 6.25 bits a weight (MXFP6) instead of 32. A swapped layer
computes with the same weight values, so the model's outputs change only by float32 summation order.

``PackedLinear.forward`` sends up to ``max_rows`` activation rows (a decode or verify step) through
``accel.formats.mxkernel.PackedMX.matmul`` (weights decoded in registers, on the cores torch's pool leaves idle:
``kernel_threads_beside_torch``); larger calls (prefill) decode the weight
once per call (``PackedMX.decode``, exact) and use ``F.linear``. ``pack_compressed(model, path)`` does the swap for
the formats an accel-compressed checkpoint directory declares (``accel generate --backend torch`` calls it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from accel.errors import BackendError
from accel.formats.elements import get_format
from accel.formats.file import SafetensorsFile
from accel.formats.mx_tensor import quantize
from accel.formats.mxkernel import PackedMX, default_threads, kernel_status

__all__ = ["PackReport", "PackedLinear", "checkpoint_mx_formats", "pack_compressed", "pack_decoder"]

#: activation rows up to which a call runs the fused kernel (decode and verify steps); more rows: decode + F.linear
DEFAULT_MAX_ROWS = 16


def kernel_threads_beside_torch() -> int:
    """Kernel threads for a call made between torch ops: the CPUs torch's own pool leaves idle, plus the caller's.

    torch's intra-op workers spin for a while after each op; kernel workers on the same cores would fight them (on 2
    cores with 2 torch threads a decode step ran 30x slower). So with ``torch.get_num_threads()`` = t on c CPUs the
    kernel takes c - t + 1 threads: torch at 1 thread leaves the kernel every core, torch at all cores leaves it one.
    """
    return max(1, default_threads() - torch.get_num_threads() + 1)


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with W kept as packed MX bytes (``PackedMX``); float32 on CPU.

    Args:
        packed: the weight [out_features, in_features].
        bias: float32 [out_features] or None.
        max_rows: calls with at most this many activation rows run the fused kernel.
    """

    def __init__(self, packed: PackedMX, bias: torch.Tensor | None = None, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        super().__init__()
        self.packed = packed
        self.in_features, self.out_features = packed.in_features, packed.out_features
        self.max_rows = int(max_rows)
        self.bias = (
            nn.Parameter(bias.detach().to(torch.float32).clone(), requires_grad=False) if bias is not None else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise BackendError(f"PackedLinear runs float32 on CPU; got {x.dtype} on {x.device}")
        rows = x.numel() // max(1, self.in_features)
        if rows <= self.max_rows:
            threads = min(self.packed.auto_threads, kernel_threads_beside_torch())
            y = torch.from_numpy(self.packed.matmul(x.detach().contiguous().numpy(), threads=threads))
            return y + self.bias if self.bias is not None else y
        return F.linear(x, torch.from_numpy(self.packed.decode()), self.bias)

    def extra_repr(self) -> str:
        w = self.packed.weight
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fmt={w.fmt.name}, "
            f"block_size={w.block_size}, kernel={self.packed.uses_kernel}"
        )


@dataclass(frozen=True)
class PackReport:
    """What ``pack_decoder`` did: layers swapped, layers kept float, and weight bytes before / after."""

    packed: int
    kept: int
    float_bytes: int
    packed_bytes: int

    def line(self) -> str:
        """One line for the console."""
        status = kernel_status()
        path = "fused kernel" if status.available else f"numpy path ({status.reason})"
        return (
            f"torch backend: {self.packed} linear layers on packed MX weights ({self.packed_bytes / 2**20:.1f} "
            f"MiB, from {self.float_bytes / 2**20:.1f} MiB float32), {self.kept} kept float; {path}"
        )


def _exact_mx(weight: np.ndarray, formats: list[tuple[str, int]]):
    for fmt, block in formats:
        mx = quantize(weight, fmt, axis=1, block_size=block)
        if np.array_equal(mx.dequantize(np.float32), weight):
            return mx
    return None


def pack_decoder(
    model: nn.Module, formats: list[tuple[str, int]], max_rows: int = DEFAULT_MAX_ROWS, use_kernel: bool = True
) -> PackReport:
    """Swap (in place) each float32 ``nn.Linear`` whose weight is exactly an MX weight of one of ``formats``
    (pairs of format name and block size) for a ``PackedLinear``; others stay. Returns the PackReport."""
    for fmt, _ in formats:
        get_format(fmt)  # FormatError for an unknown name
    swaps, kept, float_bytes, packed_bytes = [], 0, 0, 0
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or module.weight.dtype != torch.float32:
            continue
        weight = module.weight.detach().cpu().numpy()
        mx = _exact_mx(weight, formats)
        if mx is None:
            kept += 1
            continue
        swaps.append((name, PackedLinear(PackedMX(mx, use_kernel), module.bias, max_rows)))
        float_bytes += weight.nbytes
        packed_bytes += mx.nbytes
    for name, packed in swaps:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, packed)
    return PackReport(len(swaps), kept, float_bytes, packed_bytes)


def checkpoint_mx_formats(path: str | Path) -> list[tuple[str, int]]:
    """The (format, block size) pairs of the 2-D MX weights blocked along axis 1 in a checkpoint directory's
    safetensors files (empty for a plain checkpoint)."""
    return sorted({(str(mx.fmt.name), mx.block_size) for _, mx in _stored_mx(path)})


def _stored_mx(path: str | Path):
    """(HF name, MXTensor) of each 2-D MX weight blocked along axis 1 in a checkpoint directory (memory-mapped)."""
    directory = Path(path)
    for f in sorted(directory.glob("*.safetensors")) if directory.is_dir() else []:
        sf = SafetensorsFile(f)
        for name, head in sf.mx_headers.items():
            if len(head.get("shape", ())) == 2 and head.get("axis") in (1, -1):
                yield name, sf.mx_tensor(name)


def _decoder_name(model: nn.Module, hf_name: str) -> str | None:
    """The Decoder module holding ``hf_name`` when the checkpoint stores it under a plain rename (HF Llama-style
    names: ``model.layers.0.mlp.up_proj.weight`` -> ``layers.0.mlp.up_proj``), else None."""
    name = hf_name[len("model.") :] if hf_name.startswith("model.") else hf_name
    if not name.endswith(".weight"):
        return None
    try:
        module = model.get_submodule(name[: -len(".weight")])
    except AttributeError:
        return None
    return name[: -len(".weight")] if type(module) is nn.Linear else None


def pack_compressed(model: nn.Module, path: str | Path, quiet: bool = False) -> PackReport | None:
    """Swap the Linear layers of ``model`` (loaded from the accel-compressed checkpoint directory ``path``) for
    ``PackedLinear``s holding the checkpoint's own packed bytes; None for a plain checkpoint.

    A stored MX weight is used when its layer's float32 weight equals its decode bit for bit (what
    ``load_checkpoint`` produced); a layer stored under another name (GPT-2's fused ``c_attn``) is re-quantized by
    ``pack_decoder`` with the checkpoint's formats. Prints the report's line to stderr unless ``quiet``."""
    stored = list(_stored_mx(path))
    if not stored:
        return None
    swaps, float_bytes, packed_bytes, unmatched = [], 0, 0, 0
    for hf_name, mx in stored:
        name = _decoder_name(model, hf_name)
        if name is None:
            unmatched += 1
            continue
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear)  # _decoder_name checked it
        weight = linear.weight.detach().cpu().numpy()
        if weight.shape != mx.shape or weight.dtype != np.float32:
            continue
        mx = type(mx)(mx.fmt, mx.shape, 1, mx.block_size, np.array(mx.codes), np.array(mx.scales))  # own the bytes
        if not np.array_equal(mx.dequantize(np.float32), weight):
            unmatched += 1
            continue
        swaps.append((name, PackedLinear(PackedMX(mx), linear.bias)))
        float_bytes, packed_bytes = float_bytes + weight.nbytes, packed_bytes + mx.nbytes
    for name, packed in swaps:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, packed)
    if unmatched:  # stored under other names or layouts: re-quantize what is left (exactness checked)
        rest = pack_decoder(model, sorted({(mx.fmt.name, mx.block_size) for _, mx in stored}))
    else:
        kept = sum(type(m) is nn.Linear for m in model.modules())
        rest = PackReport(0, kept, 0, 0)
    report = PackReport(
        len(swaps) + rest.packed, rest.kept, float_bytes + rest.float_bytes, packed_bytes + rest.packed_bytes
    )
    if not quiet:
        print(report.line(), file=sys.stderr)
    return report
