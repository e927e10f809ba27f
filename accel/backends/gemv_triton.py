"""A Triton matrix-vector kernel for the few activation rows of a decode or verify step with float16 / bfloat16
weights on a GPU, and the ``nn.Linear`` stand-in that calls it (``GemvLinear``, ``use_gemv``).

Why: at batch 1 a decode step is a chain of matrix-vector products, and cuBLAS's kernels for one row reach
2.2-3.0 TB/s of an H200's 4.8 (benchmarks/RESULTS.md, "GPU decode"). This kernel is the plain streaming shape: one
program owns ``BLOCK_N`` output features and walks in_features ``BLOCK_K`` lanes at a time (optionally split over
several programs whose float32 partial sums ``torch.sum`` adds in a fixed order), multiplying in float32 registers
and summing the lanes once, at the end. Every weight byte is read once per call, whatever the number of rows (up to
``MAX_ROWS``). The result is rounded once to the activations' dtype; its accumulation order differs from cuBLAS's,
so half-precision logits differ from ``F.linear``'s in their last bits (float32 math on the same values is the
reference the tests hold it to).

``triton`` is optional: ``available(device)`` says whether the kernel can run (a CUDA device and an importable
triton; or, with ``CPU_INTERPRETER``, the CPU under ``TRITON_INTERPRET=1``, which the tests use). Elsewhere
``GemvLinear`` is ``F.linear``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from accel.backends.triton_support import can_run, pow2
from accel.errors import BackendError

__all__ = ["MAX_ROWS", "GemvLinear", "GemvReport", "available", "launch_config", "matmul", "use_gemv"]

#: most activation rows one kernel call takes (its accumulators are ``[rows, BLOCK_N, BLOCK_K]`` per program)
MAX_ROWS = 8
#: ``GemvLinear``'s default: calls of one row (decode steps) only; cuBLAS's skinny kernels won from 2 rows on an H200
DEFAULT_ROWS = 1
#: weight dtypes the kernel serves
HALF = (torch.float16, torch.bfloat16)

#: run the kernel on CPU tensors too, under Triton's interpreter (tests only; slow, never a default)
CPU_INTERPRETER = False

#: (BLOCK_N, BLOCK_K, num_warps, target programs) per (padded rows, out_features, in_features), where measured
#: (``benchmarks/gpu_gemv.py`` fills it in the run that measures); a target of 0 never splits in_features
TUNED: dict[tuple[int, int, int], tuple[int, int, int, int]] = {}


def available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: triton importable and a CUDA device (or, with ``CPU_INTERPRETER``
    and ``TRITON_INTERPRET=1``, the CPU)."""
    return can_run(device, CPU_INTERPRETER)


def launch_config(rows: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, target programs) of a product of ``rows`` activation rows with an ``[n, k]``
    weight: ``TUNED`` where it has the shape, else 4096 accumulator lanes a program (2048 x 2 for one row, as
    measured best on an H200; no wider than in_features) and no split of in_features."""
    mp = pow2(rows)
    if (mp, n, k) in TUNED:
        return TUNED[(mp, n, k)]
    if mp == 1:  # the best configs of one row on an H200 (benchmarks/RESULTS.md, "GPU decode")
        block_n, block_k = (2, 2048) if k % 2048 == 0 else (4, 512)
    else:
        block_n, block_k = 4, max(64, 1024 // mp)
    return block_n, min(block_k, max(16, pow2(k))), 4, 0  # no wider than the rows


def matmul(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x @ w.T`` for activations ``x [M, K]`` (1 <= M <= MAX_ROWS) and a weight ``w [N, K]`` (rows contiguous),
    both float16 or bfloat16 on the same device; returns ``[M, N]`` in x's dtype. ``config``: (BLOCK_N, BLOCK_K,
    num_warps, target programs), default ``launch_config``. Deterministic (fixed split and summation order)."""
    m, k = x.shape
    n = w.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"gemv takes 1..{MAX_ROWS} rows, got {m}")
    if w.shape[1] != k or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"gemv: x {tuple(x.shape)} and w {tuple(w.shape)} must share K, with contiguous rows")
    block_n, block_k, warps, target = config or launch_config(m, n, k)
    chunks, blocks = -(-k // block_k), -(-n // block_n)
    splits = 1 if target <= blocks else min(chunks, -(-target // blocks))
    per_split = -(-chunks // splits)
    splits = -(-chunks // per_split)
    even = n % block_n == 0 and k % block_k == 0 and chunks % per_split == 0
    out = torch.empty((m, n) if splits == 1 else (splits, m, n), dtype=x.dtype if splits == 1 else torch.float32,
                      device=x.device)  # fmt: skip
    _kernels().gemv_kernel[(blocks, splits)](
        x, w, out, n, k, x.stride(0), w.stride(0), m,
        PER_SPLIT=per_split, MP=pow2(m), BLOCK_N=block_n, BLOCK_K=block_k, EVEN=even, num_warps=warps,
    )  # fmt: skip
    return out if splits == 1 else out.sum(0).to(x.dtype)


def _kernels() -> Any:
    """The kernel's module (imports triton; triton reads ``TRITON_INTERPRET`` when it defines it, at import)."""
    return importlib.import_module("accel.backends.gemv_triton_kernels")


@torch.library.custom_op("accel::gemv", mutates_args=())
def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ w.T`` by the Triton kernel (an opaque op to ``torch.compile``; captured in CUDA graphs)."""
    return matmul(x.contiguous(), w)


@gemv.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))


class GemvLinear(nn.Module):
    """``y = x @ W.T + b`` on the same ``weight`` Parameter as the ``nn.Linear`` it replaces: calls of at most
    ``max_rows`` activation rows run ``accel::gemv`` where the kernel can (``available`` on the weight's device and a
    half-precision weight, both as at construction: build it after moving and casting), wider ones and every other
    case ``F.linear``."""

    def __init__(self, linear: nn.Linear, max_rows: int = DEFAULT_ROWS) -> None:
        super().__init__()
        if not 0 <= max_rows <= MAX_ROWS:
            raise BackendError(f"GemvLinear max_rows {max_rows} outside 0..{MAX_ROWS}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.max_rows = int(max_rows)
        # decided once, here (a plain flag: nothing for torch.compile to trace at each call)
        self.kernel = linear.weight.dtype in HALF and available(linear.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if not self.kernel or flat.shape[0] > self.max_rows or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        y = gemv(flat, self.weight).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, max_rows={self.max_rows}, "
            f"kernel={self.kernel}"
        )


@dataclass(frozen=True)
class GemvReport:
    """What ``use_gemv`` did: layers swapped and the weight bytes they hold."""

    swapped: int
    weight_bytes: int

    def line(self) -> str:
        return f"gemv kernel: {self.swapped} linear layers ({self.weight_bytes / 2**20:.0f} MiB of weights)"


def use_gemv(model: nn.Module, max_rows: int = DEFAULT_ROWS) -> GemvReport:
    """Swap (in place) every ``nn.Linear`` of ``model`` with a float16/bfloat16 weight for a ``GemvLinear`` on the
    same Parameter (tied weights stay tied); returns the report."""
    swaps = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear and m.weight.dtype in HALF]
    for name, module in swaps:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, GemvLinear(module, max_rows))
    nbytes = sum(m.weight.numel() * m.weight.element_size() for _, m in swaps)
    return GemvReport(len(swaps), nbytes)
