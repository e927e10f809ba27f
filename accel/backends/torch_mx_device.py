"""MX weights kept packed on the torch backend's device (a GPU, or the CPU), decoded inside each call's matmul.

``pack_device_mx(model, formats)`` swaps every ``nn.Linear`` whose weight is *exactly* an MX weight of one of
``formats`` (block 32, blocked along in_features; checked bit for bit with the very decode the layer runs) for a
``DeviceMXLinear``: the weight then lives on the device as planes of element bits and E8M0 scales (the MX file's
3-bytes-per-4-codes MXFP6 layout would need byte-straddling loads on a GPU).

The element values come from plain arithmetic on the code's sign, exponent and mantissa fields (no table gather),
the scale's power of two from an exponent written into a float's bits, so every decoded value is exact in float32.
A layer's ``forward`` has two forms, both torch custom ops (opaque to ``torch.compile``, captured by CUDA graphs):

- ``accel::mx_matmul`` for at most ``max_rows`` activation rows (decode steps, short verify calls): on a GPU with
  triton, ``accel.backends.mx_triton``'s kernel decodes the weight in registers inside the matmul, reading each
  weight byte once per call and never writing floats back;
- ``accel::mx_decode`` + ``F.linear`` for wider calls (prefill): the weight decoded into the activations' dtype
  once per call (a Triton kernel on a GPU), then the dense matmul.

Without triton (the CPU, or a GPU where it is not installed) both decode with torch ops and give the same values.
Outputs differ from a float layer holding the decoded weight only by summation order (and, in float16/bfloat16, by
where rounding to the activation dtype happens).

Device layout (``split_planes``): MXFP6 keeps 6.25 bits a weight as a plane of low nibbles and a plane of top 2-bit
fields, arranged per chunk of 128 elements so that a kernel reads 32 lanes at a time with contiguous loads; MXFP4
4.25 bits, MXFP8 and MXINT8 8.25 bits, against 16 for float16.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from accel.backends import mx_triton
from accel.errors import BackendError, FormatError
from accel.formats.constants import DEFAULT_BLOCK_SIZE, E8M0_BIAS
from accel.formats.elements import ElementFormat, get_format
from accel.formats.torch_ops import quantize_elements_torch

__all__ = ["DEFAULT_FUSED_ROWS", "DeviceMXLinear", "DevicePackReport", "pack_device_mx"]

#: activation rows up to which a call runs the decoding matmul (more rows: decode the weight, then F.linear)
DEFAULT_FUSED_ROWS = 8


def _pow2(biased: torch.Tensor) -> torch.Tensor:
    """2^(biased - 127) as float32, built from its bits (exact; 0.0 for biased <= 0, which no checked layer uses)."""
    return (biased.clamp(0, 254).to(torch.int32) << 23).view(torch.float32)


def element_values(codes: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Float32 values of element ``codes`` (an integer tensor) of ``fmt``, by arithmetic on the code's fields
    (OCP MX v1.0 §5.3). Exact for every finite code; NaN/Inf codes (E4M3's S.1111.111, E5M2's top exponent) decode
    as ordinary numbers, so only weights checked against the true decode may use it (``pack_device_mx`` does)."""
    c = codes.to(torch.int32)
    if fmt.is_int:
        signed = torch.where(c >= 128, c - 256, c)
        return signed.to(torch.float32) * (2.0**-fmt.mbits)
    mant = c & ((1 << fmt.mbits) - 1)
    exp = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    normal = exp > 0
    whole = torch.where(normal, mant + (1 << fmt.mbits), mant)  # the significand as an integer
    power = torch.where(normal, exp, torch.ones_like(exp)) - fmt.bias - fmt.mbits  # subnormals share exponent 1
    mag = whole.to(torch.float32) * _pow2(power + E8M0_BIAS)
    return torch.where((c >> (fmt.bits - 1)) & 1 == 1, -mag, mag)


#: elements per chunk of the device layout: four MX blocks of 32 (a weight row is padded to whole chunks)
CHUNK = 128


def padded_width(in_features: int) -> int:
    """in_features rounded up to whole chunks of ``CHUNK`` elements (the padding holds code 0, scale 2^0: zeros)."""
    return -(-in_features // CHUNK) * CHUNK


def split_planes(codes: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Element codes ``[N, K]`` as the device layout's planes, per chunk of 128 elements (quarters q = 0..3 of 32,
    lanes j = 0..31; K padded to whole chunks with code 0):

    - 8 bits: one byte a code, in order (``[N, Kp]``), no second plane;
    - 4 and 6 bits: a plane of low nibbles, 64 bytes a chunk: byte ``h * 32 + j`` (h = 0, 1) holds quarter h's
      lane j in its low nibble and quarter h + 2's in its high nibble (``[N, Kp / 2]``);
    - 6 bits also: a plane of the top 2 bits, 32 bytes a chunk: byte j holds quarter q's lane j at bits 2q, 2q + 1
      (``[N, Kp / 4]``).

    So a kernel reads each plane with plain contiguous loads of 32 lanes and rebuilds four quarters, each one MX
    block, with shifts and masks; no byte straddles two codes."""
    c = codes.to(torch.int32)
    n, k = c.shape
    c = F.pad(c, (0, padded_width(k) - k)).view(n, -1, 4, 32)  # [N, chunks, quarter, lane]
    if bits == 8:
        return c.reshape(n, -1).to(torch.uint8), None
    low = c & 0x0F
    lo_plane = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(n, -1).to(torch.uint8)
    if bits == 4:
        return lo_plane, None
    top = (c >> 4) & 0x03
    hi_plane = top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)
    return lo_plane, hi_plane.reshape(n, -1).to(torch.uint8)


def join_planes(lo: torch.Tensor, hi: torch.Tensor | None, bits: int) -> torch.Tensor:
    """The element codes (int32 ``[N, Kp]``, padding included) of ``split_planes``' planes."""
    n = lo.shape[0]
    if bits == 8:
        return lo.to(torch.int32)
    b = lo.to(torch.int32).view(n, -1, 2, 32)
    codes = torch.cat([b & 0x0F, b >> 4], dim=2)  # quarters 0, 1 from the low nibbles, 2, 3 from the high ones
    if hi is not None:
        h = hi.to(torch.int32).view(n, -1, 1, 32)
        top = torch.cat([h & 3, (h >> 2) & 3, (h >> 4) & 3, h >> 6], dim=2)
        codes = codes | (top << 4)
    return codes.reshape(n, -1)


def decode_torch(
    lo: torch.Tensor, hi: torch.Tensor | None, scales: torch.Tensor, fmt: ElementFormat, n: int, k: int
) -> torch.Tensor:
    """The device-layout weight ``[n, k]`` in float32 with torch ops (exact; padding dropped)."""
    return decode_codes(join_planes(lo, hi, fmt.bits), scales, fmt, k)


def decode_codes(codes: torch.Tensor, scales: torch.Tensor, fmt: ElementFormat, k: int) -> torch.Tensor:
    """Float32 ``[N, k]`` of element codes ``[N, whole blocks of 32]`` and their E8M0 scales ``[N, blocks]``: the
    decode every ``DeviceMXLinear`` runs (exact; padding columns dropped)."""
    n = codes.shape[0]
    values = element_values(codes, fmt).view(n, -1, DEFAULT_BLOCK_SIZE)
    return (values * _pow2(scales.to(torch.int32))[..., None]).view(n, -1)[:, :k]


@torch.library.custom_op("accel::mx_matmul", mutates_args=())
def mx_matmul(
    x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor | None, scales: torch.Tensor, fmt: str, n: int
) -> torch.Tensor:
    """``x [M, K] @ W.T`` with W in the device layout; ``[M, n]`` in x's dtype. The Triton kernel where it can
    run (``mx_triton.available``), else torch's decode and a float32 matmul."""
    element = get_format(fmt)
    if mx_triton.available(x.device) and x.shape[0] <= mx_triton.MAX_ROWS:
        return mx_triton.matmul(x.contiguous(), lo, hi, scales, element, n)
    w = decode_torch(lo, hi, scales, element, n, x.shape[1])
    return (x.to(torch.float32) @ w.T).to(x.dtype)


@mx_matmul.register_fake
def _(x, lo, hi, scales, fmt, n):
    return x.new_empty((x.shape[0], n))


@torch.library.custom_op("accel::mx_decode", mutates_args=())
def mx_decode(
    lo: torch.Tensor, hi: torch.Tensor | None, scales: torch.Tensor, fmt: str, n: int, k: int, dtype: torch.dtype
) -> torch.Tensor:
    """The device-layout weight ``[n, k]`` in ``dtype`` (rounded once from the exact decode): the Triton kernel
    where it can run, else torch ops."""
    element = get_format(fmt)
    if mx_triton.available(lo.device):
        return mx_triton.decode(lo, hi, scales, element, n, k, dtype)
    return decode_torch(lo, hi, scales, element, n, k).to(dtype)


@mx_decode.register_fake
def _(lo, hi, scales, fmt, n, k, dtype):
    return lo.new_empty((n, k), dtype=dtype)


class DeviceMXLinear(nn.Module):
    """``y = x @ W.T + b`` with W kept as MX element planes and E8M0 scales (blocks of 32) on the module's device.

    Args:
        codes: element codes int ``[out_features, whole blocks]``: in_features rounded up to a multiple of 32, the
            padding code 0 (as ``quantize_elements_torch`` gives them).
        scales: E8M0 scale codes uint8 ``[out_features, blocks]``.
        fmt: the element format.
        bias: ``[out_features]`` or None (kept in its dtype).
        max_rows: calls with at most this many activation rows run the decoding matmul (``accel::mx_matmul``);
            wider ones decode the weight into the activations' dtype (``accel::mx_decode``) and run ``F.linear``.
        in_features: the weight's width (default: the codes'); a last block shorter than 32 is padded.
    """

    lo: torch.Tensor  # registered buffers, declared for type checkers
    hi: torch.Tensor | None
    scales: torch.Tensor

    def __init__(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        fmt: ElementFormat | str,
        bias: torch.Tensor | None = None,
        max_rows: int = DEFAULT_FUSED_ROWS,
        in_features: int | None = None,
    ) -> None:
        super().__init__()
        self.fmt = get_format(fmt)
        block = DEFAULT_BLOCK_SIZE
        width = codes.shape[-1] if codes.ndim == 2 else 0
        in_features = width if in_features is None else int(in_features)
        if codes.ndim != 2 or width % block or not width - block < in_features <= width:
            raise FormatError(
                f"DeviceMXLinear needs codes [out, whole blocks of {block}] covering in_features {in_features}; got "
                f"{tuple(codes.shape)}"
            )
        if scales.shape != (codes.shape[0], width // block) or scales.dtype != torch.uint8:
            raise FormatError(
                f"DeviceMXLinear: scales must be uint8 {(codes.shape[0], width // block)}, got "
                f"{scales.dtype} {tuple(scales.shape)}"
            )
        if not 0 <= max_rows <= mx_triton.MAX_ROWS:
            raise BackendError(f"DeviceMXLinear max_rows {max_rows} outside 0..{mx_triton.MAX_ROWS}")
        self.out_features, self.in_features = codes.shape[0], in_features
        self.max_rows = int(max_rows)
        lo, hi = split_planes(codes, self.fmt.bits)
        self.register_buffer("lo", lo)
        self.register_buffer("hi", hi)
        pad = padded_width(width) // block - scales.shape[1]
        self.register_buffer("scales", F.pad(scales, (0, pad)).contiguous())  # padding: scale code 0, codes 0
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None

    def weight_float(self) -> torch.Tensor:
        """The weight ``[out_features, in_features]`` in float32, decoded on the device with torch ops (exact)."""
        return decode_torch(self.lo, self.hi, self.scales, self.fmt, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] <= self.max_rows:
            y = mx_matmul(flat, self.lo, self.hi, self.scales, self.fmt.name, self.out_features)
        else:
            w = mx_decode(self.lo, self.hi, self.scales, self.fmt.name, self.out_features, self.in_features, x.dtype)
            y = F.linear(flat, w)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        """Device bytes of the packed weight (planes and scales, padding included)."""
        planes = (self.lo, self.scales) if self.hi is None else (self.lo, self.hi, self.scales)
        return sum(t.numel() * t.element_size() for t in planes)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt.name}, "
            f"max_rows={self.max_rows}"
        )


@dataclass(frozen=True)
class DevicePackReport:
    """What ``pack_device_mx`` did: layers swapped, Linear layers kept float, and weight bytes before / after (the
    float bytes at the weights' dtype when packing)."""

    packed: int
    kept: int
    float_bytes: int
    packed_bytes: int

    def line(self) -> str:
        """One line for the console."""
        return (
            f"torch backend: {self.packed} linear layers on packed MX weights on the device "
            f"({self.packed_bytes / 2**20:.1f} MiB, from {self.float_bytes / 2**20:.1f} MiB), {self.kept} kept float"
        )


def exact_device_mx(
    weight: torch.Tensor, formats: Sequence[str]
) -> tuple[ElementFormat, torch.Tensor, torch.Tensor] | None:
    """(format, element codes, scales) of the first of ``formats`` whose ``DeviceMXLinear`` decode gives back
    ``weight`` (2-D) bit for bit in float32, computed on its device (codes padded to whole blocks of 32); None when
    none does."""
    block_size = DEFAULT_BLOCK_SIZE
    if weight.ndim != 2 or not weight.is_floating_point() or weight.numel() == 0:
        return None
    w32 = weight.detach().to(torch.float32)
    for name in formats:
        fmt = get_format(name)
        codes, scales, _ = quantize_elements_torch(w32, fmt, -1, block_size)
        if (scales == 0xFF).any():
            continue
        if torch.equal(decode_codes(codes, scales, fmt, w32.shape[1]), w32):
            return fmt, codes, scales
    return None


def pack_device_mx(
    model: nn.Module,
    formats: Sequence[str],
    *,
    max_rows: int = DEFAULT_FUSED_ROWS,
    skip: Sequence[str] = (),
) -> DevicePackReport:
    """Swap (in place) each ``nn.Linear`` of ``model`` whose weight is exactly an MX weight of one of ``formats``
    (names such as ``"mxfp6"``; blocks of 32 along in_features) for a ``DeviceMXLinear`` on the same device;
    the others stay float. Modules whose name is in ``skip`` stay float too. Returns the report."""
    if not formats:
        raise BackendError("pack_device_mx needs at least one MX format name (e.g. 'mxfp6')")
    for name in formats:
        try:
            get_format(name)
        except FormatError as exc:
            raise BackendError(f"packed MX weights: {exc}") from None
    swaps, kept, float_bytes, packed_bytes = [], 0, 0, 0
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:
            continue
        found = None if name in skip else exact_device_mx(module.weight, formats)
        if found is None:
            kept += 1
            continue
        fmt, codes, scales = found
        layer = DeviceMXLinear(codes, scales, fmt, module.bias, max_rows, module.in_features)
        swaps.append((name, layer))
        float_bytes += module.weight.numel() * module.weight.element_size()
        packed_bytes += layer.nbytes
    for name, layer in swaps:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, layer)
    return DevicePackReport(len(swaps), kept, float_bytes, packed_bytes)
