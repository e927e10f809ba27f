"""Validate accel.sim: (1) against published decode measurements of Cloud AI 100 and GPUs (accel/sim/published.py:
calibrate one point per device, predict the rest; and with the catalog's stock defaults), (2) against measurements
on this machine: calibrate on S = 1 calls + the multi-token S-curve, then predict autoregressive and speculative
decoding tokens/s and compare with measured runs.

    python benchmarks/sim_validation.py [--published-only] [--spd results/spd.json | --standin] [--wall]

Data source:
- ``results/spd.json`` when benchmarks/spd.py has written it (onnxruntime, SmolLM2 + draft). Fields read (anything
  else is ignored; docs/spd.md documents the file):
    {"target": {config}, "draft": {config}     HF config.json fields or accel.models ModelConfig.to_dict()
     "format": "fp32", "kv_format": "fp32"     optional (default fp32: exported ONNX graphs run in fp32)
     "prompt_len": P                            optional (default: the past length of the calls)
     "settings": {"max_new_tokens": G}          optional
     "calls": [{"model": "target"|"draft"|"feature_draft" (not compared), "seq_len": S, "past_len": L, "seconds": t,
                "num_logits": n (optional, default S)}, ...]   (feature_draft calls calibrate the feature draft)
     "feature_draft": {config}                  optional: a feature draft's config (calls model "feature_draft")
     "runs": [{"mode": "ar"|"spd"|"spd_dyn"|"spd_feat"|"spd_feat_dyn", "k": K (the cap for *_dyn), "tokens_per_s": x,
               "sampling": "greedy"|... (optional: runs are compared within one sampling setting),
               "decode_tokens_per_s": x (optional, preferred: prefill excluded), "min_draft_prob": p (*_dyn),
               *_dyn runs: "mean_tokens_per_loop", "drafts_per_loop", optional "all_accepted_fraction" and
               "loops" (accel.sim.LoopStats; older files without drafts_per_loop: skipped), else
               acceptance: "tokens"+"loops" (realized totals) or "mean_tokens_per_loop" (E) or
               "mean_accepted_per_loop" (E - 1) or "acceptance_by_position" or "alpha",
               "host_s" (optional: total host seconds, spread over the run's loops as host_s per loop),
               "ar_reference_tokens_per_s" (optional: AR measured right around this run; with "tokens" and
               "time_s" the measured speedup is sum(tokens) / sum(time_s * ar_reference), else the median of the
               paired ratios)}, ...]}
- otherwise a self-contained stand-in: a numpy Llama-like decoder step (fp32 weights stored (out, in), W @ x.T,
  attention over a preallocated KV cache, LM head on the last ``num_logits`` rows, argmax), a target and a small
  draft; per-call times at S = 1..8 and AR / SpD runs with i.i.d. synthetic acceptance (numpy RNG, fixed seed).
  The measured data is written in the schema above (results/sim_validation_measurements.json) and analysed by the
  same code path as results/spd.json (``--standin`` forces it even when results/spd.json exists; ``--spd FILE``
  reads another benchmarks/spd.py output instead).

The draft is calibrated separately from the target (its weights are small enough to stay in cache: a different
effective bandwidth). Output: results/sim_validation.json. Goal: SpD speedup within 15 % of measured.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

# one BLAS thread: the 2 cores are shared with other jobs, and a spinning second thread makes timings erratic
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel import sim  # noqa: E402
from accel.errors import SimError  # noqa: E402

RESULTS = ROOT / "results"
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
# CPU time of this (single-threaded) process: unlike wall time it excludes the time slices other jobs take on the shared
# 2-core machine (memory-bandwidth contention remains). `--wall` measures wall time instead.
CLOCK = time.perf_counter if "--wall" in sys.argv else time.process_time


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600
    os.replace(tmp, path)


# --- the stand-in decoder -------------------------------------------------------------------------------------------
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


# --- reading and analysis -------------------------------------------------------------------------------------------
def load_measurements(data: dict) -> dict:
    """Validate the fields this script reads (module docstring); SimError naming the bad field otherwise."""
    if not isinstance(data, dict):
        raise SimError("measurement file must hold a JSON object")
    for key in ("target", "draft", "calls", "runs"):
        if key not in data:
            raise SimError(f"measurement file lacks {key!r}")
    for i, c in enumerate(data["calls"]):
        if (
            c.get("model") not in ("target", "draft", "feature_draft")
            or not all(isinstance(c.get(f), (int, float)) for f in ("seq_len", "past_len", "seconds"))
            or c["seconds"] <= 0
        ):
            raise SimError(
                f"calls[{i}] must have model target|draft|feature_draft, seq_len, past_len, seconds > 0: {c}"
            )
    if not any(c["model"] == m and c["seq_len"] == 1 for m in ("target", "draft") for c in data["calls"]):
        raise SimError("calls need S = 1 points of the target and the draft")
    for i, r in enumerate(data["runs"]):
        # spd_dyn / spd_feat_dyn: dynamic draft length (compared through accel.sim.LoopStats); spd_feat*: the
        # feature draft, with its own calls and config; *+ngram: with n-gram lookup drafts (LoopStats too)
        modes = ("ar", "spd", "spd_dyn", "spd_feat", "spd_feat_dyn")
        if (
            str(r.get("mode", "")).removesuffix("+ngram") not in modes
            or r.get("mode") == "ar+ngram"
            or not isinstance(r.get("tokens_per_s"), (int, float))
        ):
            raise SimError(f"runs[{i}] must have mode {'|'.join(modes)} and tokens_per_s: {r}")
        if r["mode"] != "ar" and not isinstance(r.get("k"), int):
            raise SimError(f"runs[{i}] ({r['mode']}) needs an integer k")
        if r["mode"] in ("spd", "spd_feat") and not any(
            r.get(f) is not None
            for f in ("loops", "mean_tokens_per_loop", "mean_accepted_per_loop", "acceptance_by_position", "alpha")
        ):
            raise SimError(f"runs[{i}] ({r['mode']}) has no acceptance field")
    if not any(r["mode"] == "ar" for r in data["runs"]):
        raise SimError("measurement file has no autoregressive run to compare speedups against")
    return data


def _loops(run: dict) -> float | None:
    if run.get("loops"):
        return float(run["loops"])
    if run.get("mean_tokens_per_loop") and run.get("new_tokens"):
        return run["new_tokens"] / run["mean_tokens_per_loop"]
    return None


def _acceptance(runs: list[dict], k: int) -> float | list[float]:
    """Acceptance of a group of SpD runs with the same K, pooled (priority: realized tokens per loop)."""
    if all(r.get("tokens") and r.get("loops") for r in runs):
        return sim.alpha_for_expected_tokens(sum(r["tokens"] for r in runs) / sum(r["loops"] for r in runs), k)
    if all(r.get("mean_tokens_per_loop") for r in runs):
        return sim.alpha_for_expected_tokens(float(np.mean([r["mean_tokens_per_loop"] for r in runs])), k)
    if all(r.get("mean_accepted_per_loop") is not None for r in runs):
        return sim.alpha_for_expected_tokens(float(np.mean([r["mean_accepted_per_loop"] for r in runs])) + 1.0, k)
    if all(r.get("acceptance_by_position") for r in runs):
        return [float(x) for x in np.mean([np.asarray(r["acceptance_by_position"][:k], float) for r in runs], 0)]
    return float(np.mean([r["alpha"] for r in runs]))


def _pooled(rs: list[dict], field: str) -> float:
    """A per-loop mean pooled over runs (weighted by their loops)."""
    loops = [_loops(r) or 1.0 for r in rs]
    return sum(r[field] * n for r, n in zip(rs, loops, strict=True)) / sum(loops)


def _compare(rs, mode, k, ar_tps, rate, default_gen, prompt_len, fmt, kv, tspec, hw_t, hw_t_flat, hw_d, dspec):
    """Predicted vs measured speedup of one group of SpD runs (same mode, K, min_draft_prob); None when the file
    lacks what the mode needs (a feature draft's calls, or a dynamic run's drafts_per_loop: files before 11-22)."""
    if hw_d is None:
        print(f"{mode} K={k}: no feature-draft calls or config in the file, skipped")
        return None
    stats = None
    lookup = mode.endswith("+ngram")
    if lookup and not all(
        r.get("draft_calls_per_loop") is not None and r.get("lookup_fraction") is not None for r in rs
    ):
        print(f"{mode} K={k}: no draft_calls_per_loop / lookup_fraction (benchmarks/spd.py since session 14), skipped")
        return None
    if mode.removesuffix("+ngram").endswith("_dyn") or lookup:
        if not all(r.get("drafts_per_loop") and r.get("mean_tokens_per_loop") for r in rs):
            print(f"{mode} K={k}: no drafts_per_loop (written by benchmarks/spd.py since 2026-11-22), skipped")
            return None
        stats = sim.LoopStats(
            tokens_per_loop=_pooled(rs, "mean_tokens_per_loop"),
            drafts_per_loop=_pooled(rs, "drafts_per_loop"),
            all_accepted_fraction=_pooled(rs, "all_accepted_fraction")
            if all(r.get("all_accepted_fraction") is not None for r in rs)
            else None,
            draft_calls_per_loop=_pooled(rs, "draft_calls_per_loop") if lookup else None,
            lookup_fraction=_pooled(rs, "lookup_fraction") if lookup else 0.0,
        )
    meas = float(np.median([r[rate] for r in rs]))
    if all(r.get("ar_reference_tokens_per_s") and r.get("time_s") and r.get("tokens") for r in rs):
        # paired with the AR runs around each SpD run (drift cancels); ratio of sums: each run's time in
        # units of the AR time of the moment, so every token weighs alike
        meas = sum(r["tokens"] for r in rs) / sum(r["time_s"] for r in rs)
        meas_speedup = sum(r["tokens"] for r in rs) / sum(r["time_s"] * r["ar_reference_tokens_per_s"] for r in rs)
    elif all(r.get("ar_reference_tokens_per_s") for r in rs):
        meas_speedup = float(np.median([r["tokens_per_s"] / r["ar_reference_tokens_per_s"] for r in rs]))
    else:
        meas_speedup = meas / ar_tps
    acc = None if stats is not None else _acceptance(rs, k)
    loops = [_loops(r) for r in rs]
    host_loop = (
        (sum(r["host_s"] for r in rs) / sum(loops))
        if all(r.get("host_s") is not None for r in rs) and all(loops)
        else 0.0
    )
    gen = int(rs[0].get("gen_len", default_gen))

    def predict(hw, host_s):
        p = sim.predict_speedup(
            tspec,
            dspec,
            hw,
            draft_hardware=hw_d,
            target_format=fmt,
            draft_format=fmt,
            kv_format=kv,
            k=k,
            acceptance=acc,
            prompt_len=prompt_len,
            gen_len=max(gen, 2),
            host_s=host_s,
            loop_stats=stats,
        )
        return p.config(f"{fmt} AR"), p.config(f"{fmt} + SpD")

    preds = {}
    for label, hw in (("calibrated", hw_t), ("pure_roofline", hw_t_flat)):
        ar, spd = predict(hw, host_loop)
        preds[label] = {
            "ar_tokens_per_s": ar.decode_tokens_per_s,
            "spd_tokens_per_s": spd.decode_tokens_per_s,
            "speedup": spd.decode_tokens_per_s / ar.decode_tokens_per_s,
            "expected_tokens_per_loop": spd.expected_tokens_per_loop,
        }
    # + the AR run itself: the seconds per token it spends beyond the predicted call (runtime/host cost per target
    # call inside a generation loop, amortised prefill) become a per-target-call host term, added to every AR step
    # and every SpD loop
    cal = preds["calibrated"]
    extra = max(0.0, 1.0 / ar_tps - 1.0 / cal["ar_tokens_per_s"])
    spd_tps = predict(hw_t, host_loop + extra)[1].decode_tokens_per_s
    ar_adj = 1.0 / (1.0 / cal["ar_tokens_per_s"] + extra)
    preds["calibrated_ar_run"] = {
        "ar_tokens_per_s": ar_adj,
        "spd_tokens_per_s": spd_tps,
        "speedup": spd_tps / ar_adj,
        "host_s_per_target_call": extra,
        "expected_tokens_per_loop": cal["expected_tokens_per_loop"],
    }
    return {
        "k": k,
        "acceptance": acc,
        "loop_stats": stats.model_dump() if stats is not None else None,
        "host_s_per_loop": host_loop,
        "measured_rate": rate,
        "measured_spd_tokens_per_s": meas,
        "measured_ar_tokens_per_s": ar_tps,
        "measured_speedup": meas_speedup,
        "predicted": preds,
        "speedup_error": preds["calibrated"]["speedup"] / meas_speedup - 1,
        "speedup_error_ar_run": preds["calibrated_ar_run"]["speedup"] / meas_speedup - 1,
        "speedup_error_pure_roofline": preds["pure_roofline"]["speedup"] / meas_speedup - 1,
    }


def _observations(data: dict, which: str, spec, fmt: str, kv: str, only_s1: bool = False) -> list:
    out = []
    for c in data["calls"]:
        if c["model"] != which or (only_s1 and c["seq_len"] != 1):
            continue
        S = int(c["seq_len"])
        out.append(
            sim.Observation(
                model=spec,
                weight_format=fmt,
                kv_format=kv,
                new_tokens=S,
                context_len=int(c["past_len"]),
                num_logits=int(c.get("num_logits", S)),
                seconds_per_call=float(c["seconds"]),
            )
        )
    return out


def _calibrate(host: sim.Hardware, obs: list):
    """Bandwidth efficiency + call overhead, + the S-curve terms when >= 2 row counts > 1; no more terms than points."""
    fit = ["bandwidth_efficiency", "call_overhead_s"]
    if len({o.new_tokens for o in obs if o.new_tokens > 1}) >= 2:
        fit += ["multi_token_penalty", "multi_token_exponent"]
    return sim.calibrate(host, obs, fit=fit[: len(obs)])


def analyse(data: dict, host: sim.Hardware) -> dict:
    data = load_measurements(data)
    fmt, kv = data.get("format", "fp32"), data.get("kv_format", "fp32")
    prompt_len = int(data.get("prompt_len", np.median([c["past_len"] for c in data["calls"]])))
    default_gen = int((data.get("settings") or {}).get("max_new_tokens", GEN_LEN))
    tspec = sim.from_hf_config(data["target"], name="target")
    dspec = sim.from_hf_config(data["draft"], name="draft")
    hw_t = _calibrate(host, _observations(data, "target", tspec, fmt, kv))  # S = 1 points + the S-curve
    hw_t_flat = _calibrate(
        host.with_(multi_token_penalty=0.0),  # pure roofline: S = 1 points, no S-curve term
        _observations(data, "target", tspec, fmt, kv, only_s1=True),
    )
    hw_d = _calibrate(host, _observations(data, "draft", dspec, fmt, kv))
    hw_t, hw_t_flat, hw_d = (
        h.with_(name=n) for h, n in ((hw_t, "host-target"), (hw_t_flat, "host-target-flat"), (hw_d, "host-draft"))
    )
    # a feature draft (benchmarks/spd.py's spd_feat* runs) is calibrated on its own calls, like the draft
    fspec = hw_f = None
    if data.get("feature_draft") and any(c["model"] == "feature_draft" for c in data["calls"]):
        fspec = sim.from_hf_config(data["feature_draft"], name="feature_draft")
        hw_f = _calibrate(host, _observations(data, "feature_draft", fspec, fmt, kv)).with_(name="host-feature-draft")
    models = {"target": (hw_t, tspec), "draft": (hw_d, dspec), "feature_draft": (hw_f, fspec)}
    calls = []
    for c in data["calls"]:
        hw, spec = models[c["model"]]
        if hw is None:
            continue
        S = int(c["seq_len"])
        p = sim.step_time(
            spec,
            hw,
            weight_format=fmt,
            kv_format=kv,
            new_tokens=S,
            context_len=int(c["past_len"]),
            num_logits=int(c.get("num_logits", S)),
        ).time_s
        calls.append({**c, "predicted_s": p, "error": p / c["seconds"] - 1})
    rows = []
    for sampling in sorted({r.get("sampling") or "" for r in data["runs"]}):
        group = [r for r in data["runs"] if (r.get("sampling") or "") == sampling]
        ar_runs = [r for r in group if r["mode"] == "ar"]
        if not ar_runs:
            print(f"sampling {sampling!r}: no AR run, skipped")
            continue
        rate = "decode_tokens_per_s" if all(r.get("decode_tokens_per_s") for r in group) else "tokens_per_s"
        ar_tps = float(np.median([r[rate] for r in ar_runs]))
        keys = sorted({(r["mode"], int(r["k"]), r.get("min_draft_prob") or 0.0) for r in group if r["mode"] != "ar"})
        for mode, k, thr in keys:
            rs = [r for r in group if (r["mode"], int(r["k"]), r.get("min_draft_prob") or 0.0) == (mode, k, thr)]
            row = _compare(
                rs,
                mode,
                k,
                ar_tps,
                rate,
                default_gen,
                prompt_len,
                fmt,
                kv,
                tspec,
                hw_t,
                hw_t_flat,
                *(models["feature_draft"] if mode.startswith("spd_feat") else (hw_d, dspec)),
            )
            if row is not None:
                rows.append({"sampling": sampling, "mode": mode, "min_draft_prob": thr or None, **row})
    if not rows:
        raise SimError("no SpD run could be compared (need AR and SpD runs in the same sampling setting)")
    return {
        "source": data.get("source", "results/spd.json"),
        "host": host.model_dump(mode="json"),
        "target_hw": hw_t.model_dump(mode="json"),
        "draft_hw": hw_d.model_dump(mode="json"),
        "target_hw_pure_roofline": hw_t_flat.model_dump(mode="json"),
        "calls": calls,
        "spd": rows,
    }


def sweep_rate() -> float:
    t0 = time.perf_counter()
    r = sim.sweep(
        "llama-2-7b",
        "qualcomm-llama2-draft-115m",
        "cloud-ai-100-ultra",
        k=range(1, 17),
        alpha=np.linspace(0, 1, 101),
        target_format=["fp16", "mxfp6", "mxfp4", "int8"],
        batch_size=[1, 2, 4, 8, 16, 32],
        context_len=[128, 512, 1024, 2048, 4096],
    )
    return r.size / (time.perf_counter() - t0)


def published_table() -> dict:
    """Print the one-point protocol on the published points (and the stock-default errors); return the summary."""
    from accel.sim.published import summary, validate

    cal, stock = validate(calibrate_first=True), validate(calibrate_first=False)
    print(f"\n{'device':<22}{'run':<30}{'measured':>9}{'one-point':>10}{'error':>8}{'stock':>9}{'error':>8}  source")
    for r, s in zip(cal, stock, strict=True):
        tag = " (calibration point)" if r.calibration_point else ""
        print(
            f"{r.device:<22}{r.label:<30}{r.measured_tokens_per_s:>9.2f}{r.predicted_tokens_per_s:>10.2f}"
            f"{r.error * 100:>7.1f}%{s.predicted_tokens_per_s:>9.2f}{s.error * 100:>7.1f}%  {r.where}{tag}"
        )
    sc, ss = summary(cal), summary(stock)
    devices = [d for d in sc if d not in ("mean_abs_error", "points")]
    print(
        f"\nmean |error| after one point per device: {sc['mean_abs_error'] * 100:.1f}% over {sc['points']} points "
        f"(goal <= 10%); stock defaults: {ss['mean_abs_error'] * 100:.1f}% over {ss['points']} (goal <= 25%)"
    )
    print(
        "per device (one point / stock): " + ", ".join(f"{d} {sc[d] * 100:.1f}% / {ss[d] * 100:.1f}%" for d in devices)
    )
    sources = sorted({r.source for r in cal})
    print("sources:\n  " + "\n  ".join(sources))
    return {
        "one_point": sc,
        "stock": ss,
        "rows": [r.model_dump() for r in cal],
        "stock_rows": [r.model_dump() for r in stock],
    }


def main() -> int:
    rate = sweep_rate()
    print(f"sweep: {rate:,.0f} configurations/s (goal >= 100,000)")
    published = published_table()
    if "--published-only" in sys.argv:
        write_json(RESULTS / "sim_validation_published.json", published)
        print(f"wrote {RESULTS / 'sim_validation_published.json'}")
        return 0
    print(f"timing with {'wall' if CLOCK is time.perf_counter else 'process CPU'} time; measuring host ...")
    host = sim.measure_host()
    print(f"host: {host.notes}")
    spd_json = Path(sys.argv[sys.argv.index("--spd") + 1]) if "--spd" in sys.argv else RESULTS / "spd.json"
    if "--spd" in sys.argv and not spd_json.is_file():
        raise SystemExit(f"--spd {spd_json}: no such file (give a results JSON written by benchmarks/spd.py)")
    data = None
    if spd_json.exists() and "--standin" not in sys.argv:
        try:
            data = load_measurements(json.loads(spd_json.read_text()))
            print(f"using measurements from {spd_json}")
        except (SimError, json.JSONDecodeError) as exc:
            print(f"ignoring {spd_json}: {exc}; measuring the numpy stand-in instead")
    if data is None:
        data = measure_standin()
        write_json(RESULTS / "sim_validation_measurements.json", data)
    res = analyse(data, host)
    ht, hd = res["target_hw"]["calibration"]["fitted"], res["draft_hw"]["calibration"]["fitted"]
    print("calibrated target:", {k: round(v, 6) for k, v in ht.items()})
    print("calibrated draft: ", {k: round(v, 6) for k, v in hd.items()})
    print(f"\n{'model':<14}{'S':>3}{'L':>5}{'measured ms':>13}{'predicted ms':>14}{'error':>8}")
    for c in res["calls"]:
        print(
            f"{c['model']:<14}{c['seq_len']:>3}{c['past_len']:>5}{c['seconds'] * 1e3:>13.3f}"
            f"{c['predicted_s'] * 1e3:>14.3f}{c['error'] * 100:>7.1f}%"
        )
    print(
        f"\n{'sampling':<12}{'mode':<18}{'K':>3}{'E[tok]':>8}{'AR tok/s':>10}{'SpD meas':>10}{'SpD pred':>10}"
        f"{'x meas':>8}{'x pred':>8}{'error':>8}{'x +AR run':>11}{'error':>8}{'x roofline':>12}{'error':>8}"
    )
    for r in res["spd"]:
        pc, pr = r["predicted"]["calibrated"], r["predicted"]["pure_roofline"]
        mode = r["mode"] + (f" p<{r['min_draft_prob']:g}" if r.get("min_draft_prob") else "")
        print(
            f"{r['sampling'] or '-':<12}{mode:<18}{r['k']:>3}{pc['expected_tokens_per_loop']:>8.2f}"
            f"{r['measured_ar_tokens_per_s']:>10.2f}{r['measured_spd_tokens_per_s']:>10.2f}"
            f"{pc['spd_tokens_per_s']:>10.2f}{r['measured_speedup']:>8.2f}"
            f"{pc['speedup']:>8.2f}{r['speedup_error'] * 100:>7.1f}%"
            f"{r['predicted']['calibrated_ar_run']['speedup']:>11.2f}{r['speedup_error_ar_run'] * 100:>7.1f}%"
            f"{pr['speedup']:>12.2f}"
            f"{r['speedup_error_pure_roofline'] * 100:>7.1f}%"
        )
    worst = max(abs(r["speedup_error"]) for r in res["spd"])
    worst_ar = max(abs(r["speedup_error_ar_run"]) for r in res["spd"])
    print(
        f"\nworst SpD speedup error: calibrated on per-call times {worst * 100:.1f}%; plus the AR run's per-call "
        f"host term {worst_ar * 100:.1f}% (goal <= 15%); pure roofline: "
        f"{max(abs(r['speedup_error_pure_roofline']) for r in res['spd']) * 100:.1f}%"
    )
    res["worst_speedup_error_ar_run"] = worst_ar
    res["published"] = published
    res["sweep_configs_per_s"] = rate
    res["worst_speedup_error"] = worst
    res["goal_met"] = bool(min(worst, worst_ar) <= 0.15)
    write_json(RESULTS / "sim_validation.json", res)
    print(f"wrote {RESULTS / 'sim_validation.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
