"""Public configs and results of ``accel.drafts`` (pydantic; no torch import).

``DistillConfig`` describes the draft architecture, the data and the optimisation; ``DistillReport`` is what
``distill`` returns (and writes next to the checkpoint as ``distill.json``); ``DraftEval`` is what ``evaluate_draft``
measures, in the units the simulator (``accel.sim``) and the speculative loop (``accel.spd``) use.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DistillConfig", "DistillReport", "DraftEval", "HistoryPoint"]


class DistillConfig(BaseModel):
    """How to build and train a draft by distillation from a target.

    Architecture: a Llama-family decoder with the target's vocabulary; ``d_model`` hidden units, ``layers`` blocks,
    ``heads`` attention heads (``kv_heads`` for grouped-query attention), SwiGLU width ``ffn`` (default 4 * d_model).
    Data: ``data_files`` (UTF-8 text, tokenized with the target's tokenizer and cut into ``seq_len``-token windows)
    and/or ``self_generate`` continuations the target samples from ``prompts`` (``gen_tokens`` new tokens each; row
    ``i`` uses ``temperatures[i % len(temperatures)]``, 0 = greedy).
    Loss: KL(target || draft) on the next-token distribution, with the target truncated to its ``teacher_top_k``
    most likely tokens and renormalised (bounded memory: the teacher is stored once, as top-k ids + log-probs).
    ``softmax_negatives > 0`` estimates the draft's softmax normaliser from the batch's teacher tokens plus that many
    uniformly sampled others (``loss.sampled_topk_kl``): several times cheaper with a 50k vocabulary, approximate.
    Budget: ``max_steps`` optimiser steps and an optional wall-clock cap of ``minutes`` (training stops early, keeping
    the best checkpoint). The learning rate warms up linearly over ``warmup_steps`` then decays by a cosine to 10% at
    ``schedule_steps`` (default ``max_steps``); fix ``schedule_steps`` to stop and resume a run with the same schedule.
    """

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(2, ge=1, le=64)
    d_model: int = Field(128, ge=8)
    heads: int = Field(4, ge=1)
    kv_heads: int | None = None
    ffn: int | None = None
    tie_embeddings: bool = True
    init_embeddings: str = "svd"  # "svd": project the target's embedding onto its top d_model directions; "random"
    init_from: Path | None = None  # warm start: a draft checkpoint with this architecture (fine-tune it)

    data_files: list[Path] = Field(default_factory=list)
    prompts: list[str] = Field(default_factory=list)
    self_generate: int = Field(0, ge=0)
    gen_tokens: int = Field(96, ge=1, le=1 << 20)
    gen_batch_size: int = Field(8, ge=1, le=1024)
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.8])
    seq_len: int = Field(128, ge=4, le=1 << 20)
    max_windows_per_file: int | None = Field(None, ge=1)
    teacher_top_k: int = Field(32, ge=1)
    softmax_negatives: int = Field(0, ge=0)  # 0: exact softmax over the vocabulary; n: sampled (see loss.py)
    held_out_fraction: float = Field(0.05, ge=0.0, lt=1.0)

    batch_size: int = Field(16, ge=1, le=1024)
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(50, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_steps: int = Field(1000, ge=1)
    schedule_steps: int | None = Field(None, ge=1)  # length of the cosine decay (default max_steps)
    minutes: float | None = Field(None, gt=0)
    eval_every: int = Field(100, ge=1)
    checkpoint_every: int = Field(100, ge=1)
    seed: int = 0
    threads: int | None = Field(None, ge=1)
    resume: bool = False
    progress: bool = True

    @field_validator("init_embeddings")
    @classmethod
    def _check_init(cls, v: str) -> str:
        if v not in ("svd", "random"):
            raise ValueError(f"init_embeddings must be 'svd' or 'random'; got {v!r}")
        return v

    @field_validator("temperatures")
    @classmethod
    def _check_temps(cls, v: list[float]) -> list[float]:
        if not v or any(t < 0 for t in v):
            raise ValueError(f"temperatures must be a non-empty list of values >= 0 (0 = greedy); got {v}")
        return v

    @model_validator(mode="after")
    def _check(self) -> DistillConfig:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by heads {self.heads}")
        if (self.d_model // self.heads) % 2:
            raise ValueError(f"head size d_model/heads = {self.d_model // self.heads} must be even (RoPE)")
        kv = self.kv_heads or self.heads
        if self.heads % kv:
            raise ValueError(f"heads {self.heads} must be a multiple of kv_heads {kv}")
        if self.self_generate and not self.prompts:
            raise ValueError("self_generate > 0 needs prompts to continue")
        return self


class HistoryPoint(BaseModel):
    """One evaluation during training: ``step``, mean training ``loss`` (nats) since the last point, and the
    held-out greedy agreement (fraction of positions where the draft's argmax equals the target's)."""

    step: int
    loss: float
    greedy_agreement: float | None = None
    elapsed_s: float


class DistillReport(BaseModel):
    """What ``distill`` did. Times in seconds; token counts in tokens (positions with a teacher distribution)."""

    out_dir: Path
    target: str
    num_parameters: int
    weights_bytes: int
    steps: int
    train_tokens: int
    held_out_tokens: int
    tokens_seen: int
    final_loss: float
    greedy_agreement: float | None
    best_step: int
    data_time_s: float
    train_time_s: float
    stopped_by: str  # "max_steps" or "minutes"
    history: list[HistoryPoint] = Field(default_factory=list)
    config: DistillConfig


class DraftEval(BaseModel):
    """Teacher-forced agreement of a draft with its target on some token sequences.

    - ``greedy_agreement``: fraction of positions where argmax draft == argmax target (the greedy SpD acceptance of
      one draft token, if the text were the target's own greedy output).
    - ``accept_rate_by_position[j]`` (j = 0..max_k-1): probability that draft position j+1 of a speculative run is
      accepted under greedy SpD, i.e. that positions 1..j+1 all agree (averaged over every start position).
    - ``expected_tokens_per_step[K-1]`` (K = 1..max_k): 1 + sum_{j<K} accept_rate_by_position[j], the tokens one
      greedy SpD step emits on average (docs/reference.md §3, without assuming i.i.d. acceptance).
    - ``alpha``: mean over positions of sum_x min(p(x), q(x)) at ``temperature`` (the per-token acceptance of
      modified rejection sampling, Chen et al. 2023; docs/reference.md §3).
    - ``alpha_greedy_iid``: the greedy_agreement as an i.i.d. alpha, for ``accel.sim``.
    """

    positions: int
    sequences: int
    temperature: float
    greedy_agreement: float
    accept_rate_by_position: list[float]
    expected_tokens_per_step: list[float]
    alpha: float
    target_nll: float  # mean nats/token of the target on the text (how "on-distribution" the text is)
    draft_nll: float  # mean nats/token of the draft, over the positions where its probability is > 0
    draft_zero_prob: float = 0.0  # fraction of positions whose token a restricted head (head_vocab) cannot propose
