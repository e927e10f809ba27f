"""Bounds on the sizes that allocate a backend's memory (KV cache length and rows, threads), checked before anything
is allocated: a ``BackendError`` names the value and the limit instead of a MemoryError or a kernel kill."""

from __future__ import annotations

import os

import numpy as np

from accel.errors import BackendError

__all__ = ["MAX_BATCH_SIZE", "MAX_CTX_LEN", "check_sizes"]

MAX_CTX_LEN = 1 << 20  # tokens: the bound on a KV cache's length (graph tables and caches are sized by it)
MAX_BATCH_SIZE = 4096  # rows per call


def _is_count(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 1)


def check_sizes(ctx_len, batch_size, threads=None, cache_bytes_per_token_row: int = 0) -> None:
    """Check a backend's sizes before anything is allocated (BackendError naming the value and the limit).

    ``ctx_len`` (tokens) in 1..MAX_CTX_LEN, ``batch_size`` (rows) in 1..MAX_BATCH_SIZE, ``threads`` None or >= 1; with
    ``cache_bytes_per_token_row`` (bytes of K and V, all layers, per token and row), the KV cache
    (``ctx_len * batch_size`` times that) must fit in this machine's physical memory.
    """
    for name, value, top in (("ctx_len", ctx_len, MAX_CTX_LEN), ("batch_size", batch_size, MAX_BATCH_SIZE)):
        if not _is_count(value):
            raise BackendError(f"{name} must be an int >= 1; got {value!r}")
        if value > top:
            raise BackendError(f"{name} {value} too large: at most {top}")
    if threads is not None and not _is_count(threads):
        raise BackendError(f"threads must be an int >= 1; got {threads!r}")
    need = int(ctx_len) * int(batch_size) * cache_bytes_per_token_row
    have = _physical_memory()
    if have and need > have:
        raise BackendError(
            f"the KV cache of ctx_len {ctx_len} x batch_size {batch_size} needs {need / 2**30:.1f} GiB; this machine "
            f"has {have / 2**30:.1f} GiB of memory (lower ctx_len or batch_size)"
        )


def _physical_memory() -> int:
    """Bytes of physical memory (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 0
