"""Planning on a ``Deployment``: the best K, the break-even acceptance, and which tree size.

All three compare speculative decoding with autoregressive decoding *in the deployment's target format*, with the
same pricing as ``predict_speedup`` (loop and step times averaged over the generation's past lengths). The older
call forms ``best_k(target, draft, hardware, acceptance, context_len=L, ...)`` and
``break_even_alpha(target, draft, hardware, k, context_len=L, ...)`` still work: ``context_len`` evaluates at exactly
that past length (a deployment with ``prompt_len = L`` and ``gen_len = 1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from accel.errors import SimError
from accel.sim._base import MAX_K, MAX_TREE_NODES, check_int
from accel.sim.deployment import Deployment, as_deployment
from accel.sim.roofline import format_arrays
from accel.sim.rounds import chain_arrays, price_round, target_call, tree_round
from accel.sim.spd import Acceptance, catch_up_tokens, check_alpha, tokens_pmf
from accel.sim.spd import break_even_alpha as _break_even
from accel.sim.tree import best_tree


def _resolve(deployment: Any, args: tuple[Any, ...], settings: dict[str, Any], extra: str) -> tuple[Deployment, Any]:
    """(deployment, the one extra positional value) from ``(dep, x)`` or the older ``(target, draft, hardware, x)``."""
    settings = dict(settings)
    ctx = settings.pop("context_len", None)
    if ctx is not None:
        settings.update(prompt_len=ctx, gen_len=1)
    if isinstance(deployment, Deployment):
        rest = list(args)
        dep = deployment.with_(**settings) if settings else deployment
    else:
        if len(args) < 2:
            raise SimError(f"give a Deployment, or target, draft and hardware (then {extra})")
        draft, hw, *rest = args
        dep = as_deployment(deployment, draft, hw, settings)
    if len(rest) > 1:
        raise SimError(f"too many positional arguments; expected {extra} after the deployment")
    if dep.draft is None:
        raise SimError("speculative planning needs a deployment with a draft model")
    return dep, rest[0] if rest else None


def _chain_means(dep: Deployment, ks: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, float]:
    """(AR step, K draft calls summed, scoring call, draft catch-up per token): means over the decode contexts."""
    L = dep.decode_contexts()
    t_tgt, t_draft, t_score, catch = chain_arrays(
        dep, format_arrays(dep.hardware, dep.target_format), ks[:, None], L[None, :]
    )
    ar = float(np.mean(t_tgt)) + dep.host_s_per_step
    return ar, np.mean(t_draft, axis=-1), np.mean(t_score, axis=-1), float(np.mean(catch))


def best_k(
    deployment: Any, *args: Any, acceptance: Acceptance | None = None, k_max: int = 16, **settings: Any
) -> tuple[int, float]:
    """The K in 1..k_max with the highest decode speedup of speculative over AR decoding (target format) and that
    speedup: ``best_k(deployment, acceptance)``. With a per-position acceptance vector, k_max is at most its
    length."""
    dep, acc_pos = _resolve(deployment, args, settings, "acceptance")
    acc_in = acceptance if acceptance is not None else acc_pos
    if acc_in is None:
        raise SimError("best_k needs an acceptance (alpha or a per-position vector)")
    acc = check_alpha(acc_in)
    k_max = int(check_k_max(k_max))
    if acc.ndim:
        k_max = min(k_max, acc.size)
    ks = np.arange(1, k_max + 1)
    ar, t_draft, t_score, catch = _chain_means(dep, ks)
    pmfs = [tokens_pmf(acc, int(k)) for k in ks]
    e = np.array([float(np.sum(np.arange(1, len(p) + 1) * p)) for p in pmfs])
    extra = catch_up_tokens(e, np.array([p[-1] for p in pmfs]), dep.draft is not None and dep.draft.feature_dim > 0)
    loop = t_draft + t_score + catch * extra + dep.host_s + dep.host_s_per_step
    sp = e * ar / loop
    i = int(np.argmax(sp))
    return int(ks[i]), float(sp[i])


def check_k_max(k_max: Any) -> int:
    return check_int("k_max", k_max, 1, MAX_K)


def break_even_alpha(deployment: Any, *args: Any, k: int | None = None, **settings: Any) -> float | None:
    """Smallest i.i.d. acceptance at which speculative decoding with K drafts matches AR (target format):
    ``break_even_alpha(deployment, k)``; 0.0 if it wins at any alpha, ``None`` if it loses even at alpha = 1."""
    dep, k_pos = _resolve(deployment, args, settings, "k")
    k_in = k if k is not None else k_pos
    if k_in is None:
        raise SimError("break_even_alpha needs K")
    kk = check_int("K (draft tokens per loop)", k_in, 1, MAX_K)
    ar, t_draft, t_score, catch = _chain_means(dep, np.array([kk]))
    assert dep.draft is not None
    return _break_even(
        kk,
        ar,
        float(t_draft[0]) / kk,
        float(t_score[0]),
        dep.host_s + dep.host_s_per_step,
        catch_up_s=catch,
        feature_draft=dep.draft.feature_dim > 0,
    )


def tree_speedups(deployment: Deployment, acceptance: Any, budgets: Sequence[int]) -> np.ndarray:
    """Decode speedup over AR (target format) of the best tree (``accel.sim.tree.best_tree``) for each node budget:
    the answer to "which tree size" under per-rank acceptance ``acceptance``."""
    dep = deployment
    if dep.draft is None:
        raise SimError("tree planning needs a deployment with a draft (or head) model")
    if len(budgets) == 0 or len(budgets) > 64:
        raise SimError(f"give 1 to 64 tree budgets, got {len(budgets)}")
    L = dep.decode_contexts()
    ar = float(np.mean(target_call(dep, format_arrays(dep.hardware, dep.target_format), 1, L)["time_s"]))
    ar += dep.host_s_per_step
    out = []
    for n in budgets:
        tree = best_tree(acceptance, check_int("tree budget", n, 1, MAX_TREE_NODES))
        shape = tree_round(tree, acceptance, dep.draft.feature_dim > 0)
        loop = float(np.mean(price_round(dep, dep.target_format, shape, L)["loop"]))
        out.append(shape.tokens * ar / loop)
    return np.array(out)
