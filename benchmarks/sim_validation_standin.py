"""The numpy stand-in of ``benchmarks/sim_validation.py``: a Llama-like decoder step (fp32 weights stored (out, in),
W @ x.T, attention over a preallocated KV cache, LM head on the last ``num_logits`` rows, argmax), a target and a small
draft; per-call times at S = 1..8 and AR / SpD runs with i.i.d. synthetic acceptance (numpy RNG, fixed seed), written
in the measurement schema that ``sim_validation_compare.load_measurements`` reads."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from tqdm import tqdm

from accel import sim

TARGET_CFG = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1376,
    "vocab_size": 8000,
    "tie_word_embeddings": False,
}
DRAFT_CFG = {
    "model_type": "llama",
    "hidden_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "intermediate_size": 512,
    "vocab_size": 8000,
    "tie_word_embeddings": False,
}
PROMPT_LEN, GEN_LEN, CTX = 128, 16, 512
KS, ALPHA, ROUNDS = (1, 2, 3, 4, 5, 7), 0.8, 20
# CPU time of this (single-threaded) process: unlike wall time it excludes the time slices other jobs take on the
# shared 2-core machine (memory-bandwidth contention remains). ``use_wall_clock()`` measures wall time instead.
CLOCK: Callable[[], float] = time.process_time


def use_wall_clock() -> None:
    """Time with wall-clock seconds (``--wall``) instead of this process's CPU seconds."""
    global CLOCK
    CLOCK = time.perf_counter


class StandIn:
    """A Llama-like decoder step in numpy (fp32), the cost structure of a real one: every weight read once per call."""

    def __init__(self, cfg: dict, seed: int) -> None:
        self.spec = sim.from_hf_config(cfg, name=f"standin-{cfg['hidden_size']}")
        s = self.spec
        rng = np.random.default_rng(seed)

        def w(o, i):
            return (rng.standard_normal((o, i), dtype=np.float32) / np.sqrt(i)).astype(np.float32)

        self.layers = [
            dict(
                qkv=w(s.q_dim + 2 * s.kv_dim, s.d_model),
                o=w(s.d_model, s.q_dim),
                gu=w(2 * s.ffn_dim, s.d_model),
                d=w(s.d_model, s.ffn_dim),
            )
            for _ in range(s.n_layers)
        ]
        self.embed = rng.standard_normal((s.vocab_size, s.d_model), dtype=np.float32)
        self.head = w(s.vocab_size, s.d_model)
        self.k = np.zeros((s.n_layers, CTX, s.n_heads, s.dim_head), np.float32)
        self.v = np.zeros_like(self.k)

    def __call__(self, tokens: np.ndarray, pos: int, num_logits: int) -> np.ndarray:
        s, S = self.spec, len(tokens)
        H, hd, q = s.n_heads, s.dim_head, s.q_dim
        h = self.embed[tokens]  # (S, d)
        mask = np.arange(pos + S)[None, :] > (pos + np.arange(S))[:, None]  # causal over cached + new keys
        for i, lw in enumerate(self.layers):
            x = h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + 1e-6)
            qkv = (lw["qkv"] @ x.T).T  # weights (out, in): W @ x.T
            self.k[i, pos : pos + S] = qkv[:, q : 2 * q].reshape(S, H, hd)
            self.v[i, pos : pos + S] = qkv[:, 2 * q :].reshape(S, H, hd)
            qh = qkv[:, :q].reshape(S, H, hd)
            sc = np.einsum("shd,lhd->hsl", qh, self.k[i, : pos + S]) / np.sqrt(hd)
            sc[:, mask] = -1e30
            sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
            sc /= sc.sum(axis=-1, keepdims=True)
            att = np.einsum("hsl,lhd->shd", sc, self.v[i, : pos + S]).reshape(S, q)
            h = h + (lw["o"] @ att.T).T
            x = h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + 1e-6)
            gu = lw["gu"] @ x.T
            g, u = gu[: s.ffn_dim], gu[s.ffn_dim :]
            h = h + (lw["d"] @ (g / (1 + np.exp(-g)) * u)).T
        logits = self.head @ h[-num_logits:].T  # (V, num_logits)
        return np.argmax(logits, axis=0)


def _median_call(model: StandIn, S: int, L: int, num_logits: int, reps: int = 7, warm: bool = True) -> float:
    toks = np.arange(S) % model.spec.vocab_size
    if warm:
        model(toks, L, num_logits)
    ts = []
    for _ in range(reps):
        t0 = CLOCK()
        model(toks, L, num_logits)
        ts.append(CLOCK() - t0)
    return float(np.median(ts))


def ar_run(target: StandIn, gen_len: int) -> float:
    tok, pos = np.array([1]), PROMPT_LEN
    t0 = CLOCK()
    for _ in range(gen_len):
        tok = target(tok, pos, 1)
        pos += 1
    return gen_len / (CLOCK() - t0)


def spd_run(target: StandIn, draft: StandIn, k: int, alpha: float, loops: int, rng) -> dict:
    """``loops`` loops of K draft calls + one (K+1)-token scoring call; acceptance i.i.d. Bernoulli(alpha) (the timing
    does not depend on which tokens are accepted). All-accepted loops make the next first draft call feed 2 tokens.
    A fixed number of loops (not of tokens) keeps tokens/loop unbiased: stopping at a token count favours long loops."""
    pos, made, tried, accepted_by_pos = PROMPT_LEN, 0, np.zeros(k), np.zeros(k)
    pending = np.array([1])  # tokens the draft has not seen yet
    t0 = CLOCK()
    for _ in range(loops):
        dpos = pos - len(pending) + 1
        toks = draft(pending, dpos, 1)
        drafts = [toks[-1]]
        for j in range(1, k):
            drafts.append(draft(np.array([drafts[-1]]), pos + j, 1)[-1])
        target(np.concatenate([[pending[-1]], drafts]).astype(np.int64), pos, k + 1)
        acc = rng.random(k) < alpha
        n = int(np.argmin(acc)) if not acc.all() else k
        tried[: min(n + 1, k)] += 1
        accepted_by_pos[:n] += 1
        made += n + 1
        pos += n + 1
        pending = np.array([drafts[-1], 1]) if n == k else np.array([1])
    dt = CLOCK() - t0
    return {
        "tokens_per_s": made / dt,
        "tokens": made,
        "loops": loops,
        "time_s": dt,
        "mean_accepted_per_loop": made / loops - 1,
        "acceptance_by_position": [float(a / t) if t else alpha for a, t in zip(accepted_by_pos, tried, strict=True)],
    }


def measure_standin() -> dict:
    """Many short rounds of: every per-call timing once, then AR, SpD(K1), AR, SpD(K2), ..., AR (16 tokens each).
    The machine is shared: even in CPU time a call's cost drifts by +-30 % within seconds (memory-bandwidth
    contention), so short interleaved segments and medians over rounds; two more habits cancel the drift:
    - per-call times are normalized by the round's target S=1 time, the median normalized value is scaled back by the
      median target S=1 time (relative costs are what the SpD prediction depends on);
    - each SpD run records the mean of the AR runs just before and after it (``ar_reference_tokens_per_s``), and the
      measured speedup is sum(tokens) / sum(SpD time x that AR rate) over rounds (a ratio of sums)."""
    target, draft = StandIn(TARGET_CFG, 0), StandIn(DRAFT_CFG, 1)
    jobs = [("target", 1, L) for L in (64, 192, 320)] + [("target", S, 192) for S in (2, 3, 4, 5, 6, 8)]
    jobs += [("draft", 1, L) for L in (64, 192, 320)] + [("draft", 2, 192)]
    ref = ("target", 1, 192)
    times: dict[tuple, list[float]] = {j: [] for j in jobs}
    rng = np.random.default_rng(2024)
    runs = []
    for _ in tqdm(range(ROUNDS), desc="rounds (per-call times, AR and SpD runs)"):
        for job in jobs:
            name, S, L = job
            times[job].append(_median_call(target if name == "target" else draft, S, L, S, reps=1, warm=False))
        ar_before = ar_run(target, GEN_LEN)
        runs.append({"mode": "ar", "k": 0, "tokens_per_s": ar_before, "gen_len": GEN_LEN})
        for k in KS:
            r = spd_run(target, draft, k, ALPHA, max(2, round(GEN_LEN / sim.expected_tokens(ALPHA, k))), rng)
            ar_after = ar_run(target, GEN_LEN)
            runs.append(
                {
                    "mode": "spd",
                    "k": k,
                    "alpha": ALPHA,
                    "gen_len": GEN_LEN,
                    "ar_reference_tokens_per_s": (ar_before + ar_after) / 2,
                    **r,
                }
            )
            runs.append({"mode": "ar", "k": 0, "tokens_per_s": ar_after, "gen_len": GEN_LEN})
            ar_before = ar_after
    ref_t = np.array(times[ref])
    calls = [
        {
            "model": n,
            "seq_len": S,
            "past_len": L,
            "num_logits": S,
            "seconds": float(np.median(np.array(times[(n, S, L)]) / ref_t) * np.median(ref_t)),
            "seconds_raw_median": float(np.median(times[(n, S, L)])),
        }
        for n, S, L in jobs
    ]
    return {
        "target": TARGET_CFG,
        "draft": DRAFT_CFG,
        "format": "fp32",
        "kv_format": "fp32",
        "prompt_len": PROMPT_LEN,
        "calls": calls,
        "runs": runs,
        "source": "numpy stand-in (sim_validation.py)",
    }
