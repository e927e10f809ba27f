"""The data of a distill run: text windows and self-generated continuations scored by the target (its top-k
next-token distributions), cached as safetensors shards so an interrupted run never rebuilds them.

A cache is reused only for the data settings it was built with (``settings.json``); more ``self_generate`` rows only
append batches, since row i always uses the same prompt, temperature and seed.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from accel._io import check_output_path, writing
from accel.drafts.checkpoint import load_text_tokenizer
from accel.drafts.config import DistillConfig
from accel.drafts.data import TeacherData, self_generate, teacher_topk, text_windows
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["ShardCache", "build_data"]

_WHAT = "the distillation data"  # what the shard cache's errors say it was writing

_DATA_SETTINGS = {
    "data_files",
    "max_windows_per_file",
    "prompts",
    "gen_tokens",
    "gen_batch_size",
    "temperatures",
    "seq_len",
    "teacher_top_k",
    "seed",
}


class ShardCache:
    """``TeacherData`` shards in a folder, each built once by its maker and written atomically."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        check_output_path(data_dir, _WHAT, DraftError, folder=True)
        with writing(data_dir, _WHAT, DraftError):
            data_dir.mkdir(parents=True, exist_ok=True)

    def stamp(self, settings: dict[str, Any]) -> None:
        """DraftError if the folder was built with other ``settings``; else record them."""
        stamp = self.data_dir / "settings.json"
        if stamp.is_file() and json.loads(stamp.read_text()) != settings:
            raise DraftError(
                f"the data cache {self.data_dir} was built with other data settings (prompts, files, generation or "
                "top-k); rerun without --resume to rebuild it"
            )
        tmp = self.data_dir / ".settings.json.tmp"
        with writing(self.data_dir, _WHAT, DraftError):
            tmp.write_text(json.dumps(settings, sort_keys=True))
            os.replace(tmp, stamp)

    def get(self, name: str, make: Callable[[], TeacherData]) -> TeacherData:
        """The shard ``name``: loaded if present and valid, else made by ``make()`` and saved."""
        from safetensors.torch import load_file, save_file

        path = self.data_dir / f"{name}.safetensors"
        if path.is_file():
            try:
                return TeacherData.from_tensors(load_file(path), str(path))
            except DraftError:
                raise
            except Exception:  # a torn shard (killed mid-write cannot happen: rename) or foreign file: rebuild
                path.unlink()
        part = make()
        tmp = self.data_dir / f".{name}.tmp"
        with writing(self.data_dir, _WHAT, DraftError):
            save_file(part.tensors(), str(tmp))
            os.replace(tmp, path)
        return part


def build_data(target: Decoder, cfg: DistillConfig, data_dir: Path, tokenizer_dir: Path | None) -> TeacherData:
    """Build (or reload from ``data_dir`` shards) the distillation data described by ``cfg``."""
    cache = ShardCache(data_dir)
    cache.stamp(cfg.model_dump(mode="json", include=_DATA_SETTINGS))
    tokenizer: Any = None
    if cfg.data_files or cfg.self_generate:
        if tokenizer_dir is None:
            raise DraftError("text data and prompts need the target's tokenizer: pass tokenizer_dir or a target dir")
        tokenizer = load_text_tokenizer(tokenizer_dir)
    parts: list[TeacherData] = []
    if cfg.data_files:
        parts.append(_text_part(target, cfg, tokenizer, cache))
    if cfg.self_generate:
        parts += _generated_parts(target, cfg, tokenizer, cache)
    if not parts:
        raise DraftError("no distillation data: give data_files and/or self_generate > 0")
    return TeacherData.concat(parts)


def _text_part(target: Decoder, cfg: DistillConfig, tokenizer: Any, cache: ShardCache) -> TeacherData:
    """The data files' text windows, scored by the target."""
    windows = text_windows(cfg.data_files, tokenizer, cfg.seq_len, cfg.max_windows_per_file)
    if not windows:
        raise DraftError(f"data files {[str(f) for f in cfg.data_files]} hold no text windows of >= 8 tokens")

    def score() -> TeacherData:
        with tqdm(total=len(windows), desc="teacher scores text", disable=not cfg.progress, unit="seq") as bar:
            return teacher_topk(target, windows, cfg.teacher_top_k, batch_size=cfg.gen_batch_size, progress=bar)

    return cache.get("files", score)


def _generated_parts(target: Decoder, cfg: DistillConfig, tokenizer: Any, cache: ShardCache) -> list[TeacherData]:
    """The target's own continuations of the prompts, in batches of ``gen_batch_size`` rows (one shard each)."""
    prompt_ids = [tokenizer.encode(p).ids[-cfg.seq_len :] for p in cfg.prompts]
    n_prompts = len(prompt_ids)
    eos = target.config.eos_token_ids
    rows = list(range(cfg.self_generate))
    batches = [rows[i : i + cfg.gen_batch_size] for i in range(0, len(rows), cfg.gen_batch_size)]
    parts = []
    bar = tqdm(total=len(rows), desc="target generates", disable=not cfg.progress, unit="seq")
    for b, batch_rows in enumerate(batches):
        # row i: prompt i mod P; the first pass over the prompts uses temperatures[0], pass j temperatures[j]
        # (the last one repeats), so greedy rows are not duplicated
        temps = [cfg.temperatures[min(i // n_prompts, len(cfg.temperatures) - 1)] for i in batch_rows]
        prompts = [prompt_ids[i % n_prompts] for i in batch_rows]
        make = functools.partial(
            self_generate, target, prompts, temps, cfg.gen_tokens, cfg.teacher_top_k, cfg.seed * 1_000_003 + b, eos
        )
        parts.append(cache.get(f"gen-{b:05d}", make))
        bar.update(len(batch_rows))
    bar.close()
    return parts
