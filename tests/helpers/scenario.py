"""A shared decoding scenario for backend tests: batch 2 with left padding, prefill, 3 single-token steps, one
4-token scoring step -- and tiny Hugging Face reference models of every supported family."""

from __future__ import annotations

import functools

import numpy as np
import torch

STEPS = 3  # single-token steps after the prefill
SCORE = 4  # tokens in the final scoring call (K + 1 with K = 3)


def make_tokens(vocab: int, prompt_lens: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    """Per row: the whole token sequence (prompt + STEPS + SCORE tokens)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n + STEPS + SCORE) for n in prompt_lens]


def run_scenario(backend, rows: list[np.ndarray], prompt_lens: tuple[int, ...]) -> list[np.ndarray]:
    """Drive ``backend`` through prefill (left-padded), STEPS single steps and one SCORE-token call.

    Returns per row the logits ``[len(row), V]`` at positions 0..len-1 (the backend's outputs, in position order).
    """
    bsz, width = len(rows), max(prompt_lens)
    ids = np.zeros((bsz, width), np.int64)
    pos = np.full((bsz, width), -1, np.int64)
    for b, n in enumerate(prompt_lens):
        ids[b, width - n :] = rows[b][:n]
        pos[b, width - n :] = np.arange(n)
    out = [[] for _ in rows]
    logits = backend.forward(ids, pos)
    for b, n in enumerate(prompt_lens):
        out[b].extend(logits[b, width - n :])
    for s in range(STEPS):
        step_ids = np.array([[r[n + s]] for r, n in zip(rows, prompt_lens, strict=True)])
        step_pos = np.array([[n + s] for n in prompt_lens])
        logits = backend.forward(step_ids, step_pos, num_logits=1)
        for b in range(bsz):
            out[b].append(logits[b, 0])
    sc_ids = np.stack([r[n + STEPS : n + STEPS + SCORE] for r, n in zip(rows, prompt_lens, strict=True)])
    sc_pos = np.stack([np.arange(n + STEPS, n + STEPS + SCORE) for n in prompt_lens])
    logits = backend.forward(sc_ids, sc_pos, num_logits=SCORE)
    for b in range(bsz):
        out[b].extend(logits[b])
    return [np.stack(o) for o in out]


def hf_reference(hf_model, rows: list[np.ndarray]) -> list[np.ndarray]:
    """Transformers' logits over each whole row (no cache, no padding): the reference for ``run_scenario``."""
    with torch.no_grad():
        return [hf_model(torch.from_numpy(r[None]).long()).logits[0].float().numpy() for r in rows]


def tiny_hf_model(family: str, seed: int = 0):
    """A tiny random transformers causal LM of ``family`` (llama with llama3 rope scaling, qwen2 with biases and
    tied embeddings, mistral, gpt2)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=96, num_hidden_layers=2, intermediate_size=80, max_position_embeddings=128)
    if family == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            **common,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        )
        model = tf.LlamaForCausalLM(cfg)
    elif family == "qwen2":
        cfg = tf.Qwen2Config(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True, **common
        )
        model = tf.Qwen2ForCausalLM(cfg)
    elif family == "mistral":
        cfg = tf.MistralConfig(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=2, sliding_window=None, **common
        )
        model = tf.MistralForCausalLM(cfg)
    elif family == "gpt2":
        cfg = tf.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, vocab_size=96, n_positions=128, bos_token_id=0, eos_token_id=0
        )
        model = tf.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(family)
    with torch.no_grad():  # non-trivial norms and biases so a mix-up cannot hide
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name or "ln" in name else 0.0))
    return model.eval()


@functools.lru_cache(maxsize=1)
def smollm2_model():
    """SmolLM2-135M as a ``Decoder``, loaded from the cached HF-style conversion (``smollm2_checkpoint()``, built once
    per machine from the GGUF; ``ACCEL_CACHE`` overrides its location). Shared by every test in a process."""
    from accel.models import load_checkpoint, smollm2_checkpoint

    return load_checkpoint(smollm2_checkpoint())
