"""Pricing of decode steps and speculative rounds on a ``Deployment`` (the shared engine of ``predict_speedup``,
``best_k``, ``break_even_alpha``, ``sweep`` and whole-run observations).

A speculative round is a ``RoundShape``: the draft calls that build the proposal (tokens fed by each, at which past
offset), the tokens the target scores in one call, the expected tokens emitted, and the extra tokens the draft is fed
to catch up. Three kinds:

- a chain of K drafts (:func:`chain_round`): K one-token draft calls at past L .. L+K-1, the target scores K + 1;
  catch-up P(all K accepted) for a standalone draft (it then reads [d_K, bonus]), E - 1 for a feature draft;
- a token tree (:func:`tree_round`, ``accel.sim.tree``): one draft call per expanded level (widths from the tree),
  the target scores T + 1; catch-up = P(the accepted path ends at a leaf);
- measured loops (:func:`measured_round`, ``LoopStats``): ``draft_calls_per_loop`` calls of
  ``draft_tokens_per_call`` tokens at the loop's mean past length, the target scores D + 1 (fractional S: the call
  cost is evaluated on the S-curve there), the measured tokens per loop.

A round costs: the draft calls + the catch-up (tokens x the draft's marginal cost of one more token in a call,
T_draft(S=2) - T_draft(S=1)) + the target's scoring call + ``host_s`` (per round) + ``host_s_per_step`` (per target
call, like every autoregressive step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from accel.sim.deployment import Deployment
from accel.sim.formats import kv_bytes_per_element
from accel.sim.roofline import CallShape, FormatArrays, format_arrays, step_arrays
from accel.sim.spd import Acceptance, LoopStats, catch_up_tokens, expected_tokens_from, tokens_pmf
from accel.sim.tree import TokenTree, leaf_end_probability, tree_expected_tokens


@dataclass(frozen=True)
class RoundShape:
    """One speculative round, per sequence (module docstring)."""

    draft_widths: tuple[float, ...]  # tokens fed by each draft call
    draft_offsets: tuple[float, ...]  # past-length offset of each call from the round's start
    call_scale: float  # multiplies the draft calls (a measured, fractional number of calls)
    score_tokens: float  # tokens the target scores in one call (drafts + 1)
    tokens: float  # expected tokens emitted per round
    catch_up: float  # extra tokens the draft is fed per round
    drafts: float  # draft tokens proposed per round (chain K, tree T, measured D)


def chain_round(k: int, acceptance: Acceptance, feature_draft: bool) -> RoundShape:
    """K one-token draft calls, the target scores K + 1 (i.i.d. alpha or per-position acceptance)."""
    e = expected_tokens_from(acceptance, k)
    p_all = float(tokens_pmf(acceptance, k)[-1])
    return RoundShape(
        draft_widths=(1.0,) * k,
        draft_offsets=tuple(float(j) for j in range(k)),
        call_scale=1.0,
        score_tokens=k + 1.0,
        tokens=e,
        catch_up=float(catch_up_tokens(e, p_all, feature_draft)),
        drafts=float(k),
    )


def tree_round(tree: TokenTree, acceptance: Any, feature_draft: bool) -> RoundShape:
    """A token tree built level by level (``TokenTree.draft_call_widths``), scored in one target call."""
    e = tree_expected_tokens(tree, acceptance)
    widths = tree.draft_call_widths()
    return RoundShape(
        draft_widths=tuple(float(w) for w in widths),
        draft_offsets=tuple(float(d) for d in range(len(widths))),
        call_scale=1.0,
        score_tokens=tree.n_nodes + 1.0,
        tokens=e,
        catch_up=e - 1.0 if feature_draft else leaf_end_probability(tree, acceptance),
        drafts=float(tree.n_nodes),
    )


def measured_round(stats: LoopStats, feature_draft: bool) -> RoundShape:
    """Measured loops: their draft calls at the loops' mean past length, their tokens per loop."""
    d = stats.drafts_per_loop
    return RoundShape(
        draft_widths=(stats.draft_tokens_per_call,),
        draft_offsets=((d - 1.0) / 2.0,),
        call_scale=stats.draft_calls(),
        score_tokens=d + 1.0,
        tokens=stats.tokens_per_loop,
        catch_up=float(
            catch_up_tokens(stats.tokens_per_loop, stats.all_accepted(), feature_draft, stats.lookup_fraction)
        ),
        drafts=d,
    )


def target_call(dep: Deployment, fmt: FormatArrays, S: Any, L: Any, batch: Any = None) -> dict[str, np.ndarray]:
    """Step arrays of a target call scoring S tokens (S logits) after L past tokens on the deployment."""
    return step_arrays(
        dep.target,
        dep.hardware,
        CallShape(dep.batch_size if batch is None else batch, S, L, S, dep.kv_slots),
        fmt=fmt,
        kv_bpe=kv_bytes_per_element(dep.kv_format),
        devices=dep.n_devices,
        compress_lm_head=dep.compress_lm_head,
    )


def draft_call(dep: Deployment, S: Any, L: Any, batch: Any = None, num_logits: Any = None) -> np.ndarray:
    """Seconds of a draft call feeding S tokens after L past tokens."""
    assert dep.draft is not None
    batch = dep.batch_size if batch is None else batch
    return step_arrays(
        dep.draft,
        dep.draft_hw,
        CallShape(batch, S, L, S if num_logits is None else num_logits, dep.kv_slots),
        fmt=format_arrays(dep.draft_hw, dep.draft_fmt),
        kv_bpe=kv_bytes_per_element(dep.kv_format),
        devices=dep.n_draft_devices,
        compress_lm_head=dep.compress_lm_head,
    )["time_s"]


def ar_step_s(dep: Deployment, fmt: str) -> float:
    """Mean seconds of one autoregressive decode step over the generation (+ ``host_s_per_step``)."""
    L = dep.decode_contexts()
    return float(np.mean(target_call(dep, format_arrays(dep.hardware, fmt), 1, L)["time_s"])) + dep.host_s_per_step


def prefill_s(dep: Deployment, fmt: str, speculative: bool) -> float:
    """Time to first token: the target's prefill of the prompt (+ the draft's, for speculative decoding)."""
    t = float(
        step_arrays(
            dep.target,
            dep.hardware,
            CallShape(dep.batch_size, dep.prompt_len, 0, 1, dep.kv_slots),
            fmt=format_arrays(dep.hardware, fmt),
            kv_bpe=kv_bytes_per_element(dep.kv_format),
            devices=dep.n_devices,
            compress_lm_head=dep.compress_lm_head,
        )["time_s"]
    )
    if speculative:
        t += float(draft_call(dep, dep.prompt_len, 0, num_logits=1))
    return t


def price_round(dep: Deployment, fmt: str, shape: RoundShape, L: np.ndarray) -> dict[str, Any]:
    """Seconds of one round at each past length in ``L``: ``score`` (the target call's step arrays), ``draft``
    (calls + catch-up) and ``loop`` (all of it + host time)."""
    score = target_call(dep, format_arrays(dep.hardware, fmt), shape.score_tokens, L)
    widths = np.asarray(shape.draft_widths)[:, None]
    offsets = np.asarray(shape.draft_offsets)[:, None]
    draft = shape.call_scale * draft_call(dep, widths, L[None, :] + offsets).sum(axis=0)
    draft = draft + shape.catch_up * (draft_call(dep, 2, L, num_logits=1) - draft_call(dep, 1, L))
    loop = score["time_s"] + draft + dep.host_s + dep.host_s_per_step
    return {"score": score, "draft": draft, "loop": loop}


def chain_arrays(
    dep: Deployment, fmt: FormatArrays, ks: np.ndarray, L: Any, batch: Any = None
) -> tuple[np.ndarray, ...]:
    """Vectorized chain pricing: (target decode step, the K draft calls summed over past L .. L+K-1, the (K+1)-token
    scoring call, the draft's marginal cost of one more token). ``ks`` broadcasts against ``L``/``batch``/``fmt``
    (the sweep's grid); the draft calls are summed exactly by a cumulative sum up to max K."""
    ks = np.asarray(ks, dtype=np.int64)
    L = np.asarray(L, dtype=np.float64)
    b = np.asarray(dep.batch_size if batch is None else batch)
    t_tgt = target_call(dep, fmt, 1, L, b)["time_s"]
    t_score = target_call(dep, fmt, ks + 1.0, L, b)["time_s"]
    j = np.arange(int(ks.max()), dtype=np.float64)
    d_steps = draft_call(dep, 1, L[..., None] + j, b[..., None])  # (..., K_max): past lengths L + j
    cum = np.cumsum(d_steps, axis=-1)
    shape = np.broadcast_shapes(cum.shape[:-1], ks.shape)
    idx = np.broadcast_to(ks - 1, shape)[..., None]
    t_draft = np.take_along_axis(np.broadcast_to(cum, shape + cum.shape[-1:]), idx, axis=-1)[..., 0]
    catch = draft_call(dep, 2, L, b, num_logits=1) - draft_call(dep, 1, L, b)
    return t_tgt, t_draft, t_score, catch
