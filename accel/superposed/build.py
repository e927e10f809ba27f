"""Writing an n-gram store (``accel.superposed.store``) from tokenized documents: pack every position's key, sort,
write atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from accel._io import check_output_path, output_file
from accel.errors import NgramError
from accel.superposed.store import ALIGN, FORMAT_VERSION, MAGIC, bits_per_code, crc32, header_crc32

__all__ = ["DEFAULT_MAX_TOKENS", "build_store", "corpus_keys"]

DEFAULT_MAX_TOKENS = 30_000_000  # ~40 bytes per token while sorting (two 8-byte words, an index, the sorted copy)


def corpus_keys(docs: Iterable[np.ndarray], vocab_size: int, max_order: int, max_tokens: int) -> list[np.ndarray]:
    """Sorted key arrays (one per word, each ``[positions]`` uint64) of the documents' token positions.

    ``NgramError`` for ids outside ``[0, vocab_size)``, no tokens at all, or more than ``max_tokens`` tokens.
    """
    if not 1 <= max_order <= 16:
        raise NgramError(f"max_order must be in 1..16; got {max_order}")
    parts, total = [], 0
    for i, doc in enumerate(docs):
        d = np.asarray(doc)
        if d.ndim != 1 or not np.issubdtype(d.dtype, np.integer):
            raise NgramError(f"document {i} must be a 1-D array of token ids; got {d.dtype} {d.shape}")
        if d.size == 0:
            continue
        if d.min() < 0 or d.max() >= vocab_size:
            raise NgramError(f"document {i} has token ids outside [0, {vocab_size})")
        total += d.size
        if total > max_tokens:
            raise NgramError(f"the corpus exceeds max_tokens={max_tokens} tokens; give less text or raise the limit")
        parts += [d.astype(np.int64) + 1, np.zeros(1, np.int64)]  # codes, then a document end (0)
    if not total:
        raise NgramError("the corpus holds no tokens")
    codes = np.concatenate([*parts, np.zeros(max_order, np.int64)])
    n = codes.size - max_order
    real = codes[:n] != 0
    bits = bits_per_code(vocab_size)
    per_word = 64 // bits
    words = [np.zeros(n, np.uint64) for _ in range(-(-max_order // per_word))]
    alive = np.ones(n, dtype=bool)
    for j in range(max_order):
        cj = codes[j : j + n]
        alive &= cj != 0
        shift = np.uint64(bits * (per_word - 1 - j % per_word))
        words[j // per_word] |= np.where(alive, cj, 0).astype(np.uint64) << shift
    words = [w[real] for w in words]
    order = np.lexsort(words[::-1])  # the last key is the primary one
    return [w[order] for w in words]


def build_store(
    docs: Iterable[np.ndarray],
    vocab_size: int,
    path: str | Path,
    *,
    max_order: int = 6,
    meta: dict[str, Any] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Path:
    """Count every n-gram (n <= ``max_order``) of ``docs`` (1-D token id arrays; n-grams never cross documents) and
    write the store to ``path`` (a temporary file renamed at the end: never half-written). ``meta`` goes into the
    header (sources, tokenizer fingerprint). Returns the path."""
    check_output_path(path, "the n-gram store", NgramError)  # before the corpus is read and sorted
    keys = corpus_keys(docs, vocab_size, max_order, max_tokens)
    n = int(keys[0].shape[0])
    header = {
        **(meta or {}),
        "format": "accel-ngrams",
        "version": FORMAT_VERSION,
        "vocab_size": int(vocab_size),
        "max_order": int(max_order),
        "positions": n,
        "words": len(keys),
        "crc32": [crc32(k) for k in keys],
    }
    header["header_crc32"] = header_crc32(header)
    raw = json.dumps(header, sort_keys=True).encode("utf-8")
    pad = -(-(16 + len(raw)) // ALIGN) * ALIGN - 16 - len(raw)
    with output_file(path, "the n-gram store", NgramError) as out:
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + len(raw).to_bytes(8, "little") + raw + b"\0" * pad)
                for k in keys:
                    k.astype("<u8", copy=False).tofile(f)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out
