"""``predict_speedup``: autoregressive decoding in the baseline and the compressed format, and speculative decoding
(a chain, a token tree, or measured loops) in both, on one ``Deployment``, with memory fit checks.

Timeline of one request (per sequence, batch B in lock step):
- TTFT: target prefill of ``prompt_len`` tokens returning 1 logit (+ the draft's prefill for speculative decoding).
- AR: ``gen_len - 1`` decode calls at past lengths prompt_len .. prompt_len + gen_len - 2 (their mean; at most 2048
  evenly spread ones are evaluated for long generations), + ``host_s_per_step`` each.
- speculative: (gen_len - 1) / E rounds priced by ``accel.sim.rounds`` at the same past lengths (loop times
  averaged), E = expected tokens per round.
Assumptions: acceptance is the same for every sequence and the batch does not wait for its slowest member; the
target runs on ``devices`` devices (chosen per model size unless given), the draft on ``draft_devices`` (by default
tensor-parallel over the target's devices, ``accel.sim.deployment``); a ``SimWarning`` says when the placement makes
speculative decoding slower than AR (``accel.sim.placement``).
Memory: weights + KV cache for prompt_len + gen_len (+ the round's draft tokens) positions of every sequence (a
fixed cache: ctx_len), against ``devices * memory_capacity * usable_memory_fraction`` (the draft's weights and cache
share that pool when it shares the target's devices, ``draft_shares_devices``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict

from accel._legacy import Replaced, legacy_keywords
from accel.errors import SimError
from accel.sim._base import MAX_K, MAX_TREE_NODES, SimModel, SimWarning, check_int
from accel.sim.deployment import Deployment, HardwareLike, ModelLike, as_deployment, devices_to_fit
from accel.sim.placement import placement_warning
from accel.sim.planning import best_k, break_even_alpha, tree_speedups
from accel.sim.report import prediction_table
from accel.sim.roofline import Bound, bound_of, format_arrays
from accel.sim.rounds import chain_round, measured_round, prefill_s, price_round, target_call, tree_round
from accel.sim.spd import Acceptance, LoopStats, acceptance_vector, alpha_for_expected_tokens, check_alpha, check_k
from accel.sim.tree import TokenTree, best_tree, rank_acceptance

BREAKDOWN_KEYS = ("target_memory", "target_compute", "target_comm", "target_overhead", "draft", "host")
TREE_BUDGETS = (1, 2, 4, 8, 16, 32, 64, 128)  # node budgets best_tree_nodes compares (plus the one asked for)
# the deprecated strict=True: Prediction.require_fit() raises on a configuration that does not fit
_STRICT = Replaced("strict", lambda strict: strict, {"strict": "strict"}, "predict_speedup(...).require_fit()")


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
    bound: Bound
    breakdown_s: dict[str, float]
    expected_tokens_per_loop: float | None = None
    loop_s: float | None = None
    memory_bytes: float
    fits: bool
    max_batch_size: int


class Prediction(SimModel):
    """Result of :func:`predict_speedup`. ``k`` = draft tokens per round (chain K, tree nodes, or the cap of
    measured loops); ``None`` fields belong to speculative decoding in an autoregressive-only prediction."""

    model_config = ConfigDict(frozen=True)

    target: str
    draft: str | None
    hardware: str
    draft_hardware: str | None
    devices: int
    draft_devices: int | None
    draft_shares_devices: bool | None = None
    k: int | None
    acceptance: float | list[float] | list[list[float]] | None
    prompt_len: int
    gen_len: int
    batch_size: int
    cache: Literal["growing", "fixed"]
    ctx_len: int | None
    memory_available_bytes: float
    configs: list[ConfigResult]
    fits: bool
    fit_message: str
    best_k: int | None = None
    best_k_speedup: float | None = None
    break_even_alpha: float | None = None
    loop_stats: LoopStats | None = None
    feature_draft: bool = False
    tree: TokenTree | None = None
    best_tree_nodes: int | None = None
    best_tree_speedup: float | None = None

    def config(self, name: str) -> ConfigResult:
        for c in self.configs:
            if c.name == name:
                return c
        raise SimError(f"no configuration {name!r}; have {[c.name for c in self.configs]}")

    def table(self) -> str:
        """A readable text table of the configurations."""
        return prediction_table(self)

    def require_fit(self) -> Prediction:
        """This prediction when every configuration fits in memory; ``SimError`` with ``fit_message`` (what does
        not fit, and the devices that would hold it) otherwise."""
        if not self.fits:
            raise SimError(self.fit_message)
        return self


class _Speculation:
    """Validated speculative inputs of one prediction: the round shape and what the report shows."""

    def __init__(self, dep: Deployment, k: Any, acceptance: Any, loop_stats: Any, tree: Any) -> None:
        assert dep.draft is not None
        self.feature = dep.draft.feature_dim > 0
        self.stats = LoopStats(**loop_stats) if isinstance(loop_stats, dict) else loop_stats
        if self.stats is not None and not isinstance(self.stats, LoopStats):
            raise SimError(f"loop_stats must be a LoopStats or a dict of its fields, got {type(loop_stats).__name__}")
        self.tree: TokenTree | None = None
        if tree is not None:
            if self.stats is not None:
                raise SimError("give a tree or loop_stats, not both (a measured tree run is LoopStats with its calls)")
            acc = 0.8 if acceptance is None else acceptance
            self.tree = (
                best_tree(acc, check_int("tree nodes", tree, 1, MAX_TREE_NODES))
                if not isinstance(tree, TokenTree)
                else tree
            )
            self.tree_acc = acc
            self.acc_out: Any = rank_acceptance(acc, self.tree.depth).tolist() if np.ndim(acc) else float(acc)
            self.k = self.tree.n_nodes
            self.shape = tree_round(self.tree, acc, self.feature)
            return
        self.k = int(check_k(k))
        if self.stats is not None:
            s = self.stats
            if s.lookup_fraction == 0.0 and s.drafts_per_loop > self.k:
                raise SimError(f"loop_stats.drafts_per_loop {s.drafts_per_loop:g} exceeds K={self.k} (the cap)")
            if s.draft_calls() > self.k + 1e-9 and s.lookup_fraction > 0.0:
                raise SimError(f"loop_stats.draft_calls_per_loop {s.draft_calls():g} exceeds K={self.k} (the cap)")
        if acceptance is None:
            d = 1 if self.stats is None else min(MAX_K, max(1, round(self.stats.drafts_per_loop)))
            acceptance = 0.8 if self.stats is None else alpha_for_expected_tokens(self.stats.tokens_per_loop, d)
        acc = check_alpha(acceptance)
        self.acc_out = float(acc) if acc.ndim == 0 else [float(x) for x in acceptance_vector(acc, self.k)]
        chain = chain_round(self.k, self.acc_out, self.feature)
        self.shape = chain if self.stats is None else measured_round(self.stats, self.feature)

    @property
    def slots(self) -> int:
        """KV positions one round writes beyond the generated tokens (the round's drafts, at most)."""
        return self.k


def _bound_at_mid(arrays: dict[str, np.ndarray]) -> Bound:
    return bound_of(arrays, len(arrays["time_s"]) // 2)


def _parts(arrays: dict[str, np.ndarray], per: float) -> dict[str, float]:
    src = (("target_memory", "memory_bound_s"), ("target_compute", "compute_bound_s"), ("target_comm", "comm_s"),
           ("target_overhead", "overhead_s"))  # fmt: skip
    return {key: float(np.mean(arrays[s])) / per for key, s in src}


def _memory(dep: Deployment, fmt: str, slots: int, speculative: bool) -> tuple[float, float, float]:
    """(bytes needed, bytes of weights, KV bytes per sequence) of one configuration."""
    tokens = dep.context_tokens + (slots if dep.cache == "growing" else 0)
    weights = dep.target.weight_bytes(fmt, compress_lm_head=dep.compress_lm_head)
    per_seq = dep.target.kv_cache_bytes(tokens, dep.kv_format)
    if speculative and dep.draft_shares_devices and dep.draft is not None:
        weights += dep.draft.weight_bytes(dep.draft_fmt, compress_lm_head=dep.compress_lm_head)
        per_seq += dep.draft.kv_cache_bytes(tokens, dep.kv_format)
    return weights + dep.batch_size * per_seq, weights, per_seq


def _row(dep: Deployment, fmt: str, spec: _Speculation | None) -> dict[str, Any]:
    """One configuration: AR (``spec`` None) or speculative, in target format ``fmt``."""
    L = dep.decode_contexts()
    spd = spec is not None
    if spec is None:
        arrays = target_call(dep, format_arrays(dep.hardware, fmt), 1, L)
        tpot = float(np.mean(arrays["time_s"])) + dep.host_s_per_step
        parts = {**_parts(arrays, 1.0), "draft": 0.0, "host": dep.host_s_per_step}
        loop, e = None, None
    else:
        r = price_round(dep, fmt, spec.shape, L)
        arrays, e = r["score"], spec.shape.tokens
        loop = float(np.mean(r["loop"]))
        tpot = loop / e
        host = dep.host_s + dep.host_s_per_step
        parts = {**_parts(arrays, e), "draft": float(np.mean(r["draft"])) / e, "host": host / e}
    ttft = prefill_s(dep, fmt, spd)
    total = ttft + (dep.gen_len - 1) * tpot
    mem, weights, per_seq = _memory(dep, fmt, spec.slots if spec else 0, spd)
    avail = dep.n_devices * dep.hardware.memory_capacity_bytes * dep.hardware.usable_memory_fraction
    return dict(
        name=f"{fmt} + SpD" if spd else f"{fmt} AR",
        target_format=fmt,
        draft_format=dep.draft_fmt if spd else None,
        speculative=spd,
        ttft_s=ttft,
        tpot_s=tpot,
        total_s=total,
        tokens_per_s=dep.batch_size * dep.gen_len / total,
        decode_tokens_per_s=dep.batch_size / tpot,
        bound=_bound_at_mid(arrays),
        breakdown_s=parts,
        expected_tokens_per_loop=e,
        loop_s=loop,
        memory_bytes=mem,
        fits=bool(mem <= avail),
        max_batch_size=max(0, math.floor((avail - weights) / per_seq)) if avail > weights else 0,
    )


def _fit_message(dep: Deployment, configs: list[ConfigResult], strict: bool) -> str:
    hw, n = dep.hardware, dep.n_devices
    avail = n * hw.memory_capacity_bytes * hw.usable_memory_fraction
    bad = [c for c in configs if not c.fits]
    if not bad:
        return f"fits: all configurations within {avail / 1e9:.2f} GB usable on {n} device(s) of {hw.name}"
    need = devices_to_fit(hw, max(c.memory_bytes for c in bad))
    msg = (
        "DOES NOT FIT: "
        + "; ".join(f"{c.name} needs {c.memory_bytes / 1e9:.2f} GB" for c in bad)
        + f" > {avail / 1e9:.2f} GB usable ({n} x {hw.memory_capacity_bytes / 1e9:.1f} GB x "
        f"{hw.usable_memory_fraction:g}) on {hw.name}; devices={need} would hold it"
    )
    if strict:
        raise SimError(msg)
    return msg


def _planning(dep: Deployment, spec: _Speculation) -> dict[str, Any]:
    """best K and the break-even alpha (chains and measured loops), or the best node budget (trees)."""
    if spec.tree is not None:
        budgets = sorted({*TREE_BUDGETS, spec.k})
        sp = tree_speedups(dep, spec.tree_acc, budgets)
        i = int(np.argmax(sp))
        return dict(best_tree_nodes=budgets[i], best_tree_speedup=float(sp[i]))
    acc = spec.acc_out
    k_max = 16 if isinstance(acc, float) else len(acc)
    bk, bk_speed = best_k(dep, acceptance=acc, k_max=k_max)
    be = break_even_alpha(dep, k=spec.k)
    return dict(best_k=bk, best_k_speedup=bk_speed, break_even_alpha=be)


def _check_devices(dep: Deployment) -> None:
    """SimError when a model is split over more devices than it has attention heads: tensor parallelism shards the
    heads (Megatron-LM, Shoeybi et al. 2019, §3), so beyond one head per device the roofline's bandwidth x devices
    describes no real split and only predicts ever faster steps."""
    for field, spec, n in (("devices", dep.target, dep.devices), ("draft_devices", dep.draft, dep.draft_devices)):
        if spec is not None and n is not None and n > spec.n_heads:
            raise SimError(
                f"{field}={n} splits {spec.name!r} over more devices than its {spec.n_heads} attention heads "
                f"(tensor parallelism gives each device whole heads): give {field} 1..{spec.n_heads}"
            )


def _configs(dep: Deployment, spec: _Speculation | None) -> list[ConfigResult]:
    """AR in every format, then speculative decoding in every format (with ``spec``), with speedups over the first."""
    raw = [_row(dep, fmt, None) for fmt in dep.formats()]
    if spec is not None:
        raw += [_row(dep, fmt, spec) for fmt in dep.formats()]
    base = raw[0]
    return [
        ConfigResult(**r, speedup=base["total_s"] / r["total_s"], decode_speedup=base["tpot_s"] / r["tpot_s"])
        for r in raw
    ]


def _prediction(
    dep: Deployment, spec: _Speculation | None, configs: list[ConfigResult], msg: str, plan: dict[str, Any]
) -> Prediction:
    """The ``Prediction`` of ``dep``'s configurations, fit message and planning fields."""
    return Prediction(
        target=dep.target.name,
        draft=dep.draft.name if dep.draft else None,
        hardware=dep.hardware.name,
        draft_hardware=dep.draft_hw.name if dep.draft else None,
        devices=dep.n_devices,
        draft_devices=dep.draft_devices,
        draft_shares_devices=dep.draft_shares_devices,
        k=spec.k if spec else None,
        acceptance=spec.acc_out if spec else None,
        prompt_len=dep.prompt_len,
        gen_len=dep.gen_len,
        batch_size=dep.batch_size,
        cache=dep.cache,
        ctx_len=dep.ctx_len,
        memory_available_bytes=dep.n_devices * dep.hardware.memory_capacity_bytes * dep.hardware.usable_memory_fraction,
        configs=configs,
        fits=all(c.fits for c in configs),
        fit_message=msg,
        loop_stats=spec.stats if spec else None,
        feature_draft=bool(spec and spec.feature),
        tree=spec.tree if spec else None,
        **plan,
    )


def predict_speedup(
    deployment: Deployment | ModelLike | None = None,
    draft: ModelLike | None = None,
    hardware: HardwareLike | None = None,
    *,
    k: int = 7,
    acceptance: Acceptance | None = None,
    loop_stats: LoopStats | dict[str, float] | None = None,
    tree: TokenTree | int | None = None,
    **settings: Any,
) -> Prediction:
    """Predict TTFT (s), TPOT (s), tokens/s and speedups of AR in the baseline and the compressed format, and of
    speculative decoding in both when the deployment has a draft.

    ``deployment``: a ``Deployment``, or the older form ``predict_speedup(target, draft, hardware, **settings)``
    (settings = ``Deployment`` fields; with a ``Deployment`` they override its fields). ``draft=None``: AR only.
    ``acceptance``: i.i.d. alpha in [0, 1] or a measured per-position vector (length >= K); for a tree, an alpha or
    per-rank rates (``accel.sim.tree.rank_acceptance``); default 0.8, or with ``loop_stats`` the i.i.d. alpha that
    gives its tokens per loop (for ``best_k`` and the break-even alpha only). ``loop_stats``: measured loops
    (dynamic length, lookup, trees); K is then the cap. ``tree``: a ``TokenTree`` or a node budget (the best tree
    for ``acceptance``); the report then compares budgets (``best_tree_nodes``). ``Prediction.require_fit()``
    raises ``SimError`` when a configuration does not fit in memory (deprecated: ``strict=True``)."""
    objects, settings = legacy_keywords("predict_speedup", settings, (_STRICT,), {}, keep=None)
    strict = bool(objects["strict"])
    dep = as_deployment(deployment, draft, hardware, settings)
    _check_devices(dep)
    spec = None if dep.draft is None else _Speculation(dep, k, acceptance, loop_stats, tree)
    if dep.draft is None and (loop_stats is not None or tree is not None or acceptance is not None):
        raise SimError("acceptance, loop_stats and tree describe speculative decoding: give a draft model too")
    configs = _configs(dep, spec)
    msg = _fit_message(dep, configs, strict)
    slower = placement_warning(dep, spec.shape, configs) if spec is not None else None
    if slower:
        warnings.warn(slower, SimWarning, stacklevel=2)
    plan = _planning(dep, spec) if spec is not None else {}
    return _prediction(dep, spec, configs, msg, plan)


__all__ = ["BREAKDOWN_KEYS", "ConfigResult", "Prediction", "predict_speedup"]
