"""Distillation data: token sequences with the target's next-token distribution, truncated to its top k.

Two sources, both stored the same way (``TeacherData``):

- text files, tokenized with the target's tokenizer and cut into fixed windows; the target scores them in one causal
  pass per batch (``teacher_topk``);
- continuations the target generates itself from prompts (``self_generate``): batched, left-padded prompts decoded
  with the position-indexed KV cache; the logits of the prefill and of every decode step are the teacher
  distributions, so generation and scoring are one pass.

Row ``i`` of ``TeacherData``: ``tokens[i, j]`` for ``j < lengths[i]``; ``mask[i, j]`` says position ``j`` has a teacher
distribution for token ``j + 1`` (``topk_ids[i, j]`` sorted by decreasing probability, ``topk_logp`` its log-probs
under the full softmax, so they sum to <= 1 in probability).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accel._legacy import Replaced, legacy_keywords
from accel.drafts.architecture import causal_logits
from accel.errors import DraftError
from accel.models.decoder import Decoder, new_cache

__all__ = [
    "PromptSampling",
    "TeacherData",
    "chat_prompt",
    "sample_prompts",
    "self_generate",
    "teacher_topk",
    "text_windows",
]


def chat_prompt(user_text: str) -> str:
    """A ChatML user turn followed by the assistant header (SmolLM2-Instruct's chat template)."""
    return f"<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class TeacherData:
    """Sequences with top-k teacher distributions (see module docstring). Shapes ``[N, L]`` / ``[N, L, k]``."""

    tokens: torch.Tensor  # int64
    mask: torch.Tensor  # bool
    topk_ids: torch.Tensor  # int64
    topk_logp: torch.Tensor  # float32

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_positions(self) -> int:
        """Positions carrying a teacher distribution (tokens of training signal)."""
        return int(self.mask.sum())

    def tensors(self) -> dict[str, torch.Tensor]:
        """For ``safetensors.torch.save_file``."""
        return {
            "tokens": self.tokens,
            "mask": self.mask.to(torch.uint8),
            "topk_ids": self.topk_ids.to(torch.int32),
            "topk_logp": self.topk_logp,
        }

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], source: str = "data") -> TeacherData:
        """Inverse of ``tensors``; validates names and shapes (``DraftError`` otherwise)."""
        names = {"tokens", "mask", "topk_ids", "topk_logp"}
        if set(t) != names:
            raise DraftError(f"{source}: expected tensors {sorted(names)}, found {sorted(t)}")
        n, length = t["tokens"].shape
        if (
            t["mask"].shape != (n, length)
            or t["topk_ids"].shape[:2] != (n, length)
            or (t["topk_logp"].shape != t["topk_ids"].shape)
        ):
            raise DraftError(f"{source}: inconsistent tensor shapes")
        return cls(t["tokens"].long(), t["mask"].bool(), t["topk_ids"].long(), t["topk_logp"].float())

    @classmethod
    def concat(cls, parts: list[TeacherData]) -> TeacherData:
        """Rows of every part, right-padded to the longest length."""
        if not parts:
            raise DraftError("no distillation data: give data files and/or self_generate > 0 with prompts")
        length = max(p.tokens.shape[1] for p in parts)
        k = parts[0].topk_ids.shape[2]

        def pad(x: torch.Tensor, value: float) -> torch.Tensor:
            extra = length - x.shape[1]
            if extra == 0:
                return x
            shape = (x.shape[0], extra, *x.shape[2:])
            return torch.cat([x, torch.full(shape, value, dtype=x.dtype)], dim=1)

        if any(p.topk_ids.shape[2] != k for p in parts):
            raise DraftError("data parts have different teacher top-k")
        return cls(
            torch.cat([pad(p.tokens, 0) for p in parts]),
            torch.cat([pad(p.mask, False) for p in parts]),
            torch.cat([pad(p.topk_ids, 0) for p in parts]),
            torch.cat([pad(p.topk_logp, 0.0) for p in parts]),
        )

    def subset(self, rows: torch.Tensor) -> TeacherData:
        """The given rows."""
        return TeacherData(self.tokens[rows], self.mask[rows], self.topk_ids[rows], self.topk_logp[rows])


def text_windows(
    files: list[Path], tokenizer, seq_len: int, max_windows_per_file: int | None = None
) -> list[list[int]]:
    """Token windows of ``seq_len`` tokens (non-overlapping; a shorter tail window is kept if >= 8 tokens)."""
    windows: list[list[int]] = []
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise DraftError(f"data file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DraftError(f"data file {path} is not UTF-8 text: {exc}") from exc
        ids = tokenizer.encode(text).ids
        mine = [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]
        mine = [w for w in mine if len(w) >= 8]
        windows.extend(mine[:max_windows_per_file] if max_windows_per_file else mine)
    return windows


def _topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    vals, ids = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
    return ids, vals


@torch.inference_mode()
def teacher_topk(target: Decoder, windows: list[list[int]], k: int, batch_size: int = 8, progress=None) -> TeacherData:
    """Score token ``windows`` with ``target`` (one causal pass per batch) and keep its top-``k`` next-token
    log-probs."""
    length = max(len(w) for w in windows)
    n = len(windows)
    tokens = torch.zeros(n, length, dtype=torch.long)
    mask = torch.zeros(n, length, dtype=torch.bool)
    for i, w in enumerate(windows):
        tokens[i, : len(w)] = torch.tensor(w)
        mask[i, : len(w) - 1] = True
    kk = min(k, target.config.vocab_size)
    ids = torch.zeros(n, length, kk, dtype=torch.long)
    logp = torch.zeros(n, length, kk)
    for start in range(0, n, batch_size):
        rows = slice(start, start + batch_size)
        width = int(mask[rows].sum(dim=1).max()) + 1
        top_ids, top_logp = _topk(causal_logits(target, tokens[rows, :width]), kk)
        ids[rows, :width], logp[rows, :width] = top_ids, top_logp
        if progress is not None:
            progress.update(min(batch_size, n - start))
    return TeacherData(tokens, mask, ids, logp)


@torch.inference_mode()
def self_generate(
    target: Decoder,
    prompts: list[list[int]],
    temperatures: list[float],
    gen_tokens: int,
    k: int,
    seed: int,
    eos_token_ids: tuple[int, ...] = (),
) -> TeacherData:
    """Let ``target`` continue each prompt by ``gen_tokens`` tokens (row ``i`` at ``temperatures[i]``, 0 = greedy),
    in one batch with a KV cache; return prompt + continuation with the teacher's top-``k`` at every position.

    A row stops after an end-of-sequence token (later steps are computed for the batch but not kept).
    """
    if len(prompts) != len(temperatures):
        raise DraftError(f"{len(prompts)} prompts but {len(temperatures)} temperatures")
    if any(len(p) == 0 for p in prompts):
        raise DraftError("empty prompt: every prompt needs at least one token")
    gen = torch.Generator().manual_seed(seed)
    plen = torch.tensor([len(p) for p in prompts])
    width = int(plen.max())
    ctx = width + gen_tokens
    logits, keys, values = _left_padded_prefill(target, prompts, width, ctx)
    kk = min(k, target.config.vocab_size)
    out = _prompt_teacher(prompts, logits, width, ctx, kk)
    _decode_continuations(target, out, (logits, keys, values), plen, temperatures, gen_tokens, gen, eos_token_ids)
    return out


def _left_padded_prefill(
    target: Decoder, prompts: list[list[int]], width: int, ctx: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the left-padded prompts through ``target`` into a fresh KV cache of ``ctx`` positions."""
    bsz = len(prompts)
    ids = torch.zeros(bsz, width, dtype=torch.long)
    pos = torch.full((bsz, width), -1, dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: position -1 (docs/reference.md §2)
        ids[i, width - len(p) :] = torch.tensor(p)
        pos[i, width - len(p) :] = torch.arange(len(p))
    keys, values = new_cache(target.config, bsz, ctx)
    logits, keys, values = target(ids, pos, keys, values, inplace=True)
    return logits, keys, values


def _prompt_teacher(prompts: list[list[int]], logits: torch.Tensor, width: int, ctx: int, kk: int) -> TeacherData:
    """Output buffers of ``ctx`` positions holding each prompt and the teacher's top-``kk`` over it."""
    bsz = len(prompts)
    out_tokens = torch.zeros(bsz, ctx, dtype=torch.long)
    out_mask = torch.zeros(bsz, ctx, dtype=torch.bool)
    out_ids = torch.zeros(bsz, ctx, kk, dtype=torch.long)
    out_logp = torch.zeros(bsz, ctx, kk)
    pre_ids, pre_logp = _topk(logits, kk)
    for i, p in enumerate(prompts):
        n = len(p)
        out_tokens[i, :n] = torch.tensor(p)
        out_ids[i, :n], out_logp[i, :n] = pre_ids[i, width - n :], pre_logp[i, width - n :]
        out_mask[i, :n] = True
    return TeacherData(out_tokens, out_mask, out_ids, out_logp)


def _decode_continuations(
    target: Decoder,
    out: TeacherData,
    prefill: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    plen: torch.Tensor,
    temperatures: list[float],
    gen_tokens: int,
    gen: torch.Generator,
    eos_token_ids: tuple[int, ...],
) -> None:
    """Decode ``gen_tokens`` tokens per row after the prefill's ``(logits, keys, values)``, writing into ``out``."""
    logits, keys, values = prefill
    out_tokens, out_mask, out_ids, out_logp = out.tokens, out.mask, out.topk_ids, out.topk_logp
    bsz, kk = out_tokens.shape[0], out_ids.shape[2]
    temps = torch.tensor(temperatures, dtype=torch.float32)
    greedy = temps <= 0
    alive = torch.ones(bsz, dtype=torch.bool)
    last = logits[:, -1, :].float()
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long)
    rows = torch.arange(bsz)
    for t in range(gen_tokens):
        # inverse-CDF sampling with one uniform per row (torch.multinomial draws V exponentials per row)
        cdf = torch.softmax(last / temps.clamp(min=1e-6)[:, None], dim=-1, dtype=torch.float64).cumsum(-1)
        u = torch.rand(bsz, 1, generator=gen, dtype=torch.float64) * cdf[:, -1:]
        sampled = torch.searchsorted(cdf, u).squeeze(1).clamp(max=cdf.shape[-1] - 1)
        nxt = torch.where(greedy, last.argmax(dim=-1), sampled)
        cur = plen + t  # position of the new token
        out_tokens[rows[alive], cur[alive]] = nxt[alive]
        if t == gen_tokens - 1:
            break
        finished = alive & torch.isin(nxt, eos) if len(eos) else torch.zeros_like(alive)
        alive = alive & ~finished
        if not alive.any():
            break
        step_pos = torch.where(alive, cur, torch.full_like(cur, -1))[:, None]
        logits, keys, values = target(nxt[:, None], step_pos, keys, values, inplace=True)
        last = logits[:, -1, :].float()
        i_, v_ = _topk(last, kk)
        out_ids[rows[alive], cur[alive]] = i_[alive]
        out_logp[rows[alive], cur[alive]] = v_[alive]
        out_mask[rows[alive], cur[alive]] = True


def split_rows(n: int, held_out_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic train / held-out row indices (at least one held-out row when the fraction is > 0 and n > 1)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7919))
    n_held = round(n * held_out_fraction)
    if held_out_fraction > 0 and n > 1:
        n_held = max(1, n_held)
    return perm[n_held:].sort().values, perm[:n_held].sort().values


def to_numpy_ids(seqs) -> list[np.ndarray]:
    """Normalise a list of token sequences / a 2-D array to a list of 1-D int64 arrays."""
    return [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]


@dataclass(frozen=True)
class PromptSampling:
    """How ``sample_prompts`` samples: each sample continues a start at ``temperature`` for at most ``max_tokens``
    tokens and counts when the single-token string ``stop`` ends it (with ``partial``, a sample that did not reach it
    is kept too, cut after its last sentence end); ``batch_size`` rows per generation, seeded by ``seed``. A kept
    sample becomes ``wrap(start + sample)`` (default ``start + sample + stop``); the strings in ``exclude`` are never
    returned."""

    stop: str
    max_tokens: int = 48
    temperature: float = 1.0
    batch_size: int = 64
    seed: int = 0
    exclude: tuple[str, ...] = ()
    wrap: Callable[[str], str] | None = None
    partial: bool = False


def sample_prompts(
    target: Decoder,
    tokenizer: Any,
    starts: list[str],
    n: int,
    sampling: PromptSampling | None = None,
    *,
    progress: bool = True,
    **legacy: Any,
) -> list[str]:
    """Up to ``n`` distinct prompts the target writes itself: it continues each of ``starts`` (cycled) as
    ``sampling`` says (a ``PromptSampling``); a sample counts when its ``stop`` ends it (e.g. ``"<|im_end|>"`` after a
    ChatML user header: a complete user question; ``"\\n"`` after ``"def "``: a complete signature).

    Returns the kept samples in generation order, without duplicates and without ``sampling.exclude``. Costs
    ``ceil(n / batch_size)`` batched generations or more when samples are dropped (stops after ``4 n`` samples).
    Deprecated: ``sampling``'s fields as keywords (``stop=``, ``max_tokens=``, ...; use ``PromptSampling(...)``).
    """
    from tqdm.auto import tqdm

    sampling = _legacy_sampling("sample_prompts", sampling, legacy)
    if not starts:
        raise DraftError("sample_prompts needs at least one start string")
    stop_ids = tokenizer.encode(sampling.stop).ids
    if len(stop_ids) != 1:
        raise DraftError(f"stop string {sampling.stop!r} must be a single token; it is {len(stop_ids)} tokens")
    start_ids = [tokenizer.encode(s).ids for s in starts]
    kept: list[str] = []
    seen = set(sampling.exclude)
    batch, size = 0, sampling.batch_size
    with tqdm(total=n, desc="target writes prompts", disable=not progress, unit="prompt") as bar:
        while len(kept) < n and batch * size < 4 * n:
            rows = [(batch * size + i) % len(starts) for i in range(size)]
            data = _generate_prompt_batch(target, start_ids, rows, sampling, stop_ids[0], batch)
            for i, r in enumerate(rows):
                new = data.tokens[i, len(start_ids[r]) : len(start_ids[r]) + sampling.max_tokens].tolist()
                body = _sample_body(tokenizer, new, stop_ids[0], sampling.partial)
                if body is None or len(body) < 8:
                    continue
                text = sampling.wrap(starts[r] + body) if sampling.wrap else starts[r] + body + sampling.stop
                if text not in seen and len(kept) < n:
                    seen.add(text)
                    kept.append(text)
                    bar.update(1)
            batch += 1
    return kept


def _legacy_sampling(func: str, sampling: PromptSampling | None, legacy: dict[str, Any]) -> PromptSampling:
    """``sampling``, or the ``PromptSampling`` built from the deprecated keywords ``legacy`` (``accel._legacy``: one
    ``DeprecationWarning`` naming them; unknown keywords, or both forms, a TypeError)."""
    objects, _ = legacy_keywords(func, legacy, [_SAMPLING], {"sampling": sampling}, keep=())
    if objects["sampling"] is None:
        raise TypeError(f"{func}() needs sampling=PromptSampling(stop=...)")
    return objects["sampling"]


def _prompt_sampling(**kw: Any) -> PromptSampling:
    """``PromptSampling`` of the deprecated keywords (``exclude`` as a tuple, as the dataclass keeps it)."""
    if "exclude" in kw:
        kw["exclude"] = tuple(kw["exclude"])
    return PromptSampling(**kw)


_SAMPLING = Replaced(
    "sampling", _prompt_sampling, {f.name: f.name for f in fields(PromptSampling)}, label="PromptSampling"
)


def _generate_prompt_batch(
    target: Decoder, start_ids: list[list[int]], rows: list[int], sampling: PromptSampling, stop_id: int, batch: int
) -> TeacherData:
    """Batch number ``batch`` of samples continuing the starts ``rows``, each stopped by ``stop_id``."""
    return self_generate(
        target,
        [start_ids[r] for r in rows],
        [sampling.temperature] * len(rows),
        sampling.max_tokens,
        1,
        seed=sampling.seed * 7_919 + batch,
        eos_token_ids=(stop_id,),
    )


def _sample_body(tokenizer: Any, new: list[int], stop_id: int, partial: bool) -> str | None:
    """A sample's text up to ``stop_id`` (with ``partial``, else up to its last sentence end); None to drop it."""
    if stop_id in new:
        return tokenizer.decode(new[: new.index(stop_id)]).strip()
    if partial:  # cut after the last sentence end
        text = tokenizer.decode(new)
        return text[: max(text.rfind(c) for c in ".?!\n") + 1].strip()
    return None
