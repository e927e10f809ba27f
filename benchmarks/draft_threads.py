"""Which draft sizes run faster on 1 onnxruntime thread than on 2: the crossover behind ``accel generate``'s
``--draft-threads`` default (``accel.decode.build.WIDE_DRAFT_PARAMS``).

Random checkpoints of real shapes (SmolLM2's vocabulary and layouts: ~30 M, ~60 M, SmolLM2-135M, SmolLM2-360M
drafts; a SmolLM2-1.7B-shaped target exported as ``mxint8-nbits``, as a user would run it) are written to disk and
exported; then, per draft, with the target on 2 threads:

- the draft's decode step (S = 1 after 64 cached tokens, median of 40 calls) on 1 and on 2 threads;
- greedy SpD (``DraftChain``, K = 4) on 3 random prompts x 32 new tokens, draft on 1 and on 2 threads, runs in the
  order 1, 2, 2, 1 (so a load drift on a shared machine affects both alike); tokens/s of the mean per thread count.

Random weights accept few drafts, so the draft's share of the time is larger than with a trained pair: the ratio
shows which thread count is faster for the draft, not the speed-up a real pair gets. The tokens are the same for both
thread counts (checked).

    python benchmarks/draft_threads.py --work-dir W --prepare   # the exports, outside the lock
    flock /work/helpers/bench.lock flock /work/helpers/bigmem.lock python benchmarks/draft_threads.py --work-dir W

Writes ``results/draft_threads.json``: ``{"run": {...}, "rows": [one per draft]}`` (``bench_support``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_support import json_out, save_results

_SMOLLM2 = dict(model_type="llama", vocab_size=49152, tie_word_embeddings=True, rms_norm_eps=1e-5)
#: name -> (hidden, layers, heads, kv heads, intermediate)
SHAPES = {
    "draft-30m": (384, 6, 6, 2, 1024),
    "draft-60m": (512, 12, 8, 2, 1536),
    "smollm2-135m": (576, 30, 9, 3, 1536),
    "smollm2-360m": (960, 32, 15, 5, 2560),
    "smollm2-1.7b": (2048, 24, 32, 32, 8192),
}


def _config(name: str):
    from accel.models.config import ModelConfig

    h, n, heads, kv, inter = SHAPES[name]
    return ModelConfig.from_hf(
        dict(
            _SMOLLM2, hidden_size=h, num_hidden_layers=n, num_attention_heads=heads, num_key_value_heads=kv,
            intermediate_size=inter, max_position_embeddings=2048,
        )
    )  # fmt: skip


def _export(name: str, work: Path, weights: str, ctx_len: int) -> tuple[Path, int]:
    """The export of ``name`` in ``work`` (reused when ``--prepare`` made it already) and its parameter count."""
    from accel.backends.export import export_onnx
    from accel.models.random_checkpoint import write_random_checkpoint
    from accel.models.sources import open_checkpoint

    path, meta = work / f"{name}-{weights}.onnx", work / f"{name}-{weights}.json"
    if path.is_file() and meta.is_file():
        return path, json.loads(meta.read_text())["params"]
    src = write_random_checkpoint(_config(name), work / name, std=0.05)
    params = open_checkpoint(src)[1].num_elements()
    export_onnx(src, path, ctx_len=ctx_len, weights=weights, progress=False)
    meta.write_text(json.dumps({"params": params}))
    shutil.rmtree(src)
    return path, params


def _spd(target, draft, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    from accel.spd import DraftChain, generate
    from accel.spd.warps import Sampling

    t0 = time.perf_counter()
    tokens = []
    for p in prompts:
        res = generate(target, DraftChain(draft, k=4), [p], max_new_tokens=new, sampling=Sampling(greedy=True))
        tokens.append(list(res.tokens[0]))
    return sum(len(t) for t in tokens) / (time.perf_counter() - t0), tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafts", default="draft-30m,draft-60m,smollm2-135m,smollm2-360m")
    p.add_argument("--target", default="smollm2-1.7b")
    p.add_argument("--target-weights", default="mxint8-nbits")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--prompts", type=int, default=3, help="random prompts of 32 tokens")
    p.add_argument("--work-dir", default=None, help="keep the exports here (default: a temporary directory)")
    p.add_argument("--prepare", action="store_true", help="only export into --work-dir (outside the bench lock)")
    p.add_argument("--out", type=json_out, default="results/draft_threads.json")
    args = p.parse_args(argv)
    if args.prepare:
        if not args.work_dir:
            p.error("--prepare needs --work-dir")
        for name in [args.target, *args.drafts.split(",")]:
            _export(name, Path(args.work_dir), args.target_weights if name == args.target else "fp32", 256)
        return 0

    from spd_support import call_latency_s

    from accel.backends import OrtBackend

    ctx = 256
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="accel-draft-threads-"))
    rows = []
    try:
        t0 = time.perf_counter()
        tpath, tparams = _export(args.target, work, args.target_weights, ctx)
        print(f"target {args.target} ({tparams / 1e6:.0f} M, {args.target_weights}) exported in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        target = OrtBackend(tpath, threads=2)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, 49152, size=32).tolist() for _ in range(args.prompts)]
        print(f"{'draft':<14} {'params':>7} {'step ms 1t':>10} {'2t':>6} {'spd tok/s 1t':>12} {'2t':>6} {'2t/1t':>6}")
        for name in args.drafts.split(","):
            dpath, dparams = _export(name, work, "fp32", ctx)
            drafts = {t: OrtBackend(dpath, threads=t) for t in (1, 2)}
            step = {t: 1e3 * call_latency_s(d, [1], past_len=64, repeats=40)[1] for t, d in drafts.items()}
            speeds: dict[int, list[float]] = {1: [], 2: []}
            seen = None
            for t in (1, 2, 2, 1):
                tps, tokens = _spd(target, drafts[t], prompts, args.new_tokens)
                speeds[t].append(tps)
                if seen is not None and tokens != seen:
                    raise SystemExit(f"{name}: the tokens differ between thread counts")
                seen = tokens
            tok_s = {t: float(np.mean(v)) for t, v in speeds.items()}
            row = dict(draft=name, params=dparams, step_ms=step, spd_tok_s=tok_s, target=args.target,
                       target_weights=args.target_weights, target_params=tparams)  # fmt: skip
            rows.append(row)
            print(f"{name:<14} {dparams / 1e6:>6.0f}M {step[1]:>10.2f} {step[2]:>6.2f} {tok_s[1]:>12.2f} "
                  f"{tok_s[2]:>6.2f} {tok_s[2] / tok_s[1]:>6.2f}", flush=True)  # fmt: skip
            del drafts
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {save_results(args.out, {'rows': rows}, __file__, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
