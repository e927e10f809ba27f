"""Whether accel's Triton kernels can run (``mx_triton``, ``gemv_triton``, ``attention_triton``): triton is optional
(CUDA builds of torch bring it; the dev extra installs it for the tests, which run the kernels under Triton's CPU
interpreter, ``TRITON_INTERPRET=1`` set before triton is first imported)."""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["can_run", "has_triton", "interpreting", "pow2"]


@functools.cache
def has_triton() -> bool:
    """Whether triton can be imported here."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is on in this process."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def can_run(device: torch.device, cpu_interpreter: bool) -> bool:
    """Whether a Triton kernel can run on ``device``: triton importable and a CUDA device, or the CPU where
    ``cpu_interpreter`` (a module's test switch) and the interpreter are both on."""
    if not has_triton():
        return False
    return device.type == "cuda" or (cpu_interpreter and interpreting())


def pow2(n: int) -> int:
    """``n`` rounded up to a power of two (a kernel's block extent; 1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())
