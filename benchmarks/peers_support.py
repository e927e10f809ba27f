"""The math, the reporting and the peers' model files of ``benchmarks/peers.py``: speeds, greedy agreement, KL
quality, the Pareto check, the table and the speed-vs-KL plot (numpy, matplotlib), and the onnxruntime-genai and GGUF
files each built once and cached. A peer runtime is imported only inside the functions that build its files, so the
module (and its tests) load without onnxruntime-genai or llama-cpp-python.

Definitions (every runtime is timed the same way, from outside it):

- one greedy decode of ``n`` tokens is a :class:`Decoded`: its tokens, ``total_s`` from the call to the last token,
  and ``first_s`` / ``first_tokens``, when the first tokens came out (the prompt processed and the first round done:
  one token for autoregressive decoding, the accepted tokens of the first round for speculative decoding);
- end-to-end tokens/s = tokens / total seconds over a set of decodes; decode tokens/s = (tokens - first tokens) /
  (total - first seconds), i.e. the prefill and the first round left out;
- quality: at each scored position, KL(p_ref || p_row) = sum_x p_ref(x) (log p_ref(x) - log p_row(x)) in nats over the
  full vocabulary (float64 log-softmax of the float32 logits; exact up to float64 rounding), and top-1 agreement =
  argmax equal.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: llama.cpp rows -> the ``llama_ftype`` libllama quantizes the shipped file to (None: the shipped Q4_1 as it is)
LLAMA_FTYPES: dict[str, int | None] = {
    "F32": 0, "Q8_0": 7, "Q4_1": None, "Q4_0": 2, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q3_K_M": 12, "Q2_K": 10,
    "IQ4_XS": 30,
}  # fmt: skip
#: the llama.cpp rows of a run without ``--llama`` (the main table); the K-quant and IQ4 files are asked for by name
LLAMA_DEFAULT = ("F32", "Q8_0", "Q4_1", "Q4_0")
#: the issue's goal: a peer row is beaten when accel has a row of KL <= the peer's at >= this times its tokens/s
PARETO_SPEEDUP = 1.5
#: mean KLs (nats) below this are float32 summation order, not quantization: the same model summed in another order
#: (llama.cpp F32, onnxruntime-genai fp32, accel gguf-kernel all give 7e-12 to 1e-11 against accel fp32), so the
#: Pareto comparison counts them as equal; the smallest quantization step measured is 0.0026 (int8 activations)
KL_FLOAT_NOISE = 1e-9


@dataclass(frozen=True)
class Decoded:
    """One greedy decode: ``tokens`` generated, ``total_s`` seconds from the call to the last token, and the first
    ``first_tokens`` tokens out after ``first_s`` seconds."""

    tokens: list[int]
    total_s: float
    first_s: float
    first_tokens: int


def rates(runs: Sequence[Decoded]) -> tuple[float, float]:
    """``(end-to-end tokens/s, decode tokens/s)`` over ``runs`` (module docstring; NaN where no time was spent)."""
    tokens = sum(len(r.tokens) for r in runs)
    total_s = sum(r.total_s for r in runs)
    decode_tokens = sum(len(r.tokens) - r.first_tokens for r in runs)
    decode_s = sum(r.total_s - r.first_s for r in runs)
    return (tokens / total_s if total_s > 0 else math.nan, decode_tokens / decode_s if decode_s > 0 else math.nan)


def median_rates(rounds: Sequence[Sequence[Decoded]]) -> dict[str, Any]:
    """The median over rounds of each round's :func:`rates` (a round: one decode per prompt), in tokens/s, with
    the per-round values."""
    per_round = [rates(r) for r in rounds]
    return {
        "tokens_per_s": statistics.median(e for e, _ in per_round),
        "decode_tokens_per_s": statistics.median(d for _, d in per_round),
        "rounds_tokens_per_s": [e for e, _ in per_round],
        "rounds_decode_tokens_per_s": [d for _, d in per_round],
    }


def prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Tokens before the first position where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def greedy_agreement(reference: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How far greedy outputs ``got`` follow ``reference`` (one token list per prompt): ``equal`` prompts whose whole
    output is the reference's, of ``prompts``, and ``mean_prefix`` tokens agreed before the first difference."""
    if len(reference) != len(got):
        raise ValueError(f"{len(got)} outputs for {len(reference)} reference prompts")
    prefixes = [prefix_len(r, g) for r, g in zip(reference, got, strict=True)]
    equal = sum(list(r) == list(g) for r, g in zip(reference, got, strict=True))
    return {"equal": equal, "prompts": len(reference), "mean_prefix": float(np.mean(prefixes)) if prefixes else 0.0}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities over the last axis (max-shifted, so large logits do not overflow)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_top1(ref_logp: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position (rows of ``[P, V]``): KL(ref || row) in nats from the reference log-probabilities ``ref_logp``
    and the row's raw ``logits``, and whether their argmaxes agree."""
    ref_logp = np.asarray(ref_logp, dtype=np.float64)
    if ref_logp.shape != np.shape(logits):
        raise ValueError(f"reference {ref_logp.shape} and row logits {np.shape(logits)} differ in shape")
    row_logp = log_softmax(logits)
    kl = np.sum(np.exp(ref_logp) * (ref_logp - row_logp), axis=-1)
    return np.maximum(kl, 0.0), np.argmax(ref_logp, axis=-1) == np.argmax(row_logp, axis=-1)


def quality_summary(ref_logp: Sequence[np.ndarray], logits: Sequence[np.ndarray]) -> dict[str, float]:
    """:func:`kl_top1` over every position of every sequence (``ref_logp[i]`` and ``logits[i]``: ``[P_i, V]``):
    ``mean_kl`` and ``p95_kl`` in nats, ``top1`` (fraction of positions) and ``positions`` (count)."""
    pairs = [kl_top1(r, x) for r, x in zip(ref_logp, logits, strict=True)]
    kl = np.concatenate([k for k, _ in pairs])
    return {
        "mean_kl": float(kl.mean()),
        "p95_kl": float(np.percentile(kl, 95)),
        "top1": float(np.mean(np.concatenate([t for _, t in pairs]))),
        "positions": int(kl.size),
    }


def genai_overlay(threads: int, ctx_len: int) -> dict[str, Any]:
    """The onnxruntime-genai config overlay of a run: ``threads`` intra-op threads, a ``ctx_len``-token KV buffer
    (max_length), greedy search (the benchmark reads the logits and takes the argmax itself)."""
    return {
        "model": {"decoder": {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}},
        "search": {"max_length": ctx_len, "do_sample": False, "num_beams": 1},
    }


def pareto(rows: Sequence[dict[str, Any]], speedup: float = PARETO_SPEEDUP) -> list[dict[str, Any]]:
    """For each peer row (``runtime`` other than ``accel``) with a speed and a KL: the fastest accel row whose mean KL
    is at most the peer's (KLs under ``KL_FLOAT_NOISE`` count as equal), its speed ratio to the peer, and whether that
    meets ``speedup``. Rows need ``name``, ``runtime``, ``tokens_per_s`` and ``mean_kl`` (None when not measured)."""
    accel = [r for r in rows if r["runtime"] == "accel" and r.get("mean_kl") is not None]
    out = []
    for peer in rows:
        if peer["runtime"] == "accel" or peer.get("mean_kl") is None:
            continue
        bound = max(peer["mean_kl"], KL_FLOAT_NOISE)
        fit = [a for a in accel if a["mean_kl"] <= bound]
        best = max(fit, key=lambda a: a["tokens_per_s"], default=None)
        ratio = best["tokens_per_s"] / peer["tokens_per_s"] if best else None
        out.append(
            {
                "peer": peer["name"],
                "peer_tokens_per_s": peer["tokens_per_s"],
                "peer_mean_kl": peer["mean_kl"],
                "best_accel": best["name"] if best else None,
                "speed_ratio": ratio,
                "goal_met": bool(ratio is not None and ratio >= speedup),
            }
        )
    return out


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def markdown_table(rows: Sequence[dict[str, Any]], q4_1: bool) -> list[str]:
    """The results table, one line per row (``q4_1``: a column of mean KL against llama.cpp Q4_1)."""
    head = (
        "| runtime, weights | tok/s | decode tok/s | x accel fp32 AR | greedy = fp32 | mean prefix | mean KL | p95 KL"
    )
    head += " | top-1 |" + (" KL vs Q4_1 |" if q4_1 else "")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        g = r.get("greedy") or {}
        cells = [
            r["name"],
            _num(r["tokens_per_s"], ".1f"),
            _num(r["decode_tokens_per_s"], ".1f"),
            _num(r.get("x_fp32_ar"), ".2f"),
            f"{g['equal']}/{g['prompts']}" if g else "",
            _num(g.get("mean_prefix"), ".1f"),
            _num(r.get("mean_kl"), ".2g"),
            _num(r.get("p95_kl"), ".2g"),
            f"{100 * r['top1']:.1f}%" if r.get("top1") is not None else "",
        ]
        if q4_1:
            cells.append(_num(r.get("kl_vs_q4_1"), ".2g"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def pareto_lines(summary: Sequence[dict[str, Any]], speedup: float = PARETO_SPEEDUP) -> list[str]:
    """The Pareto summary as markdown lines: one per peer row."""
    lines = [f"| peer row | tok/s | mean KL | fastest accel row at KL <= | x peer | >= {speedup}x |", "|---" * 6 + "|"]
    for s in summary:
        ratio = _num(s["speed_ratio"], ".2f")
        met = "yes" if s["goal_met"] else "no"
        peer = f"| {s['peer']} | {s['peer_tokens_per_s']:.1f} | {s['peer_mean_kl']:.2g}"
        lines.append(f"{peer} | {s['best_accel'] or '(none)'} | {ratio} | {met} |")
    return lines


#: KLs below this (the reference itself: 0) are drawn at it on the plot's log axis
KL_FLOOR = 1e-7


def plot_speed_kl(rows: Sequence[dict[str, Any]], path: str | Path, title: str) -> Path:
    """A PNG of tokens/s against mean KL (log scale; KL 0 drawn at ``KL_FLOOR``), one marker per runtime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"accel": ("tab:blue", "o"), "onnxruntime-genai": ("tab:orange", "s"), "llama.cpp": ("tab:green", "^")}
    fig, ax = plt.subplots(figsize=(8, 5))
    for runtime, (color, marker) in styles.items():
        pts = [r for r in rows if r["runtime"] == runtime and r.get("mean_kl") is not None]
        if not pts:
            continue
        xs = [max(r["mean_kl"], KL_FLOOR) for r in pts]
        ax.scatter(xs, [r["tokens_per_s"] for r in pts], color=color, marker=marker, label=runtime)
        for x, r in zip(xs, pts, strict=True):
            ax.annotate(r["name"], (x, r["tokens_per_s"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    kls = [max(r["mean_kl"], KL_FLOOR) for r in rows if r.get("mean_kl") is not None]
    if kls:  # room on the right for the labels
        ax.set_xlim(KL_FLOOR / 3, max(kls) * 300)
    ax.set_xlabel(f"mean KL(fp32 || row), nats (below {KL_FLOOR:g}: drawn at {KL_FLOOR:g})")
    ax.set_ylabel("tokens/s (end-to-end, median)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")  # written whole, then renamed: never a half-written PNG
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------- the peers' model files (built once, cached)


def genai_model_dir(ckpt: Path, precision: str) -> Path:
    """onnxruntime-genai's model builder output for ``ckpt`` at ``precision`` (CPU), built once and cached under
    ``$ACCEL_CACHE/peers`` (built in a temporary sibling, then renamed; its log beside it)."""
    import onnxruntime_genai as og

    from accel.models.smollm2 import cache_root

    out = cache_root() / "peers" / f"genai-{og.__version__}-{precision}"
    if (out / "genai_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log, tmp = out.parent / f"{out.name}.log", Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    cmd = ["-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o", str(tmp / "m"), "-p", precision]
    print(f"building the onnxruntime-genai {precision} model (about 30 s, once): {out}", flush=True)
    try:
        with open(log, "w") as f:
            done = subprocess.run([sys.executable, *cmd, "-e", "cpu", "-c", str(tmp / "hf")], stdout=f, stderr=f)
        if done.returncode != 0:
            raise RuntimeError(f"the model builder exited {done.returncode}; its log: {log}")
        os.replace(tmp / "m", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextlib.contextmanager
def fds_to(path: Path) -> Iterator[None]:
    """Send file descriptors 1 and 2 (what C libraries print) to ``path`` inside the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "w") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def llama_gguf(kind: str, threads: int) -> Path:
    """The GGUF of llama.cpp row ``kind``: the shipped Q4_1 file, or one libllama's quantizer made from it (cached
    under ``$ACCEL_CACHE/peers``, written to a temporary name, then renamed)."""
    from accel.models.smollm2 import cache_root, smollm2_gguf_path

    src, ftype = smollm2_gguf_path(), LLAMA_FTYPES[kind]
    if ftype is None:
        return src
    import llama_cpp

    out = cache_root() / "peers" / f"smollm2-135m-{kind}-llama-cpp-{llama_cpp.__version__}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, threads
    tmp, log = out.with_name(f".{out.name}.tmp"), out.parent / f"{out.name}.log"
    print(f"quantizing the shipped GGUF to {kind} with libllama (seconds, once): {out}", flush=True)
    with fds_to(log):  # libllama prints a line per tensor on stdout
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize to {kind} returned {rc}; its log: {log}")
    os.replace(tmp, out)
    return out


def llama_system_info() -> str:
    """libllama's own line on the instruction sets it was built for and uses (e.g. ``AVX2 = 1 | AVX512 = 0``), or ""
    where llama-cpp-python is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        return ""
    import llama_cpp

    return " ".join(llama_cpp.llama_print_system_info().decode(errors="replace").split())


def llama_has_amx() -> bool:
    """Whether libllama was built with AMX (its AMX matmul segfaults on these GGUFs), saying so in one line."""
    if "AMX_INT8 = 1" not in llama_system_info():
        return False
    print("skipping the llama.cpp rows: this llama-cpp-python was built with AMX, whose matmul crashes on SmolLM2's")
    print("quantized GGUFs; rebuild it without (make peers passes -mno-amx-*), or --llama '' to skip it quietly")
    return True
