"""Corpora for n-gram stores, all available offline: text files a user gives, the Python standard library's source
(code), and the target's own writing (its continuations of the drafts' built-in prompts, ``accel.drafts``).

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

from accel.errors import NgramError

__all__ = [
    "TEXT_SUFFIXES",
    "self_written_texts",
    "stdlib_files",
    "tokenize_texts",
    "tokenizer_fingerprint",
    "user_text_files",
]

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".tex")
_BATCH = 256  # texts per encode_batch call


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short stable hash of a ``tokenizers.Tokenizer`` (its JSON), stored in a store's header and compared on use."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()[:16]


def tokenize_texts(texts: Sequence[str], tokenizer: Any) -> Iterator[np.ndarray]:
    """Token id arrays (int64) of ``texts``, in order."""
    for start in range(0, len(texts), _BATCH):
        for enc in tokenizer.encode_batch(list(texts[start : start + _BATCH])):
            yield np.asarray(enc.ids, dtype=np.int64)


def _read_files(files: Sequence[tuple[Path, bool]], max_bytes: int | None) -> tuple[list[str], int]:
    """UTF-8 texts of ``(file, strict)`` pairs up to ``max_bytes`` in total; an undecodable file is an error where
    ``strict``, else skipped."""
    texts, used = [], 0
    for f, strict in files:
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
            break
        texts.append(text)
        used += size
    return texts, used


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
    texts, used = _read_files(files, max_bytes)
    if not texts:
        raise NgramError(f"no UTF-8 text found in {[str(p) for p in paths]}")
    return texts, f"text: {len(texts)} files, {used} bytes from {', '.join(str(p) for p in paths)}"


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
    texts, used = _read_files([(f, False) for f in files], max_bytes)
    return texts, f"stdlib: {len(texts)} files, {used} bytes from {root}"


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
    texts = _generate(ckpt, tokenizer, [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(rows)], settings)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(texts), encoding="utf-8")
        os.replace(tmp, cached)
    return texts, desc


def _generate(ckpt: Path, tokenizer: Any, prompts: list[str], settings: dict[str, Any]) -> list[str]:
    import torch
    from tqdm.auto import tqdm

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
