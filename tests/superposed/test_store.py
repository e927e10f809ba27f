"""The n-gram store (``accel.superposed.store``/``build``): counts equal a brute-force count, every file problem is a
clear ``NgramError``. Exact: counts are integers, compared exactly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from accel.superposed import NgramError, NgramStore, build_store
from accel.superposed.build import corpus_keys

VOCAB = 7


def _docs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=n) for n in (40, 1, 0, 25, 60)]


def _brute(docs: list[np.ndarray], max_order: int) -> Counter:
    c: Counter = Counter()
    for d in docs:
        t = d.tolist()
        for i in range(len(t)):
            for n in range(1, max_order + 1):
                if i + n <= len(t):
                    c[tuple(t[i : i + n])] += 1
    return c


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[NgramStore, Counter, Path]:
    path = build_store(_docs(), VOCAB, tmp_path_factory.mktemp("ng") / "s.ngrams", max_order=4, meta={"src": "t"})
    return NgramStore.load(path), _brute(_docs(), 4), path


def test_counts_equal_brute_force(store):
    s, brute, _ = store
    assert s.positions == sum(d.size for d in _docs()) and s.meta["src"] == "t"
    rng = np.random.default_rng(1)
    seen = list(brute)
    queries = seen + [tuple(rng.integers(0, VOCAB, size=rng.integers(1, 5)).tolist()) for _ in range(300)]
    for n in range(1, 5):
        rows = [q for q in queries if len(q) == n]
        got = s.count(np.array(rows))
        assert got.tolist() == [brute[q] for q in rows]
    assert s.count(np.zeros((1, 3), np.int64), np.array([0])).tolist() == [s.positions]


def test_mixed_lengths_and_continuations(store):
    s, brute, _ = store
    rows = np.array([[1, 2, 3], [4, 0, 0], [5, 6, 0], [2, 2, 2]])
    lengths = np.array([3, 1, 2, 0])
    want = [brute[(1, 2, 3)], brute[(4,)], brute[(5, 6)], s.positions]
    assert s.count(rows, lengths).tolist() == want
    cont = s.continuation_count(rows, lengths)
    for q, ln, got in zip(rows.tolist(), lengths.tolist(), cont.tolist(), strict=True):
        assert got == sum(brute[(*q[:ln], t)] for t in range(VOCAB))


def test_multi_word_keys(tmp_path):
    """A vocabulary needing several 64-bit words per key (17 bits x order 6 = 2 words); tokens near the top id."""
    vocab = 100_000
    rng = np.random.default_rng(2)
    docs = [rng.choice([0, 1, vocab - 1, vocab - 2], size=200), rng.integers(0, vocab, size=50)]
    s = NgramStore.load(build_store(docs, vocab, tmp_path / "big.ngrams", max_order=6))
    assert len(s.keys) == 2
    brute = _brute(docs, 6)
    rows = list(brute)[:400]
    for n in range(1, 7):
        sub = [r for r in rows if len(r) == n]
        if sub:
            assert s.count(np.array(sub)).tolist() == [brute[r] for r in sub]


def test_keys_are_sorted():
    keys = corpus_keys(_docs(), VOCAB, 4, 10_000)
    assert np.all(np.diff(keys[0].astype(np.float64)) >= 0)


def _rewrite(path: Path, tmp_path: Path, fn) -> Path:
    data = bytearray(path.read_bytes())
    out = tmp_path / "bad.ngrams"
    out.write_bytes(bytes(fn(data)))
    return out


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda d: d[:-8], "truncated"),
        (lambda d: d + b"\0" * 8, "trailing data"),
        (lambda d: b"NOTASTORE" + d[9:], "not an accel n-gram store"),
        (lambda d: d[:20], "truncated inside its header"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 0x40]), "CRC-32"),
        (lambda d: d[:8] + (10**9).to_bytes(8, "little") + d[16:], "header length"),
        (lambda d: d.replace(b'"version": 2', b'"version": 9'), "format version"),
        (lambda d: d.replace(b'"max_order": 4', b'"max_order": 0'), "max_order"),
        (lambda d: d.replace(b'"format": "accel-ngrams"', b'"format": "accel-ngramz"'), "does not describe"),
    ],
)
def test_corrupt_files_are_refused(store, tmp_path, fn, match):
    with pytest.raises(NgramError, match=match):
        NgramStore.load(_rewrite(store[2], tmp_path, fn))


def _with_header(path: Path, out: Path, change, keys: list[np.ndarray] | None = None) -> Path:
    """The store at ``path`` written to ``out`` with its header changed by ``change(header)`` (padding redone) and,
    given ``keys``, other key arrays."""
    import json

    from accel.superposed.store import ALIGN, MAGIC, read_header

    header, offset = read_header(path)
    raw = path.read_bytes()
    data = raw[offset:] if keys is None else b"".join(k.astype("<u8").tobytes() for k in keys)
    change(header)
    text = json.dumps(header, sort_keys=True).encode()
    pad = -(-(16 + len(text)) // ALIGN) * ALIGN - 16 - len(text)
    out.write_bytes(MAGIC + len(text).to_bytes(8, "little") + text + b"\0" * pad + data)
    return out


def test_unsorted_keys_are_refused(store, tmp_path):
    """Keys swapped with the CRCs (and the header's own) left valid: the order check catches a file not written by
    accel."""
    from accel.superposed.store import crc32, header_crc32

    keys = [np.array(k)[::-1].copy() for k in store[0].keys]

    def change(h):
        h["crc32"] = [crc32(k) for k in keys]
        h["header_crc32"] = header_crc32(h)

    with pytest.raises(NgramError, match="not sorted"):
        NgramStore.load(_with_header(store[2], tmp_path / "unsorted.ngrams", change, keys))


@pytest.mark.parametrize(("field", "value"), [("vocab_size", 5), ("max_order", 3), ("positions", 0), ("src", "u")])
def test_an_edited_header_field_is_refused(store, tmp_path, field, value):
    """Before: ``vocab_size`` 7 -> 5 or ``max_order`` 4 -> 3 loaded (same words per key, the key CRCs intact) and
    reinterpreted the keys: counts off without a word. Now the header's own CRC-32 names the change."""
    bad = _with_header(store[2], tmp_path / "edited.ngrams", lambda h: h.update({field: value}))
    with pytest.raises(NgramError, match="header fails its CRC-32 check"):
        NgramStore.load(bad)


def test_a_version_1_store_is_read_without_a_header_checksum(store, tmp_path):
    """Stores written before the header checksum (format version 1) still load, with the same counts."""

    def to_v1(h):
        h["version"] = 1
        del h["header_crc32"]

    old = NgramStore.load(_with_header(store[2], tmp_path / "v1.ngrams", to_v1))
    seqs = np.array([[1, 2], [3, 0], [6, 6]])
    np.testing.assert_array_equal(old.count(seqs), store[0].count(seqs))


@pytest.mark.parametrize(
    ("docs", "kw", "match"),
    [
        ([np.array([0, 7])], {}, "outside"),
        ([np.array([[1, 2]])], {}, "1-D"),
        ([np.array([], np.int64)], {}, "no tokens"),
        ([np.arange(7)] * 3, {"max_tokens": 10}, "max_tokens"),
        ([np.arange(7)], {"max_order": 17}, "max_order"),
    ],
)
def test_bad_corpus(tmp_path, docs, kw, match):
    with pytest.raises(NgramError, match=match):
        build_store(docs, VOCAB, tmp_path / "x.ngrams", **kw)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_bad_queries_and_missing_file(store, tmp_path):
    s = store[0]
    with pytest.raises(NgramError, match="query token ids"):
        s.count(np.array([[VOCAB]]))
    with pytest.raises(NgramError, match="exceeds"):
        s.count(np.zeros((1, 5), np.int64))
    with pytest.raises(NgramError, match="exceeds"):
        s.continuation_count(np.zeros((1, 4), np.int64))
    with pytest.raises(NgramError, match="2-D"):
        s.count(np.zeros(3, np.int64))
    with pytest.raises(NgramError, match="no n-gram store"):
        NgramStore.load(tmp_path / "missing.ngrams")


def test_package_does_not_import_torch():
    """``accel.superposed`` (decoding, store, proposer) needs numpy only: torch stays unimported."""
    import subprocess
    import sys

    code = "import sys\nimport accel.superposed\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    subprocess.run([sys.executable, "-c", code], check=True)
