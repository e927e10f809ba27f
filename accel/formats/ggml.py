"""llama.cpp's block-quantized weights kept as stored (GGUF ``Q8_0``, ``Q4_0``, ``Q4_1``) or repacked exactly (K-quants
``Q2_K`` to ``Q6_K``, ``IQ4_XS``, ``IQ4_NL`` and ``Q5_0``, ``Q5_1``: ``accel.formats.ggml_repack``), for the fused
kernel.

A ``GGMLTensor`` is a 2-D weight ``[N, K]`` (``N`` outputs, ``K`` inputs, blocks of 32 along ``K``) in one of seven
kernel layouts (``GGML_TYPES``), split into two planes the kernel reads with aligned loads
(``accel/formats/mxkernel.h``). The three GGUF types the kernel reads as stored:

- ``codes`` uint8 ``[N, K / 32, 32]`` (``Q8_0``: the int8 codes) or ``[N, K / 32, 16]`` (``Q4_0``, ``Q4_1``: byte ``j``
  holds weight ``j`` in its low nibble and weight ``j + 16`` in its high nibble, as llama.cpp stores them);
- ``scales`` uint8 ``[N, K / 32, 2]`` (the block's float16 scale ``d``, little-endian) or ``[N, K / 32, 4]``
  (``Q4_1``: ``d``, then the float16 offset ``m``).

Each weight's float32 value (``dequantize``) is what llama.cpp's reference and the ``gguf`` package compute, bit for
bit: ``Q8_0``: ``d * q`` (q in [-128, 127]); ``Q4_0``: ``d * (q - 8)`` (q in [0, 15]); ``Q4_1``: ``(d * q) + m``
rounded once in float32 (``d * q`` is exact: an 11-bit mantissa times a 4-bit integer). The four repacked layouts
hold float32 scales: ``Q4_F32`` (``Q4_1``'s codes, scales ``[N, K / 32, 8]``: float32 ``d``, ``m``), ``Q5S_F32`` and
``Q5_F32`` (codes ``[N, K / 32, 20]``: ``Q4_1``'s nibbles, then 4 bytes whose bit ``i`` is code ``i``'s fifth bit;
``Q5S_F32`` subtracts 16; scales as ``Q4_F32``) and ``I8_F32`` (int8 codes ``[N, K / 32, 32]``, scales
``[N, K / 32, 16]``: float32 ``d``, ``m`` for weights 0..15, then for 16..31), each weight ``(d * q) + m`` (``d * q``
exact), equal to the ``gguf`` package's value of the file's type.
``GGMLTensor.source`` names the file's type. The fused kernel multiplies
these exact values by float32 activations (``accel.formats.ggml_kernel.GGMLKernel``), and the onnxruntime operator
``ai.accel::MXLinear`` runs them in an exported graph (``weights="gguf-kernel"``: docs/formats.md, "GGUF blocks on
the kernel").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from accel.errors import FormatError
from accel.formats.ggml_repack import REPACKED, repack

__all__ = ["GGML_TYPES", "GGUF_KERNEL_TYPES", "GGMLTensor", "GGMLType"]

BLOCK = 32


@dataclass(frozen=True)
class GGMLType:
    """One kernel layout of 32-weight blocks: its name (the GGUF type's, for the three read as stored), bytes a block
    (code bytes + scale bytes; in the GGUF file for those three), the kernel's format code (``fast``), code width in
    bits and what it subtracts from its unsigned codes (``code_offset``; mxkernel.h's ``code_offset``)."""

    name: str
    block_bytes: int
    code_bytes: int
    scale_bytes: int
    fast: int
    bits: int
    code_offset: int = 0


#: the kernel's block layouts, by name: three GGUF types as stored, two repacked layouts (module docstring)
GGML_TYPES: dict[str, GGMLType] = {
    t.name: t
    for t in (
        GGMLType("Q8_0", 34, 32, 2, 4, 8),
        GGMLType("Q4_0", 18, 16, 2, 5, 4, code_offset=8),
        GGMLType("Q4_1", 20, 16, 4, 6, 4),
        GGMLType("Q4_F32", 24, 16, 8, 7, 4),
        GGMLType("I8_F32", 48, 32, 16, 8, 8),
        GGMLType("Q5S_F32", 28, 20, 8, 9, 5, code_offset=16),
        GGMLType("Q5_F32", 28, 20, 8, 10, 5),
    )
}
_STORED = ("Q8_0", "Q4_0", "Q4_1")  # GGUF types whose blocks are a kernel layout as they are
#: every GGUF type the kernel runs (as stored or repacked exactly)
GGUF_KERNEL_TYPES: tuple[str, ...] = (*_STORED, *REPACKED)


def ggml_type(name: str) -> GGMLType:
    """The kernel layout ``GGMLType`` called ``name``; FormatError naming the supported ones."""
    t = GGML_TYPES.get(str(name).upper())
    if t is None:
        supported = ", ".join(GGUF_KERNEL_TYPES)
        raise FormatError(f"GGUF block type {name!r} is not run by accel's kernel; supported: {supported}")
    return t


@dataclass(frozen=True)
class GGMLTensor:
    """A 2-D weight ``[N, K]`` in llama.cpp blocks (module docstring): ``qtype`` (the kernel layout, ``GGMLType``),
    ``shape`` (N, K), ``codes`` and ``scales`` planes (uint8), ``source`` (the GGUF type it was read from; default:
    the layout's name)."""

    qtype: GGMLType
    shape: tuple[int, int]
    codes: np.ndarray
    scales: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        if not self.source:
            object.__setattr__(self, "source", self.qtype.name)
        n, k = self.shape
        if n < 1 or k < BLOCK or k % BLOCK:
            raise FormatError(f"{self.qtype.name} weight of shape {self.shape}: need N >= 1 and K a multiple of 32")
        want = {"codes": (n, k // BLOCK, self.qtype.code_bytes), "scales": (n, k // BLOCK, self.qtype.scale_bytes)}
        for name, shape in want.items():
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.shape != shape:
                got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise FormatError(f"{self.qtype.name} weight {self.shape}: {name} must be uint8 {shape}, got {got}")

    @classmethod
    def from_blocks(cls, raw: np.ndarray, qtype: str | GGMLType, shape: Sequence[int]) -> GGMLTensor:
        """The weight ``shape`` ``[N, K]`` from its GGUF bytes ``raw`` (uint8, the file's blocks row after row):
        ``Q8_0``, ``Q4_0``, ``Q4_1`` kept as stored, ``Q2_K`` to ``Q6_K``, ``Q5_0``, ``Q5_1`` repacked
        exactly (``accel.formats.ggml_repack``; ``GGUF_KERNEL_TYPES``)."""
        name = qtype.name if isinstance(qtype, GGMLType) else str(qtype).upper()
        n, k = (int(d) for d in shape)
        if name in REPACKED:
            if n < 1 or k < BLOCK:
                raise FormatError(f"{name} weight of shape {(n, k)}: need N >= 1 and K >= 32")
            layout, codes, scales = repack(raw, name, (n, k))
            return cls(GGML_TYPES[layout], (n, k), codes, scales, name)
        t = qtype if isinstance(qtype, GGMLType) else ggml_type(qtype)
        if n < 1 or k < BLOCK or k % BLOCK:
            raise FormatError(f"{t.name} weight of shape {(n, k)}: need N >= 1 and K a multiple of 32")
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.size != n * (k // BLOCK) * t.block_bytes:
            raise FormatError(
                f"{t.name} weight {(n, k)}: need {n * (k // BLOCK) * t.block_bytes} bytes of blocks, "
                f"got {raw.dtype} x {raw.size}"
            )
        blocks = raw.reshape(n, k // BLOCK, t.block_bytes)
        scales = np.ascontiguousarray(blocks[..., : t.scale_bytes])
        codes = np.ascontiguousarray(blocks[..., t.scale_bytes :])
        return cls(t, (n, k), codes, scales)

    @property
    def nblocks(self) -> int:
        """Blocks a row (``K / 32``)."""
        return self.shape[1] // BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes of the two planes (as stored in a graph: the GGUF's own size)."""
        return int(self.codes.nbytes + self.scales.nbytes)

    def _d_m(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The blocks' scales ``d`` and offsets ``m`` (None without), float32 ``[N, K / 32, 1]`` (``I8_F32``:
        ``[N, K / 32, 32]``, each weight's own)."""
        if self.qtype.scale_bytes <= 4:  # float16 d (and Q4_1's m)
            halves = self.scales.view(np.dtype("<f2")).astype(np.float32)
            return halves[..., 0:1], halves[..., 1:2] if self.qtype.scale_bytes == 4 else None
        f = self.scales.view("<f4")  # float32 (d, m) pairs: one a block, or (I8_F32) one per 16 weights
        d, m = f[..., 0::2], f[..., 1::2]
        per = BLOCK // d.shape[-1]
        return (np.repeat(d, per, axis=-1), np.repeat(m, per, axis=-1)) if per > 1 else (d, m)

    def integer_codes(self) -> np.ndarray:
        """Every weight's integer code, int16 ``[N, K / 32, 32]``: ``Q8_0``, ``I8_F32`` in [-128, 127], ``Q4_0``
        ``q - 8`` in [-8, 7], ``Q4_1``, ``Q4_F32`` ``q`` in [0, 15], ``Q5S_F32`` ``q - 16`` in [-16, 15], ``Q5_F32``
        ``q`` in [0, 31]."""
        if self.qtype.bits == 8:
            return self.codes.view(np.int8).astype(np.int16)
        nib = self.codes[..., :16]
        q = np.concatenate([nib & 0x0F, nib >> 4], axis=-1).astype(np.int16)
        if self.qtype.bits == 5:  # bytes 16..19: bit i is code i's fifth bit
            fifth = np.unpackbits(self.codes[..., 16:20], axis=-1, bitorder="little").astype(np.int16)
            q |= fifth << 4
        return q - self.qtype.code_offset

    def dequantize(self, dtype: type = np.float32) -> np.ndarray:
        """Every weight ``[N, K]`` in float32 (module docstring: exact, llama.cpp's values), then cast to ``dtype``."""
        d, m = self._d_m()
        with np.errstate(invalid="ignore", over="ignore"):  # NaN where a scale is NaN or infinite meets a zero code
            w = d * self.integer_codes().astype(np.float32)
            if m is not None:
                w = w + m
        return w.reshape(self.shape).astype(dtype, copy=False)

    def take_rows(self, rows: np.ndarray) -> GGMLTensor:
        """The weight made of rows ``rows`` (int indices into N) of this one, in that order."""
        rows = np.asarray(rows)
        shape = (int(rows.size), self.shape[1])
        return GGMLTensor(self.qtype, shape, self.codes[rows], self.scales[rows], self.source)

    @staticmethod
    def concat(parts: Sequence[GGMLTensor]) -> GGMLTensor:
        """The weights ``parts`` (same type and K) stacked along their outputs (rows)."""
        if not parts or len({(p.qtype.name, p.shape[1]) for p in parts}) != 1:
            got = [(p.qtype.name, p.shape) for p in parts]
            raise FormatError(f"cannot join GGUF weights of different types or input features: {got}")
        n = sum(p.shape[0] for p in parts)
        codes, scales = np.concatenate([p.codes for p in parts]), np.concatenate([p.scales for p in parts])
        sources = "+".join(dict.fromkeys(p.source for p in parts))
        return GGMLTensor(parts[0].qtype, (n, parts[0].shape[1]), codes, scales, sources)
