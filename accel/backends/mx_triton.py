"""Triton kernels of the device MX layout (``accel.backends.torch_mx_device``): a matmul that decodes MX weights in
registers, for the few activation rows of a decode or verify step, and a decode of the whole weight into 16-bit
floats for wider calls.

``triton`` is optional: ``available(device)`` says whether these kernels can run there (a CUDA device and an
importable triton; or any device under ``TRITON_INTERPRET=1``, Triton's CPU interpreter, which the tests use).
Without it ``torch_mx_device`` decodes with torch ops.

The matmul: one program owns ``BLOCK_N`` output features and walks in_features one chunk of 128 elements (four MX
blocks) at a time: it loads the chunk's plane bytes of its rows (32 lanes per load, contiguous), rebuilds each
quarter's element codes with shifts and masks, turns them into float32 values by their sign, exponent and mantissa
fields, multiplies them with the activations' 32 columns of that quarter and sums, then scales the quarter's partial
sums by the block's power of two (an exponent written into a float's bits: exact). Every weight byte is read once
per call, whatever the number of rows (up to ``MAX_ROWS``); accumulation is float32.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from accel.backends.triton_support import can_run, pow2
from accel.formats.elements import ElementFormat

__all__ = ["MAX_ROWS", "available", "decode", "launch_config", "matmul"]

#: most activation rows one matmul call takes (its accumulators are [rows, BLOCK_N] per program)
MAX_ROWS = 16


#: run the kernels on CPU tensors too, under Triton's interpreter (``TRITON_INTERPRET=1`` before triton is imported):
#: the tests set it to send a layer's calls through the kernels' code; slow, never a default
CPU_INTERPRETER = False


def available(device: torch.device) -> bool:
    """Whether the kernels can run on ``device``: triton importable and a CUDA device (or, with ``CPU_INTERPRETER``
    and the interpreter on, the CPU)."""
    return can_run(device, CPU_INTERPRETER)


def _kernels() -> Any:
    """The kernels' module (imports triton; triton reads ``TRITON_INTERPRET`` when it defines them, at import)."""
    return importlib.import_module("accel.backends.mx_triton_kernels")


def _fields(fmt: ElementFormat) -> dict[str, int]:
    return {"BITS": fmt.bits, "EBITS": fmt.ebits, "MBITS": fmt.mbits, "BIAS": fmt.bias, "IS_INT": int(fmt.is_int)}


#: (BLOCK_N, num_warps, target programs) per padded row count, where measured (``benchmarks/gpu.py --layer``)
TUNED: dict[int, tuple[int, int, int]] = {}


def padded_rows(rows: int) -> int:
    """``rows`` rounded up to a power of two (the kernel's accumulator height)."""
    return pow2(rows)


def launch_config(rows: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, target programs) of a matmul of ``rows`` activation rows and ``n`` output features:
    ``TUNED`` where it has the row count, else 16 features a program (8 from 16 rows: registers) and enough programs,
    splitting in_features, to fill a large GPU."""
    if padded_rows(rows) in TUNED:
        return TUNED[padded_rows(rows)]
    return (8 if rows > 8 else 16), 4, 1024


def matmul(
    x: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor | None,
    scales: torch.Tensor,
    fmt: ElementFormat,
    n: int,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """``x @ W.T`` for activations ``x [M, K]`` (M <= MAX_ROWS, contiguous rows) and the device-layout weight
    (planes ``lo``/``hi``, scales ``[n, Kp / 32]``); returns ``[M, n]`` in x's dtype. ``config``: (BLOCK_N,
    num_warps, target programs), default ``launch_config``. Deterministic: partial sums of in_features splits are
    added by ``torch.sum`` in a fixed order."""
    m, k = x.shape
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"mx matmul takes 1..{MAX_ROWS} rows, got {m}")
    block, warps, target = config or launch_config(m, n)
    chunks = scales.shape[1] // 4
    blocks = -(-n // block)
    splits = max(1, min(chunks, -(-target // blocks)))
    per_split = -(-chunks // splits)
    splits = -(-chunks // per_split)
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    _kernels().mx_matmul_kernel[(blocks, splits)](
        x, lo, lo if hi is None else hi, scales, part, n, k, chunks * 128, x.stride(0), m,
        CHUNKS=chunks, PER_SPLIT=per_split, MP=padded_rows(m), BLOCK_N=block, num_warps=warps, **_fields(fmt),
    )  # fmt: skip
    return (part[0] if splits == 1 else part.sum(0)).to(x.dtype)


def decode(
    lo: torch.Tensor,
    hi: torch.Tensor | None,
    scales: torch.Tensor,
    fmt: ElementFormat,
    n: int,
    k: int,
    dtype: torch.dtype,
    block: int = 16,
) -> torch.Tensor:
    """The weight ``[n, k]`` in ``dtype`` (values rounded once from the exact float32 decode)."""
    kernel = _kernels().mx_decode_kernel
    w = torch.empty((n, k), dtype=dtype, device=lo.device)
    kp = scales.shape[1] * 32
    kernel[(-(-n // block), kp // 128)](
        lo, lo if hi is None else hi, scales, w, n, k, kp, BLOCK_N=block, **_fields(fmt)
    )
    return w
