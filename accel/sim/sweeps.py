"""Vectorized sweeps of speculative decoding over grids of weight format, batch, context, K and alpha.

Decode-phase quantities at fixed past lengths (no prefill): the chain pricing of ``accel.sim.rounds``, evaluated with
numpy broadcasting over the whole grid at once (millions of configurations per second). The grid is bounded
(``MAX_SWEEP_POINTS`` configurations) and checked before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ConfigDict

from accel._legacy import Replaced, legacy_keywords
from accel.errors import SimError
from accel.sim._base import MAX_BATCH, MAX_SWEEP_POINTS, MAX_TOKENS, SimModel, check_int_array
from accel.sim.deployment import Deployment, HardwareLike, ModelLike, as_deployment
from accel.sim.formats import normalize_format
from accel.sim.roofline import format_arrays
from accel.sim.rounds import chain_arrays
from accel.sim.spd import catch_up_tokens, check_alpha, check_k, expected_tokens

AXES = ("target_format", "batch_size", "context_len", "k", "alpha")
DEFAULT_ALPHAS = np.linspace(0, 1, 21)


@dataclass(frozen=True)
class SweepAxes:
    """The deployment axes of a sweep (K and alpha are ``sweep``'s own keywords): weight formats of the target,
    batch sizes (sequences) and past lengths (tokens) at which the decode steps are priced; ``None``: the
    deployment's formats (baseline and compressed), its batch size, its prompt length."""

    target_format: Sequence[str] | str | None = None
    batch_size: Sequence[int] | None = None
    context_len: Sequence[int] | None = None


_SWEEP_LEGACY = (Replaced("axes", SweepAxes, {k: k for k in ("target_format", "batch_size", "context_len")}),)


class SweepResult(SimModel):
    """Arrays of shape (formats, batches, contexts, Ks, alphas) (axis order ``AXES``); times in seconds.
    ``draft_steps_s`` = the K draft calls + the expected catch-up (alpha^K times the extra token after an
    all-accepted loop; E - 1 extra tokens for a feature draft, which re-feeds each loop); ``loop_s`` = that + the
    scoring call + host time.

    ``speedup``: SpD decode tokens/s over AR with the same target format; ``speedup_vs_fp16``: over AR in the
    deployment's baseline format (fp16 or bf16); ``best_k``: argmax over the K axis (shape without K)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    axes: dict[str, Any]
    expected_tokens: np.ndarray
    target_step_s: np.ndarray
    draft_steps_s: np.ndarray
    score_step_s: np.ndarray
    loop_s: np.ndarray
    ar_tokens_per_s: np.ndarray
    spd_tokens_per_s: np.ndarray
    speedup: np.ndarray
    speedup_vs_fp16: np.ndarray
    best_k: np.ndarray

    @property
    def size(self) -> int:
        return int(self.speedup.size)


def _axes(dep: Deployment, axes: SweepAxes, k: Any, alpha: Any) -> tuple:
    target_format, batch_size, context_len = axes.target_format, axes.batch_size, axes.context_len
    fmts = dep.formats() if target_format is None else target_format
    fmts = [normalize_format(f) for f in ([fmts] if isinstance(fmts, str) else list(fmts))]
    if not fmts or len(fmts) > 64:
        raise SimError(f"target_format needs 1 to 64 formats, got {len(fmts)}")
    k_list = [k] if np.isscalar(k) else list(k)
    if len(k_list) > 64:
        raise SimError(f"a sweep takes at most 64 values of K, got {len(k_list)}")
    ks = np.atleast_1d(check_k(np.asarray(k_list)))
    al = np.atleast_1d(check_alpha(np.asarray(alpha, dtype=np.float64) if not isinstance(alpha, str) else alpha))
    bs = check_int_array("batch_size", [dep.batch_size] if batch_size is None else batch_size, 1, MAX_BATCH)
    ctx = [dep.prompt_len] if context_len is None else context_len
    ls = check_int_array("context_len", ctx, 0, MAX_TOKENS)
    n = len(fmts) * bs.size * ls.size * ks.size * al.size
    if n > MAX_SWEEP_POINTS or al.ndim != 1:
        raise SimError(f"a sweep grid holds at most {MAX_SWEEP_POINTS:,} configurations (1-d axes), got {n:,}")
    return fmts, bs, ls, ks, al


def sweep(
    deployment: Deployment | ModelLike | None = None,
    draft: ModelLike | None = None,
    hardware: HardwareLike | None = None,
    *,
    k: Sequence[int] | int = range(1, 17),
    alpha: Sequence[float] | np.ndarray = DEFAULT_ALPHAS,
    axes: SweepAxes | None = None,
    **settings: Any,
) -> SweepResult:
    """Speculative decode speed on the full grid (formats x batch x context x K x alpha); see ``SweepResult``.
    ``deployment``: a ``Deployment`` (or ``target, draft, hardware, **settings``, settings = ``Deployment`` fields);
    ``k``: draft lengths, ``alpha``: acceptances; ``axes`` (``SweepAxes``): the formats, batch sizes and past lengths,
    by default the deployment's formats, batch and prompt length. Deprecated: ``target_format``, ``batch_size``,
    ``context_len`` as axis keywords (use ``axes=SweepAxes(...)``)."""
    objects, settings = legacy_keywords("sweep", settings, _SWEEP_LEGACY, {"axes": axes}, keep=None)
    dep = as_deployment(deployment, draft, hardware, settings)
    if dep.draft is None:
        raise SimError("a speculative sweep needs a deployment with a draft model")
    fmts, bs, ls, ks, al = _axes(dep, objects["axes"] or SweepAxes(), k, alpha)
    fa = np.array([format_arrays(dep.hardware, f) for f in fmts])  # (F, 3)
    tf = (fa[:, 0].reshape(-1, 1, 1, 1), fa[:, 1].reshape(-1, 1, 1, 1), fa[:, 2].reshape(-1, 1, 1, 1))
    B, L, K = bs.reshape(1, -1, 1, 1), ls.reshape(1, 1, -1, 1).astype(np.float64), ks.reshape(1, 1, 1, -1)
    t_tgt, t_draft, t_score, t_catch = chain_arrays(dep, tf, K, L, B)
    shape = (len(fmts), bs.size, ls.size, ks.size, al.size)
    e = np.broadcast_to(expected_tokens(al[None, :], ks[:, None]), shape)  # (K, A) -> full
    p_all = al[None, :] ** ks[:, None]  # (K, alpha): all K drafts accepted
    extra = np.asarray(t_catch)[..., None] * catch_up_tokens(e, p_all, dep.draft.feature_dim > 0)
    t_draft = np.asarray(t_draft)[..., None] + extra
    host = dep.host_s + dep.host_s_per_step
    loop = np.broadcast_to(t_draft + np.asarray(t_score)[..., None] + host, shape)
    t_tgt5 = np.broadcast_to(np.asarray(t_tgt)[..., None] + dep.host_s_per_step, shape)
    B5 = bs.reshape(1, -1, 1, 1, 1)
    spd_tps = B5 * e / loop
    ar_tps = np.broadcast_to(B5 / t_tgt5, shape)
    if dep.baseline in fmts:
        base_tps = ar_tps[fmts.index(dep.baseline)][None]
    else:
        t16 = chain_arrays(dep, format_arrays(dep.hardware, dep.baseline), K[..., :1], L, B)[0]
        base_tps = B5 / (np.asarray(t16)[..., None] + dep.host_s_per_step)
    speed = spd_tps / ar_tps
    return SweepResult(
        axes={"target_format": fmts, "batch_size": bs, "context_len": ls, "k": ks, "alpha": al},
        expected_tokens=np.ascontiguousarray(e),
        target_step_s=np.ascontiguousarray(t_tgt5),
        draft_steps_s=np.ascontiguousarray(np.broadcast_to(t_draft, shape)),
        score_step_s=np.ascontiguousarray(np.broadcast_to(np.asarray(t_score)[..., None], shape)),
        loop_s=np.ascontiguousarray(loop),
        ar_tokens_per_s=np.ascontiguousarray(ar_tps),
        spd_tokens_per_s=spd_tps,
        speedup=speed,
        speedup_vs_fp16=spd_tps / base_tps,
        best_k=ks[np.argmax(speed, axis=3)],
    )
