"""Corpora for n-gram stores, all available offline: text files a user gives, the Python standard library's source
(code), the target's own writing (its continuations of the drafts' built-in prompts, ``accel.drafts``), and shards
of target-written token ids made by ``accel.drafts.distill_data.build_data`` (``teacher_shards``).

Each source yields documents (token id arrays, n-grams never cross them) and a one-line description for the store's
header. Text is tokenized with the target's tokenizer (``tokenizers.Tokenizer``), in batches.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from accel._io import check_output_path, output_file
from accel.errors import NgramError

__all__ = [
    "TEXT_SUFFIXES",
    "drop_containing",
    "self_written_texts",
    "stdlib_files",
    "teacher_shards",
    "tokenize_texts",
    "tokenizer_fingerprint",
    "user_text_files",
]

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".tex")
_BATCH = 256  # texts per encode_batch call
_CACHED = "the self-written texts"  # what the cache write's errors say it was writing


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short stable hash of a ``tokenizers.Tokenizer`` (its JSON), stored in a store's header and compared on use."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()[:16]


def tokenize_texts(texts: Sequence[str], tokenizer: Any) -> Iterator[np.ndarray]:
    """Token id arrays (int64) of ``texts``, in order."""
    for start in range(0, len(texts), _BATCH):
        for enc in tokenizer.encode_batch(list(texts[start : start + _BATCH])):
            yield np.asarray(enc.ids, dtype=np.int64)


def _read_files(files: Sequence[tuple[Path, bool]], max_bytes: int | None) -> tuple[list[str], int, int]:
    """UTF-8 texts of ``(file, strict)`` pairs, at most ``max_bytes`` in total; an undecodable file is an error where
    ``strict``, else skipped. A file that does not fit in what is left of ``max_bytes`` is skipped and reading goes
    on (a later, smaller file may fit); reading stops once the budget is spent. Returns the texts, their bytes and
    the number of files skipped for size."""
    texts, used, skipped = [], 0, 0
    for f, strict in files:
        if max_bytes is not None and used >= max_bytes:
            break
        try:
            if max_bytes is not None and f.stat().st_size > 2 * (max_bytes - used):
                skipped += 1
                continue  # too big without reading it (newline translation at most halves a file)
        except OSError as exc:
            raise NgramError(f"cannot read {f}: {exc}") from exc
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            if strict:
                raise NgramError(f"{f} is not UTF-8 text ({exc})") from exc
            continue
        except OSError as exc:
            raise NgramError(f"cannot read {f}: {exc}") from exc
        size = len(text.encode("utf-8"))
        if max_bytes is not None and used + size > max_bytes:
            skipped += 1
            continue
        texts.append(text)
        used += size
    return texts, used, skipped


def _skipped(n: int) -> str:
    return f" ({n} files over --max-bytes skipped)" if n else ""


def user_text_files(paths: Sequence[str | Path], max_bytes: int | None = None) -> tuple[list[str], str]:
    """The texts of the given files, and of the files under given directories whose names end in ``TEXT_SUFFIXES``
    (sorted; a non-UTF-8 file found in a directory is skipped, a named one is an error), up to ``max_bytes``."""
    files: list[tuple[Path, bool]] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += [(f, False) for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in TEXT_SUFFIXES]
        elif p.is_file():
            files.append((p, True))
        else:
            raise NgramError(f"no text file or directory at {p}")
    texts, used, skipped = _read_files(files, max_bytes)
    if not texts:
        raise NgramError(f"no UTF-8 text within max_bytes={max_bytes} found in {[str(p) for p in paths]}")
    where = ", ".join(str(p) for p in paths)
    return texts, f"text: {len(texts)} files, {used} bytes from {where}{_skipped(skipped)}"


def stdlib_files(max_bytes: int | None = None) -> tuple[list[str], str]:
    """The ``.py`` sources of this Python's standard library (sorted; test suites, ``site-packages`` and
    ``idlelib`` left out), up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    if not files:
        raise NgramError(f"no Python sources under {root}")
    texts, used, skipped = _read_files([(f, False) for f in files], max_bytes)
    return texts, f"stdlib: {len(texts)} files, {used} bytes from {root}{_skipped(skipped)}"


def self_written_texts(
    checkpoint: str | Path,
    tokenizer: Any,
    rows: int,
    *,
    gen_tokens: int = 96,
    temperature: float = 0.8,
    seed: int = 0,
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
) -> tuple[list[str], str]:
    """The target's own writing: it continues the drafts' built-in prompts (``accel.drafts.DEFAULT_PROMPTS``, cycled;
    chat requests and code openings) by ``gen_tokens`` tokens at ``temperature`` (one batched torch pass per
    ``batch_size`` rows; needs torch). Each text is prompt + continuation, cut after an end-of-sequence token.
    With ``cache_dir``, the texts are kept in a JSON file keyed by the settings and the checkpoint's files, and
    reused."""
    # torch-optional: accel.drafts.prompts imports torch (via accel.drafts.data); the store must not
    from accel.drafts.prompts import DEFAULT_PROMPTS

    ckpt = Path(checkpoint)
    if not ckpt.is_dir():
        raise NgramError(f"self-written text needs a target checkpoint directory; got {ckpt}")
    if rows < 1 or gen_tokens < 1 or batch_size < 1 or temperature < 0:
        raise NgramError("rows, gen_tokens and batch_size must be >= 1 and temperature >= 0")
    settings = {"rows": rows, "gen_tokens": gen_tokens, "temperature": temperature, "seed": seed, "batch": batch_size}
    stamp = [f"{f.name}:{f.stat().st_size}" for f in sorted(ckpt.iterdir()) if f.is_file()]
    key = hashlib.sha256(json.dumps([settings, stamp], sort_keys=True).encode()).hexdigest()[:12]
    cached = Path(cache_dir) / f"self-written-{ckpt.name}-{key}.json" if cache_dir else None
    desc = f"self-written: {rows} continuations of {gen_tokens} tokens at T={temperature} by {ckpt.name}"
    if cached is not None and cached.is_file():
        texts = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(texts, list) and all(isinstance(t, str) for t in texts) and len(texts) == rows:
            return texts, desc
    if cached is not None:
        check_output_path(cached, _CACHED, NgramError)  # before the texts are generated
    texts = _generate(ckpt, tokenizer, [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(rows)], settings)
    if cached is not None:
        with output_file(cached, _CACHED, NgramError):
            tmp = cached.with_suffix(f".tmp{os.getpid()}")
            try:
                tmp.write_text(json.dumps(texts), encoding="utf-8")
                os.replace(tmp, cached)
            finally:
                tmp.unlink(missing_ok=True)
    return texts, desc


def _generate(ckpt: Path, tokenizer: Any, prompts: list[str], settings: dict[str, Any]) -> list[str]:
    import torch
    from tqdm.auto import tqdm

    # torch-optional: generating the corpus runs the torch target; the store and its lookups must not need it
    from accel.drafts.data import self_generate
    from accel.models import load_checkpoint

    model = load_checkpoint(ckpt).eval()
    eos = tuple(model.config.eos_token_ids)
    texts: list[str] = []
    batch = settings["batch"]
    with torch.inference_mode(), tqdm(total=len(prompts), desc="target writes", unit="text") as bar:
        for b, start in enumerate(range(0, len(prompts), batch)):
            chunk = [tokenizer.encode(p).ids for p in prompts[start : start + batch]]
            temps = [settings["temperature"]] * len(chunk)
            data = self_generate(model, chunk, temps, settings["gen_tokens"], 1, settings["seed"] * 7_919 + b, eos)
            for i, p in enumerate(chunk):
                row = data.tokens[i, : len(p) + settings["gen_tokens"]].tolist()
                new = row[len(p) :]
                cut = next((j + 1 for j, t in enumerate(new) if t in eos), len(new))
                texts.append(tokenizer.decode(p + new[:cut], skip_special_tokens=False))
            bar.update(len(chunk))
    return texts


def teacher_shards(paths: Sequence[str | Path], vocab_size: int) -> tuple[list[np.ndarray], str]:
    """The token rows of ``accel.drafts.distill_data`` shards (``*.safetensors`` files, or directories holding them,
    not searched recursively): each row is a prompt and the target's continuation, right-padded. A row's document is
    ``tokens[: last masked position + 2]`` (the mask marks positions that carry a teacher distribution: the prompt and
    every generated token but the last); rows with no masked position are skipped. Only ``tokens`` and ``mask`` are
    read; ``NgramError`` names a file that is not such a shard (other tensors, shapes, dtypes, ids outside
    ``[0, vocab_size)``)."""
    from safetensors import safe_open

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise NgramError(f"no *.safetensors shards in {p} (give the shards' folder, e.g. WORK/data)")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise NgramError(f"no shard file or directory at {p}")
    docs: list[np.ndarray] = []
    for f in files:
        try:
            with safe_open(str(f), framework="numpy") as st:
                names = set(st.keys())
                if not {"tokens", "mask"} <= names:
                    raise NgramError(
                        f"{f} is not a distill-data shard: it needs tensors 'tokens' and 'mask' "
                        f"(accel.drafts.distill_data format); found {sorted(names)[:8]}"
                    )
                tokens, mask = st.get_tensor("tokens"), st.get_tensor("mask")
        except NgramError:
            raise
        except Exception as exc:  # safetensors raises its own error types for a torn or foreign file
            raise NgramError(f"cannot read the shard {f}: {exc}") from exc
        docs += _shard_rows(f, tokens, mask, vocab_size)
    n_tok = sum(d.size for d in docs)
    if not docs:
        raise NgramError(f"the shards {[str(f) for f in files]} hold no rows")
    return docs, f"shards: {len(docs)} target-written rows, {n_tok} tokens from {len(files)} files"


def _shard_rows(f: Path, tokens: np.ndarray, mask: np.ndarray, vocab_size: int) -> list[np.ndarray]:
    """The documents of one shard (``teacher_shards``), validated."""
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise NgramError(f"{f}: 'tokens' must be a 2-D integer array; got {tokens.dtype} {tokens.shape}")
    if mask.shape != tokens.shape or not (mask.dtype == np.bool_ or np.issubdtype(mask.dtype, np.integer)):
        raise NgramError(f"{f}: 'mask' must be a bool/uint8 array shaped like 'tokens' {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise NgramError(f"{f}: token ids outside [0, {vocab_size}): not written with this target's vocabulary")
    m = mask.astype(bool)
    last = np.where(m.any(axis=1), tokens.shape[1] - 1 - np.argmax(m[:, ::-1], axis=1), -1)
    ends = np.minimum(last + 2, tokens.shape[1])
    return [tokens[i, :e].astype(np.int64) for i, e in enumerate(ends) if last[i] >= 0]


def drop_containing(docs: Sequence[np.ndarray], sequences: Sequence[Sequence[int]]) -> tuple[list[np.ndarray], int]:
    """The documents that contain none of ``sequences`` (token ids) as a contiguous run, and how many were dropped
    (e.g. rows written from an evaluation prompt, which a store for that evaluation must not hold)."""
    pats = [np.asarray(s, "<i4").tobytes() for s in sequences if len(s)]
    kept = []
    for d in docs:
        raw = np.asarray(d, "<i4").tobytes()
        if not any(_find_aligned(raw, p) for p in pats):
            kept.append(d)
    return kept, len(docs) - len(kept)


def _find_aligned(raw: bytes, pat: bytes) -> bool:
    """Whether ``pat`` occurs in ``raw`` at a multiple of 4 bytes (a whole int32 token)."""
    i = raw.find(pat)
    while i >= 0:
        if i % 4 == 0:
            return True
        i = raw.find(pat, i + 1)
    return False
