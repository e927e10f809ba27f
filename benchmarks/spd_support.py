"""Parts of benchmarks/spd.py: stand-in and tied-head drafts, per-call latency, run aggregation, transformers'
baselines, the quantized target's distance to fp32, and the plot. Imported by the script (same folder)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from accel.backends.base import TreeInputs
from accel.backends.calls import chain_tree_inputs

__all__ = ["aggregate", "call_latency_s", "full_head_copy", "hf_assisted", "layer_skip_draft", "plot", "target_quality"]


def layer_skip_draft(target, num_layers: int):
    """The target's embeddings + first ``num_layers`` blocks + its final norm and LM head (shared weights copied)."""
    from accel.models import Decoder

    draft = Decoder(target.config.with_(num_layers=num_layers))
    state = {
        k: v for k, v in target.state_dict().items() if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers
    }
    draft.load_state_dict(state)
    return draft.eval()


def full_head_copy(draft):
    """``draft`` itself, or for a restricted LM head (``head_vocab``) the tied full-vocabulary model it was cut from
    by ``accel.drafts.restrict_head`` (its head rows are the embedding rows), for transformers' assisted generation.
    At the kept ids the logits are equal; elsewhere transformers' draft may propose tokens ours cannot."""
    import torch

    from accel.models import Decoder

    if not draft.config.head_vocab:
        return draft
    full = Decoder(draft.config.with_(head_vocab=0, tie_word_embeddings=True))
    state = {k: v for k, v in draft.state_dict().items() if not k.startswith("lm_head")}
    full.load_state_dict(state, strict=False)
    kept = draft.lm_head_token_ids
    if not torch.allclose(full.embed_tokens.weight[kept], draft.lm_head.weight, atol=1e-6):
        raise SystemExit("the draft's restricted head is not a subset of its embedding; cannot build a tied copy")
    return full.eval()


def call_latency_s(backend, seq_lens, past_len: int, repeats: int, tree: bool = False) -> dict[int, float]:
    """Median seconds of one forward with S new tokens at positions past_len .. past_len+S-1 (cache pre-filled);
    ``tree``: as a tree call (``tree=TreeInputs(...)`` given; the mask is dense, so any tree shape costs the same).

    The S values are interleaved within each of the ``repeats`` passes, so a load change on a shared machine shifts
    every S alike instead of bending the S-curve the simulator is calibrated on. A feature draft gets random target
    features (prepared outside the timed call)."""
    rng = np.random.default_rng(0)
    vocab, width = backend.info.vocab_size, backend.info.feature_size

    def make(ids, start):
        pos = np.arange(start, start + ids.shape[1])[None, :]
        kw = {"features": rng.standard_normal((*ids.shape, width)).astype(np.float32)} if width else {}
        return ids, pos, kw

    def as_tree(ids, pos, kw):
        slots, mask = chain_tree_inputs(pos, backend.info.ctx_len)
        return ids, pos, {**kw, "tree": TreeInputs(slots, mask)}

    backend.reset()
    prompt = rng.integers(0, vocab, size=(1, past_len))
    for s in range(0, past_len, backend.info.max_seq_len):
        ids, pos, kw = make(prompt[:, s : s + backend.info.max_seq_len], s)
        backend.forward(ids, pos, num_logits=1, **kw)
    inputs = {s: make(rng.integers(0, vocab, size=(1, s)), past_len) for s in seq_lens}
    if tree:
        inputs = {s: as_tree(*x) for s, x in inputs.items()}
    times: dict[int, list[float]] = {s: [] for s in seq_lens}
    for ids, pos, kw in inputs.values():  # warm-up
        backend.forward(ids, pos, num_logits=ids.shape[1], **kw)
    for _ in range(repeats):
        for s, (ids, pos, kw) in inputs.items():
            t0 = time.perf_counter()
            backend.forward(ids, pos, num_logits=s, **kw)
            times[s].append(time.perf_counter() - t0)
    return {s: statistics.median(t) for s, t in times.items()}


def _hist_mean(hists: list[list[int]]) -> float | None:
    """The mean value of pooled histograms (count of value i at index i); None when empty."""
    width = max((len(h) for h in hists), default=0)
    pooled = np.zeros(width)
    for h in hists:
        pooled[: len(h)] += h
    return float(pooled @ np.arange(width) / pooled.sum()) if pooled.sum() else None


def aggregate(results, mode: str, sampling: str, k: int, min_draft_prob: float | None = None) -> dict:
    new = sum(r.stats.new_tokens for r in results)
    wall = sum(r.stats.wall_s for r in results)
    prefill = sum(r.stats.prefill_s for r in results)
    row = {
        "mode": mode,
        "sampling": sampling,
        "k": k,
        "min_draft_prob": min_draft_prob,
        "tokens_per_s": new / wall,
        "new_tokens": new,
        "wall_s": wall,
        "prefill_s": prefill,
        "decode_tokens_per_s": new / (wall - prefill),
        "alpha": None,
        "mean_tokens_per_loop": 1.0,
    }
    if mode != "ar":
        acc = sum(r.stats.accepted_drafts for r in results)
        reached = sum(r.stats.proposed_drafts for r in results)
        rounds = sum(r.stats.row_calls for r in results)
        row["alpha"] = acc / reached if reached else None
        row["alpha_overlap"] = float(np.mean([r.stats.alpha_overlap for r in results]))
        row["mean_tokens_per_loop"] = (acc + rounds) / rounds
        # loop shape for accel.sim.LoopStats (dynamic draft lengths) and the pooled per-position acceptance
        row["loops"] = rounds
        row["drafts_per_loop"] = sum(r.stats.draft_tokens for r in results) / rounds
        row["all_accepted_fraction"] = sum(r.stats.all_accepted_rounds for r in results) / rounds
        width = max(len(r.stats.proposed_per_position) for r in results)  # a tree's depth may vary per run
        reached_at, accepted_at = np.zeros(width), np.zeros(width)
        for r in results:
            n = np.asarray(r.stats.proposed_per_position, dtype=np.float64)
            reached_at[: n.size] += n
            accepted_at[: n.size] += np.nan_to_num(np.asarray(r.stats.acceptance_per_position) * n)
        row["acceptance_by_position"] = [
            float(a / n) if n else None for a, n in zip(accepted_at, reached_at, strict=True)
        ]
        row["draft_calls_per_loop"] = sum(r.stats.draft_calls_per_loop * r.stats.rounds for r in results) / sum(
            r.stats.rounds for r in results
        )
        row["lookup_loops"] = sum(r.stats.lookup_rounds for r in results)
        row["lookup_fraction"] = row["lookup_loops"] / rounds
        row["lookup_accepted"] = sum(r.stats.lookup_accepted for r in results)
        row["tree_rounds"] = sum(r.stats.tree_rounds for r in results)
        row["mean_tree_nodes"] = _hist_mean([r.stats.tree_nodes_histogram for r in results])
        row["mean_tree_depth"] = _hist_mean([r.stats.tree_depth_histogram for r in results])
        row["draft_s"] = sum(r.stats.draft_s for r in results)
        row["target_s"] = sum(r.stats.target_s for r in results)
        row["host_s"] = sum(r.stats.host_s for r in results)
    return row


def hf_assisted(
    target_dir: Path, draft_dir: Path, prompts_ids, max_new: int, temperature: float, ngram: int = 0, ngram_k: int = 4
) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()

    tgt = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    dft = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    out: dict = {"threads": torch.get_num_threads()}
    settings = [("greedy", dict(do_sample=False)), ("multinomial", dict(do_sample=True, temperature=temperature))]
    for name, kw in settings:
        labels = [("ar", {}), ("assisted", {"assistant_model": dft})]
        if ngram:  # transformers' own n-gram lookup (prompt lookup decoding; it cannot combine it with a draft model)
            labels.append(("lookup", {"prompt_lookup_num_tokens": ngram_k, "max_matching_ngram_size": ngram}))
        for label, extra in labels:
            new = 0
            wall = 0.0
            torch.manual_seed(0)
            for ids in tqdm(prompts_ids, desc=f"transformers {label} {name}", leave=False):
                x = torch.tensor([ids])
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    y = tgt.generate(
                        x,
                        attention_mask=torch.ones_like(x),
                        max_new_tokens=max_new,
                        min_new_tokens=max_new,
                        pad_token_id=0,
                        **kw,
                        **extra,
                    )
                    wall += time.perf_counter() - t0
                new += y.shape[1] - x.shape[1]
            out[f"{label}_{name}_tokens_per_s"] = new / wall
    return out


def target_quality(quant, ref, prompts_ids, continuations) -> dict:
    """How far the quantized target ``quant`` is from the fp32 one ``ref`` (both OrtBackend), teacher-forced on the
    fp32 target's greedy ``continuations``: top-1 agreement and mean KL(fp32 || quantized) in nats per position, and
    how many greedy continuations of ``quant`` (from the benchmark's own AR run) equal the fp32 ones."""
    agree = kl = positions = 0.0
    for ids, cont in zip(prompts_ids, continuations, strict=True):
        seq = np.array([list(ids) + list(cont[:-1])])
        pos = np.arange(seq.shape[1])[None, :]
        ref.reset()
        quant.reset()
        a = ref.forward(seq, pos)[0, len(ids) - 1 :].astype(np.float64)
        b = quant.forward(seq, pos)[0, len(ids) - 1 :].astype(np.float64)
        la = a - a.max(-1, keepdims=True)
        la -= np.log(np.exp(la).sum(-1, keepdims=True))
        lb = b - b.max(-1, keepdims=True)
        lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
        agree += float((a.argmax(-1) == b.argmax(-1)).sum())
        kl += float((np.exp(la) * (la - lb)).sum())
        positions += len(a)
    return {"top1_agreement": agree / positions, "kl_nats": kl / positions, "positions": int(positions)}


def plot(runs: list[dict], hf: dict | None, path: Path) -> None:
    """tokens/s vs K for SpD (greedy, multinomial), AR and transformers' assisted generation as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for sampling, color in (("greedy", "tab:blue"), ("multinomial", "tab:orange")):
        ar = next((r for r in runs if r["mode"] == "ar" and r["sampling"] == sampling), None)
        if ar is None:  # --greedy-only
            continue
        spd = sorted((r for r in runs if r["mode"] == "spd" and r["sampling"] == sampling), key=lambda r: r["k"])
        ax.plot([r["k"] for r in spd], [r["tokens_per_s"] for r in spd], "o-", color=color, label=f"SpD {sampling}")
        feat = sorted((r for r in runs if r["mode"] == "spd_feat" and r["sampling"] == sampling), key=lambda r: r["k"])
        if feat:
            ax.plot(
                [r["k"] for r in feat],
                [r["tokens_per_s"] for r in feat],
                "s-",
                color=color,
                alpha=0.6,
                label=f"SpD {sampling}, feature draft",
            )
        ax.axhline(ar["tokens_per_s"], color=color, ls="--", label=f"AR {sampling}")
        if hf:
            ax.axhline(hf[f"assisted_{sampling}_tokens_per_s"], color=color, ls=":", label=f"HF assisted {sampling}")
    ax.set_xlabel("K (draft tokens per round)")
    ax.set_ylabel("tokens/s")
    ax.set_title("accel.spd on onnxruntime")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
