"""A tree call's attention against a chain call's: accel's ``CacheAttention`` operator, one SmolLM2 layer's shape.

A chain token attends over the slots up to its position; a tree token over the slots its ``tree_mask`` row marks (the
committed prefix and its own path). The operator walks a tree row only up to its last visible slot and scores eight
visible slots at a time on AVX2, so a tree call should cost about what a chain call of the same width costs, whatever
the cache's length. Timed here: a one-node onnxruntime graph of ``ai.accel::CacheAttention`` (9 query heads, 3 KV
heads, head_dim 64: SmolLM2-135M's layer; 30 of them make a step) for S tokens after ``--past`` committed slots, as a
chain (positions past .. past + S - 1) and as a tree (the first S nodes of a 3-wide tree of that many tokens, each
seeing the prefix and its path), at several ``ctx_len``, the caches bound in place as ``OrtBackend`` binds them;
medians of calls interleaved chain / tree.

    python benchmarks/tree_attention.py [--past 128] [--ctx 512,2048] [--tokens 2,5,9,17] [--repeats 300]

Prints the table (microseconds per layer, tree / chain) and writes results/tree_attention.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_support import cpu_model, json_out, save_results

H, HKV, D, LAYERS = 9, 3, 64, 30  # SmolLM2-135M


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--past", type=int, default=128, help="committed slots before the call (default 128)")
    ap.add_argument("--ctx", default="512,2048", help="cache lengths in slots (comma-separated)")
    ap.add_argument("--tokens", default="2,5,9,17", help="tokens per call (comma-separated)")
    ap.add_argument("--repeats", type=int, default=300, help="timed calls per point and shape (default 300)")
    ap.add_argument("--threads", type=int, default=2, help="kernel threads (default 2)")
    ap.add_argument("--out", type=json_out, default="results/tree_attention.json")
    args = ap.parse_args(argv)
    try:
        args.ctx = [int(c) for c in args.ctx.split(",") if c]
        args.tokens = [int(s) for s in args.tokens.split(",") if s]
    except ValueError as exc:
        ap.error(f"--ctx and --tokens take comma-separated integers ({exc})")
    if not args.ctx or not args.tokens:
        ap.error("--ctx and --tokens need at least one value each")
    if min(args.past, args.repeats, args.threads, *args.ctx, *args.tokens) < 1:
        ap.error("--past, --repeats, --threads, --ctx and --tokens must be >= 1")
    if any(args.past + s > c for c in args.ctx for s in args.tokens):
        ap.error("every --ctx must hold --past + the most --tokens")
    return args


def session(threads: int):
    """An onnxruntime session of one ``CacheAttention`` node (SmolLM2's heads), the kernel on ``threads`` threads."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from accel.backends.onnx_builder import IR_VERSION
    from accel.backends.onnx_mxlinear import register_mx_kernel

    names = ("qkv", "past_key", "past_value", "position_ids", "slots", "cos", "sin", "tree_mask")
    types = (TensorProto.FLOAT,) * 3 + (TensorProto.INT64,) * 2 + (TensorProto.FLOAT,) * 2 + (TensorProto.BOOL,)
    outs = ("attention", "present_key", "present_value")
    node = helper.make_node("CacheAttention", list(names), list(outs), domain="ai.accel", num_heads=H, num_kv_heads=HKV)
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types, strict=True)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.accel", 1)], ir_version=IR_VERSION
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # the kernel's own pool, as accel runs it
    register_mx_kernel(opts, threads)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def feeds(s: int, past: int, ctx: int, rng: np.random.Generator) -> tuple[dict, dict]:
    """The chain and the tree call of ``s`` tokens after ``past`` slots (the tree: node i's parent (i - 1) // 3)."""
    parents = [-1] + [(i - 1) // 3 for i in range(1, s)]
    depth = [0] * s
    for i in range(1, s):
        depth[i] = depth[parents[i]] + 1
    mask = np.zeros((1, s, ctx), dtype=bool)
    mask[..., :past] = True
    for i in range(s):
        j = i
        while j >= 0:
            mask[0, i, past + j] = True
            j = parents[j]
    ang = np.arange(ctx, dtype=np.float32)[:, None] * 10000.0 ** (-np.arange(0, D, 2, dtype=np.float32) / D)
    common = {
        "qkv": rng.standard_normal((1, s, (H + 2 * HKV) * D), dtype=np.float32),
        "past_key": rng.standard_normal((1, HKV, ctx, D), dtype=np.float32),
        "past_value": rng.standard_normal((1, HKV, ctx, D), dtype=np.float32),
        "cos": np.cos(ang),
        "sin": np.sin(ang),
    }
    chain_pos = np.arange(past, past + s, dtype=np.int64)[None]
    chain = {**common, "position_ids": chain_pos, "slots": chain_pos, "tree_mask": np.zeros(0, dtype=bool)}
    tree_pos = (past + np.asarray(depth, dtype=np.int64))[None]
    tree = {**common, "position_ids": tree_pos, "slots": chain_pos, "tree_mask": mask}
    return chain, tree


def bound(sess, feed: dict):
    """An IO binding of ``feed`` with the caches in place (past and present one buffer, as ``OrtBackend`` binds them),
    so a call times the operator, not copies of the cache."""
    import onnxruntime as ort

    io = sess.io_binding()
    for name, value in feed.items():
        if name not in ("past_key", "past_value"):
            io.bind_cpu_input(name, value)
    for kv in ("key", "value"):
        cache = ort.OrtValue.ortvalue_from_numpy(feed[f"past_{kv}"].copy())
        io.bind_ortvalue_input(f"past_{kv}", cache)
        io.bind_ortvalue_output(f"present_{kv}", cache)
    io.bind_output("attention")
    return io


def time_point(sess, chain: dict, tree: dict, repeats: int) -> tuple[float, float]:
    """Median seconds of the chain and the tree call, interleaved (5 untimed calls of each first)."""
    times: dict[str, list[float]] = {"chain": [], "tree": []}
    calls = {"chain": bound(sess, chain), "tree": bound(sess, tree)}
    for k in range(repeats + 5):
        for name, io in calls.items():
            t0 = time.perf_counter()
            sess.run_with_iobinding(io)
            if k >= 5:
                times[name].append(time.perf_counter() - t0)
    return statistics.median(times["chain"]), statistics.median(times["tree"])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from accel.backends.cpu import cpu_flags

    sess, rng = session(args.threads), np.random.default_rng(0)
    flags = " ".join(f for f in ("avx2", "fma", "avx512f") if f in cpu_flags())
    print(f"CPU: {cpu_model()} ({flags}); {args.threads} kernel threads; past {args.past}")
    print("| ctx_len | tokens | chain us/layer | tree us/layer | tree / chain | tree, 30 layers (ms) |")
    print("|---|---|---|---|---|---|")
    rows = []
    for ctx in args.ctx:
        for s in args.tokens:
            chain_s, tree_s = time_point(sess, *feeds(s, args.past, ctx, rng), args.repeats)
            rows.append({"ctx_len": ctx, "tokens": s, "chain_s": chain_s, "tree_s": tree_s})
            print(
                f"| {ctx} | {s} | {1e6 * chain_s:.1f} | {1e6 * tree_s:.1f} | {tree_s / chain_s:.2f} | "
                f"{1e3 * LAYERS * tree_s:.2f} |"
            )
    settings = {"past": args.past, "threads": args.threads, "repeats": args.repeats}
    print(f"wrote {save_results(args.out, {'cpu': cpu_model(), 'settings': settings, 'rows': rows}, __file__)}")


if __name__ == "__main__":
    main()
