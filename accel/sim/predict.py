"""``predict_speedup``: FP16 AR (baseline), MX AR, FP16 + SpD, MX + SpD side by side, with fit checks.

Timeline of one request (per sequence, batch B in lock step):
- TTFT: target prefill of ``prompt_len`` tokens returning 1 logit (+ the draft's prefill for SpD).
- AR: ``gen_len - 1`` decode calls at past lengths prompt_len .. prompt_len + gen_len - 2 (each evaluated).
- SpD: (gen_len - 1) / E loops; a loop at past length L = K draft calls (S = 1, past L .. L+K-1) + one target call
  scoring K+1 tokens (past L, K+1 logits) + ``host_s`` + the draft's catch-up (its next first call feeds 2 tokens
  after an all-accepted loop, docs/reference.md §2; a feature draft re-feeds all E tokens of the loop:
  ``accel.sim.spd.draft_catch_up_s``); loop times are averaged over L in the generation range.
- SpD with measured ``loop_stats`` (a dynamic draft length): D = ``drafts_per_loop`` draft calls and a target call
  scoring D + 1 tokens per loop (fractional D: the call cost is interpolated along the S-curve), E =
  ``tokens_per_loop``; K is then the cap (memory and validation only). With n-gram lookup drafts
  (``draft_calls_per_loop`` < D, ``lookup_fraction`` > 0) only the draft-model calls are priced, and the draft's
  later catch-up on the lookup loops' tokens is added.
Assumptions: acceptance is i.i.d. per sequence (or the given per-position vector) and the batch does not wait for its
slowest member; the draft runs on ``draft_devices`` (default 1) devices, the target on ``devices`` (default all).
Memory: weights + KV cache for prompt_len + gen_len (+ K) tokens of every sequence, against
``devices * memory_capacity * usable_memory_fraction`` (the draft's weights share that pool).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np

from accel.errors import SimError
from accel.sim._base import SimModel
from accel.sim.formats import kv_bytes_per_element, normalize_format
from accel.sim.hardware import Hardware
from accel.sim.hardware import hardware as _hardware
from accel.sim.models import ModelSpec, resolve_model
from accel.sim.roofline import BOUNDS, bound_of, format_arrays, resolve_devices, step_arrays, step_time
from accel.sim.spd import (
    Acceptance,
    LoopStats,
    acceptance_vector,
    alpha_for_expected_tokens,
    check_alpha,
    check_k,
    draft_catch_up_s,
    expected_tokens_from,
    tokens_pmf,
)
from accel.sim.spd import break_even_alpha as _break_even

ModelLike = ModelSpec | str | dict[str, Any] | Path
BREAKDOWN_KEYS = ("target_memory", "target_compute", "target_comm", "target_overhead", "draft", "host")


class ConfigResult(SimModel):
    """One configuration. Times in seconds; ``breakdown_s`` = seconds per generated token (per sequence)."""

    name: str
    target_format: str
    draft_format: str | None
    speculative: bool
    ttft_s: float
    tpot_s: float
    total_s: float
    tokens_per_s: float  # end to end: batch * gen_len / total_s
    decode_tokens_per_s: float  # batch / tpot_s
    speedup: float  # baseline total_s / total_s
    decode_speedup: float  # baseline tpot_s / tpot_s
    bound: Literal["memory", "compute", "overhead"]
    breakdown_s: dict[str, float]
    expected_tokens_per_loop: float | None = None
    loop_s: float | None = None
    memory_bytes: float
    fits: bool
    max_batch_size: int


class Prediction(SimModel):
    """Result of :func:`predict_speedup`."""

    target: str
    draft: str
    hardware: str
    draft_hardware: str
    devices: int
    draft_devices: int
    k: int
    acceptance: float | list[float]
    prompt_len: int
    gen_len: int
    batch_size: int
    memory_available_bytes: float
    configs: list[ConfigResult]
    fits: bool
    fit_message: str
    best_k: int
    best_k_speedup: float
    break_even_alpha: float | None
    loop_stats: LoopStats | None = None
    feature_draft: bool = False

    def config(self, name: str) -> ConfigResult:
        for c in self.configs:
            if c.name == name:
                return c
        raise SimError(f"no configuration {name!r}; have {[c.name for c in self.configs]}")

    def table(self) -> str:
        """A readable text table of the four configurations."""
        acc = (
            self.acceptance
            if isinstance(self.acceptance, float)
            else "[" + ", ".join(f"{a:.2f}" for a in self.acceptance) + "]"
        )
        where = "" if self.draft_hardware == self.hardware else f" of {self.draft_hardware}"
        kind = "feature draft" if self.feature_draft else "draft"
        if self.loop_stats is not None:
            acc = (
                f"measured {self.loop_stats.tokens_per_loop:.3f} tokens and {self.loop_stats.drafts_per_loop:.3f} "
                f"drafts per loop (K cap {self.k})"
            )
        lines = [
            f"{self.target} + {kind} {self.draft} on {self.hardware} (target on {self.devices} device(s), draft "
            f"on {self.draft_devices}{where}); K={self.k}, acceptance={acc}, batch={self.batch_size}, "
            f"prompt={self.prompt_len}, gen={self.gen_len}",
            f"{'configuration':<22}{'TTFT ms':>9}{'TPOT ms':>9}{'tok/s':>9}{'total s':>9}{'speedup':>9}"
            f"{'decode x':>9}  {'bound':<9}{'memory GB':>10}  fits{'max B':>7}",
        ]
        for c in self.configs:
            lines.append(
                f"{c.name:<22}{c.ttft_s * 1e3:>9.2f}{c.tpot_s * 1e3:>9.3f}{c.tokens_per_s:>9.1f}"
                f"{c.total_s:>9.3f}{c.speedup:>8.2f}x{c.decode_speedup:>8.2f}x  {c.bound:<9}"
                f"{c.memory_bytes / 1e9:>10.2f}  {'yes' if c.fits else 'NO ':<4}{c.max_batch_size:>7}"
            )
        spd = [c for c in self.configs if c.speculative][-1]
        be = "never (SpD loses even at alpha=1)" if self.break_even_alpha is None else f"{self.break_even_alpha:.3f}"
        lines.append(
            f"E[tokens/loop] = {spd.expected_tokens_per_loop:.3f}; best K for {spd.name} = {self.best_k} "
            f"({self.best_k_speedup:.2f}x over {spd.target_format} AR); break-even alpha at K={self.k}: {be}"
        )
        lines.append(self.fit_message)
        return "\n".join(lines)


def _check_len(name: str, v: int, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise SimError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _steps(spec, hw, fmt, kv_format, *, batch, S, L, NL, devices, compress_lm_head) -> dict[str, np.ndarray]:
    bpe, mx, peak = format_arrays(hw, fmt)
    return step_arrays(
        spec,
        hw,
        weight_bpe=bpe,
        weight_mx=mx,
        peak_flops=peak,
        kv_bpe=kv_bytes_per_element(kv_format),
        batch=batch,
        new_tokens=S,
        context_len=L,
        num_logits=NL,
        devices=devices,
        compress_lm_head=compress_lm_head,
    )


def spd_step_arrays(
    target: ModelSpec,
    draft: ModelSpec,
    hw: Hardware,
    *,
    target_fmt: tuple,
    draft_fmt: tuple,
    k,
    context_len,
    batch_size,
    kv_bpe: float,
    devices: int,
    draft_devices: int,
    compress_lm_head: bool = False,
    draft_hw: Hardware | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Array core of :func:`spd_step_times`. ``*_fmt`` = (bytes/element, is MX, peak FLOP/s), each broadcastable.
    The K draft calls are summed exactly over past lengths L .. L+K-1 (cumulative sum up to max K)."""

    def steps(spec, fmt, S, L, NL, devs, batch=batch_size, on=hw):
        return step_arrays(
            spec,
            on,
            weight_bpe=fmt[0],
            weight_mx=fmt[1],
            peak_flops=fmt[2],
            kv_bpe=kv_bpe,
            batch=batch,
            new_tokens=S,
            context_len=L,
            num_logits=NL,
            devices=devs,
            compress_lm_head=compress_lm_head,
        )["time_s"]

    k = np.asarray(k, dtype=np.int64)
    L = np.asarray(context_len, dtype=np.float64)
    t_tgt = steps(target, target_fmt, 1, L, 1, devices)
    t_score = steps(target, target_fmt, k + 1.0, L, k + 1.0, devices)
    j = np.arange(int(k.max()), dtype=np.float64)
    d_steps = steps(
        draft,
        tuple(np.asarray(x, dtype=np.float64)[..., None] for x in draft_fmt),
        1,
        L[..., None] + j,
        1,
        draft_devices,
        batch=np.asarray(batch_size)[..., None],
        on=draft_hw or hw,
    )  # (..., K_max): past lengths L + j
    cum = np.cumsum(d_steps, axis=-1)
    shape = np.broadcast_shapes(cum.shape[:-1], k.shape)
    idx = np.broadcast_to(k - 1, shape)[..., None]
    t_draft = np.take_along_axis(np.broadcast_to(cum, shape + cum.shape[-1:]), idx, axis=-1)[..., 0]
    # all-accepted loops: the draft never saw d_K, so its next first call feeds [d_K, bonus] (docs/reference.md §2)
    catch_up = steps(draft, draft_fmt, 2, L, 1, draft_devices, on=draft_hw or hw) - steps(
        draft, draft_fmt, 1, L, 1, draft_devices, on=draft_hw or hw
    )
    return t_tgt, t_draft, t_score, catch_up


def spd_step_times(
    target: ModelSpec,
    draft: ModelSpec,
    hw: Hardware,
    *,
    target_format: str,
    draft_format: str,
    k,
    context_len,
    batch_size: int = 1,
    kv_format: str = "fp16",
    devices: int | None = None,
    draft_devices: int = 1,
    compress_lm_head: bool = False,
    draft_hardware: Hardware | str | None = None,
) -> tuple[np.ndarray, ...]:
    """(target decode step, sum of the K draft steps, (K+1)-token scoring step, draft catch-up) in seconds at past
    length ``context_len`` (vectorized over k and context_len). The catch-up is the extra cost of the draft call
    after an all-accepted loop (2 tokens instead of 1), paid with probability P(all K accepted).
    ``draft_hardware``: profile the draft runs on (default: the target's ``hw``; e.g. a separately calibrated profile
    when the draft's weights stay in cache)."""
    dhw = hw if draft_hardware is None else _hardware(draft_hardware)
    return spd_step_arrays(
        target,
        draft,
        hw,
        target_fmt=format_arrays(hw, target_format),
        draft_fmt=format_arrays(dhw, draft_format),
        k=k,
        context_len=context_len,
        draft_hw=dhw,
        batch_size=batch_size,
        kv_bpe=kv_bytes_per_element(kv_format),
        devices=resolve_devices(hw, devices),
        draft_devices=resolve_devices(dhw, draft_devices),
        compress_lm_head=compress_lm_head,
    )


def memory_bytes(
    model: ModelSpec, weight_format: str, kv_format: str, batch_size, tokens, *, compress_lm_head: bool = False
) -> float:
    """Device memory (bytes) for the weights plus a KV cache of ``tokens`` positions for each of ``batch_size``."""
    return model.weight_bytes(weight_format, compress_lm_head=compress_lm_head) + np.asarray(
        batch_size
    ) * tokens * model.kv_bytes_per_token(kv_format)


def predict_speedup(
    target: ModelLike,
    draft: ModelLike,
    hardware: Hardware | str,
    *,
    target_format: str = "mxfp6",
    draft_format: str = "fp16",
    k: int = 7,
    acceptance: Acceptance | None = None,
    prompt_len: int = 128,
    gen_len: int = 896,
    batch_size: int = 1,
    devices: int | None = None,
    draft_devices: int = 1,
    kv_format: str = "fp16",
    host_s: float = 0.0,
    compress_lm_head: bool = False,
    strict: bool = False,
    draft_hardware: Hardware | str | None = None,
    loop_stats: LoopStats | dict[str, float] | None = None,
) -> Prediction:
    """Predict TTFT (s), TPOT (s), tokens/s and speedups of FP16 AR, MX AR, FP16 + SpD and MX + SpD.

    ``acceptance``: i.i.d. per-token acceptance alpha in [0, 1] or a measured per-position vector (length >= K);
    default 0.8, or with ``loop_stats`` the i.i.d. alpha giving its tokens per loop (used for ``best_k`` and the
    break-even alpha only). ``loop_stats``: measured tokens and drafts per loop (``LoopStats``, e.g. a dynamic draft
    length); the SpD rows then use them instead of ``acceptance`` and K is the draft-length cap.
    A draft whose spec has ``feature_dim`` (a feature draft) re-feeds each loop's tokens (module docstring).
    ``host_s``: host seconds per SpD loop (sampling, verification). ``strict=True`` raises ``SimError`` when a
    configuration does not fit in memory; otherwise ``fits``/``fit_message`` report it. ``draft_hardware``: a
    different profile for the draft (its memory is then not counted against the target's devices)."""
    tgt, drf, hw = resolve_model(target), resolve_model(draft), _hardware(hardware)
    k = int(check_k(k))
    stats = LoopStats(**loop_stats) if isinstance(loop_stats, dict) else loop_stats
    if stats is not None and not isinstance(stats, LoopStats):
        raise SimError(f"loop_stats must be a LoopStats or a dict of its fields, got {type(loop_stats).__name__}")
    if stats is not None and stats.lookup_fraction == 0.0 and stats.drafts_per_loop > k:
        raise SimError(f"loop_stats.drafts_per_loop {stats.drafts_per_loop:g} exceeds K={k} (the draft-length cap)")
    if stats is not None and stats.draft_calls() > k + 1e-9 and stats.lookup_fraction > 0.0:
        raise SimError(f"loop_stats.draft_calls_per_loop {stats.draft_calls():g} exceeds K={k} (the draft-length cap)")
    if acceptance is None:
        acceptance = (
            0.8
            if stats is None
            else alpha_for_expected_tokens(stats.tokens_per_loop, max(1, round(stats.drafts_per_loop)))
        )
    acc = check_alpha(acceptance)
    feature = drf.feature_dim > 0
    acc_out: float | list[float] = float(acc) if acc.ndim == 0 else [float(x) for x in acceptance_vector(acc, k)]
    prompt_len = _check_len("prompt_len", prompt_len, 1)
    gen_len = _check_len("gen_len", gen_len, 1)
    batch_size = _check_len("batch_size", batch_size, 1)
    if not (isinstance(host_s, (int, float)) and host_s >= 0):
        raise SimError(f"host_s must be seconds >= 0, got {host_s!r}")
    dhw = hw if draft_hardware is None else _hardware(draft_hardware)
    n, nd = resolve_devices(hw, devices), resolve_devices(dhw, draft_devices)
    tfmt, dfmt = normalize_format(target_format), normalize_format(draft_format)
    kv_format = normalize_format(
        kv_format,
        allowed=("fp32", "fp16", "bf16", "fp8", "int8", "mxfp8", "mxint8", "mxfp6", "mxfp4"),
        what="KV-cache format",
    )
    avail = n * hw.memory_capacity_bytes * hw.usable_memory_fraction
    ctx_tokens = prompt_len + gen_len
    e_tokens = expected_tokens_from(acc_out, k) if stats is None else stats.tokens_per_loop
    p_all = float(tokens_pmf(acc_out, k)[-1]) if stats is None else stats.all_accepted()  # P(all drafts accepted)
    n_draft = k if stats is None else stats.drafts_per_loop  # draft calls per loop; the target scores n_draft + 1
    L_dec = prompt_len + np.arange(max(gen_len - 1, 1), dtype=np.float64)  # past lengths of the decode steps
    n_dec = gen_len - 1
    kw = dict(batch=batch_size, devices=n, compress_lm_head=compress_lm_head)

    def prefill(spec, fmt, devs):
        return float(
            _steps(
                spec,
                hw,
                fmt,
                kv_format,
                S=prompt_len,
                L=0,
                NL=1,
                batch=batch_size,
                devices=devs,
                compress_lm_head=compress_lm_head,
            )["time_s"]
        )

    raw: list[dict[str, Any]] = []
    for name, fmt, spd in (
        ("fp16 AR", "fp16", False),
        (f"{tfmt} AR", tfmt, False),
        ("fp16 + SpD", "fp16", True),
        (f"{tfmt} + SpD", tfmt, True),
    ):
        ttft = prefill(tgt, fmt, n)
        mem = memory_bytes(
            tgt, fmt, kv_format, batch_size, ctx_tokens + (k if spd else 0), compress_lm_head=compress_lm_head
        )
        per_seq_kv = (ctx_tokens + (k if spd else 0)) * tgt.kv_bytes_per_token(kv_format)
        weights = tgt.weight_bytes(fmt, compress_lm_head=compress_lm_head)
        if not spd:
            r = _steps(tgt, hw, fmt, kv_format, S=1, L=L_dec, NL=1, **kw)
            tpot = float(np.mean(r["time_s"]))
            parts = {
                key: float(np.mean(r[src]))
                for key, src in (
                    ("target_memory", "memory_bound_s"),
                    ("target_compute", "compute_bound_s"),
                    ("target_comm", "comm_s"),
                    ("target_overhead", "overhead_s"),
                )
            }
            parts.update(draft=0.0, host=0.0)
            i_mid = len(L_dec) // 2
            bnd = BOUNDS[
                int(
                    bound_of(
                        r["memory_bound_s"][i_mid],
                        r["compute_bound_s"][i_mid],
                        r["comm_s"][i_mid] + r["overhead_s"][i_mid],
                    )
                )
            ]
            loop = None
        else:
            ttft += float(
                _steps(
                    drf,
                    dhw,
                    dfmt,
                    kv_format,
                    S=prompt_len,
                    L=0,
                    NL=1,
                    batch=batch_size,
                    devices=nd,
                    compress_lm_head=compress_lm_head,
                )["time_s"]
            )
            if dhw is hw:
                mem += memory_bytes(drf, dfmt, kv_format, batch_size, ctx_tokens + k, compress_lm_head=compress_lm_head)
                per_seq_kv += (ctx_tokens + k) * drf.kv_bytes_per_token(kv_format)
                weights += drf.weight_bytes(dfmt, compress_lm_head=compress_lm_head)
            sc = _steps(tgt, hw, fmt, kv_format, S=n_draft + 1, L=L_dec, NL=n_draft + 1, **kw)
            _, t_draft, _, t_catch = spd_step_times(
                tgt,
                drf,
                hw,
                target_format=fmt,
                draft_format=dfmt,
                k=k,
                context_len=L_dec,
                batch_size=batch_size,
                kv_format=kv_format,
                devices=n,
                draft_devices=nd,
                compress_lm_head=compress_lm_head,
                draft_hardware=dhw,
            )
            if stats is not None:  # the loops' draft calls (one-token) at the mean past length of a loop's drafts
                t_draft = (
                    stats.draft_calls()
                    * _steps(
                        drf,
                        dhw,
                        dfmt,
                        kv_format,
                        S=1,
                        L=L_dec + (n_draft - 1) / 2,
                        NL=1,
                        batch=batch_size,
                        devices=nd,
                        compress_lm_head=compress_lm_head,
                    )["time_s"]
                )
            t_draft = t_draft + draft_catch_up_s(
                t_catch, e_tokens, p_all, feature, stats.lookup_fraction if stats is not None else 0.0
            )
            loop = float(np.mean(sc["time_s"] + t_draft)) + host_s
            tpot = loop / e_tokens
            parts = {
                key: float(np.mean(sc[src])) / e_tokens
                for key, src in (
                    ("target_memory", "memory_bound_s"),
                    ("target_compute", "compute_bound_s"),
                    ("target_comm", "comm_s"),
                    ("target_overhead", "overhead_s"),
                )
            }
            parts.update(draft=float(np.mean(t_draft)) / e_tokens, host=host_s / e_tokens)
            i_mid = len(L_dec) // 2
            bnd = BOUNDS[
                int(
                    bound_of(
                        sc["memory_bound_s"][i_mid],
                        sc["compute_bound_s"][i_mid],
                        sc["comm_s"][i_mid] + sc["overhead_s"][i_mid],
                    )
                )
            ]
        total = ttft + n_dec * tpot
        max_b = max(0, math.floor((avail - weights) / per_seq_kv)) if avail > weights else 0
        raw.append(
            dict(
                name=name,
                target_format=fmt,
                draft_format=dfmt if spd else None,
                speculative=spd,
                ttft_s=ttft,
                tpot_s=tpot,
                total_s=total,
                tokens_per_s=batch_size * gen_len / total,
                decode_tokens_per_s=batch_size / tpot,
                bound=bnd,
                breakdown_s=parts,
                expected_tokens_per_loop=e_tokens if spd else None,
                loop_s=loop,
                memory_bytes=float(mem),
                fits=bool(mem <= avail),
                max_batch_size=max_b,
            )
        )
    base = raw[0]
    configs = [
        ConfigResult(**r, speedup=base["total_s"] / r["total_s"], decode_speedup=base["tpot_s"] / r["tpot_s"])
        for r in raw
    ]
    bad = [c for c in configs if not c.fits]
    if bad:
        msg = (
            "DOES NOT FIT: "
            + "; ".join(f"{c.name} needs {c.memory_bytes / 1e9:.2f} GB" for c in bad)
            + f" > {avail / 1e9:.2f} GB usable ({n} x {hw.memory_capacity_bytes / 1e9:.1f} GB x "
            f"{hw.usable_memory_fraction:g}) on {hw.name}"
        )
        if strict:
            raise SimError(msg)
    else:
        msg = f"fits: all configurations within {avail / 1e9:.2f} GB usable on {n} device(s) of {hw.name}"
    mid = prompt_len + gen_len / 2
    bk, bk_speed = best_k(
        tgt,
        drf,
        hw,
        acc_out,
        target_format=tfmt,
        draft_format=dfmt,
        context_len=mid,
        batch_size=batch_size,
        kv_format=kv_format,
        devices=n,
        draft_devices=nd,
        host_s=host_s,
        compress_lm_head=compress_lm_head,
        k_max=16 if acc.ndim == 0 else len(acc_out),
        draft_hardware=dhw,
    )
    t_tgt, t_draft, t_score, t_catch = (
        float(x)
        for x in spd_step_times(
            tgt,
            drf,
            hw,
            target_format=tfmt,
            draft_format=dfmt,
            k=k,
            context_len=mid,
            batch_size=batch_size,
            kv_format=kv_format,
            devices=n,
            draft_devices=nd,
            compress_lm_head=compress_lm_head,
            draft_hardware=dhw,
        )
    )
    be = _break_even(k, t_tgt, t_draft / k, t_score, host_s, catch_up_s=t_catch, feature_draft=feature)
    return Prediction(
        target=tgt.name,
        draft=drf.name,
        hardware=hw.name,
        draft_hardware=dhw.name,
        devices=n,
        draft_devices=nd,
        k=k,
        acceptance=acc_out,
        prompt_len=prompt_len,
        gen_len=gen_len,
        batch_size=batch_size,
        memory_available_bytes=avail,
        configs=configs,
        fits=not bad,
        fit_message=msg,
        best_k=bk,
        best_k_speedup=bk_speed,
        break_even_alpha=be,
        loop_stats=stats,
        feature_draft=feature,
    )


def best_k(
    target: ModelLike,
    draft: ModelLike,
    hardware: Hardware | str,
    acceptance: Acceptance,
    *,
    target_format: str = "mxfp6",
    draft_format: str = "fp16",
    context_len: float = 512,
    batch_size: int = 1,
    kv_format: str = "fp16",
    devices: int | None = None,
    draft_devices: int = 1,
    host_s: float = 0.0,
    compress_lm_head: bool = False,
    k_max: int = 16,
    draft_hardware: Hardware | str | None = None,
) -> tuple[int, float]:
    """The K in 1..k_max with the highest decode speedup of SpD over AR with the same target format, and that speedup.
    With a per-position acceptance vector, k_max is at most its length."""
    tgt, drf, hw = resolve_model(target), resolve_model(draft), _hardware(hardware)
    k_max = int(check_k(k_max))
    acc = check_alpha(acceptance)
    if acc.ndim:
        k_max = min(k_max, acc.size)
    ks = np.arange(1, k_max + 1)
    t_tgt, t_draft, t_score, t_catch = spd_step_times(
        tgt,
        drf,
        hw,
        target_format=target_format,
        draft_format=draft_format,
        k=ks,
        context_len=context_len,
        batch_size=batch_size,
        kv_format=kv_format,
        devices=devices,
        draft_devices=draft_devices,
        compress_lm_head=compress_lm_head,
        draft_hardware=draft_hardware,
    )
    pmfs = [tokens_pmf(acc, int(kk)) for kk in ks]
    e = np.array([float(np.sum(np.arange(1, len(p) + 1) * p)) for p in pmfs])
    p_all = np.array([p[-1] for p in pmfs])
    sp = e * t_tgt / (t_draft + t_score + host_s + draft_catch_up_s(t_catch, e, p_all, drf.feature_dim > 0))
    i = int(np.argmax(sp))
    return int(ks[i]), float(sp[i])


def break_even_alpha(
    target: ModelLike,
    draft: ModelLike,
    hardware: Hardware | str,
    k: int,
    *,
    target_format: str = "mxfp6",
    draft_format: str = "fp16",
    context_len: float = 512,
    batch_size: int = 1,
    kv_format: str = "fp16",
    devices: int | None = None,
    draft_devices: int = 1,
    host_s: float = 0.0,
    compress_lm_head: bool = False,
    draft_hardware: Hardware | str | None = None,
) -> float | None:
    """Smallest i.i.d. acceptance at which SpD with K drafts matches AR (same target format); None if never."""
    tgt, drf, hw = resolve_model(target), resolve_model(draft), _hardware(hardware)
    k = int(check_k(k))
    t_tgt, t_draft, t_score, t_catch = (
        float(x)
        for x in spd_step_times(
            tgt,
            drf,
            hw,
            target_format=target_format,
            draft_format=draft_format,
            k=k,
            context_len=context_len,
            batch_size=batch_size,
            kv_format=kv_format,
            devices=devices,
            draft_devices=draft_devices,
            compress_lm_head=compress_lm_head,
            draft_hardware=draft_hardware,
        )
    )
    return _break_even(k, t_tgt, t_draft / k, t_score, host_s, catch_up_s=t_catch, feature_draft=drf.feature_dim > 0)


__all__ = [
    "ConfigResult",
    "Prediction",
    "best_k",
    "break_even_alpha",
    "memory_bytes",
    "predict_speedup",
    "spd_step_times",
    "step_time",
]
