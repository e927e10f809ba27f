"""accel against its peers on one CPU: accel, onnxruntime-genai and llama.cpp on SmolLM2-135M-Instruct, one run.

Every runtime decodes the same held-out prompts as the same token ids, greedily (the argmax of logits the benchmark
reads itself, so EOS never stops a row: every decode makes exactly ``--max-new-tokens`` tokens), batch 1, with the
same ``--threads`` (keep it <= the idle cores), interleaved prompt by prompt (every row on prompt 1, then every row
on prompt 2, ...) for ``--rounds`` rounds; speeds are the median over rounds (``peers_support`` defines them). Rows:

- accel (``accel.decode.build``): fp32, ``gguf-kernel`` (the shipped Q4_1 GGUF's own blocks on accel's kernel, float32
  activations: the fp32 model's exact weights at 5 bits a weight), ``gguf-kernel:KIND`` (the file of llama.cpp's row
  ``KIND``, e.g. ``Q4_K_M``, on accel's kernel: its K-quant and Q5 blocks repacked exactly), ``mxfp6-kernel``
  (float32 activations) and ``mxfp6-kernel-q8`` /
  ``mxfp4-kernel-q8`` (int8 activations, integer dot products) targets (``--accel``), autoregressive, speculative
  (the shipped feature draft's chain of ``--spd-chain`` tokens after n-gram lookup, on every target; and where the
  target scores trees, i.e. float32 activations, its tree of ``--spd-nodes`` nodes merged with lookup), and the last
  of these with ``autotune``; and the
  MX precision ladder (``--ladder``): the fp32 target drafted by its own ``mxfp4-kernel`` copy (after lookup,
  autotuned), exact without any training;
- onnxruntime-genai: its model builder's fp32 and int4 graphs of the same checkpoint (built once, cached);
- llama.cpp (llama-cpp-python): the shipped Q4_1 GGUF as it is, and F32 (with an f32 KV cache), Q8_0, Q4_0, Q4_K_M,
  Q5_K_M and Q6_K made from it by libllama's quantizer with its default tensor-type choices (cached); the other rows
  keep llama.cpp's default f16 KV cache.

Quality is teacher-forced on the held-out prompts followed by accel fp32's greedy continuation of
``--quality-tokens`` tokens: at the positions that predict the continuation (8 x 64 = 512 by default), KL(accel fp32
|| row) in nats, its 95th percentile and top-1 agreement, plus the mean KL against llama.cpp running the shipped Q4_1
file. accel's "fp32" SmolLM2 is the shipped Q4_1 GGUF dequantized (``accel.models.smollm2``). Speculative rows share
their autoregressive row's quality (they are exact). A Pareto summary says, for each peer row, whether accel has a
row with KL <= the peer's at >= 1.5x its speed (KLs under 1e-9 nats, float32 summation order, count as equal).

The peers live in their own environment (never a dependency of ``make test``)::

    make peers                                  # .venv-peers: accel, onnxruntime-genai, llama-cpp-python (built)
    .venv-peers/bin/python benchmarks/peers.py  # the full run; --prompts 1 --max-new-tokens 8 --rounds 1: a smoke test
    make peers-avx2                             # an AVX2-only llama.cpp build in .venv-peers/llama-avx2, then
    PYTHONPATH=.venv-peers/llama-avx2 .venv-peers/bin/python benchmarks/peers.py --isa avx2

``--isa avx2`` holds accel's kernels to AVX2 without AVX-VNNI: with the AVX2-only llama.cpp, what an AVX2-only CPU
runs of both, on this CPU's memory (onnxruntime and onnxruntime-genai keep their own choice: MLAS reads CPUID).

A runtime that is not installed is skipped with a one-line message (``--genai ''`` / ``--llama ''`` skip by choice).
Results: ``results/peers.json`` (``--out``) and the plot ``results/peers.png`` (``--plot``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from bench_support import cpu_model, json_out, package_version, save_results
from peers_support import (
    LLAMA_DEFAULT,
    LLAMA_FTYPES,
    Decoded,
    genai_model_dir,
    genai_overlay,
    greedy_agreement,
    llama_gguf,
    llama_has_amx,
    llama_system_info,
    log_softmax,
    markdown_table,
    median_rates,
    pareto,
    pareto_lines,
    plot_speed_kl,
    quality_summary,
)
from tqdm.auto import tqdm

FEATURE_DRAFT = Path(__file__).resolve().parents[1] / "accel" / "demo_data" / "smollm2-feature-draft"
ISA = ("avx2", "avx512f", "avx512bw", "avx512vbmi", "avx512_vnni", "avx_vnni", "amx_int8")
GENAI_PRECISIONS = ("fp32", "int4")
VERSIONS = ("accel", "onnxruntime", "onnxruntime-genai", "llama-cpp-python", "torch", "transformers", "numpy")
REFERENCE = "accel fp32 AR"
Q4_1_ROW = "llama.cpp Q4_1 (shipped)"


class Runner(Protocol):
    def greedy(self, ids: list[int], n: int) -> Decoded:
        """``n`` greedy tokens after prompt ``ids``, timed."""
        ...

    def logits_many(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """Teacher-forced float32 logits ``[len(seq), V]`` of each sequence."""
        ...


@dataclass
class Row:
    """A table row: its ``runner``, and ``quality_of``, the row whose model its quality is measured on."""

    name: str
    runtime: str
    weights: str
    runner: Runner
    quality_of: str


class AccelRunner:
    """An ``accel.decode.DecodeSetup``: ``accel.spd.generate`` with its target and proposer, EOS ignored."""

    def __init__(self, spec: dict[str, Any], tokenizer: Any) -> None:
        from accel.decode import DecodeSpec, build

        self.setup = build(DecodeSpec.model_validate(spec), tokenizer)

    def greedy(self, ids: list[int], n: int) -> Decoded:
        from accel.spd import GREEDY, generate

        first: list[tuple[float, int]] = []

        def stream(row: int, tokens: list, from_draft: list) -> None:
            if not first:
                first.append((time.perf_counter(), len(tokens)))

        t0 = time.perf_counter()
        setup = self.setup
        res = generate(
            setup.target, setup.proposer, [ids], max_new_tokens=n, eos_token_id=[], sampling=GREEDY, stream=stream
        )
        return Decoded(res.tokens[0], time.perf_counter() - t0, first[0][0] - t0, first[0][1])

    def logits_many(self, seqs: list[list[int]]) -> list[np.ndarray]:
        target, out = self.setup.target, []
        for seq in seqs:
            target.reset()
            step, parts = target.info.max_seq_len, []
            for s in range(0, len(seq), step):
                ids = np.asarray([seq[s : s + step]], dtype=np.int64)
                pos = np.arange(s, s + ids.shape[1], dtype=np.int64)[None]
                parts.append(np.asarray(target.forward(ids, pos, num_logits=ids.shape[1]))[0])
            out.append(np.concatenate(parts))
        return out


class GenaiRunner:
    """An onnxruntime-genai model: ``append_tokens`` then the argmax of ``get_logits`` per token."""

    def __init__(self, model_dir: Path, threads: int, ctx_len: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(str(model_dir))
        config.overlay(json.dumps(genai_overlay(threads, ctx_len)))
        self.model = og.Model(config)

    def _generator(self) -> Any:
        return self.og.Generator(self.model, self.og.GeneratorParams(self.model))

    def greedy(self, ids: list[int], n: int) -> Decoded:
        t0 = time.perf_counter()
        gen = self._generator()
        gen.append_tokens(ids)
        out = [int(np.argmax(gen.get_logits()))]
        t_first = time.perf_counter()
        while len(out) < n:
            gen.append_tokens(out[-1:])
            out.append(int(np.argmax(gen.get_logits())))
        return Decoded(out, time.perf_counter() - t0, t_first - t0, 1)

    def logits_many(self, seqs: list[list[int]]) -> list[np.ndarray]:
        out = []
        for seq in seqs:
            gen = self._generator()
            gen.append_tokens(seq)
            out.append(np.array(gen.get_output("logits"), dtype=np.float32).reshape(len(seq), -1))
        return out


class LlamaRunner:
    """A llama-cpp-python ``Llama``: ``eval`` then the argmax of the last logits (libllama's own buffer) per token."""

    def __init__(self, path: Path, threads: int, ctx_len: int, f32_kv: bool) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self.path = path
        f32 = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if f32_kv else {}
        self.kwargs = {"n_threads": threads, "n_threads_batch": threads, "n_ctx": ctx_len, "verbose": False, **f32}
        self.llm = self._open(logits_all=False)
        self.vocab = int(self.llm.n_vocab())

    def _open(self, logits_all: bool) -> Any:
        return self.lib.Llama(model_path=str(self.path), logits_all=logits_all, **self.kwargs)

    def _argmax(self) -> int:
        ptr = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.vocab,))))

    def greedy(self, ids: list[int], n: int) -> Decoded:
        t0 = time.perf_counter()
        self.llm.reset()
        self.llm.eval(ids)
        out = [self._argmax()]
        t_first = time.perf_counter()
        while len(out) < n:
            self.llm.eval(out[-1:])
            out.append(self._argmax())
        return Decoded(out, time.perf_counter() - t0, t_first - t0, 1)

    def logits_many(self, seqs: list[list[int]]) -> list[np.ndarray]:
        llm, out = self._open(logits_all=True), []  # every position's logits: a second context, closed after
        try:
            for seq in seqs:
                llm.reset()
                llm.eval(seq)
                out.append(np.array(llm.scores[: len(seq)], dtype=np.float32))
        finally:
            llm.close()
        return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per decode (default 128)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; speeds are their median (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every runtime (default 2; <= idle cores)")
    ap.add_argument("--ctx-len", type=int, default=512, help="KV cache length in tokens of every runtime")
    ap.add_argument("--quality-tokens", type=int, default=64, help="scored continuation tokens per prompt")
    ap.add_argument(
        "--accel",
        default="fp32,gguf-kernel,mxfp6-kernel,mxfp6-kernel-q8,mxfp4-kernel-q8",
        help="accel target weights (comma-separated; fp32 first; gguf-kernel: the shipped Q4_1 GGUF's own blocks; "
        "gguf-kernel:KIND: the llama.cpp row KIND's file, e.g. Q4_K_M, on accel's kernel; gguf-kernel-q8 and "
        "gguf-kernel-q8:KIND: the same blocks with int8 activations, as llama.cpp multiplies them)",
    )
    ap.add_argument("--spd-nodes", type=int, default=8, help="feature-draft tree nodes of the SpD rows (0: no SpD)")
    ap.add_argument(
        "--spd-chain",
        type=int,
        default=1,
        help="feature-draft chain length of the chain-after-lookup SpD rows (every target; autotune.py's best fixed "
        "setting on gguf-kernel-q8 and gguf-kernel: K = 1 after lookup)",
    )
    ap.add_argument("--no-autotune", action="store_true", help="leave out the autotune SpD rows")
    ap.add_argument(
        "--ladder",
        default="mxfp4-kernel",
        help="the MX precision ladder row: the fp32 target drafted by its own copy in these weights, after lookup, "
        "autotuned (exact: no training; '' skips)",
    )
    ap.add_argument("--genai", default=",".join(GENAI_PRECISIONS), help="onnxruntime-genai precisions ('' skips)")
    ap.add_argument(
        "--llama", default=",".join(LLAMA_DEFAULT), help=f"llama.cpp GGUF types, of {','.join(LLAMA_FTYPES)} ('' skips)"
    )
    ap.add_argument(
        "--isa",
        choices=("best", "avx2"),
        default="best",
        help="accel's kernels: the best this CPU has, or AVX2 without AVX-VNNI (an AVX2-only CPU's code, on this CPU's "
        "memory; llama.cpp runs what its build was compiled for: its system info is recorded)",
    )
    ap.add_argument("--no-quality", action="store_true", help="skip the teacher-forced KL measurement")
    ap.add_argument("--out", type=json_out, default=Path("results/peers.json"))
    ap.add_argument("--plot", type=Path, default=Path("results/peers.png"), help="the speed-vs-KL PNG")
    args = ap.parse_args()
    args.accel, args.genai, args.llama = ([w for w in v.split(",") if w] for v in (args.accel, args.genai, args.llama))
    if not args.accel or args.accel[0] != "fp32":
        ap.error("--accel must start with fp32: accel fp32 AR is the reference of every row")
    files = {w.split(":", 1)[1] for w in args.accel if w.startswith(("gguf-kernel:", "gguf-kernel-q8:"))}
    if files - set(LLAMA_FTYPES):
        ap.error(
            f"--accel gguf-kernel(-q8):KIND: unknown {sorted(files - set(LLAMA_FTYPES))}; choose from {LLAMA_FTYPES}"
        )
    for flag, got, known in (("--genai", args.genai, GENAI_PRECISIONS), ("--llama", args.llama, tuple(LLAMA_FTYPES))):
        if set(got) - set(known):
            ap.error(f"{flag}: unknown {sorted(set(got) - set(known))}; choose from {', '.join(known)}")
    if min(args.prompts, args.max_new_tokens, args.rounds, args.threads, args.quality_tokens, args.spd_chain) < 1:
        ap.error("--prompts, --max-new-tokens, --rounds, --threads, --quality-tokens and --spd-chain must be >= 1")
    if args.threads > (os.cpu_count() or 1):
        print(f"warning: --threads {args.threads} > {os.cpu_count()} CPUs: timings will mostly measure contention")
    return args


def installed(module: str, what: str, flag: str) -> bool:
    """Whether ``module`` imports; if not, one line saying which rows are skipped and how to install them."""
    if importlib.util.find_spec(module) is not None:
        return True
    print(f"{what} is not installed here: skipping its rows (`make peers`, then .venv-peers/bin/python; {flag} '')")
    return False


def try_row(name: str, make: Callable[[], Row]) -> list[Row]:
    """``[make()]``, or ``[]`` with one line saying why when the peer cannot be set up (a peer row is optional)."""
    try:
        return [make()]
    except Exception as exc:  # a peer's own error types: skip the row, never a traceback
        print(f"skipping {name}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        return []


def _spd_specs(base: dict[str, Any], weights: str, nodes: int, chain_k: int) -> list[tuple[dict[str, Any], str]]:
    """The pinned SpD rows of a target: the feature draft's chain of ``chain_k`` after lookup (``autotune.py``'s best
    fixed setting on the int8 targets and, on AVX2 code, on ``gguf-kernel``, whose wide calls cost most), then, where
    the target scores trees (float32 activations; ``DecodeSpec`` refuses trees on int8 ones: docs/spd.md), its tree of
    ``nodes`` merged with lookup."""
    from accel.backends.weights import WeightFormat

    chain = {"kind": "chain", "draft": FEATURE_DRAFT, "k": chain_k}
    specs = [
        (
            {**base, "proposer": {"kind": "first_of", "lookup": {"n": 3, "k": 4}, "then": chain}},
            f"accel {weights} SpD (feature chain {chain_k} after lookup)",
        )
    ]
    if not WeightFormat(weights).int8_activations:
        tree = {"kind": "tree", "draft": FEATURE_DRAFT, "nodes": nodes}
        specs.append(
            (
                {**base, "proposer": {"kind": "merge", "lookup": {"n": 3, "k": 4}, "tree": tree}},
                f"accel {weights} SpD (feature tree {nodes} + lookup)",
            )
        )
    return specs


def accel_rows(args: argparse.Namespace, ckpt: Path, tokenizer: Any) -> list[Row]:
    """AR, SpD and autotuned SpD rows for each of ``--accel``'s target weights."""
    from accel.models.smollm2 import smollm2_gguf_path

    rows = []
    for entry in tqdm(args.accel, desc="accel setups", leave=False):
        w, label, path = entry.split(":", 1)[0], entry, ckpt
        if entry in ("gguf-kernel", "gguf-kernel-q8"):
            path = smollm2_gguf_path()  # the shipped Q4_1 file's own blocks, exact
        elif ":" in entry:  # a file libllama quantized (the llama.cpp row's own), run by accel
            kind = entry.split(":", 1)[1]
            path, label = llama_gguf(kind, args.threads), f"{w} {kind}"
        target = {"path": path, "weights": w, "ctx_len": args.ctx_len, "threads": args.threads}
        base = {"target": target, "sampling": {"greedy": True}, "eos_token_id": [], "max_new_tokens": 1}
        ar = f"accel {label} AR"
        rows.append(Row(ar, "accel", label, AccelRunner(base, tokenizer), ar))
        if args.spd_nodes < 1:
            continue
        for spd, name in _spd_specs(base, w, args.spd_nodes, args.spd_chain):
            name = name.replace(f"accel {w} ", f"accel {label} ", 1)
            rows.append(Row(name, "accel", label, AccelRunner(spd, tokenizer), ar))
        if not args.no_autotune:
            auto = AccelRunner({**spd, "autotune": True}, tokenizer)
            rows.append(Row(f"{name}, autotune", "accel", label, auto, ar))
        if args.ladder and w == "fp32":  # the MX precision ladder: a lower-precision copy of the target drafts it
            ladder = {"kind": "chain", "draft": ckpt, "weights": args.ladder}
            spec = {**base, "proposer": {"kind": "first_of", "lookup": {"n": 3}, "then": ladder}}
            name = f"accel fp32 SpD ({args.ladder} ladder draft + lookup, autotune)"
            rows.append(Row(name, "accel", w, AccelRunner(spec, tokenizer), ar))
    return rows


def peer_rows(args: argparse.Namespace, ckpt: Path) -> list[Row]:
    """The onnxruntime-genai and llama.cpp rows that can be set up here."""
    rows: list[Row] = []
    if args.genai and installed("onnxruntime_genai", "onnxruntime-genai", "--genai"):
        for p in args.genai:
            name = f"onnxruntime-genai {p}"
            make = lambda p=p, n=name: Row(  # noqa: E731
                n, "onnxruntime-genai", p, GenaiRunner(genai_model_dir(ckpt, p), args.threads, args.ctx_len), n
            )
            rows += try_row(name, make)
    if args.llama and installed("llama_cpp", "llama-cpp-python", "--llama") and not llama_has_amx():
        for k in args.llama:
            name = Q4_1_ROW if k == "Q4_1" else f"llama.cpp {k}"
            make = lambda k=k, n=name: Row(  # noqa: E731
                n, "llama.cpp", k, LlamaRunner(llama_gguf(k, args.threads), args.threads, args.ctx_len, k == "F32"), n
            )
            rows += try_row(name, make)
    return rows


def measure_quality(rows: list[Row], prompts: list[list[int]], tokens: int) -> dict[str, dict[str, float]]:
    """Teacher-forced quality of each model (module docstring), keyed by the row whose model it is."""
    models = {r.name: r.runner for r in rows if r.quality_of == r.name}
    seqs = [p + models[REFERENCE].greedy(p, tokens).tokens for p in prompts]
    spans = [slice(len(p) - 1, len(p) - 1 + tokens) for p in prompts]  # the positions predicting the continuation

    def scored(name: str) -> list[np.ndarray]:
        return [x[s] for x, s in zip(models[name].logits_many(seqs), spans, strict=True)]

    done = {REFERENCE: scored(REFERENCE)}
    ref = [log_softmax(x) for x in done[REFERENCE]]
    q4_1: list[np.ndarray] | None = None
    out = {}
    for name in tqdm(sorted(models, key=lambda n: (n != REFERENCE, n != Q4_1_ROW)), desc="quality"):  # refs first
        logits = done.pop(name) if name in done else scored(name)
        out[name] = quality_summary(ref, logits)
        if name == Q4_1_ROW:
            q4_1 = [log_softmax(x) for x in logits]
        if q4_1 is not None:
            out[name]["kl_vs_q4_1"] = quality_summary(q4_1, logits)["mean_kl"]
    return out


def time_rows(rows: list[Row], prompts: list[list[int]], n: int, rounds: int) -> dict[str, list[list[Decoded]]]:
    """Every row on every prompt, interleaved prompt by prompt, ``rounds`` times (after one untimed warm-up each)."""
    for r in rows:
        r.runner.greedy(prompts[0], min(n, 8))
    runs: dict[str, list[list[Decoded]]] = {r.name: [[] for _ in range(rounds)] for r in rows}
    with tqdm(total=rounds * len(prompts), desc="decode (round x prompt)") as bar:
        for k in range(rounds):
            for ids in prompts:
                for r in rows:
                    d = r.runner.greedy(ids, n)
                    if len(d.tokens) != n:
                        raise SystemExit(f"{r.name}: made {len(d.tokens)} tokens, not {n} (is --ctx-len too short?)")
                    runs[r.name][k].append(d)
                bar.update()
    return runs


def assemble(rows: list[Row], runs: dict[str, list[list[Decoded]]], quality: dict) -> list[dict[str, Any]]:
    """One result dict per row: speeds, the ratio to accel fp32 AR, greedy agreement, quality."""
    ref_tokens = [d.tokens for d in runs[REFERENCE][0]]
    ref_speed = median_rates(runs[REFERENCE])["tokens_per_s"]
    out = []
    for r in rows:
        speed = median_rates(runs[r.name])
        tokens = [d.tokens for d in runs[r.name][0]]
        own = greedy_agreement([d.tokens for d in runs[r.quality_of][0]], tokens)
        if own["equal"] != own["prompts"]:
            print(f"warning: {r.name}: {own['equal']}/{own['prompts']} prompts equal to {r.quality_of}'s tokens")
        out.append(
            {
                "name": r.name,
                "runtime": r.runtime,
                "weights": r.weights,
                "quality_of": r.quality_of,
                **speed,
                "x_fp32_ar": speed["tokens_per_s"] / ref_speed,
                "greedy": greedy_agreement(ref_tokens, tokens),
                "equal_to_own_ar": own["equal"],
                **quality.get(r.quality_of, {}),
            }
        )
    return out


def main() -> None:
    args = parse_args()
    from accel.backends.cpu import cpu_flags
    from accel.drafts.prompts import HELD_OUT_PROMPTS
    from accel.models import load_tokenizer, smollm2_checkpoint

    cpu, isa = cpu_model(), " ".join(f for f in ISA if f in cpu_flags())
    versions = {n: package_version(n) for n in VERSIONS}
    print(f"CPU: {cpu}; flags: {isa or '(none read)'}; threads {args.threads} of {os.cpu_count()}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    if args.isa == "avx2":  # an AVX2-only CPU's kernel code (the same results: tests/formats check every path)
        from accel.formats.mxkernel import set_isa

        set_isa(1, avx_vnni=False)
        print("accel kernels: AVX2 without AVX-VNNI (--isa avx2)")
    llama_info = llama_system_info() if args.llama else ""
    if llama_info:
        print(f"llama.cpp: {llama_info}")
    ckpt = smollm2_checkpoint()
    tokenizer = load_tokenizer(ckpt)
    prompts = [tokenizer.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    rows = accel_rows(args, ckpt, tokenizer) + peer_rows(args, ckpt)
    quality = {} if args.no_quality else measure_quality(rows, prompts, args.quality_tokens)
    table = assemble(rows, time_rows(rows, prompts, args.max_new_tokens, args.rounds), quality)
    has_q4_1 = any("kl_vs_q4_1" in q for q in quality.values())
    print("\n".join(markdown_table(table, has_q4_1)))
    summary = pareto(table)
    if summary:
        print("\n".join(["", *pareto_lines(summary)]))
    by_name = {t["name"]: t for t in table}
    same_runtime = {}  # the second goal: accel fp32 AR >= onnxruntime-genai fp32 AR (same weights, same ORT)
    if "onnxruntime-genai fp32" in by_name:
        a, g = by_name[REFERENCE], by_name["onnxruntime-genai fp32"]
        same_runtime = {k: a[k] / g[k] for k in ("tokens_per_s", "decode_tokens_per_s")}
        print(f"\naccel fp32 AR / onnxruntime-genai fp32: {same_runtime['tokens_per_s']:.2f}x end-to-end, ", end="")
        print(f"{same_runtime['decode_tokens_per_s']:.2f}x decode")
    title = f"SmolLM2-135M, {cpu}, {args.threads} threads, {args.prompts} prompts x {args.max_new_tokens} tokens"
    if quality:
        print(f"wrote {plot_speed_kl(table, args.plot, title)}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    data = {"cpu": cpu, "isa": isa, "versions": versions, "settings": settings, "rows": table, "pareto": summary}
    data["llama_cpp_system_info"] = llama_info
    data["accel_fp32_ar_over_genai_fp32"] = same_runtime
    print(f"wrote {save_results(args.out, data, __file__)}")


if __name__ == "__main__":
    main()
