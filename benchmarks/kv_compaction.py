"""KV compaction after a tree round: host-side moves in OrtBackend's buffers vs moves inside an onnxruntime graph.

After a tree round the accepted path's K/V must sit at the slots of its positions. Accepted nodes on the first-child
chain are already there (``accel.spd.tree.layout``); the others take M moves (M <= accepted tokens). Two ways:

- *host*: ``OrtBackend.move_cache(src, dst)``, one numpy gather/assign over all layers' buffers, only in rounds
  that need it;
- *in-graph*: each call takes ``move_src``/``move_dst`` inputs and gathers/scatters every cache tensor before its
  attention (2 ops per cache tensor per call, every call). Timed here as a separate graph holding just those ops,
  bound in place like OrtBackend's cache (its cost is what fusing it into the decoder graph would add, plus one
  session launch).

Both are compared with one SmolLM2-135M target call (S = 1 and 16) at ctx_len 256, medians of interleaved repeats.

    python benchmarks/kv_compaction.py [--ctx-len 256] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from accel.backends import OrtBackend, export_onnx
from accel.models import load_checkpoint, smollm2_checkpoint


def move_graph(names: list[str], shape: tuple[int, ...]) -> onnx.ModelProto:
    """past_X [B, H, ctx, D] -> past_X with slots dst <- slots src (row 0), for every cache tensor."""
    idx = [helper.make_tensor_value_info(n, TensorProto.INT64, ["M"]) for n in ("move_src", "move_dst")]
    b, h, _, d = shape
    nodes = [
        helper.make_node("Reshape", ["move_dst", "dst_shape"], ["dst_4d"]),
        helper.make_node("Shape", ["move_dst"], ["m"]),
        helper.make_node("Concat", ["bh", "m", "dd"], ["upd_shape"], axis=0),
        helper.make_node("Expand", ["dst_4d", "upd_shape"], ["dst_idx"]),
    ]
    inits = [
        helper.make_tensor("dst_shape", TensorProto.INT64, [4], [1, 1, -1, 1]),
        helper.make_tensor("bh", TensorProto.INT64, [2], [b, h]),
        helper.make_tensor("dd", TensorProto.INT64, [1], [d]),
    ]
    ins, outs = list(idx), []
    for n in names:
        ins.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)))
        outs.append(helper.make_tensor_value_info(n + "_out", TensorProto.FLOAT, list(shape)))
        nodes += [  # slots src -> dst along the slot axis (2) of every cache tensor
            helper.make_node("Gather", [n, "move_src"], [n + "_g"], axis=2),
            helper.make_node("ScatterElements", [n, "dst_idx", n + "_g"], [n + "_out"], axis=2),
        ]
    graph = helper.make_graph(nodes, "moves", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="accel-kv-moves-"))
    target = load_checkpoint(smollm2_checkpoint())
    tb = OrtBackend(export_onnx(target, tmp / "t.onnx", ctx_len=args.ctx_len, tree=True, progress=False), threads=1)
    past = 128
    rng = np.random.default_rng(0)
    tb.forward(rng.integers(0, 1000, (1, past)), np.arange(past)[None])
    calls = {}
    for s in (1, 16):
        ids, pos = rng.integers(0, 1000, (1, s)), np.arange(past, past + s)[None]
        calls[s] = median_s(lambda ids=ids, pos=pos: tb.forward(ids, pos), max(20, args.repeats // 10))
    kv = tb._kv  # [2 x layers, B, H, ctx, D]
    names = [f"c{i}" for i in range(kv.shape[0])]
    sess = ort.InferenceSession(move_graph(names, kv.shape[1:]).SerializeToString(), providers=["CPUExecutionProvider"])
    print(f"SmolLM2-135M ctx {args.ctx_len}: call S=1 {calls[1] * 1e3:.2f} ms, S=16 {calls[16] * 1e3:.2f} ms")
    print(f"{'M':>3} {'host ms':>8} {'in-graph ms':>12} {'host/S=1 call':>14} {'graph/S=1 call':>15}")
    for m in (1, 2, 4, 8):
        src = np.arange(past + 8, past + 8 + m, dtype=np.int64)[None]
        dst = np.arange(past, past + m, dtype=np.int64)[None]
        host = median_s(lambda src=src, dst=dst: tb.move_cache(src, dst), args.repeats)
        io = sess.io_binding()
        io.bind_cpu_input("move_src", src[0])
        io.bind_cpu_input("move_dst", dst[0])
        for i, n in enumerate(names):
            v = ort.OrtValue.ortvalue_from_numpy(kv[i])
            io.bind_ortvalue_input(n, v)
            io.bind_ortvalue_output(n + "_out", v)
        kv[:, :, :, dst[0]] = 0.0  # undo the host moves, then check the graph's
        sess.run_with_iobinding(io)
        if not np.array_equal(kv[:, :, :, dst[0]], kv[:, :, :, src[0]]) or not kv[:, :, :, src[0]].any():
            raise SystemExit("the in-graph move did not move the slots")
        graph = median_s(lambda io=io: sess.run_with_iobinding(io), args.repeats)
        print(f"{m:3d} {host * 1e3:8.3f} {graph * 1e3:12.3f} {host / calls[1]:14.4f} {graph / calls[1]:15.4f}")


if __name__ == "__main__":
    main()
