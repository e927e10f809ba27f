"""Feature-conditioned drafts (EAGLE-style): a one-layer draft that reads the target's hidden states.

A standalone draft must guess the next token from tokens alone; the target's final-norm hidden state ``h_{p-1}`` at
the previous position already holds almost everything the target "knows" about position ``p``. A feature draft
(``ModelConfig.feature_size > 0``) reads, at position ``p``, the token ``x_p`` and that feature, enters its layers with
``fc(concat(embed(x_p), h_{p-1}))``, and outputs both next-token logits and its own estimate of ``h_p`` (its final-norm
hidden state). While drafting several tokens in a round, the estimate stands in for the target feature it does not have
yet; the target's verification call returns the true features, which replace the estimates in the draft's KV cache the
next round (``accel.spd`` does this when the draft backend reports the ``"features"`` capability).

Training (``train_feature_draft``) uses the distillation data of ``accel.drafts`` (target-written sequences with the
target's top-k next-token distributions) plus the target's features of the same sequences (``target_features``):
loss = cross-entropy against the teacher's top-k distribution (over the tokens the draft's restricted head scores)
+ ``reg_weight`` x smooth-L1 between the draft's hidden state and the target's feature at the same position, with
uniform noise on the input features (EAGLE's recipe; it makes the draft tolerate its own estimates).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from accel._legacy import Replaced, legacy_keywords
from accel.drafts.architecture import causal_hidden, sorted_token_ids, svd_embedding
from accel.errors import DraftError
from accel.models.decoder import Decoder, ExtraInputs, new_cache, rotate_half

__all__ = [
    "FeatureLoss",
    "FeatureTrainConfig",
    "augment_draft",
    "build_feature_draft",
    "deepen_feature_draft",
    "estimates_features",
    "feature_draft_loss",
    "greedy_acceptance",
    "load_feature_shards",
    "shift_features",
    "target_features",
    "train_feature_draft",
    "unrolled_hidden",
]


def build_feature_draft(
    target: Decoder, head_ids: torch.Tensor, *, layers: int = 1, embed_size: int = 128, seed: int = 0
) -> Decoder:
    """A feature draft for ``target``: ``layers`` decoder layers shaped like the target's, initialised from its last
    ``layers`` layers; the token embedding is the target's projected on its top ``embed_size`` singular directions;
    the head scores ``head_ids`` (sorted distinct token ids) with the target's head rows; final norm copied.

    The ``fc`` input layer starts as ``[0 | I]`` (the feature passes through, the token adds nothing), so the untrained
    draft already predicts roughly what the target's last layers would. Deterministic in ``seed``.
    """
    tc = target.config
    if tc.feature_size:
        raise DraftError("the target is itself a feature draft")
    if not 1 <= layers <= tc.num_layers:
        raise DraftError(f"layers must be in 1..{tc.num_layers} (the target's layer count); got {layers}")
    ids = sorted_token_ids(head_ids, tc.vocab_size)  # DraftError unless distinct ints in range, fewer than vocab
    cfg = tc.with_(
        num_layers=layers,
        tie_word_embeddings=False,
        head_vocab=len(ids),
        feature_size=tc.hidden_size,
        embed_size=embed_size,
    )
    draft = Decoder(cfg).init_weights(seed=seed)
    sd = target.state_dict()
    first = tc.num_layers - layers
    with torch.no_grad():
        for i, layer in enumerate(draft.blocks):
            layer.load_state_dict(
                {k[len(f"layers.{first + i}.") :]: v for k, v in sd.items() if k.startswith(f"layers.{first + i}.")}
            )
        draft.norm.load_state_dict(target.norm.state_dict())
        emb = target.embed_tokens.weight.detach().float()
        draft.embed_tokens.weight.copy_(svd_embedding(emb, embed_size))
        draft.lm_head.weight.copy_(target.lm_head.weight.detach().float()[ids])
        draft.lm_head_token_ids.copy_(ids)
        fc = torch.zeros_like(draft.fc.weight)
        fc[:, embed_size:] = torch.eye(tc.hidden_size)
        draft.fc.weight.copy_(fc)
    return draft


def deepen_feature_draft(draft: Decoder, target: Decoder, extra_layers: int = 1) -> Decoder:
    """A copy of a trained feature draft with ``extra_layers`` more decoder layers on top, which start as the identity:
    each is initialised from the target's last layers with its ``o_proj`` and ``down_proj`` zeroed, so its residual
    branches add nothing and the deeper draft computes exactly what ``draft`` does until it is trained (a warm start
    for a bigger draft that keeps what the smaller one learned)."""
    c, tc = draft.config, target.config
    if not c.feature_size:
        raise DraftError("deepen_feature_draft needs a feature draft (config.feature_size > 0)")
    if (c.hidden_size, c.num_heads, c.num_kv_heads, c.intermediate_size) != (
        tc.hidden_size,
        tc.num_heads,
        tc.num_kv_heads,
        tc.intermediate_size,
    ):
        raise DraftError("the draft's layers are not shaped like the target's: cannot initialise new ones from it")
    if isinstance(extra_layers, bool) or not isinstance(extra_layers, int) or not 1 <= extra_layers <= tc.num_layers:
        raise DraftError(f"extra_layers must be an int in 1..{tc.num_layers}; got {extra_layers!r}")
    out = Decoder(c.with_(num_layers=c.num_layers + extra_layers))
    state = dict(draft.state_dict())
    src = target.state_dict()
    for i in range(extra_layers):
        t_prefix, d_prefix = f"layers.{tc.num_layers - extra_layers + i}.", f"layers.{c.num_layers + i}."
        for k, v in src.items():
            if k.startswith(t_prefix):
                name = d_prefix + k[len(t_prefix) :]
                zero = name.endswith(
                    ("self_attn.o_proj.weight", "mlp.down_proj.weight", "o_proj.bias", "down_proj.bias")
                )
                state[name] = torch.zeros_like(v) if zero else v.detach().clone()
    out.load_state_dict(state, strict=True)
    return out.to(next(draft.parameters()).dtype)


def augment_draft(draft: Decoder, feature_size: int) -> Decoder:
    """A copy of a standalone draft that also reads target features of width ``feature_size``: ``fc`` maps
    ``concat(embed(token), feature)`` to its width and starts as ``[I | 0]``, so it computes exactly the standalone
    draft until trained. Its width differs from the target's, so it cannot estimate features while drafting: those
    steps get zero features (``estimates_features`` is False) and only catch-up columns see the target's states.
    """
    c = draft.config
    if c.feature_size:
        raise DraftError("the draft already reads features")
    if isinstance(feature_size, bool) or not isinstance(feature_size, int) or feature_size < 1:
        raise DraftError(f"feature_size must be a positive int (the target's hidden size); got {feature_size!r}")
    out = Decoder(c.with_(feature_size=feature_size))
    state = dict(draft.state_dict())
    fc = torch.zeros(c.hidden_size, c.hidden_size + feature_size)
    fc[:, : c.hidden_size] = torch.eye(c.hidden_size)
    state["fc.weight"] = fc
    out.load_state_dict(state, strict=True)
    return out


def estimates_features(config) -> bool:
    """Whether a feature draft's own hidden state can stand in for the target's feature while drafting (its width is
    the feature width); otherwise drafting steps are fed zero features."""
    return config.hidden_size == config.feature_size


def shift_features(hidden: torch.Tensor) -> torch.Tensor:
    """The draft's feature input for a whole sequence: column ``p`` holds ``hidden[:, p - 1]`` (zeros at ``p = 0``)."""
    return torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)


@torch.no_grad()
def target_features(
    target: Decoder, tokens: torch.Tensor, *, batch_size: int = 16, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """The target's final-norm hidden states ``[N, L, hidden]`` of ``tokens [N, L]`` (causal, positions 0..L-1).

    Computed with a copy of the target cast to ``dtype`` (bfloat16 by default: ~3x faster on CPU; the draft trains on
    these with added noise anyway) and returned in that dtype.
    """
    if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.numel() == 0:
        raise DraftError(
            f"tokens must be a non-empty 2-D integer tensor [N, L]; got {tuple(tokens.shape)} {tokens.dtype}"
        )
    if int(tokens.min()) < 0 or int(tokens.max()) >= target.config.vocab_size:
        raise DraftError(f"token ids must be in [0, {target.config.vocab_size})")
    model = copy.deepcopy(target).to(dtype)  # a cast copy: casting in place would round the target's weights
    parts = [causal_hidden(model, tokens[s : s + batch_size]) for s in range(0, tokens.shape[0], batch_size)]
    return torch.cat(parts)


def _head_index(draft: Decoder) -> torch.Tensor:
    """``[vocab]`` int64: a token's column in the restricted head, -1 when the head does not score it."""
    lookup = torch.full((draft.config.vocab_size,), -1, dtype=torch.int64)
    lookup[draft.lm_head_token_ids] = torch.arange(draft.config.head_vocab)
    return lookup


def _qkv(model: Decoder, layer, h: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys, values ``[B, heads, S, head_dim]`` of one layer (RoPE applied, K/V repeated to every head)."""
    c = model.config
    att = layer.self_attn
    bsz, seq, _ = h.shape
    q = att.q_proj(h).view(bsz, seq, c.num_heads, c.head_dim).transpose(1, 2)
    k = att.k_proj(h).view(bsz, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
    v = att.v_proj(h).view(bsz, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
    cos, sin = rope
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    groups = c.num_heads // c.num_kv_heads
    return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def unrolled_hidden(
    model: Decoder,
    tokens: torch.Tensor,
    features: torch.Tensor,
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
):
    """Final-norm hidden states ``[B, S, H]`` of a feature draft over whole sequences, and each layer's K/V.

    ``past=None``: a plain causal pass. Otherwise ``past`` holds an earlier pass's per-layer K/V, and position ``i``
    attends to that pass's keys/values at ``j < i`` and to its own at ``i``: exactly what the draft computes at a
    drafting step, when the cache holds states computed from true features and only the newest token was fed an
    estimate (``features`` then holds those estimates).
    """
    c = model.config
    bsz, seq = tokens.shape
    pos = torch.arange(seq).expand(bsz, seq)
    x = model.embed(tokens, pos, features)
    rope = model.rope_tables(pos, x.dtype)
    scale = 1.0 / math.sqrt(c.head_dim)
    strict = torch.ones(seq, seq, dtype=torch.bool).tril(-1)
    kvs = []
    for i, layer in enumerate(model.blocks):
        q, k, v = _qkv(model, layer, layer.input_layernorm(x), rope)
        kvs.append((k, v))
        if past is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k1, v1 = past[i]
            scores = (q @ k1.transpose(-1, -2) * scale).masked_fill(~strict, float("-inf"))  # j < i: old pass
            own = (q * k).sum(-1, keepdim=True) * scale  # j = i: this pass
            probs = torch.softmax(torch.cat([scores, own], dim=-1).float(), dim=-1).to(q.dtype)
            out = probs[..., :seq] @ v1 + probs[..., seq:] * v
        x = x + layer.self_attn.o_proj(out.transpose(1, 2).reshape(bsz, seq, c.num_heads * c.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x), kvs


def _loss_terms(
    draft: Decoder,
    out: torch.Tensor,
    m: torch.Tensor,
    weight: torch.Tensor,
    p: torch.Tensor,
    col: torch.Tensor,
    target: torch.Tensor,
    estimates: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy, feature regression and top-1 of hidden states ``out``, positions weighted ``m * weight``."""
    logp = torch.log_softmax(draft.lm_head(out).float(), dim=-1)  # [B, L, head_vocab]
    w = m * weight
    n = w.sum().clamp(min=1.0)
    ce = (-(p * logp.gather(-1, col.clamp(min=0))).sum(-1) * w).sum() / n
    if not estimates:  # nothing to regress: the draft's states are not in the feature space
        return ce, ce.new_zeros(()), ((logp.argmax(-1) == col[..., 0]).float() * w).sum() / n
    reg = (F.smooth_l1_loss(out.float(), target, reduction="none").mean(-1) * w).sum() / n
    top1 = ((logp.argmax(-1) == col[..., 0]).float() * w).sum() / n
    return ce, reg, top1


@dataclass(frozen=True)
class FeatureLoss:
    """The loss of a feature draft (``feature_draft_loss``): cross-entropy + ``reg_weight`` x smooth-L1 of its hidden
    state against the target's, with uniform noise of half-width ``noise`` on the input features; ``unroll = 2`` adds
    the same loss for the second drafting step (1 or 2)."""

    reg_weight: float = 1.0
    noise: float = 0.0
    unroll: int = 2


@dataclass(frozen=True)
class FeatureTrainConfig:
    """Training of a feature draft (``train_feature_draft``): ``steps`` AdamW steps (linear warm-up over ``warmup``,
    cosine decay to 10%) at learning rate ``lr`` on ``loss``; ``max_seconds`` stops early (seconds of wall time); the
    draft is scored every ``eval_every`` steps and at the end; ``seed`` drives the feature noise."""

    steps: int
    lr: float = 1e-3
    warmup: int = 100
    loss: FeatureLoss = FeatureLoss(noise=0.1)
    max_seconds: float | None = None
    eval_every: int = 500
    seed: int = 0


def feature_draft_loss(
    draft: Decoder,
    batch: Sequence[torch.Tensor],
    loss: FeatureLoss = FeatureLoss(),
    *,
    generator: torch.Generator | None = None,
    lookup: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Training loss of a feature draft on one batch; returns ``(loss, {"ce", "reg", "top1", "top1_step2"})``.

    ``batch = (tokens [B, L], hidden [B, L, H], mask [B, L], topk_ids [B, L, k], topk_logp [B, L, k])``: the
    target's features of ``tokens``, whether a position has a teacher distribution, and that distribution.
    Cross-entropy (nats) is against the teacher's renormalised top-k restricted to the head's tokens, plus
    ``loss.reg_weight`` x smooth-L1 of the draft's hidden state against the target's (``FeatureLoss``).
    ``unroll = 2`` adds the same loss for the second drafting step: each position fed the draft's own estimate of the
    previous feature (zeros for a draft that cannot estimate, see ``augment_draft``), attending to the first pass's
    K/V (``unrolled_hidden``), as at inference. The regression term exists only for drafts whose width is the
    feature width. ``top1``/``top1_step2``: the fraction of masked positions whose head argmax is the teacher's top-1
    (agreement with the target's greedy choice). ``lookup``: ``_head_index(draft)``, computed when not given.
    """
    if loss.unroll not in (1, 2):
        raise DraftError(f"unroll must be 1 or 2; got {loss.unroll}")
    tokens, hidden, mask, topk_ids, topk_logp = batch
    lookup = _head_index(draft) if lookup is None else lookup
    col = lookup[topk_ids]  # [B, L, k]
    p = torch.softmax(topk_logp.float(), dim=-1) * (col >= 0)
    m = mask.float()
    target = hidden.float()
    estimates = estimates_features(draft.config)
    feats = shift_features(target)
    if loss.noise > 0:
        feats = feats + (torch.rand(feats.shape, generator=generator) * 2 - 1) * loss.noise
    out, kvs = unrolled_hidden(draft, tokens, feats)
    ce, reg, top1 = _loss_terms(draft, out, m, torch.ones_like(m), p, col, target, estimates)
    total = ce + loss.reg_weight * reg
    parts = {"ce": float(ce.detach()), "reg": float(reg.detach()), "top1": float(top1)}
    if loss.unroll == 2:
        step_feats = shift_features(out) if estimates else torch.zeros_like(feats)
        out2, _ = unrolled_hidden(draft, tokens, step_feats, past=kvs)
        prev = torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], dim=1)  # step 2 follows a scored step 1
        ce2, reg2, top2 = _loss_terms(draft, out2, m, prev, p, col, target, estimates)
        total = total + ce2 + loss.reg_weight * reg2
        parts["top1_step2"] = float(top2)
    return total, parts


def train_feature_draft(
    draft: Decoder,
    batches: Callable[[int], Sequence[torch.Tensor]],
    config: FeatureTrainConfig | None = None,
    *,
    eval_fn: Callable[[Decoder], float] | None = None,
    log: Callable[[str], None] = print,
    progress: bool = True,
    **legacy: Any,
) -> Decoder:
    """Train ``draft`` in place as ``config`` (a ``FeatureTrainConfig``) says and return the best state seen.

    ``batches(step)`` returns ``(tokens, hidden, mask, topk_ids, topk_logp)`` for that step (see
    ``feature_draft_loss``); ``eval_fn(draft) -> score`` (higher is better, e.g. held-out agreement) is called every
    ``config.eval_every`` steps and at the end, and the best-scoring weights are kept. Runs in bfloat16 autocast on
    CPU. ``progress``: show a tqdm bar with running losses. Deprecated: ``config``'s fields as keywords (``steps=``,
    ``lr=``, ..., and ``reg_weight=``/``noise=``/``unroll=`` of its ``loss``; use ``FeatureTrainConfig(...)``).
    """
    config = _legacy_config("train_feature_draft", config, legacy)
    if config.steps < 1:
        raise DraftError(f"steps must be >= 1; got {config.steps}")
    opt, sched = _adamw_with_schedule(draft, config.lr, config.warmup, config.steps)
    gen = torch.Generator().manual_seed(config.seed)
    lookup = _head_index(draft)
    best: tuple[float, dict[str, torch.Tensor] | None] = (-math.inf, None)
    t0 = time.perf_counter()
    run: dict[str, float] = {}
    draft.train()
    bar = tqdm(range(config.steps), desc="feature draft", unit="step", disable=not progress)
    for step in bar:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, parts = feature_draft_loss(draft, batches(step), config.loss, generator=gen, lookup=lookup)
        _optimizer_step(draft, loss, opt, sched)
        run = {k: v if k not in run else 0.98 * run[k] + 0.02 * v for k, v in parts.items()}
        bar.set_postfix({k: f"{v:.3f}" for k, v in run.items()})
        done = config.max_seconds is not None and time.perf_counter() - t0 > config.max_seconds
        if (step + 1) % config.eval_every == 0 or done:
            best = _evaluate_keep_best(draft, eval_fn, step + 1, t0, log, best)
        if done:
            log(f"stopped at step {step + 1}: time budget of {config.max_seconds:.0f} s used")
            break
    else:
        if config.steps % config.eval_every:
            best = _evaluate_keep_best(draft, eval_fn, config.steps, t0, log, best)
    draft.eval()
    if best[1] is not None:
        draft.load_state_dict(best[1])
    return draft


def _legacy_config(func: str, config: FeatureTrainConfig | None, legacy: dict[str, Any]) -> FeatureTrainConfig:
    """``config``, or the ``FeatureTrainConfig`` built from the deprecated keywords ``legacy`` (``accel._legacy``: one
    ``DeprecationWarning`` naming them; unknown keywords, or both forms, a TypeError)."""
    objects, _ = legacy_keywords(func, legacy, [_CONFIG], {"config": config}, keep=())
    if objects["config"] is None:
        raise TypeError(f"{func}() needs config=FeatureTrainConfig(steps=...)")
    return objects["config"]


def _train_config(**kw: Any) -> FeatureTrainConfig:
    """``FeatureTrainConfig`` of the deprecated keywords, the loss's own (``reg_weight``, ``noise``, ``unroll``) in
    its ``FeatureLoss``."""
    if "steps" not in kw:
        raise TypeError("train_feature_draft() needs config=FeatureTrainConfig(steps=...)")
    loss_names = {f.name for f in fields(FeatureLoss)}
    loss = replace(FeatureTrainConfig.loss, **{k: v for k, v in kw.items() if k in loss_names})
    return FeatureTrainConfig(**{k: v for k, v in kw.items() if k not in loss_names}, loss=loss)


_CONFIG = Replaced(
    "config",
    _train_config,
    {f.name: f.name for cls in (FeatureTrainConfig, FeatureLoss) for f in fields(cls) if f.name != "loss"},
    label="FeatureTrainConfig",
)


def _adamw_with_schedule(
    draft: Decoder, lr: float, warmup: int, steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters with a linear warm-up and a cosine decay to 10% over ``steps``."""
    opt = torch.optim.AdamW(
        [p for p in draft.parameters() if p.requires_grad], lr=lr, weight_decay=0.0, betas=(0.9, 0.95)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    )
    return opt, sched


def _optimizer_step(
    draft: Decoder, loss: torch.Tensor, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR
) -> None:
    """Back-propagate ``loss``, clip the gradient norm to 1 and step the optimiser and its schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    opt.step()
    sched.step()


def _evaluate_keep_best(
    draft: Decoder,
    eval_fn: Callable[[Decoder], float] | None,
    step: int,
    t0: float,
    log: Callable[[str], None],
    best: tuple[float, dict[str, torch.Tensor] | None],
) -> tuple[float, dict[str, torch.Tensor] | None]:
    """Score and log ``draft`` with ``eval_fn``; returns the new ``(best score, its weights)``."""
    if eval_fn is None:
        return best
    draft.eval()
    with torch.no_grad():
        score = eval_fn(draft)
    draft.train()
    log(f"step {step}: eval {score:.4f} ({time.perf_counter() - t0:.0f} s)")
    if score > best[0]:
        return score, {k: v.detach().clone() for k, v in draft.state_dict().items()}
    return best


@torch.no_grad()
def greedy_acceptance(
    draft: Decoder,
    sequences: Sequence[torch.Tensor],
    prompt_lengths: Sequence[int],
    hidden: Sequence[torch.Tensor],
    max_k: int = 4,
) -> list[float]:
    """Exact greedy drafting on fixed sequences: ``P_j`` (j = 0..max_k-1), over every start position in the generated
    part, the fraction where the draft's first j+1 greedy proposals all equal the sequence's next tokens.

    Each start ``p`` feeds the draft token ``p`` with the target's feature at ``p - 1`` (its cache holding true-feature
    states of the earlier positions), then drafts with its own estimates, exactly as ``accel.spd`` does; for greedy
    target continuations this is the acceptance greedy SpD would see. ``sequences`` are 1-D token tensors,
    ``hidden`` the target's final-norm states ``[L, H]`` of each, ``prompt_lengths`` the unscored prompt lengths.
    ``E[tokens per round]`` at K is ``1 + sum(P[:K])``.
    """
    hits, starts = [0] * max_k, 0
    estimates = estimates_features(draft.config)
    for seq, plen, hid in zip(sequences, prompt_lengths, hidden, strict=True):
        seq, length = seq.long(), len(seq)
        if plen < 1 or plen >= length:
            raise DraftError(f"prompt length {plen} leaves nothing to score in a sequence of {length} tokens")
        feats = shift_features(hid[None].float())
        keys, values = new_cache(draft.config, 1, length + max_k + 1)
        pos = torch.arange(length)[None]
        if plen > 1:
            extra = ExtraInputs(features=feats[:, : plen - 1])
            _, keys, values = draft.hidden_forward(seq[None, : plen - 1], pos[:, : plen - 1], keys, values, True, extra)
        for p in range(plen - 1, length - 1):
            extra = ExtraInputs(features=feats[:, p : p + 1])
            out, keys, values = draft.hidden_forward(seq[None, p : p + 1], pos[:, p : p + 1], keys, values, True, extra)
            starts += 1
            for j in range(min(max_k, length - 1 - p)):
                tok = int(draft.logits(out[:, -1]).argmax())
                if tok != int(seq[p + 1 + j]):
                    break
                hits[j] += 1
                est = out[:, -1:] if estimates else torch.zeros_like(feats[:, :1])
                out, keys, values = draft.hidden_forward(
                    torch.tensor([[tok]]), torch.tensor([[p + 1 + j]]), keys, values, True, ExtraInputs(features=est)
                )
    return [h / max(starts, 1) for h in hits]


def load_feature_shards(data_dir: str | Path, feature_dir: str | Path) -> list[tuple[Path, Path]]:
    """Pairs ``(data shard, feature shard)`` with the same file name in both directories (DraftError if none)."""
    data_dir, feature_dir = Path(data_dir), Path(feature_dir)
    pairs = [
        (p, feature_dir / p.name) for p in sorted(data_dir.glob("*.safetensors")) if (feature_dir / p.name).is_file()
    ]
    if not pairs:
        raise DraftError(f"no data shards in {data_dir} with features in {feature_dir}")
    return pairs
