"""Public configs and results of Hydra heads (pydantic; no torch import).

``HydraConfig`` is the heads' architecture (their ``config.json``); ``HydraTrainConfig`` the optimisation of
``train_hydra``; ``HydraReport`` what training did; ``HeadsEval`` what ``evaluate_heads`` measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["HeadsEval", "HydraConfig", "HydraHistoryPoint", "HydraReport", "HydraSpec", "HydraTrainConfig"]

KIND: Literal["accel-hydra-heads"] = "accel-hydra-heads"


class HydraConfig(BaseModel):
    """Architecture of a set of Hydra heads for one target (Ankner et al. 2024; docs/drafts.md, "Hydra heads").

    Head ``i`` (1..``num_heads``) predicts the token ``i + 1`` places after a base position ``t`` from the base
    state at ``t`` and the input embeddings of the ``i`` tokens after ``t``: a first residual block from the
    concatenation (width ``(i + 1) x hidden``) to ``hidden``, then ``mlp_layers - 1`` residual blocks of width
    ``hidden`` (distinct weights), then the LM head. The base state is the target's final-norm hidden state, or with
    ``prefix`` (Hydra++) the output of one extra decoder layer shaped like the target's that attends over the
    target's hidden states of the whole prefix (with its own KV cache).
    The LM head and the input embeddings are the target's own (frozen, read from the target, never stored); the LM
    head scores the ``head_vocab`` token ids stored with the heads (0: the full vocabulary).

    ``target`` is the target's ``config.json`` (sizes, RoPE and norm of the prefix layer); ``target_fingerprint``
    (mean absolute value of its first 256 embedding rows) catches heads used with another target.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["accel-hydra-heads"] = KIND
    num_heads: int = Field(4, ge=1, le=8)
    mlp_layers: int = Field(1, ge=1, le=8)
    prefix: bool = False
    head_vocab: int = Field(0, ge=0)
    target: dict[str, Any]
    target_fingerprint: float

    @property
    def hidden_size(self) -> int:
        return int(self.target["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.target["vocab_size"])


class HydraSpec(BaseModel):
    """The heads ``distill_hydra`` builds: ``num_heads`` heads of ``mlp_layers`` residual blocks, with the Hydra++
    prefix layer when ``prefix``; the LM head scores the ``head_vocab`` tokens the target predicts most often in the
    training data (0: the full vocabulary)."""

    model_config = ConfigDict(extra="forbid")

    num_heads: int = Field(4, ge=1, le=8)
    mlp_layers: int = Field(1, ge=1, le=8)
    prefix: bool = False
    head_vocab: int = Field(8192, ge=0)


class HydraTrainConfig(BaseModel):
    """Optimisation of ``train_hydra``: AdamW (betas 0.9/0.95), linear warm-up over ``warmup_steps``, cosine decay to
    10% at ``max_steps``; ``batch_rows`` sequences per step; a wall-clock cap of ``minutes``. Every ``eval_every``
    steps the held-out score is measured and the best heads are written; every ``checkpoint_every`` steps the whole
    state (heads, optimiser, data order) is saved, so ``resume`` continues with the same batches."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(2000, ge=1)
    batch_rows: int = Field(8, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(50, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    minutes: float | None = Field(None, gt=0)
    eval_every: int = Field(200, ge=1)
    checkpoint_every: int = Field(100, ge=1)
    seed: int = 0
    threads: int | None = Field(None, ge=1)
    resume: bool = False
    progress: bool = True


class HydraHistoryPoint(BaseModel):
    """One evaluation: mean training loss (nats, summed over heads) since the last point, per-head training top-1
    agreement, the held-out score (higher is better) and the training seconds so far."""

    step: int
    loss: float
    train_top1: list[float]
    score: float | None = None
    elapsed_s: float


class HydraReport(BaseModel):
    """What ``train_hydra`` did: time in seconds, positions in tokens (base positions with a teacher)."""

    out_dir: Path
    num_parameters: int
    steps: int
    positions_seen: int
    best_step: int
    best_score: float | None
    train_time_s: float
    data_time_s: float = 0.0  # data generation and hidden states (distill_hydra)
    stopped_by: str  # "max_steps" or "minutes"
    history: list[HydraHistoryPoint] = Field(default_factory=list)
    config: HydraTrainConfig


class HeadsEval(BaseModel):
    """Teacher-forced quality of Hydra heads on token sequences (greedy target continuations make it exact for greedy
    speculative decoding), over the base positions after each prompt:

    - ``top1[i]``: head i+1's argmax is the sequence's token (its path being the true tokens);
    - ``topk_coverage[i]``: the token is among head i+1's ``top_k`` most likely;
    - ``chain_accept_by_position[j]``: heads 1..j+1 are all right (a greedy chain of j+1 head tokens accepted);
      ``chain_tokens_per_call[j] = 1 + sum(chain_accept_by_position[:j+1])``;
    - ``tree_tokens_per_call``: mean tokens a greedy round emits with the tree the Hydra proposer builds (``tree``
      describes its shape), i.e. 1 + the longest root path of the tree that the sequence follows.
    """

    positions: int
    sequences: int
    top_k: int
    top1: list[float]
    topk_coverage: list[float]
    chain_accept_by_position: list[float]
    chain_tokens_per_call: list[float]
    tree: dict[str, int | float | None]
    tree_tokens_per_call: float
    tree_nodes: float  # mean nodes below the root
