"""Hydra heads priced as a draft model (Ankner et al. 2024; docs/reference.md §9; ``accel.drafts.hydra``).

A Hydra proposer makes one small call per tree level (the root level with one path, then the expanded nodes), like
a draft model does, so the simulator prices it as one: ``hydra_draft(target, ...)`` returns the ``ModelSpec`` of an
*equivalent draft* whose one call streams the weights of a mean Hydra level call. What one round reads
(elements; ``d`` = the target's width, ``K`` heads of ``m`` residual blocks, ``V_h`` LM-head rows):

- head ``i``: a first block from ``(i + 1) d`` to ``d`` with a Linear and a residual Linear, ``2 (i + 1) d^2``, then
  ``m - 1`` blocks of ``d^2``; the mean over ``i = 1..K`` is ``d^2 (K + 3 + m - 1)`` per level call;
- the LM head, ``V_h d`` (restricted to ``V_h`` tokens, or the target's full head), read by every level call;
- Hydra++: the prefix layer (one decoder layer shaped like the target's) once per round, i.e. ``1 / K`` of its
  weights per level call.

The equivalent draft is one layer of width ``d`` whose attention is negligible (one head of width 1: ``4 d``
elements, a KV cache of 2 values per token) and whose plain MLP has ``ffn_dim = (linear elements - 4 d) / (2 d)``
(rounded: within ``d`` elements), plus the LM head above. Approximations: biases and norms of the heads are left
out (a few ``d`` per block); the equivalent draft's own embedding table is counted in its storage, while the real
heads reuse the target's (a memory-fit estimate errs by ``vocab x d`` elements); the prefix layer's KV cache is
priced as the equivalent draft's (smaller). Timing follows the draft pricing of ``accel.sim.rounds``.
"""

from __future__ import annotations

from accel.errors import SimError
from accel.sim._base import check_int
from accel.sim.models import ModelSpec

__all__ = ["hydra_draft", "hydra_level_elements"]


def hydra_level_elements(target: ModelSpec, num_heads: int = 4, mlp_layers: int = 1, prefix: bool = False) -> float:
    """Weight elements (LM head excluded) one mean Hydra level call reads: the heads' blocks averaged over the
    ``num_heads`` levels, plus ``1 / num_heads`` of the prefix layer with ``prefix`` (module docstring)."""
    if not isinstance(target, ModelSpec):
        raise SimError(f"hydra_draft needs the target's ModelSpec; got {type(target).__name__}")
    k = check_int("Hydra heads", num_heads, 1, 64)
    m = check_int("Hydra MLP layers", mlp_layers, 1, 64)
    d = float(target.d_model)
    heads = d * d * (k + 3 + (m - 1))
    layer = float(target.linear_params_per_layer) if prefix else 0.0  # attention + FFN of one layer
    return heads + layer / k


def hydra_draft(
    target: ModelSpec,
    *,
    num_heads: int = 4,
    mlp_layers: int = 1,
    prefix: bool = False,
    head_vocab: int = 0,
    name: str | None = None,
) -> ModelSpec:
    """The equivalent draft ``ModelSpec`` of Hydra heads on ``target`` (module docstring): give it to
    ``predict_speedup(target, hydra_draft(target, ...), hardware, tree=...)`` as the draft. ``head_vocab``: rows of
    a restricted LM head (0: the target's full head)."""
    elements = hydra_level_elements(target, num_heads, mlp_layers, prefix)
    d = target.d_model
    rows = check_int("Hydra head_vocab", head_vocab, 0, target.vocab_size)
    restricted = 0 < rows < target.vocab_size
    kind = "hydra++" if prefix else "hydra"
    return ModelSpec(
        name=name or f"{target.name}-{kind}-{num_heads}x{mlp_layers}",
        n_layers=1,
        d_model=d,
        n_heads=1,
        n_kv_heads=1,
        head_dim=1,
        ffn_dim=max(1, round((elements - 4 * d) / (2 * d))),
        ffn_type="mlp",
        vocab_size=target.vocab_size,
        dtype=target.dtype,
        tied_embeddings=False,
        head_vocab=rows if restricted else 0,
        max_context=target.max_context,
    )
