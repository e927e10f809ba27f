"""Predictive Pipelined Decoding on onnxruntime with SmolLM2-135M: match rate, tokens/s, speedup over AR, and the
measured latency against Theorem 4.1 and a contention-aware estimate for this CPU.

    flock /work/helpers/bench.lock .venv/bin/python benchmarks/ppd.py [--exit-layers 15] [--ks 1 2 3]
        [--prompts 4] [--new 48] [--heads accel/demo_data] [--plain] [--work results/ppd_bench]

Per exit layer ``e`` the target is exported as stages [0, e) (exit logits through the trained head in
``<heads>/smollm2-exit-L{e}`` or ``<heads>/exit-L{e}``, by default the heads shipped in ``accel/demo_data``; the plain
exit where there is none, and also with ``--plain``) with k rows and [e, L) with one row (``accel.backends.stages``),
beside the whole graph for the AR baseline; every session uses one thread. On the first ``--prompts`` held-out prompts
(``HELD_OUT_PROMPTS``, never trained on) it runs greedy AR, PPD serial (``concurrent=False``: the same work on one
thread) and PPD concurrent (two threads) prompt by prompt, interleaved so that load changes on a shared machine hit
all three alike, checks that PPD's tokens equal AR's, and prints per (e, k):

- ``p``: the decoder's match rate (the true token among the exit's top k);
- decode tokens/s of AR, PPD serial and PPD concurrent, and the speedup of concurrent PPD over AR;
- ``SpD loop``: the same candidates as a proposer of the speculative decoding loop (``EarlyExit`` on an exit stage of
  batch 1, verified by the whole graph with tree inputs: the ``early_exit`` kind of a ``DecodeSpec``), its tokens/s
  and speedup over AR (one thread, no pipelining: a matching candidate's front pass is recomputed);
- ``theory``: Theorem 4.1 per token, ``L - (L - dbar) p`` layer times with ``dbar = max(e, L - e)`` and one layer time
  = AR's measured time per token / L (the paper's assumption: the candidates run on otherwise idle hardware);
- ``sim``: the simulator's same-device placement (``accel.sim.ppd_stages.ppd_step_time``): per token
  ``host + P + (1 - p) t_miss`` with ``P = max(t_back, t_spec, (t_back + t_spec) / s)``, from the stage times
  measured alone (the serial run), ``s`` = how much two concurrent onnxruntime calls get done in the time of one
  (measured on two back-stage sessions before each prompt, the median: 2 if the cores were independent, 1 if the
  memory bus serialises them),
  ``host`` the serial run's time per token outside the stage calls; and its error against the measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def contention_factor(a, b, hidden: int, calls: int = 20) -> float:
    """``s``: (2 x one call's time) / (time of two concurrent calls), medians, on two sessions ``a``, ``b`` of the
    back stage's graph (one decode token at position 64)."""
    pos, h = np.array([[64]]), np.random.default_rng(0).normal(size=(1, 1, hidden)).astype(np.float32)

    def call(s):
        return s.forward_stage(pos, hidden_in=h, num_logits=1)

    alone, pair = [], []
    with ThreadPoolExecutor(max_workers=1) as pool:
        for _ in range(calls):
            t0 = time.perf_counter()
            call(a)
            alone.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            job = pool.submit(call, b)
            call(a)
            job.result()
            pair.append(time.perf_counter() - t0)
    return 2 * statistics.median(alone) / statistics.median(pair)


def per_token(res) -> float:
    """Decode seconds per token after the first (PPD or AR result)."""
    s = res.stats
    return (s.wall_s - s.prefill_s) / max(s.new_tokens - 1, 1)


def export_all(target, args, work: Path):
    from accel.backends import export_onnx
    from accel.backends.stages import split_layers
    from accel.drafts.early_exit import load_exit_head

    L = target.config.num_layers
    kw = dict(ctx_len=args.ctx, progress=False)
    out = {"whole": work / "whole.onnx", "whole_tree": work / "whole-tree.onnx", "stages": {}, "loop": {}}
    if not out["whole"].is_file():
        export_onnx(target, out["whole"], batch_size=1, **kw)
    if not out["whole_tree"].is_file():  # the SpD loop's target: tree calls verify k > 1 candidates
        export_onnx(target, out["whole_tree"], batch_size=1, tree=True, **kw)
    for e in args.exit_layers:
        front_spec, back_spec = split_layers(L, [e], exit_logits=True)
        head_dir = next((d for d in (Path(args.heads) / f"smollm2-exit-L{e}", Path(args.heads) / f"exit-L{e}")
                         if d.is_dir()), None)  # fmt: skip
        heads = {"trained": load_exit_head(head_dir, target)} if head_dir is not None else {}
        if args.plain or not heads:
            heads = {"plain": None, **heads}
        back = work / f"back-L{e}.onnx"
        if not back.is_file():
            export_onnx(target, back, batch_size=1, stage=back_spec, **kw)
        for kind, head in heads.items():
            fronts = {}
            for k in args.ks:
                fronts[k] = work / f"front-L{e}-k{k}-{kind}.onnx"
                if not fronts[k].is_file() or kind == "trained":  # a head may have been retrained: re-export
                    export_onnx(target, fronts[k], batch_size=k, stage=front_spec, exit_head=head, **kw)
            out["stages"][(e, kind)] = (back, fronts)
            out["loop"][(e, kind)] = work / f"front-L{e}-b1-{kind}.onnx"  # EarlyExit's stage: the target's batch
            if not out["loop"][(e, kind)].is_file() or kind == "trained":
                export_onnx(target, out["loop"][(e, kind)], batch_size=1, stage=front_spec, exit_head=head, **kw)
        print(f"exit layer {e}: {'trained head ' + str(head_dir) if head_dir else 'plain exit (no trained head)'}")
    return out


def run_config(e, k, back_path, front_path, whole, prompts, args, loop) -> dict:
    """AR, serial PPD, concurrent PPD and the same candidates on the SpD loop (``loop`` = (whole target with tree
    inputs, exit stage of batch 1): ``generate(target, EarlyExit(stage, k))``), interleaved prompt by prompt (so
    that a shared machine's load changes affect all alike) with ``s`` measured before each prompt (the median is
    used); exactness checked against AR."""
    from accel.backends import OrtBackend
    from accel.spd import Sampling, generate, generate_ar
    from accel.spd.exit_proposer import EarlyExit
    from accel.spd.ppd import generate_ppd

    front, back = OrtBackend(front_path, threads=1), OrtBackend(back_path, threads=1)
    tree_target, stage = OrtBackend(loop[0], threads=1), OrtBackend(loop[1], threads=1)
    runs: dict[str, list] = {"ar": [], "serial": [], "concurrent": [], "loop": []}
    s_values, pair = [], (OrtBackend(back_path, threads=1), OrtBackend(back_path, threads=1))
    hidden = back.info.hidden_size or whole.info.hidden_size
    for p in prompts:
        s_values.append(contention_factor(*pair, hidden, calls=10))  # beside the runs it prices
        ar = generate_ar(whole, [p], max_new_tokens=args.new, sampling=Sampling(greedy=True))
        runs["ar"].append(ar)
        for mode in ("serial", "concurrent"):
            res = generate_ppd(front, back, p, max_new_tokens=args.new, concurrent=mode == "concurrent")
            if res.tokens != ar.tokens[0]:
                raise SystemExit(f"PPD (e={e}, k={k}, {mode}) differs from AR: exactness broken")
            runs[mode].append(res)
        res = generate(tree_target, EarlyExit(stage, k), [p], max_new_tokens=args.new, sampling=Sampling(greedy=True))
        if res.tokens != ar.tokens:
            raise SystemExit(f"EarlyExit on the SpD loop (e={e}, k={k}) differs from AR: exactness broken")
        runs["loop"].append(res)
    row = {"e": e, "k": k, **{f"{m}_s": statistics.mean(per_token(r) for r in rs) for m, rs in runs.items()}}
    serial = runs["serial"]
    steps = sum(r.stats.steps for r in serial)
    hits = sum(r.stats.hits for r in serial)
    toks = sum(r.stats.new_tokens - 1 for r in serial)
    calls = sum(r.stats.main_s + r.stats.spec_s + r.stats.miss_s for r in serial)
    decode = sum(r.stats.wall_s - r.stats.prefill_s for r in serial)
    row["p"] = hits / steps
    row["t_back"] = sum(r.stats.main_s for r in serial) / toks
    row["t_spec"] = sum(r.stats.spec_s for r in serial) / steps
    row["t_miss"] = sum(r.stats.miss_s for r in serial) / max(steps - hits, 1)
    row["host"] = (decode - calls) / toks
    row["s"] = statistics.median(s_values)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exit-layers", type=int, nargs="+", default=[15])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--heads", default=str(REPO / "accel" / "demo_data"), help="folder of exit-head directories")
    ap.add_argument("--plain", action="store_true", help="also run the plain exit where a trained head exists")
    ap.add_argument("--work", default=str(REPO / "results" / "ppd_bench"))
    args = ap.parse_args()

    from accel.backends import OrtBackend
    from accel.drafts.checkpoint import load_text_tokenizer
    from accel.drafts.prompts import HELD_OUT_PROMPTS
    from accel.models import load_checkpoint, smollm2_checkpoint
    from accel.sim.ppd import ppd_expected_latency
    from accel.sim.ppd_stages import PPDPlacement, PPDStageTimes, ppd_step_time

    target = load_checkpoint(smollm2_checkpoint()).eval()
    tok = load_text_tokenizer(smollm2_checkpoint())
    L = target.config.num_layers
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    paths = export_all(target, args, work)
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    whole = OrtBackend(paths["whole"], threads=1)
    print(f"{len(prompts)} held-out prompts x {args.new} tokens, greedy; onnxruntime, 1 thread per session")
    head = (
        "| e | k | exit | p | AR tok/s | PPD serial | PPD conc. | speedup | SpD loop | loop speedup | theory tok/s "
        "| sim tok/s | err |"
    )
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for (e, kind), (back, fronts) in paths["stages"].items():
        for k, front in fronts.items():
            r = run_config(e, k, back, front, whole, prompts, args, (paths["whole_tree"], paths["loop"][(e, kind)]))
            p, t_ar = r["p"], r["ar_s"]
            theory = ppd_expected_latency(L, max(e, L - e), p, 10_000) / 10_000 * t_ar / L
            times = PPDStageTimes(front_s=r["t_spec"], back_s=r["t_back"], miss_s=r["t_miss"])
            place = PPDPlacement(kind="same-device", concurrency=min(max(r["s"], 1.0), 2.0), host_s=r["host"])
            est = ppd_step_time(times, p, place)[1]
            err = (est - r["concurrent_s"]) / r["concurrent_s"]
            print(
                f"| {e} | {k} | {kind} | {p:.3f} | {1 / t_ar:.1f} | {1 / r['serial_s']:.1f} | "
                f"{1 / r['concurrent_s']:.1f} | {t_ar / r['concurrent_s']:.2f}x | {1 / r['loop_s']:.1f} | "
                f"{t_ar / r['loop_s']:.2f}x | {1 / theory:.1f} | {1 / est:.1f} | "
                f"{err:+.1%} |",
                flush=True,
            )
            print(
                f"    alone: back {r['t_back'] * 1e3:.1f} ms, speculation {r['t_spec'] * 1e3:.1f} ms, miss "
                f"{r['t_miss'] * 1e3:.1f} ms, host {r['host'] * 1e3:.2f} ms per token; AR {t_ar * 1e3:.1f} ms; "
                f"s = {r['s']:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
