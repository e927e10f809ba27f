"""The torch path: quantize / dequantize with torch ops (CPU or GPU), and MXLinear.

Same bits as the numpy path (``accel.formats.quantize``): the same floor rule for the E8M0 scale (from
``torch.frexp``), scaling by exact powers of two, and ``torch.round`` (round half to even) for the elements.
This module imports torch; ``accel.formats`` never imports it eagerly.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from accel.errors import FormatError
from accel.formats.constants import DEFAULT_BLOCK_SIZE, E8M0_BIAS, E8M0_MAX_EXP, E8M0_MIN_EXP, E8M0_NAN
from accel.formats.elements import ElementFormat, get_format
from accel.formats.mx_tensor import MXTensor, check_layout
from accel.formats.packing import packed_nbytes
from accel.formats.scaling import check_scale_range

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _encode_torch(v: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Element codes (int32) of ``v`` (already divided by the block scale): RNE, saturating; NaN -> code 0."""
    sign = torch.signbit(v)
    a = v.abs().clamp_max(fmt.max_normal)
    nan = torch.isnan(a)
    a = torch.where(nan, torch.zeros_like(a), a)
    if fmt.is_int:
        k = torch.round(torch.ldexp(a, torch.tensor(fmt.mbits, dtype=a.dtype, device=a.device))).to(torch.int32)
        return torch.where(sign, -k, k) & 0xFF
    _, e2 = torch.frexp(a)
    e = torch.clamp_min(e2 - 1, fmt.emin)
    k = torch.round(torch.ldexp(a, (fmt.mbits - e).to(a.dtype))).to(torch.int32)
    code = ((e + (fmt.bias - 1)) << fmt.mbits) + k
    code = torch.where(a == 0, torch.zeros_like(code), code)
    code = code | (sign.to(torch.int32) << (fmt.bits - 1))
    return torch.where(nan, torch.zeros_like(code), code)


def _pack_torch(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack flat int32 codes into uint8 exactly as ``packing.pack_codes``."""
    n = codes.numel()
    if bits == 8:
        return codes.to(torch.uint8)
    group = 2 if bits == 4 else 4
    pad = -n % group
    x = F.pad(codes, (0, pad)).view(-1, group)
    if bits == 4:
        return (x[:, 0] | (x[:, 1] << 4)).to(torch.uint8)
    b = torch.stack([x[:, 0] | (x[:, 1] << 6), (x[:, 1] >> 2) | (x[:, 2] << 4), (x[:, 2] >> 4) | (x[:, 3] << 2)], 1)
    return (b & 0xFF).to(torch.uint8).view(-1)[: packed_nbytes(n, 6)]


def _unpack_torch(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first ``n`` codes of a packed uint8 tensor, as int32 (bit work in uint8: 1 byte per code)."""
    b = packed
    if bits == 8:
        return b[:n].to(torch.int32)
    if bits == 4:
        return torch.stack([b & 0x0F, b >> 4], 1).view(-1)[:n].to(torch.int32)
    groups = -(-n // 4)
    b = F.pad(b, (0, 3 * groups - b.numel())).view(groups, 3)
    b0, b1, b2 = b[:, 0], b[:, 1], b[:, 2]
    x0 = b0 & 0x3F
    x1 = (b0 >> 6) | ((b1 & 0x0F) << 2)
    x2 = (b1 >> 4) | ((b2 & 0x03) << 4)
    return torch.stack([x0, x1, x2, b2 >> 2], 1).view(-1)[:n].to(torch.int32)


def quantize_torch(
    t: torch.Tensor,
    fmt: ElementFormat | str = "mxfp6",
    axis: int = -1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    name: str | None = None,
) -> MXTensor:
    """Quantize a float tensor to MX with torch ops; the result is bit-identical to ``accel.formats.quantize``."""
    fmt = get_format(fmt)
    elements, scales, axis = quantize_elements_torch(t, fmt, axis, block_size, name)
    return MXTensor(
        fmt,
        tuple(t.shape),
        axis,
        block_size,
        _pack_torch(elements.reshape(-1), fmt.bits).cpu().numpy(),
        scales.cpu().numpy(),
        name=name,
    )


def quantize_elements_torch(
    t: torch.Tensor,
    fmt: ElementFormat | str = "mxfp6",
    axis: int = -1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    name: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``quantize_torch``'s codes before packing, on ``t``'s device: (element codes int32 ``[*prefix, nblocks *
    block_size]``, E8M0 scales uint8 ``[*prefix, nblocks]``, the normalized axis); ``prefix`` is the shape of the
    axes other than ``axis``, which moves last (padding elements of a short last block are code 0)."""
    fmt = get_format(fmt)
    if not isinstance(t, torch.Tensor):
        raise FormatError(f"tensor {name or ''!r}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise FormatError(f"tensor {name or ''!r}: dtype {t.dtype} cannot be quantized; allowed: {_FLOAT_DTYPES}")
    axis, nblocks = check_layout(tuple(t.shape), axis, block_size, name)
    work = torch.float64 if t.dtype == torch.float64 else torch.float32
    moved = t.detach().to(work).movedim(axis, -1)
    prefix, length = tuple(moved.shape[:-1]), moved.shape[-1]
    blocks = F.pad(moved.reshape(-1, length), (0, nblocks * block_size - length)).reshape(-1, block_size)
    amax = blocks.abs().amax(-1) if blocks.numel() else torch.zeros(blocks.shape[0], dtype=work, device=t.device)
    _, e2 = torch.frexp(amax)
    e = e2 - 1 - fmt.emax
    over = int((torch.isfinite(amax) & (e > E8M0_MAX_EXP)).sum())
    if over:  # the same rule and message as the numpy path (scaling.check_scale_range)
        check_scale_range(np.full(over, E8M0_MAX_EXP + 1), np.ones(over, bool), fmt, name)
    e = torch.clamp(e, E8M0_MIN_EXP, E8M0_MAX_EXP)
    e = torch.where(amax == 0, torch.full_like(e, E8M0_MIN_EXP), e)
    bad = ~torch.isfinite(amax)
    scales = torch.where(bad, torch.full_like(e, E8M0_NAN), e + E8M0_BIAS)
    scaled = torch.ldexp(blocks, (-torch.where(bad, torch.zeros_like(e), e)).to(work)[:, None])
    elements = torch.where(bad[:, None], 0, _encode_torch(scaled, fmt))  # a NaN-scale block stores zero codes
    return (
        elements.reshape((*prefix, nblocks * block_size)),
        scales.to(torch.uint8).reshape((*prefix, nblocks)),
        axis,
    )


_LUTS: dict[tuple[str, str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _tables(fmt: ElementFormat, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(code -> value, E8M0 code -> 2^(code-127)) tables on ``device`` (tiny, cached per device and dtype)."""
    key = (fmt.name, str(device), dtype)
    if key not in _LUTS:
        scales = np.ldexp(1.0, np.arange(256) - E8M0_BIAS)
        scales[E8M0_NAN] = np.nan
        _LUTS[key] = (
            torch.from_numpy(fmt.code_values().astype(np.float64)).to(device=device, dtype=dtype),
            torch.from_numpy(scales).to(device=device, dtype=dtype),
        )
    return _LUTS[key]


def dequantize_codes_torch(
    codes: torch.Tensor,
    scales: torch.Tensor,
    fmt: ElementFormat,
    shape: tuple[int, ...],
    axis: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Values of packed ``codes`` / E8M0 ``scales`` (uint8 tensors, MXTensor layout) in ``shape``, as ``dtype``.

    Computed in float32 (float64 if asked; exact), then cast to ``dtype``.
    """
    work = torch.float64 if dtype == torch.float64 else torch.float32
    values, scale_table = _tables(fmt, codes.device, work)
    nblocks = scales.shape[-1]
    idx = _unpack_torch(codes, fmt.bits, scales.numel() * block_size)
    elements = torch.index_select(values, 0, idx).view(-1, block_size)
    out = elements * torch.index_select(scale_table, 0, scales.reshape(-1).to(torch.int32))[:, None]
    prefix = tuple(shape[:axis]) + tuple(shape[axis + 1 :])
    out = out.view((*prefix, nblocks * block_size))[..., : shape[axis]].movedim(-1, axis)
    return out.to(dtype).contiguous()


def dequantize_torch(mx: MXTensor, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
    """``mx`` as a torch tensor of its original shape, as ``dtype`` on ``device`` (default CPU)."""
    codes = torch.from_numpy(np.array(mx.codes)).to(device)
    scales = torch.from_numpy(np.array(mx.scales)).to(device)
    return dequantize_codes_torch(codes, scales, mx.fmt, mx.shape, mx.axis, mx.block_size, dtype)


class MXLinear(nn.Module):
    """A Linear layer whose weight is stored as MX (packed uint8 ``codes`` and ``scales`` buffers).

    The weight (out_features, in_features) is blocked along in_features (the reduction axis). forward dequantizes it
    on the fly into the input's dtype and device and runs ``F.linear``; nothing big is cached.
    """

    codes: torch.Tensor  # registered buffers, declared for type checkers
    scales: torch.Tensor

    def __init__(self, mx: MXTensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if len(mx.shape) != 2 or mx.axis != 1:
            raise FormatError(f"MXLinear needs a 2-D weight blocked along axis 1, got shape {mx.shape} axis {mx.axis}")
        self.fmt, self.block_size = mx.fmt, mx.block_size
        self.out_features, self.in_features = mx.shape
        self.register_buffer("codes", torch.from_numpy(np.array(mx.codes)))
        self.register_buffer("scales", torch.from_numpy(np.array(mx.scales)))
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, fmt: ElementFormat | str = "mxfp6", block_size: int = 32, name: str | None = None
    ) -> MXLinear:
        """Quantize ``linear.weight`` (bit-identical to the numpy path) and keep its bias."""
        mx = quantize_torch(linear.weight, fmt, axis=1, block_size=block_size, name=name)
        return cls(mx, linear.bias)

    def mx_weight(self) -> MXTensor:
        """The weight as an MXTensor (numpy, CPU)."""
        return MXTensor(
            self.fmt,
            (self.out_features, self.in_features),
            1,
            self.block_size,
            self.codes.cpu().numpy(),
            self.scales.cpu().numpy(),
        )

    def dequantized_weight(self, dtype: torch.dtype = torch.float32, device: torch.device | None = None):
        codes, scales = self.codes, self.scales
        if device is not None and codes.device != torch.device(device):
            codes, scales = codes.to(device), scales.to(device)
        return dequantize_codes_torch(
            codes, scales, self.fmt, (self.out_features, self.in_features), 1, self.block_size, dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.dequantized_weight(x.dtype, x.device)
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt.name}, "
            f"block_size={self.block_size}, bias={self.bias is not None}"
        )
