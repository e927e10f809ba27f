"""Training data for early-exit heads (``accel.drafts.early_exit``) from an existing distillation data folder.

``read_teacher_dir`` reads, never writes, a folder built by ``accel.drafts.distill_data.build_data`` (its
``settings.json`` and ``files.safetensors`` / ``gen-*.safetensors`` shards of ``TeacherData``: token sequences with
the target's top-k next-token log-probs) and checks it before any work: a foreign or damaged folder is a
``DraftError`` naming the file and the problem. ``exit_states`` computes the target's residual states after the exit
layer at the positions that carry a teacher distribution, batch by batch with progress, in float32 (a few
dimensions of SmolLM2's residual stream reach ~2.5e4, too close to float16's limit to store them so).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from accel.drafts.data import TeacherData
from accel.drafts.early_exit import exit_hidden
from accel.errors import DraftError
from accel.models.decoder import Decoder

__all__ = ["exit_states", "read_teacher_dir"]


def _check_shard(part: TeacherData, path: Path, vocab_size: int, top_k: int) -> None:
    if part.topk_ids.shape[2] != top_k:
        raise DraftError(f"{path}: teacher top-{part.topk_ids.shape[2]}, but settings.json says top-{top_k}")
    if part.tokens.numel() == 0 or not bool(part.mask.any()):
        raise DraftError(f"{path}: no positions with a teacher distribution")
    for name, ids in (("tokens", part.tokens), ("topk_ids", part.topk_ids)):
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise DraftError(f"{path}: {name} outside the target's vocabulary [0, {vocab_size})")
    logp = part.topk_logp[part.mask]
    if not bool(torch.isfinite(logp).all()) or float(logp.max()) > 1e-3:
        raise DraftError(f"{path}: topk_logp must be finite log-probabilities (<= 0) at masked positions")
    if float(torch.logsumexp(logp, dim=-1).max()) > 1e-3:
        raise DraftError(f"{path}: top-k probabilities sum to more than 1 at some position")


def read_teacher_dir(path: str | Path, *, vocab_size: int, max_shards: int = 0) -> TeacherData:
    """The distillation data in the ``build_data`` folder ``path`` (read only), checked for a target of
    ``vocab_size`` tokens: ``settings.json`` with ``teacher_top_k``, then ``files.safetensors`` and the
    ``gen-*.safetensors`` shards in order (the first ``max_shards`` only when > 0). Shards are safetensors (no
    pickle); each is validated (names, shapes, id ranges, finite log-probs summing to <= 1)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(path)
    if not root.is_dir():
        raise DraftError(f"data folder {root} does not exist")
    stamp = root / "settings.json"
    try:
        top_k = int(json.loads(stamp.read_text())["teacher_top_k"])
    except FileNotFoundError:
        raise DraftError(f"{root} is not a distillation data folder (no settings.json)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise DraftError(f"{stamp}: not a build_data settings file ({exc!r})") from None
    shards = sorted(root.glob("files.safetensors")) + sorted(root.glob("gen-*.safetensors"))
    if max_shards < 0:
        raise DraftError(f"max_shards must be >= 0; got {max_shards}")
    if max_shards:
        shards = shards[:max_shards]
    if not shards:
        raise DraftError(f"{root} holds no data shards (files.safetensors or gen-*.safetensors)")
    parts = []
    for shard in shards:
        try:
            part = TeacherData.from_tensors(load_file(str(shard)), str(shard))
        except (SafetensorError, OSError, ValueError) as exc:
            raise DraftError(f"{shard}: not a readable safetensors shard ({exc})") from None
        _check_shard(part, shard, vocab_size, top_k)
        parts.append(part)
    return TeacherData.concat(parts)


def exit_states(
    target: Decoder,
    data: TeacherData,
    layer: int,
    *,
    batch_size: int = 16,
    log: Callable[[str], None] = print,
) -> torch.Tensor:
    """The residual states ``[M, hidden]`` (float32) after ``layer`` layers of ``target`` at the ``M`` positions
    where ``data.mask`` holds, in row-major order (``data.mask.nonzero()``'s order, matching
    ``data.topk_ids[data.mask]``). Logs progress (rows, positions/s) about every 30 seconds."""
    m = data.num_positions
    out = torch.empty(m, target.config.hidden_size, dtype=torch.float32)
    at, t0, last = 0, time.perf_counter(), -math.inf
    for s in range(0, len(data), batch_size):
        rows = slice(s, s + batch_size)
        mask = data.mask[rows]
        width = int(mask.nonzero()[:, 1].max()) + 1 if bool(mask.any()) else 0
        if width == 0:
            continue
        hidden = exit_hidden(target, data.tokens[rows, :width], layer, batch_size=batch_size)
        picked = hidden[mask[:, :width]]
        out[at : at + len(picked)] = picked
        at += len(picked)
        now = time.perf_counter()
        if now - last > 30 or at == m:
            last = now
            log(f"layer {layer} states: {min(s + batch_size, len(data))}/{len(data)} rows, {at}/{m} positions "
                f"({at / max(now - t0, 1e-9):.0f} positions/s)")  # fmt: skip
    return out
