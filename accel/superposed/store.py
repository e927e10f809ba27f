"""``NgramStore``: exact n-gram counts of a tokenized corpus, as sorted packed suffix keys in one memory-mapped file.

Layout (docs/superposed.md, "The n-gram store"). Every corpus position i (a token of some document) has a key: the
codes of tokens ``i .. i + max_order - 1`` of its document (code = token id + 1; 0 past the document's end), packed
``bits`` bits per code, most significant first, ``per_word = 64 // bits`` codes per uint64 word, ``words`` words. The
keys are sorted lexicographically, so the positions whose text starts with any sequence ``s`` of at most
``max_order`` tokens form one contiguous range: ``count(s)`` (the n-gram count of ``s``, documents never crossed) is
the difference of two lower bounds. That is a suffix array truncated to ``max_order`` tokens, with the keys in place
of the suffixes: 8 bytes x ``words`` per corpus token for all orders at once (SmolLM2's 49152-token vocabulary: 16
bits per code, 2 words for order 6, 16 bytes per token), exact, and no pickle.

File: ``b"ACNGRAM1"``, the header length (uint64 little-endian), a JSON header, zero padding to a 64-byte boundary,
then ``words`` arrays of ``positions`` little-endian uint64 (word 0 of every key, then word 1, ...). The header holds
the CRC-32 of each array and (format version 2) its own (``header_crc32``: of the header's sorted-key JSON without
that field), so an edited ``vocab_size`` or ``max_order``, which would reinterpret the keys and give other counts
without a word, is caught. Loading checks the magic, the header fields and checksum, the exact file size, each
array's CRC-32 and the key order (``NgramError`` naming the problem), then maps the arrays read-only. Version 1
stores (written before the header checksum) are read without it.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from accel.errors import NgramError

__all__ = ["FORMAT_VERSION", "MAGIC", "READ_VERSIONS", "NgramStore", "bits_per_code", "header_crc32"]

MAGIC = b"ACNGRAM1"
FORMAT_VERSION = 2  # 2: the header carries its own CRC-32 (header_crc32)
READ_VERSIONS = (1, 2)  # 1: stores written before the header checksum, read without it
ALIGN = 64
_MAX_HEADER = 1 << 20
_CRC_CHUNK = 1 << 24  # bytes per zlib.crc32 call


def bits_per_code(vocab_size: int) -> int:
    """Bits per packed token code: codes run 0 (past the end) .. vocab_size, and ``vocab_size + 1`` must fit too (the
    exclusive upper end of a range query)."""
    return max(1, int(vocab_size + 1).bit_length())


class NgramStore:
    """Read-only n-gram counts (module docstring). Open with ``NgramStore.load(path)``.

    Attributes:
        vocab_size: token ids are ``0 .. vocab_size - 1``.
        max_order: the longest n-gram counted (tokens).
        positions: corpus tokens (keys).
        meta: the header (sources, tokenizer fingerprint, ...).
    """

    def __init__(self, keys: list[np.ndarray], vocab_size: int, max_order: int, meta: dict[str, Any]) -> None:
        self.keys = keys  # words arrays, each [positions] uint64, sorted lexicographically together
        self.vocab_size, self.max_order, self.meta = vocab_size, max_order, meta
        self.bits = bits_per_code(vocab_size)
        self.per_word = 64 // self.bits
        self.positions = int(keys[0].shape[0]) if keys else 0

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path, *, verify: bool = True) -> NgramStore:
        """Open the store at ``path`` (memory-mapped). ``verify`` (default) checks every array's CRC-32 and the key
        order, reading the whole file once; the header and the file size are always checked."""
        path = Path(path)
        if not path.is_file():
            raise NgramError(f"no n-gram store at {path}")
        header, offset = read_header(path)
        vocab, order, n, words = (int(header[k]) for k in ("vocab_size", "max_order", "positions", "words"))
        size = path.stat().st_size
        want = offset + words * n * 8
        if size != want:
            raise NgramError(
                f"{path}: the file has {size} bytes; its header describes {want} ({words} x {n} keys): "
                f"{'truncated' if size < want else 'trailing data'}"
            )
        keys: list[np.ndarray] = [
            np.memmap(path, dtype="<u8", mode="r", offset=offset + w * n * 8, shape=(n,)) for w in range(words)
        ]
        if verify:
            for w, arr in enumerate(keys):
                if crc32(arr) != int(header["crc32"][w]):
                    raise NgramError(f"{path}: key array {w} fails its CRC-32 check (the file is corrupt)")
            if not keys_sorted(keys):
                raise NgramError(f"{path}: the keys are not sorted (not a store written by accel, or corrupt)")
        return cls(keys, vocab, order, header)

    # ------------------------------------------------------------------ queries

    def count(self, seqs: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        """Occurrences of each token sequence in the corpus (documents never crossed).

        Args:
            seqs: int ``[Q, L]`` token ids, ``L <= max_order``; row q's sequence is its first ``lengths[q]`` ids.
            lengths: int ``[Q]`` (default: all ``L``); a length of 0 counts every position.

        Returns:
            int64 ``[Q]`` counts.
        """
        seqs, lengths = self._check_queries(seqs, lengths)
        lo = self.pack(seqs + 1, lengths)
        hi = self.pack(seqs + 1, lengths, bump_last=True)
        return self.lower_bound(hi) - self.lower_bound(lo)

    def continuation_count(self, seqs: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
        """Occurrences of each sequence followed by a token of the same document (``sum_t count(seq + t)``): the
        denominator of an n-gram probability. Sequences must be shorter than ``max_order``."""
        seqs, lengths = self._check_queries(seqs, lengths, room=1)
        q, width = seqs.shape
        ext = np.zeros((q, width + 1), dtype=np.int64)
        ext[:, :width] = seqs + 1
        ext[np.arange(q), lengths] = 1  # the smallest real code after the sequence
        lo = self.pack(ext, lengths + 1)
        hi = self.pack(seqs + 1, lengths, bump_last=True)
        return self.lower_bound(hi) - self.lower_bound(lo)

    def _check_queries(
        self, seqs: np.ndarray, lengths: np.ndarray | None, room: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        s = np.asarray(seqs)
        if s.ndim != 2 or not np.issubdtype(s.dtype, np.integer):
            raise NgramError(f"n-gram queries must be a 2-D integer array [Q, L]; got {s.dtype} {s.shape}")
        ln = np.full(s.shape[0], s.shape[1], np.int64) if lengths is None else np.asarray(lengths, np.int64)
        if ln.shape != (s.shape[0],) or np.any(ln < 0) or np.any(ln > s.shape[1]):
            raise NgramError(f"query lengths must be [Q] ints in 0..{s.shape[1]}")
        if ln.size and int(ln.max()) + room > self.max_order:
            raise NgramError(
                f"a query of {int(ln.max())} tokens exceeds this store's max_order {self.max_order - room}"
            )
        used = np.arange(s.shape[1])[None, :] < ln[:, None]
        if np.any(used & ((s < 0) | (s >= self.vocab_size))):
            raise NgramError(f"query token ids must be in [0, {self.vocab_size})")
        return np.where(used, s, 0).astype(np.int64), ln

    def pack(self, codes: np.ndarray, lengths: np.ndarray, bump_last: bool = False) -> np.ndarray:
        """Keys ``[words, Q]`` uint64 of code rows (first ``lengths[q]`` codes, zeros after); ``bump_last`` adds 1 to
        the last code (the exclusive end of the range of keys starting with the row; length 0: past every key)."""
        q, width = codes.shape
        c = np.zeros((q, self.per_word * len(self.keys)), dtype=np.uint64)
        used = np.arange(width)[None, :] < lengths[:, None]
        c[:, :width] = np.where(used, codes, 0).astype(np.uint64)
        if bump_last:
            rows = np.flatnonzero(lengths > 0)
            c[rows, lengths[rows] - 1] += np.uint64(1)
        shifts = (self.bits * np.arange(self.per_word - 1, -1, -1)).astype(np.uint64)
        words = (c.reshape(q, len(self.keys), self.per_word) << shifts).sum(axis=2, dtype=np.uint64).T
        if bump_last:  # length 0: beyond the largest key
            words[:, lengths == 0] = np.iinfo(np.uint64).max
        return words

    def lower_bound(self, query: np.ndarray) -> np.ndarray:
        """For each query key (``[words, Q]``), the number of stored keys lexicographically smaller."""
        k0, q0 = self.keys[0], query[0]
        lo = np.searchsorted(k0, q0, side="left").astype(np.int64)
        if len(self.keys) == 1:
            return lo
        hi = np.searchsorted(k0, q0, side="right").astype(np.int64)
        while True:  # binary search on the later words within each query's run of equal first words
            active = lo < hi
            if not active.any():
                return lo
            mid = (lo + hi) // 2
            at = np.minimum(mid, self.positions - 1)
            less = _lex_less([k[at] for k in self.keys[1:]], list(query[1:]))
            lo = np.where(active & less, mid + 1, lo)
            hi = np.where(active & ~less, mid, hi)


def _lex_less(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """Elementwise ``tuple(a) < tuple(b)`` over words."""
    less = np.zeros(a[0].shape, dtype=bool)
    equal = np.ones(a[0].shape, dtype=bool)
    for x, y in zip(a, b, strict=True):
        less |= equal & (x < y)
        equal &= x == y
    return less


def keys_sorted(keys: list[np.ndarray], chunk: int = 1 << 22) -> bool:
    """Whether the key arrays are in nondecreasing lexicographic order (checked in chunks of positions)."""
    n = int(keys[0].shape[0])
    for start in range(0, max(n - 1, 0), chunk):
        stop = min(start + chunk, n - 1)
        a = [np.asarray(k[start:stop]) for k in keys]
        b = [np.asarray(k[start + 1 : stop + 1]) for k in keys]
        if _lex_less(b, a).any():
            return False
    return True


def crc32(arr: np.ndarray) -> int:
    """CRC-32 of an array's bytes (little-endian uint64), in chunks."""
    view = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    crc = 0
    for start in range(0, view.size, _CRC_CHUNK):
        crc = zlib.crc32(view[start : start + _CRC_CHUNK].tobytes(), crc)
    return crc


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a store file and the byte offset of its key arrays (``NgramError`` when malformed)."""
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            raise NgramError(f"{path} is not an accel n-gram store (no {MAGIC!r} magic)")
        length = int.from_bytes(head[8:16], "little")
        if not 2 <= length <= _MAX_HEADER:
            raise NgramError(f"{path}: header length {length} is out of range (corrupt file)")
        raw = f.read(length)
    if len(raw) != length:
        raise NgramError(f"{path}: truncated inside its header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NgramError(f"{path}: the header is not valid JSON ({exc})") from exc
    check_header(header, str(path))
    return header, -(-(16 + length) // ALIGN) * ALIGN


def check_header(h: Any, source: str) -> None:
    """``NgramError`` unless ``h`` is a complete, consistent store header."""
    if not isinstance(h, dict) or h.get("format") != "accel-ngrams":
        raise NgramError(f"{source}: the header does not describe an accel n-gram store")
    version = h.get("version")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        raise NgramError(f"{source}: store format version {version!r}; this accel reads {list(READ_VERSIONS)}")
    for key in ("vocab_size", "max_order", "positions", "words"):
        if not isinstance(h.get(key), int) or isinstance(h.get(key), bool) or h[key] < (0 if key == "positions" else 1):
            raise NgramError(f"{source}: header field {key!r} must be a positive int; got {h.get(key)!r}")
    bits = bits_per_code(h["vocab_size"])
    if bits > 32:
        raise NgramError(f"{source}: vocab_size {h['vocab_size']} is too large for this format")
    words = -(-h["max_order"] // (64 // bits))
    if h["words"] != words:
        raise NgramError(f"{source}: {h['words']} words per key; vocab {h['vocab_size']} and order need {words}")
    crcs = h.get("crc32")
    if not isinstance(crcs, list) or len(crcs) != words or not all(type(c) is int for c in crcs):
        raise NgramError(f"{source}: header field 'crc32' must list {words} ints")
    if version >= 2 and h.get("header_crc32") != header_crc32(h):
        raise NgramError(
            f"{source}: the header fails its CRC-32 check (header_crc32 {h.get('header_crc32')!r}): a field was "
            "changed or the file is corrupt"
        )


def header_crc32(h: dict[str, Any]) -> int:
    """CRC-32 of a store header's sorted-key JSON without its ``header_crc32`` field (written by ``build_store``)."""
    body = {k: v for k, v in h.items() if k != "header_crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode("utf-8"))
