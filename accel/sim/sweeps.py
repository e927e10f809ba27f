"""Vectorized sweeps of speculative decoding over grids of weight format, batch, context, K and alpha.

Decode-phase quantities at a fixed past length (no prefill): the same equations as :func:`accel.sim.best_k`, evaluated
with numpy broadcasting over the whole grid at once (millions of configurations per second).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import ConfigDict

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.formats import kv_bytes_per_element, normalize_format
from accel.sim.hardware import Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.models import resolve_model
from accel.sim.predict import ModelLike, spd_step_arrays
from accel.sim.roofline import format_arrays, resolve_devices
from accel.sim.spd import check_alpha, check_k, draft_catch_up_s, expected_tokens

AXES = ("target_format", "batch_size", "context_len", "k", "alpha")


class SweepResult(SimModel):
    """Arrays of shape (formats, batches, contexts, Ks, alphas) (axis order ``AXES``); times in seconds.
    ``draft_steps_s`` = the K draft calls + the expected catch-up (alpha^K times the extra token after an
    all-accepted loop; E - 1 extra tokens for a feature draft, which re-feeds each loop); ``loop_s`` = that + the
    scoring call + host time.

    ``speedup``: SpD decode tokens/s over AR with the same target format; ``speedup_vs_fp16``: over FP16 AR;
    ``best_k``: argmax over the K axis (shape without K)."""

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


def _int_axis(name: str, v, lo: int) -> np.ndarray:
    a = np.atleast_1d(np.asarray(v))
    if (
        a.ndim != 1
        or a.size == 0
        or not np.issubdtype(a.dtype, np.number)
        or np.any(a < lo)
        or np.any(a != np.round(a))
    ):
        raise SimError(f"{name} must be integers >= {lo}, got {v!r}")
    return a.astype(np.int64)


def sweep(
    target: ModelLike,
    draft: ModelLike,
    hardware: Hardware | str,
    *,
    k: Sequence[int] = range(1, 17),
    alpha: Sequence[float] = np.linspace(0, 1, 21),
    target_format: Sequence[str] = ("fp16", "mxfp6"),
    batch_size: Sequence[int] = (1,),
    context_len: Sequence[int] = (512,),
    draft_format: str = "fp16",
    kv_format: str = "fp16",
    devices: int | None = None,
    draft_devices: int = 1,
    host_s: float = 0.0,
    compress_lm_head: bool = False,
) -> SweepResult:
    """Evaluate SpD decode speed on the full grid (formats x batch x context x K x alpha); see ``SweepResult``."""
    tgt, drf, hw = resolve_model(target), resolve_model(draft), _hardware(hardware)
    fmts = [normalize_format(f) for f in ([target_format] if isinstance(target_format, str) else target_format)]
    if not fmts:
        raise SimError("target_format needs at least one format")
    ks = np.atleast_1d(check_k(np.asarray(list(k) if not np.isscalar(k) else [k])))
    al = np.atleast_1d(check_alpha(np.asarray(alpha, dtype=np.float64)))
    bs = _int_axis("batch_size", batch_size, 1)
    ls = _int_axis("context_len", context_len, 0)
    if not (isinstance(host_s, (int, float)) and host_s >= 0):
        raise SimError(f"host_s must be seconds >= 0, got {host_s!r}")
    n, nd = resolve_devices(hw, devices), resolve_devices(hw, draft_devices)
    fa = np.array([format_arrays(hw, f) for f in fmts])  # (F, 3)
    tf = tuple(fa[:, i].reshape(-1, 1, 1, 1) for i in range(3))
    B = bs.reshape(1, -1, 1, 1)
    L = ls.reshape(1, 1, -1, 1).astype(np.float64)
    K = ks.reshape(1, 1, 1, -1)
    t_tgt, t_draft, t_score, t_catch = spd_step_arrays(
        tgt,
        drf,
        hw,
        target_fmt=tf,
        draft_fmt=format_arrays(hw, draft_format),
        k=K,
        context_len=L,
        batch_size=B,
        kv_bpe=kv_bytes_per_element(kv_format),
        devices=n,
        draft_devices=nd,
        compress_lm_head=compress_lm_head,
    )
    shape = (len(fmts), bs.size, ls.size, ks.size, al.size)
    e = np.broadcast_to(expected_tokens(al[None, :], ks[:, None]), shape)  # (K, A) -> full
    t_tgt5 = np.broadcast_to(np.asarray(t_tgt)[..., None], shape)
    p_all = al[None, :] ** ks[:, None]  # (K, alpha): all K drafts accepted -> 2-token draft catch-up next loop
    extra = draft_catch_up_s(np.asarray(t_catch)[..., None], e, p_all, drf.feature_dim > 0)  # feature: E - 1 tokens
    t_draft = np.asarray(t_draft)[..., None] + extra
    loop = np.broadcast_to(t_draft + np.asarray(t_score)[..., None] + host_s, shape)
    B5 = bs.reshape(1, -1, 1, 1, 1)
    spd_tps = B5 * e / loop
    ar_tps = np.broadcast_to(B5 / t_tgt5, shape)
    if "fp16" in fmts:
        fp16_tps = ar_tps[fmts.index("fp16")][None]
    else:
        f16 = format_arrays(hw, "fp16")
        t16 = spd_step_arrays(
            tgt,
            drf,
            hw,
            target_fmt=f16,
            draft_fmt=f16,
            k=K[..., :1],
            context_len=L,
            batch_size=B,
            kv_bpe=kv_bytes_per_element(kv_format),
            devices=n,
            draft_devices=nd,
            compress_lm_head=compress_lm_head,
        )[0]
        fp16_tps = B5 / np.asarray(t16)[..., None]
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
        speedup_vs_fp16=spd_tps / fp16_tps,
        best_k=ks[np.argmax(speed, axis=3)],
    )
