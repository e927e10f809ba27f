"""Helpers shared by the Superposed Decoding benchmarks: an n-gram store built from target-written distill-data
shards with given prompts' rows left out, and the training prompts to tune on (never the evaluation prompts)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from accel.drafts.prompts import DEFAULT_PROMPTS, HELD_OUT_PROMPTS
from accel.superposed import NgramError, NgramStore, build_store
from accel.superposed.corpus import drop_containing, teacher_shards, tokenizer_fingerprint
from accel.superposed.evaluate import Completions, distinct_n, perplexity


def completions(name: str, backend: Any, prompt: list[int], drafts: list[list[int]], wall: float, calls: int):
    """``Completions`` of ``drafts``, each scored under the target (``backend``)."""
    ppl = [perplexity(backend, prompt, d) for d in drafts]
    return Completions(name, drafts, ppl, distinct_n(drafts, 1), distinct_n(drafts, 2), wall, calls)


def row(name: str, ms: list[Completions]) -> dict:
    """One method over all prompts: time and calls summed; per-token perplexity of all drafts of all prompts
    (``exp`` of the mean NLL per token), the mean over prompts of the drafts' mean and best perplexity, distinct-2."""
    return {
        "method": name,
        "wall_s": float(sum(m.wall_s for m in ms)),
        "calls": int(sum(m.calls for m in ms)),
        "token_perplexity": float(np.exp(sum(m.nll_sum for m in ms) / sum(m.tokens for m in ms))),
        "perplexity": float(np.mean([m.mean_perplexity for m in ms])),
        "best_perplexity": float(np.mean([m.best_perplexity for m in ms])),
        "distinct_2": float(np.mean([m.distinct_2 for m in ms])),
    }


def shard_prompt_ids(data: Path, tok: Any, prompts: Sequence[str]) -> list[list[int]]:
    """The token ids the shards of ``data`` hold for ``prompts`` (cut to the build's ``seq_len`` last tokens, as
    ``accel.drafts.distill_data`` cuts them)."""
    settings = json.loads((data / "data" / "settings.json").read_text())
    seq_len = int(settings.get("seq_len", 1 << 30))
    return [tok.encode(p).ids[-seq_len:] for p in prompts]


def shard_store(data: Path, tok: Any, vocab: int, exclude: Sequence[str], cache: Path) -> tuple[NgramStore, str]:
    """The n-gram store of the shards under ``data/data`` without the rows that contain one of the prompts
    ``exclude`` (and never the held-out prompts), built once per shard set and exclusion and cached under ``cache``.
    Returns the store and a one-line description."""
    store = NgramStore.load(shard_store_file(data, tok, vocab, exclude, cache))
    return store, str(store.meta["sources"][0])


def shard_store_file(data: Path, tok: Any, vocab: int, exclude: Sequence[str], cache: Path) -> Path:
    """``shard_store``'s file (built if it is not cached yet): what a ``SuperposedSpec``'s ``store`` names."""
    excluded = [*exclude, *HELD_OUT_PROMPTS]
    shards = sorted((data / "data").glob("*.safetensors"))
    stamp = json.dumps([[f.name, f.stat().st_size] for f in shards] + sorted(excluded))
    path = cache / f"shards-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}.ngrams"
    if not path.is_file():
        docs, desc = teacher_shards([data / "data"], vocab)
        docs, dropped = drop_containing(docs, shard_prompt_ids(data, tok, excluded))
        desc += f"; {dropped} rows of {len(excluded)} excluded prompts dropped"
        build_store(docs, vocab, path, meta={"sources": [desc], "tokenizer": tokenizer_fingerprint(tok)})
    return path


def tuning_prompts(data: Path, n: int) -> list[str]:
    """``n`` training prompts to tune on: the built-in prompts (``accel.drafts.DEFAULT_PROMPTS``, chat and code
    alike) that the shards' prompt list holds, spread evenly over it. Never a held-out prompt."""
    listed = set(json.loads((data / "prompts.json").read_text()))
    pool = [p for p in DEFAULT_PROMPTS if p in listed and p not in HELD_OUT_PROMPTS]
    if len(pool) < n:
        raise NgramError(f"only {len(pool)} built-in prompts in {data / 'prompts.json'}; asked for {n}")
    step = len(pool) / n
    return [pool[int(i * step)] for i in range(n)]
