"""int8 drafts on every x86 CPU: accel's int8 weight schemes side by side, on this CPU, in one interleaved run.

onnxruntime multiplies uint8 activations by int8 weights with a saturating int16 pair sum on x86 CPUs without VNNI
(``accel.backends.onnx_int8``). Each shipped draft (the standalone draft, the feature draft, the Hydra++ heads) is
exported as fp32 and with each int8 scheme (``u8s8``: full-range int8 codes, the export before the fix; ``u8s7``:
7-bit codes; ``u8u8``: the codes as uint8 + 128, the default) and decodes the held-out prompts greedily with
speculative decoding on SmolLM2-135M (fp32 target), prompt by prompt, every row in turn. The table gives each row's
acceptance (tokens per target call), its tokens/s, and the draft's median call time at S = 1 and S = 8 tokens
(standalone and feature drafts), with the ratios to the ``u8s8`` row; a first table times one int8 MatMul per scheme
and shape (``--kernels-only``: that table alone, a few seconds). It also says what onnxruntime's u8 x s8 kernel
does on this CPU (a probe: ``exact`` with VNNI, ``saturating`` without).

Run it under an emulated AVX2-only CPU to see the acceptance there (the timings of an emulator mean nothing)::

    python benchmarks/int8.py                          # this CPU: acceptance and speed
    qemu-x86_64 -cpu Haswell .venv/bin/python benchmarks/int8.py --prompts 2 --max-new-tokens 32 --no-timing

(``apt-get install qemu-user``.) Results JSON: ``results/int8.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
from bench_support import cpu_model, json_out, save_results
from spd_support import call_latency_s
from tqdm.auto import tqdm

from accel.backends import OrtBackend, export_onnx
from accel.backends.cpu import INT8_DOT_FLAGS, cpu_flags
from accel.backends.weights import INT8_SCHEMES, ExportWeights
from accel.drafts.prompts import HELD_OUT_PROMPTS
from accel.spd import GREEDY, DraftChain, DraftTree, generate, generate_ar

DEMO = Path(__file__).resolve().parents[1] / "accel" / "demo_data"
ISA = ("avx2", "avx512f", "avx512bw", "avx512vbmi", *INT8_DOT_FLAGS)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads of the target")
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--schemes", default=",".join(INT8_SCHEMES), help="int8 schemes to compare (comma-separated)")
    ap.add_argument(
        "--drafts", default="standalone,feature,hydra", help="drafts to run (comma-separated; default all three)"
    )
    ap.add_argument(
        "--kernels-only", action="store_true", help="only time one int8 MatMul per scheme and shape (1 thread)"
    )
    ap.add_argument("--no-timing", action="store_true", help="skip the draft call timings (e.g. under an emulator)")
    ap.add_argument("--cpu-label", default="", help="what the CPU is, when /proc/cpuinfo cannot say (an emulator)")
    ap.add_argument("--out", type=json_out, default=Path("results/int8.json"))
    args = ap.parse_args()
    args.schemes = [s for s in args.schemes.split(",") if s]
    args.drafts = [d for d in args.drafts.split(",") if d]
    if not args.drafts or set(args.drafts) - {"standalone", "feature", "hydra"}:
        ap.error(f"--drafts: choose from standalone, feature, hydra; got {args.drafts}")
    bad = [s for s in args.schemes if s not in INT8_SCHEMES]
    if bad or not args.schemes:
        ap.error(f"--schemes: unknown {bad}; known: {', '.join(INT8_SCHEMES)}")
    if args.prompts < 1 or args.max_new_tokens < 1:
        ap.error("--prompts and --max-new-tokens must be >= 1")
    return args


def probe_u8s8() -> str:
    """What onnxruntime's uint8 x int8 ``MatMulInteger`` computes on this CPU: ``exact`` (int32 sums: VNNI, AMX) or
    ``saturating`` (a clipped int16 pair sum: AVX2, AVX-512 without VNNI)."""
    from accel.backends.cpu import onnxruntime_u8s8_pair

    y = onnxruntime_u8s8_pair()
    return "exact" if y == 2 * 255 * 127 else f"saturating ({y} for {2 * 255 * 127})"


def kernel_ms(schemes: list[str], repeats: int = 30) -> dict:
    """Median ms of one ``DynamicQuantizeLinear`` + ``MatMulInteger`` (as exported, fused by onnxruntime) per scheme,
    for SmolLM2's shapes (K x N) and 1 or 8 rows, 1 thread, the schemes interleaved call by call."""
    import time

    import onnxruntime as ort
    from onnx import TensorProto, helper

    from accel.backends.onnx_builder import GraphBuilder
    from accel.backends.onnx_int8 import int8_matmul

    def session(w_t: np.ndarray, scheme: str) -> ort.InferenceSession:
        g = GraphBuilder()
        y = int8_matmul(g, "x", w_t, "w", {}, "y", scheme)
        k, n = w_t.shape
        graph = helper.make_graph(
            g.nodes,
            "one",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, [None, n])],
            g.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)
    out: dict = {}
    for k, n in ((576, 1536), (1536, 576), (576, 49152)):
        w_t = rng.standard_normal((k, n)).astype(np.float32)
        sessions = {s: session(w_t, s) for s in schemes}
        for rows in (1, 8):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            times: dict = {s: [] for s in schemes}
            for _ in range(repeats):
                for s, sess in sessions.items():
                    t0 = time.perf_counter()
                    sess.run(None, {"x": x})
                    times[s].append(time.perf_counter() - t0)
            out[(k, n, rows)] = {s: 1e3 * statistics.median(t) for s, t in times.items()}
    return out


def print_kernels(table: dict) -> None:
    schemes = list(next(iter(table.values())))
    print(
        "| K x N | rows | "
        + " | ".join(f"{s} ms" for s in schemes)
        + " | "
        + " | ".join(f"{s} / u8s8" for s in schemes if s != "u8s8")
        + " |"
    )
    print("|---" * (2 + 2 * len(schemes) - ("u8s8" in schemes)) + "|")
    for (k, n, rows), t in table.items():
        ratios = [f"{t[s] / t['u8s8']:.2f}" for s in schemes if s != "u8s8"] if "u8s8" in t else []
        print(
            f"| {k} x {n} | {rows} | " + " | ".join(f"{t[s]:.3f}" for s in schemes) + " | " + " | ".join(ratios) + " |"
        )


def export_drafts(args: argparse.Namespace, tmp: Path, target) -> dict:
    """``{draft kind: {weights: backend or Hydra runtime}}`` for fp32 and each scheme."""
    from accel.drafts.hydra import HydraRuntime, load_hydra
    from accel.drafts.hydra.export import export_hydra
    from accel.models import load_checkpoint

    kinds = {"standalone": DEMO / "smollm2-draft", "feature": DEMO / "smollm2-feature-draft"}
    kinds = {k: v for k, v in kinds.items() if k in args.drafts}
    out: dict = {k: {} for k in (*kinds, "hydra")}
    weights = ["fp32", *args.schemes]
    for kind, src in kinds.items():
        model = load_checkpoint(src)
        for w in tqdm(weights, desc=f"export {kind}", leave=False):
            spec = ExportWeights("fp32") if w == "fp32" else ExportWeights("int8", int8_scheme=w)  # type: ignore[arg-type]
            path = export_onnx(model, tmp / f"{kind}-{w}.onnx", ctx_len=args.ctx_len, weights=spec, tree=True)
            out[kind][w] = OrtBackend(path, threads=2 if kind == "feature" else 1)
    if "hydra" not in args.drafts:
        return out
    heads = load_hydra(DEMO / "smollm2-hydra", target)
    for w in tqdm(weights, desc="export hydra", leave=False):
        kw = {"weights": "fp32"} if w == "fp32" else {"weights": "int8", "int8_scheme": w}
        out["hydra"][w] = HydraRuntime(export_hydra(heads, tmp / f"hydra-{w}", ctx_len=args.ctx_len, **kw), threads=1)
    return out


def rows_of(drafts: dict) -> dict:
    """Row name -> a function making a fresh proposer."""
    from accel.drafts.hydra import HydraProposer, TreeShape

    rows: dict = {}
    for w, b in drafts.get("standalone", {}).items():
        rows[("standalone chain k=4", w)] = lambda b=b: DraftChain(b, k=4)
    for w, b in drafts.get("feature", {}).items():
        rows[("feature chain k=4", w)] = lambda b=b: DraftChain(b, k=4)
        rows[("feature tree 8", w)] = lambda b=b: DraftTree(b, nodes=8)
    for w, heads in drafts.get("hydra", {}).items():
        shape = TreeShape.for_decoding(heads.num_heads, 4, 4)
        rows[("Hydra++ tree 4", w)] = lambda h=heads, s=shape: HydraProposer(h, s)
    return rows


def decode(args: argparse.Namespace, tb: OrtBackend, rows: dict, prompts: list[list[int]]) -> dict:
    """Greedy SpD of every row on every prompt, interleaved; each row's tokens checked against AR."""
    got: dict = {r: [] for r in rows}
    for ids in tqdm(prompts, desc="prompts"):
        ar = generate_ar(tb, [ids], max_new_tokens=args.max_new_tokens, sampling=GREEDY).tokens
        for r, make in rows.items():
            res = generate(tb, make(), [ids], max_new_tokens=args.max_new_tokens, sampling=GREEDY)
            if res.tokens != ar:
                raise SystemExit(f"{r}: greedy SpD differs from AR: the engine is broken")
            got[r].append(res.stats)
    return {
        r: {
            "tokens_per_target_call": sum(s.new_tokens for s in st) / sum(s.row_calls for s in st),
            "tokens_per_s": sum(s.new_tokens for s in st) / sum(s.wall_s for s in st),
        }
        for r, st in got.items()
    }


def draft_call_ms(drafts: dict, no_timing: bool) -> dict:
    """Median ms per draft call at S = 1 and 8 tokens, the schemes interleaved within each pass."""
    out: dict = {}
    if no_timing:
        return out
    for kind in [k for k in ("standalone", "feature") if drafts.get(k)]:
        for _ in range(3):  # passes, each over every weight choice
            for w, b in drafts[kind].items():
                t = call_latency_s(b, (1, 8), past_len=64, repeats=7)
                out.setdefault((kind, w), []).append({s: 1e3 * v for s, v in t.items()})
    return {k: {s: statistics.median(p[s] for p in v) for s in (1, 8)} for k, v in out.items()}


def main() -> None:
    args = parse_args()
    from accel.models import load_checkpoint, load_tokenizer, smollm2_checkpoint

    flags = cpu_flags()
    cpu = args.cpu_label or cpu_model()
    isa = "as emulated (see cpu)" if args.cpu_label else " ".join(f for f in ISA if f in flags)
    probe = probe_u8s8()
    print(f"CPU: {cpu}; flags: {isa or '(none read)'}; onnxruntime u8 x s8 MatMulInteger: {probe}")
    kernels = {} if args.no_timing else kernel_ms(args.schemes)
    if kernels:
        print_kernels(kernels)
    if args.kernels_only:
        rows = [{"k": k, "n": n, "rows": r, **t} for (k, n, r), t in kernels.items()]
        data = {"cpu": cpu, "isa": isa, "u8s8_kernel": probe, "kernel_ms": rows}
        print(f"wrote {save_results(args.out, data, __file__)}")
        return
    target_dir = smollm2_checkpoint()
    target = load_checkpoint(target_dir)
    tok = load_tokenizer(target_dir)
    prompts = [tok.encode(p).ids for p in HELD_OUT_PROMPTS[: args.prompts]]
    tmp = Path(tempfile.mkdtemp(prefix="accel-int8-bench-"))
    path = export_onnx(target, tmp / "target.onnx", ctx_len=args.ctx_len, hidden_output=True, tree=True)
    tb = OrtBackend(path, threads=args.threads)
    drafts = export_drafts(args, tmp, target)
    table = decode(args, tb, rows_of(drafts), prompts)
    calls = draft_call_ms(drafts, args.no_timing)
    print_table(table, calls)
    data = {
        "cpu": cpu,
        "isa": isa,
        "u8s8_kernel": probe,
        "rows": [{"row": r, "weights": w, **v} for (r, w), v in table.items()],
        "kernel_ms": [{"k": k, "n": n, "rows": r, **t} for (k, n, r), t in kernels.items()],
        "draft_call_ms": [
            {"draft": k, "weights": w, **{f"s{s}": v for s, v in t.items()}} for (k, w), t in calls.items()
        ],
    }
    print(f"wrote {save_results(args.out, data, __file__)}")


def print_table(table: dict, calls: dict) -> None:
    """One row per (draft, weights): acceptance, tokens/s, draft call times, and ratios to the u8s8 row."""
    print("| draft | weights | tokens per target call | tok/s | x u8s8 tok/s | draft ms S=1 | S=8 | x u8s8 S=1 | S=8 |")
    print("|---|---|---|---|---|---|---|---|---|")
    order = {w: i for i, w in enumerate(["fp32", *INT8_SCHEMES])}
    names = list(dict.fromkeys(r for r, _ in table))
    for (r, w), v in sorted(table.items(), key=lambda kv: (names.index(kv[0][0]), order[kv[0][1]])):
        base = table.get((r, "u8s8"))
        kind = "standalone" if r.startswith("standalone") else "feature" if r.startswith("feature") else None
        c, c0 = calls.get((kind, w)), calls.get((kind, "u8s8"))
        cells = [f"{v['tokens_per_target_call']:.2f}", f"{v['tokens_per_s']:.1f}"]
        cells.append(f"{v['tokens_per_s'] / base['tokens_per_s']:.2f}" if base else "")
        cells += [f"{c[1]:.2f}", f"{c[8]:.2f}"] if c else ["", ""]
        cells += [f"{c[1] / c0[1]:.2f}", f"{c[8] / c0[8]:.2f}"] if c and c0 else ["", ""]
        print(f"| {r} | {w} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
