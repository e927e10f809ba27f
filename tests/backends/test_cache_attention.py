"""``ai.accel::CacheAttention`` (``accel/formats/mxkernel_attn.c``): one node per layer for RoPE, the in-place KV-cache
write at each token's slot and the attention over the slots each token sees, in real onnxruntime sessions.

Op level: a hand-built one-node graph against a float64 numpy reference of the documented semantics (the cache rows
bit for bit: RoPE is plain float32 products and a difference or sum, which numpy computes the same way), padding,
tree masks, no RoPE, head_dim 12 (the portable tail), 16 (the AVX2 path, bitwise equal to the portable one), 64 and
96 (the AVX2 path's 64 output columns in registers, and a 32-column rest), row
independence, out-of-range and wrong-shaped inputs, and the in-place cache under IO binding. Model level: a tiny GQA
decoder exported with and without ``accel_attention`` (chain, left padding, greedy decoding, tree calls). Tolerances:
the operator sums in float32 in slot order, onnxruntime's graph in another order; both sit ~1e-7 of the reference,
``1e-5`` (relative to the values' magnitude or the logits' spread) leaves margin and still catches a wrong head, slot
or mask (O(0.1))."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from accel.backends import OrtBackend, TreeInputs, export_onnx
from accel.backends.graph_spec import GraphSpec
from accel.backends.onnx_builder import IR_VERSION
from accel.backends.onnx_mxlinear import check_mx_kernel_graph, register_mx_kernel
from accel.errors import BackendError
from accel.formats import mxkernel, mxkernel_build
from accel.models import Decoder, ModelConfig
from tests.helpers.trees import SHAPES, tree_inputs

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(mxkernel_build.load_kernel() is None, reason="accel's kernel library cannot be built")

TOL = 1e-5
NAMES = ("qkv", "past_key", "past_value", "position_ids", "slots", "cos", "sin", "tree_mask")
TYPES = (TensorProto.FLOAT,) * 3 + (TensorProto.INT64,) * 2 + (TensorProto.FLOAT,) * 2 + (TensorProto.BOOL,)
OUTS = ("attention", "present_key", "present_value")

# ---------------------------------------------------------------------------------------------- op level


def one_node_model(h: int, hkv: int, n_inputs: int = 8) -> onnx.ModelProto:
    """A graph of one CacheAttention node, every input a graph input of any shape."""
    ins = [helper.make_tensor_value_info(n, t, None) for n, t in zip(NAMES[:n_inputs], TYPES, strict=False)]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in OUTS]
    node = helper.make_node(
        "CacheAttention", list(NAMES[:n_inputs]), list(OUTS), name="attn", domain="ai.accel", num_heads=h,
        num_kv_heads=hkv,
    )  # fmt: skip
    graph = helper.make_graph([node], "cache_attention", ins, outs)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("ai.accel", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


_SESSIONS: dict[tuple[int, int], ort.InferenceSession] = {}


def new_session(h: int, hkv: int, intra: int = 1, spin: str | None = None) -> ort.InferenceSession:
    """A session of ``one_node_model`` (``intra`` onnxruntime threads; ``spin``: its allow_spinning entry)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra
    if spin is not None:
        opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    register_mx_kernel(opts, 2)
    return ort.InferenceSession(one_node_model(h, hkv).SerializeToString(), opts, providers=["CPUExecutionProvider"])


def session(h: int, hkv: int) -> ort.InferenceSession:
    if (h, hkv) not in _SESSIONS:
        _SESSIONS[h, hkv] = new_session(h, hkv)
    return _SESSIONS[h, hkv]


def run(feed: dict[str, np.ndarray], h: int, hkv: int) -> list[np.ndarray]:
    """A plain ``session.run`` (the caches not bound: the operator copies them first)."""
    return session(h, hkv).run(None, feed)


def rope_tables(ctx: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 10000.0 ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = (np.arange(ctx, dtype=np.float64)[:, None] * inv[None]).astype(np.float32)
    return np.cos(ang), np.sin(ang)


def make_case(d: int, *, rope: bool = True, tree: bool = False, h: int = 4, hkv: int = 2, ctx: int = 16, seed: int = 0):
    """Inputs of a batch-2, 4-token call on a random cache: row 0 at positions 5..8, row 1 left-padded (two -1
    columns, then positions 3, 4). ``tree``: row 0 is the tree ``[-1, 0, 0, 1]`` after 5 committed slots (siblings at
    one position, nodes at slots apart from their positions), row 1 the chain ``[-1, 0]`` after 3."""
    rng = np.random.default_rng(seed)
    b, s = 2, 4
    feed = {
        "qkv": rng.standard_normal((b, s, (h + 2 * hkv) * d), dtype=np.float32),
        "past_key": rng.standard_normal((b, hkv, ctx, d), dtype=np.float32),
        "past_value": rng.standard_normal((b, hkv, ctx, d), dtype=np.float32),
    }
    if tree:
        p0, s0, m0 = tree_inputs([-1, 0, 0, 1], 5, ctx)
        p1, s1, m1 = tree_inputs([-1, 0], 3, ctx)
        pad = np.full(2, -1)
        feed["position_ids"] = np.stack([p0, np.concatenate([pad, p1])]).astype(np.int64)
        feed["slots"] = np.stack([s0, np.concatenate([[0, 0], s1])]).astype(np.int64)
        feed["tree_mask"] = np.stack([m0, np.concatenate([np.zeros((2, ctx), bool), m1])])
    else:
        feed["position_ids"] = np.array([[5, 6, 7, 8], [-1, -1, 3, 4]], np.int64)
        feed["slots"] = feed["position_ids"].copy()
        feed["tree_mask"] = np.zeros(0, bool)
    if rope:
        feed["cos"], feed["sin"] = rope_tables(ctx, d)
    else:
        feed["cos"] = feed["sin"] = np.zeros(0, np.float32)
    return feed


def rope32(x: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """rotate_half RoPE in float32 (plain products, then a difference / sum): the operator's cache rows bit for bit."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def reference(feed, h: int, hkv: int, *, kv_head=None, visible=None):
    """The documented semantics in float64 (the caches in float32, written as the operator writes them):
    ``(attention [B, S, H*D], present_key, present_value)``. ``kv_head(hq, h, hkv)`` and ``visible(t, p)`` (a chain
    token at position p sees slot t) replace the GQA mapping and the chain mask for the negative checks."""
    kv_head = kv_head or (lambda hq, h, hkv: hq // (h // hkv))
    visible = visible or (lambda t, p: t <= p)
    qkv, pos, slots, cos, sin, mask = (feed[n] for n in ("qkv", "position_ids", "slots", "cos", "sin", "tree_mask"))
    kc, vc = feed["past_key"].copy(), feed["past_value"].copy()
    b_, s_, _ = qkv.shape
    ctx, d = kc.shape[2:]
    x = qkv.reshape(b_, s_, h + 2 * hkv, d)
    rope = cos.size > 0
    for b in range(b_):  # every write first
        for s in range(s_):
            p, slot = pos[b, s], slots[b, s]
            if 0 <= p < ctx and 0 <= slot < ctx:
                k = x[b, s, h : h + hkv]
                kc[b, :, slot] = rope32(k, cos[p], sin[p]) if rope else k
                vc[b, :, slot] = x[b, s, h + hkv :]
    out = np.zeros((b_, s_, h, d))
    for b in range(b_):
        for s in range(s_):
            p = pos[b, s]
            if p < 0:
                continue
            if p >= ctx:
                out[b, s] = np.nan
                continue
            vis = mask[b, s] if mask.size else visible(np.arange(ctx), p)
            q = x[b, s, :h].astype(np.float64)
            if rope:
                q = rope32(q, cos[p].astype(np.float64), sin[p].astype(np.float64))
            for hq in range(h):
                kh = kv_head(hq, h, hkv)
                sc = kc[b, kh, vis].astype(np.float64) @ q[hq] / np.sqrt(d)
                e = np.exp(sc - sc.max())
                out[b, s, hq] = e @ vc[b, kh, vis].astype(np.float64) / e.sum()
    return out.reshape(b_, s_, h * d), kc, vc


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def assert_bitwise(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("d", [12, 16, 64, 96])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_matches_the_reference(d, rope, tree):
    """Attention within 1e-5 of the float64 reference; the caches written at exactly the call's slots (roped K rows,
    V rows copied, bit for bit) and untouched elsewhere (padding columns write nothing); padding rows are zero."""
    feed = make_case(d, rope=rope, tree=tree)
    out, pk, pv = run(feed, 4, 2)
    want, wk, wv = reference(feed, 4, 2)
    assert out.shape == want.shape == (2, 4, 4 * d)
    assert rel_err(out, want) < TOL, rel_err(out, want)
    assert_bitwise(pk, wk)
    assert_bitwise(pv, wv)
    for present, past in ((pk, feed["past_key"]), (pv, feed["past_value"])):
        changed = [set(np.flatnonzero((present[b] != past[b]).any(axis=(0, 2)))) for b in range(2)]
        assert changed == [set(feed["slots"][0].tolist()), set(feed["slots"][1, 2:].tolist())]
    assert not out[1, :2].any()  # the padding columns: exact zeros
    assert np.isfinite(out).all()


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param({"kv_head": lambda hq, h, hkv: hq % hkv}, id="gqa_modulo"),
        pytest.param({"visible": lambda t, p: t < p}, id="chain_without_own_slot"),
    ],
)
def test_a_wrong_reference_is_caught(variant):
    """The reference check can fail: with query head hq on KV head hq % Hkv (instead of hq // (H / Hkv)), or a chain
    token not seeing its own slot, the operator's output is far outside the tolerance."""
    feed = make_case(16)
    out = run(feed, 4, 2)[0]
    assert rel_err(out, reference(feed, 4, 2)[0]) < TOL
    assert rel_err(out, reference(feed, 4, 2, **variant)[0]) > 1e-2


@pytest.mark.parametrize("h,hkv", [(4, 4), (6, 2), (3, 1)])
def test_other_head_groupings(h, hkv):
    """MHA (group 1), group 3 and MQA against the reference (head_dim 16)."""
    feed = make_case(16, h=h, hkv=hkv, seed=3)
    out, pk, pv = run(feed, h, hkv)
    want, wk, wv = reference(feed, h, hkv)
    assert rel_err(out, want) < TOL
    assert_bitwise(pk, wk)
    assert_bitwise(pv, wv)


@pytest.mark.parametrize("d", [12, 16, 32, 64, 96, 128])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_portable_and_avx2_paths_are_bitwise_equal(d, tree):
    """set_isa(0) (the portable C loop) and set_isa(3) (AVX2 where D % 8 == 0) give the same bits: the same FMA per
    lane and the same reduction order. (set_isa reaches onnxruntime's operator: one copy of the library is loaded.)"""
    maps = Path("/proc/self/maps")
    if maps.exists():
        run(make_case(d), 4, 2)
        loaded = {line.split()[-1] for line in maps.read_text().splitlines() if "mxkernel" in line}
        assert loaded == {mxkernel_build.kernel_status().library}
    portable_equals_best(make_case(d, tree=tree, seed=5))


def portable_equals_best(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``feed`` on the best path (set_isa(3)), checked bit for bit against the portable loop's."""
    try:
        mxkernel.set_isa(0)
        portable = run(feed, 4, 2)
    finally:
        mxkernel.set_isa(3)
    best = run(feed, 4, 2)
    for a, b in zip(portable, best, strict=True):
        assert_bitwise(a, b)
    return best


def long_case(d: int, tree: bool, seed: int = 11, ctx: int = 96) -> dict[str, np.ndarray]:
    """One row, 10 tokens after 45 committed slots of a ``ctx``-slot cache: the scores run in blocks of 8 visible
    slots and a tail. ``tree``: the "wide" tree (nodes at slots 45..54, each seeing its path), with committed slot 17
    hidden from every node (a block of 8 with a hole: its slots one by one) and the cache's slots past the tree
    unseen (the row stops at its last visible slot)."""
    rng = np.random.default_rng(seed)
    h, hkv, parents = 4, 2, SHAPES["wide"]
    feed = {
        "qkv": rng.standard_normal((1, len(parents), (h + 2 * hkv) * d), dtype=np.float32),
        "past_key": rng.standard_normal((1, hkv, ctx, d), dtype=np.float32),
        "past_value": rng.standard_normal((1, hkv, ctx, d), dtype=np.float32),
    }
    if tree:
        pos, slots, mask = tree_inputs(parents, 45, ctx)
        mask[:, 17] = False
        feed.update(position_ids=pos[None].astype(np.int64), slots=slots[None].astype(np.int64), tree_mask=mask[None])
    else:
        pos = np.arange(45, 45 + len(parents), dtype=np.int64)[None]
        feed.update(position_ids=pos, slots=pos.copy(), tree_mask=np.zeros(0, bool))
    feed["cos"], feed["sin"] = rope_tables(ctx, d)
    return feed


@pytest.mark.parametrize("d", [16, 64])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_blocks_of_eight_slots_give_the_portable_bits(d, tree):
    """Scores of 8 visible slots at a time (AVX2), the slots of a block with a hidden one singly, and a tree row cut at
    its last visible slot: bit for bit the portable loop's, and within 1e-5 of the float64 reference."""
    feed = long_case(d, tree)
    best = portable_equals_best(feed)
    want = reference(feed, 4, 2)[0]
    assert rel_err(best[0], want) < TOL
    if tree:  # the hidden slot is really hidden: seeing it moves the result far outside the tolerance
        seen = {**feed, "tree_mask": feed["tree_mask"].copy()}
        seen["tree_mask"][..., 17] = True
        assert rel_err(best[0], reference(seen, 4, 2)[0]) > 1e-3


@pytest.mark.parametrize("d", [12, 16])
def test_rows_are_independent_of_the_call(d):
    """Three chain tokens in one call (positions 6..8) equal three single-token calls in sequence on the same cache,
    bit for bit (attention and the caches): a row depends only on its query and the slots it sees."""
    base = make_case(d, seed=7)
    pos = np.array([[6, 7, 8], [2, 3, 4]], np.int64)
    feed = {**base, "qkv": base["qkv"][:, :3].copy(), "position_ids": pos, "slots": pos}
    whole, wk, wv = run(feed, 4, 2)
    k, v, parts = base["past_key"], base["past_value"], []
    for j in range(3):
        one = {**feed, "qkv": feed["qkv"][:, j : j + 1].copy(), "position_ids": pos[:, j : j + 1].copy()}
        one["slots"] = one["position_ids"]
        out, k, v = run({**one, "past_key": k, "past_value": v}, 4, 2)
        parts.append(out)
    assert_bitwise(whole, np.concatenate(parts, axis=1))
    assert_bitwise(wk, k)
    assert_bitwise(wv, v)


def test_a_position_outside_the_cache_is_nan_for_its_row():
    """A position >= ctx: that row's attention is NaN (and writes nothing); the other rows are as without it."""
    feed = make_case(16)
    feed["position_ids"] = np.array([[5, 16, 7, 8], [-1, -1, 3, 4]], np.int64)
    feed["slots"] = np.array([[5, 6, 7, 8], [0, 0, 3, 4]], np.int64)
    out, pk, _ = run(feed, 4, 2)
    want, wk, _ = reference(feed, 4, 2)
    assert np.isnan(out[0, 1]).all()
    assert np.isfinite(np.delete(out, 1, axis=1)).all()
    ok = np.isfinite(want)
    assert rel_err(out[ok], want[ok]) < TOL
    assert_bitwise(pk, wk)
    assert (pk[0, :, 6] == feed["past_key"][0, :, 6]).all()


def _bad_inputs(what: str) -> dict[str, np.ndarray]:
    feed = make_case(16)
    if what == "qkv_width":
        feed["qkv"] = feed["qkv"][:, :, :-16].copy()
    elif what == "past_value_shape":
        feed["past_value"] = feed["past_value"][:, :, :-1].copy()
    elif what == "cos_shape":
        feed["cos"] = np.concatenate([feed["cos"], feed["cos"]], axis=1)
    elif what == "tree_mask_shape":
        feed["tree_mask"] = np.ones((2, 4, 15), bool)
    elif what == "slots_shape":
        feed["slots"] = feed["slots"][:, :3].copy()
    return feed


BAD = ["qkv_width", "past_value_shape", "cos_shape", "tree_mask_shape", "slots_shape"]


@pytest.mark.parametrize("what", BAD)
def test_wrong_shapes_give_no_numbers_and_no_crash(what):
    """A wrong-shaped input: no exception, no finite attention value, and (with the caches bound in place, as
    OrtBackend binds them) the caches unchanged."""
    feed = _bad_inputs(what)
    out = run(feed, 4, 2)[0]
    assert not np.isfinite(out).any()
    k, v = feed["past_key"].copy(), feed["past_value"].copy()
    out, _, _ = run_bound(feed, k, v, 4, 2)
    assert not np.isfinite(out).any()
    assert_bitwise(k, feed["past_key"])
    assert_bitwise(v, feed["past_value"])


def test_a_wrong_qkv_width_gives_nan_attention_of_the_full_shape():
    """As documented ("NaN attention", as MXLinear): [B, S, H*D] of NaN (D from the cache), which the graph's o_proj
    can still take."""
    out = run(_bad_inputs("qkv_width"), 4, 2)[0]
    assert out.shape == (2, 4, 4 * 16) and np.isnan(out).all()


def test_a_slot_outside_the_cache_is_nan_for_its_row():
    """mxkernel_attn.c's header: "A row with a position or slot outside the cache is NaN" (and writes nothing)."""
    feed = make_case(16)
    feed["slots"] = np.array([[5, 16, 7, 8], [-1, -1, 3, 4]], np.int64)
    out = run(feed, 4, 2)[0]
    assert np.isnan(out[0, 1]).all()


def run_bound(feed, k: np.ndarray, v: np.ndarray, h: int, hkv: int):
    """A run with ``past_X`` and ``present_X`` bound to one OrtValue over the numpy array ``k`` (``v``), as OrtBackend
    binds them: ``(attention, present_key, present_value)`` as the binding returns them."""
    sess = session(h, hkv)
    io = sess.io_binding()
    for name in NAMES:
        if name not in ("past_key", "past_value"):
            io.bind_cpu_input(name, feed[name])
    for kv, arr in (("key", k), ("value", v)):
        value = ort.OrtValue.ortvalue_from_numpy(arr)
        io.bind_ortvalue_input(f"past_{kv}", value)
        io.bind_ortvalue_output(f"present_{kv}", value)
    io.bind_output("attention")
    sess.run_with_iobinding(io)
    outs = dict(zip(("present_key", "present_value", "attention"), io.get_outputs(), strict=True))
    return tuple(outs[n].numpy() for n in OUTS)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_the_cache_is_updated_in_place_when_bound(tree):
    """Bound in place: the numpy arrays behind the cache OrtValues hold the new rows after the run (the reference's
    caches, bit for bit) and the attention equals a plain run's; a plain run leaves its input arrays as they were and
    returns the same caches (the operator copied them first)."""
    feed = make_case(16, tree=tree, seed=11)
    plain = run(feed, 4, 2)
    before = feed["past_key"].copy(), feed["past_value"].copy()
    assert_bitwise(feed["past_key"], before[0])
    assert_bitwise(feed["past_value"], before[1])
    want, wk, wv = reference(feed, 4, 2)
    assert rel_err(plain[0], want) < TOL
    assert_bitwise(plain[1], wk)
    assert_bitwise(plain[2], wv)
    k, v = feed["past_key"].copy(), feed["past_value"].copy()
    out, _, _ = run_bound(feed, k, v, 4, 2)
    assert_bitwise(k, wk)
    assert_bitwise(v, wv)
    assert_bitwise(out, plain[0])


# ---------------------------------------------------------------------------------------------- model level

CTX = 32
CFG = ModelConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """The same random GQA decoder (head_dim 16) exported with onnxruntime's fused operators, with and without
    accel_attention: batch 2 chain graphs and batch 1 tree graphs."""
    d = tmp_path_factory.mktemp("cache_attention")
    model = Decoder(CFG).init_weights(0, std=0.3)
    out = {}
    for name, kw in {"std": {}, "acc": {"accel_attention": True}}.items():
        out[name] = export_onnx(model, d / f"{name}.onnx", ctx_len=CTX, batch_size=2, ort_ops=True, progress=False,
                                **kw)  # fmt: skip
        out[f"{name}_tree"] = export_onnx(model, d / f"{name}_t.onnx", ctx_len=CTX, tree=True, ort_ops=True,
                                          progress=False, **kw)  # fmt: skip
    return out


def spread_err(a: np.ndarray, b: np.ndarray) -> float:
    """The largest ``|a - b|`` relative to ``b``'s logit spread, over the rows of ``[..., V]``."""
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return float((np.abs(a - b).max(axis=1) / np.ptp(b, axis=1)).max())


def test_graph_has_one_cache_attention_a_layer(exports):
    """num_layers CacheAttention nodes (num_heads 4, num_kv_heads 2), no ScatterND (the standard graph has them), the
    kernel-graph check passes, and OrtBackend accepts the in-place cache."""
    for name in ("acc", "acc_tree"):
        proto = onnx.load(str(exports[name]))
        nodes = [n for n in proto.graph.node if n.op_type == "CacheAttention"]
        assert len(nodes) == CFG.num_layers and all(n.domain == "ai.accel" for n in nodes)
        assert all({a.name: a.i for a in n.attribute} == {"num_heads": 4, "num_kv_heads": 2} for n in nodes)
        assert not [n for n in proto.graph.node if n.op_type == "ScatterND"]
        meta = {p.key: p.value for p in proto.metadata_props}
        assert json.loads(meta["accel.graph_spec"])["accel_attention"] is True
        check_mx_kernel_graph(exports[name])
    std = onnx.load(str(exports["std"]))
    assert not [n for n in std.graph.node if n.op_type == "CacheAttention"]
    assert [n for n in std.graph.node if n.op_type == "ScatterND"]
    OrtBackend(exports["acc"], threads=2)


def test_left_padded_prefill_and_greedy_steps_match_the_standard_graph(exports):
    """Batch 2, the shorter prompt left-padded (-1 columns): the prefill's valid columns, 5 greedy steps (each graph
    feeding its own argmax) and a 3-token call agree within 1e-5 of the spread, and the greedy tokens are equal."""
    std, acc = OrtBackend(exports["std"], threads=2), OrtBackend(exports["acc"], threads=2)
    rng = np.random.default_rng(1)
    lens = (7, 4)
    ids = np.zeros((2, 7), np.int64)
    pos = np.full((2, 7), -1, np.int64)
    for b, n in enumerate(lens):
        ids[b, 7 - n :] = rng.integers(0, CFG.vocab_size, n)
        pos[b, 7 - n :] = np.arange(n)
    a, s = acc.forward(ids, pos), std.forward(ids, pos)
    valid = pos >= 0
    assert spread_err(a[valid], s[valid]) < TOL, spread_err(a[valid], s[valid])
    ta, ts = a[:, -1].argmax(-1), s[:, -1].argmax(-1)
    nxt = np.array(lens)
    for _ in range(5):
        assert (ta == ts).all()
        a = acc.forward(ta[:, None], nxt[:, None])
        s = std.forward(ts[:, None], nxt[:, None])
        assert spread_err(a, s) < TOL, spread_err(a, s)
        ta, ts, nxt = a[:, 0].argmax(-1), s[:, 0].argmax(-1), nxt + 1
    assert (ta == ts).all()
    more = rng.integers(0, CFG.vocab_size, (2, 3))
    mpos = nxt[:, None] + np.arange(3)
    a, s = acc.forward(more, mpos, num_logits=3), std.forward(more, mpos, num_logits=3)
    assert spread_err(a, s) < TOL, spread_err(a, s)


@pytest.mark.parametrize("shape", ["wide", "bushy"])
def test_tree_calls_match_the_standard_tree_graph(exports, shape):
    """A chain prefill (OrtBackend's chain tree inputs), then one tree call: every node's logits within 1e-5 of the
    spread of the standard tree graph's (a chain mask instead would be ~0.8 off), the same argmax."""
    parents = SHAPES[shape]
    prompt = np.random.default_rng(2).integers(0, CFG.vocab_size, 9)
    toks = np.random.default_rng(3).integers(0, CFG.vocab_size, len(parents))
    n = len(prompt)
    pos, slots, mask = tree_inputs(parents, n, CTX)
    got = []
    for name in ("acc_tree", "std_tree"):
        backend = OrtBackend(exports[name], threads=2)
        assert "tree" in backend.info.capabilities
        pre = backend.forward(prompt[None], np.arange(n)[None])
        tree = backend.forward(toks[None], pos[None], tree=TreeInputs(slots[None], mask[None]))
        got.append((pre, tree))
    (pa, ta), (ps, ts) = got
    assert spread_err(pa, ps) < TOL, spread_err(pa, ps)
    assert spread_err(ta, ts) < TOL, spread_err(ta, ts)
    np.testing.assert_array_equal(ta.argmax(-1), ts.argmax(-1))


# ---------------------------------------------------------------------------------------------- refusals


def test_accel_attention_needs_ort_ops():
    with pytest.raises(BackendError, match=r"accel_attention.*needs ort_ops"):
        GraphSpec(ctx_len=CTX, accel_attention=True, ort_ops=False)
    assert GraphSpec(ctx_len=CTX, accel_attention=True, ort_ops=True).accel_attention


@pytest.mark.parametrize("what", ["num_heads_3", "seven_inputs", "extra_attribute"])
def test_hand_edited_nodes_are_refused_by_name(exports, tmp_path, what):
    """A CacheAttention node with num_heads 3 over num_kv_heads 2, with 7 inputs, or with an unknown attribute:
    check_mx_kernel_graph names the node, and OrtBackend refuses the file too."""
    model = onnx.load(str(exports["acc"]))
    node = next(n for n in model.graph.node if n.op_type == "CacheAttention")
    if what == "num_heads_3":
        next(a for a in node.attribute if a.name == "num_heads").i = 3
        needle = "num_heads 3 must be a multiple of num_kv_heads 2"
    elif what == "seven_inputs":
        del node.input[7]
        needle = "8 inputs and 3 outputs; got 7, 3"
    else:
        node.attribute.append(helper.make_attribute("scale", 2))
        needle = "attributes"
    bad = tmp_path / f"{what}.onnx"
    onnx.save(model, str(bad))
    with pytest.raises(BackendError, match=rf"node '{node.name}'.*{needle}"):
        check_mx_kernel_graph(bad)
    with pytest.raises(BackendError, match=rf"node '{node.name}'"):
        OrtBackend(bad)


def test_check_on_the_op_level_graph(tmp_path):
    """The hand-built one-node graph passes the check; with 7 inputs it is refused naming the node."""
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(one_node_model(4, 2), str(good))
    onnx.save(one_node_model(4, 2, n_inputs=7), str(bad))
    check_mx_kernel_graph(good)
    with pytest.raises(BackendError, match=r"node 'attn'.*8 inputs"):
        check_mx_kernel_graph(bad)


@pytest.mark.parametrize("intra", [1, 2])
def test_the_operator_runs_on_onnxruntimes_pool_when_it_spins(intra):
    """Where onnxruntime offers KernelContext_ParallelFor (1.17+) and the session's idle threads spin, every call
    splits its rows over the session's own intra-op pool (the library counts such calls); a session whose threads
    sleep uses the library's pool (the count stays still). Both give the same floats."""
    lib = mxkernel_build.load_kernel()
    feed = make_case(16, h=4, hkv=2, seed=3)
    spinning, sleeping = new_session(4, 2, intra, "1"), new_session(4, 2, intra, "0")
    outs = []
    for sess, calls in ((spinning, 1), (sleeping, 0), (spinning, 1)):  # each session keeps its own choice
        before = lib.mxk_pfor_calls()
        outs.append(sess.run(None, feed))
        assert lib.mxk_pfor_calls() == before + calls
    for out in outs[1:]:
        for a, b in zip(outs[0], out, strict=True):
            assert_bitwise(a, b)
