"""``weights="mxfp6-kernel"`` (``mxfp4-kernel``, ``mxint8-kernel``): MX weights packed in the graph and run by accel's
fused kernel as the onnxruntime custom operator ``ai.accel::MXLinear`` (accel/formats/mxkernel_ort.c).

What is exact and what is not: the operator calls the same ``mxk_linear`` as ``PackedMX.matmul``, so its outputs
equal ``PackedMX.matmul`` bit for bit (checked on edge-case blocks through a real onnxruntime session). The weights
are the MX values exactly and the activations stay float32, so the logits differ from the fp32 graph of the same
MX-rounded weights only by float32 summation order. Each output row is the same sum whatever the number of rows in
the call, so greedy SpD equals greedy AR on such a target."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from accel.backends import ExportWeights, OrtBackend, export_onnx
from accel.backends.onnx_builder import GraphBuilder
from accel.backends.onnx_mxlinear import DOMAIN, check_mx_kernel_graph, mx_linear, register_mx_kernel
from accel.errors import BackendError
from accel.formats import MXTensor, mxkernel_build, quantize
from accel.formats.mxkernel import PackedMX
from accel.models import Decoder
from accel.spd import GREEDY, DraftChain, DraftTree, generate, generate_ar
from tests.backends.test_onnx_nbits_fp import _edge_tensor, _rounded
from tests.backends.test_onnx_nbits_fp import _model as _tiny_model
from tests.helpers.scenario import make_tokens, run_scenario

PROMPTS = (4, 6)
CTX = 32
MODES = [("mxfp6-kernel", "mxfp6_e2m3"), ("mxfp4-kernel", "mxfp4_e2m1"), ("mxint8-kernel", "mxint8")]

pytestmark = pytest.mark.skipif(mxkernel_build.load_kernel() is None, reason="the fused MX kernel cannot be built")


def _model(tied: bool = True, inter: int = 96, seed: int = 0) -> Decoder:
    """The nbits tests' tiny model, with every Linear's input a multiple of 32 by default."""
    return _tiny_model(tied=tied, inter=inter, seed=seed)


def _node_session(mxs: list[MXTensor], act_bits: int = 32, spin: str | None = None, ndim: int = 2, glu: bool = False):
    """An onnxruntime session of one real MXLinear node computing ``x @ W^T`` for ``x`` of ``ndim`` dimensions (the
    weights joined along their outputs; ``act_bits`` 8: int8 activations per block; ``spin``: the session's
    allow_spinning entry, None: the default; ``glu``: silu of the first weight's outputs times the second's)."""
    g = GraphBuilder()
    y = mx_linear(g, "x", [f"w{i}" for i in range(len(mxs))], mxs, "y", act_bits=act_bits, glu=glu)
    k, n = mxs[0].shape[1], sum(m.shape[0] for m in mxs) // (2 if glu else 1)
    lead = [f"d{i}" for i in range(ndim - 1)]
    graph = helper.make_graph(
        g.nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [*lead, n])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    opts = ort.SessionOptions()
    if spin is not None:
        opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    register_mx_kernel(opts, 2)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run_node(mxs: list[MXTensor], x: np.ndarray, act_bits: int = 32) -> np.ndarray:
    """``x @ W^T`` by one real MXLinear node (``_node_session``)."""
    return _node_session(mxs, act_bits, ndim=x.ndim).run(None, {"x": x})[0]


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp4_e2m1", "mxint8"])
@pytest.mark.parametrize("k", [32, 96, 544])
def test_node_equals_packed_matmul_bit_for_bit(fmt, k):
    """Edge-case blocks (test_onnx_nbits_fp's: zero row and block, scales 2^+-100, a NaN scale in row 0), 1 and 6
    rows, 2-D and 3-D inputs: the node's outputs are PackedMX.matmul's bit for bit (NaN where the reference has NaN),
    and within float32 rounding of the float64 product of the exact weights."""
    mx = _edge_tensor(fmt, k)
    rng = np.random.default_rng(k)
    w64 = mx.dequantize(np.float32).astype(np.float64)
    for shape in ((1, k), (6, k), (2, 3, k)):
        x = rng.standard_normal(shape).astype(np.float32)
        got, ref = _run_node([mx], x), PackedMX(mx).matmul(x)
        assert got.shape == (*shape[:-1], 5)
        np.testing.assert_array_equal(got, ref)
        assert np.isnan(got[..., 0]).all() and not np.isnan(got[..., 1:]).any()
        y64 = x.astype(np.float64) @ w64.T
        bound = k * 2.0**-23 * (np.abs(x.astype(np.float64)) @ np.abs(w64).T)
        ok = ~np.isnan(y64)
        assert np.all(np.abs(got[ok] - y64[ok]) <= bound[ok] + 1e-300)


def test_joined_weights_equal_separate_ones():
    """q+k+v style joining: one node over weights joined along their outputs gives each weight's own outputs."""
    rng = np.random.default_rng(1)
    mxs = [quantize(rng.standard_normal((n, 64)).astype(np.float32), "mxfp6", axis=-1) for n in (5, 3, 4)]
    x = rng.standard_normal((3, 64)).astype(np.float32)
    joined = _run_node(mxs, x)
    np.testing.assert_array_equal(joined, np.concatenate([_run_node([m], x) for m in mxs], axis=-1))


def test_node_with_wrong_sized_codes_outputs_nan():
    """A hand-edited MXLinear whose codes or scales are shorter than N, K and bits say is never read past its end:
    every output is NaN (a custom operator of this ABI version cannot return an error)."""
    rng = np.random.default_rng(2)
    mx = quantize(rng.standard_normal((6, 64)).astype(np.float32), "mxfp6", axis=-1)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    assert not np.isnan(_run_node([mx], x)).any()
    for codes, scales in ((mx.codes[:-3], mx.scales), (mx.codes, mx.scales[:, :1])):
        short = MXTensor.__new__(MXTensor)  # the arrays as a broken file would hold them, past MXTensor's own checks
        for slot in MXTensor.__slots__:
            setattr(short, slot, getattr(mx, slot))
        short.codes, short.scales = codes, scales
        assert np.isnan(_run_node([short], x)).all()


@pytest.mark.parametrize(("weights", "element"), MODES)
def test_logits_against_the_float_graph_of_the_same_weights(weights, element, tmp_path):
    """The reference is the fp32 graph of the same MX-rounded weights (head included): only the float32 summation
    order differs, 1e-5 of the logits' spread (measured 2.9e-7 to 4.3e-7); MX rounding moves them 1.3% to 29%."""
    model = _model(tied=False)
    rows = make_tokens(96, PROMPTS, seed=3)

    def logits(m: Decoder, w: ExportWeights | str, name: str) -> list[np.ndarray]:
        path = export_onnx(m, tmp_path / name, ctx_len=CTX, batch_size=2, weights=w, progress=False)
        return run_scenario(OrtBackend(path, threads=2), rows, PROMPTS)

    ref = logits(_rounded(model, element), "fp32", "r.onnx")
    kernel = logits(model, weights, "k.onnx")
    fp32 = logits(model, "fp32", "o.onnx")

    def err(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return max(float(np.abs(x - y).max() / np.ptp(y)) for x, y in zip(a, b, strict=True))

    assert err(kernel, ref) < 1e-5, err(kernel, ref)
    assert err(ref, fp32) > 10 * err(kernel, ref)  # the comparison sees MX rounding: the reference is not fp32's


def test_graph_runs_every_weight_on_the_kernel(tmp_path):
    """A tied model: the head gets its own MXFP6 copy; every Linear is an MXLinear (q+k+v joined; gate+up joined with
    the SiLU and the product in the node), no MatMul reads a weight, and the embedding stays float32 for its Gather."""
    path = export_onnx(_model(tied=True), tmp_path / "m.onnx", ctx_len=CTX, weights="mxfp6-kernel", progress=False)
    graph = onnx.load(str(path)).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("MXLinear") == 2 * 4 + 1
    gated = [
        n for n in graph.node if n.op_type == "MXLinear" and any(a.name == "glu" and a.i == 1 for a in n.attribute)
    ]
    assert len(gated) == 2 and "Sigmoid" not in ops
    inits = {t.name for t in graph.initializer}
    assert not [n for n in graph.node if n.op_type == "MatMul" and set(n.input) & inits]
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert "mxfp6" in meta.get("accel.weights", "") + meta.get("accel.mx_format", "")


def test_input_features_off_the_block_are_refused(tmp_path):
    """down_proj's input of 80 features is not a multiple of 32: a clear error names the weight."""
    with pytest.raises(BackendError, match=r"MXLinear weight .*down_proj.* multiple of 32"):
        export_onnx(_model(inter=80), tmp_path / "m.onnx", ctx_len=CTX, weights="mxfp6-kernel", progress=False)


def test_greedy_spd_on_a_kernel_target_equals_its_ar(tmp_path):
    """Greedy SpD (chains and a token tree) reproduces the MXFP6-kernel target's own greedy AR tokens, batch 1
    and 3 (one-token calls are not padded: a row's outputs do not depend on the other rows)."""
    target = _model(tied=True, inter=128, seed=1)
    draft = _model(tied=True, inter=128, seed=2)
    for batch, lens in ((1, (7,)), (3, (5, 9, 6))):
        kw = {"ctx_len": CTX * 2, "batch_size": batch, "progress": False}
        tpath = export_onnx(target, tmp_path / f"t{batch}.onnx", weights="mxfp6-kernel", tree=True, **kw)
        dpath = export_onnx(draft, tmp_path / f"d{batch}.onnx", tree=True, **kw)
        tb, db = OrtBackend(tpath, threads=2), OrtBackend(dpath)
        assert tb.min_rows == 1
        prompts = make_tokens(96, lens, seed=batch)
        ar = generate_ar(tb, prompts, max_new_tokens=20, sampling=GREEDY).tokens
        for proposer in (DraftChain(db, k=1), DraftChain(db, k=3)):
            assert generate(tb, proposer, prompts, max_new_tokens=20, sampling=GREEDY).tokens == ar
        if batch == 1:
            tree = DraftTree(db, nodes=6)
            assert generate(tb, tree, prompts, max_new_tokens=20, sampling=GREEDY).tokens == ar


def test_without_the_kernel_the_session_says_why(tmp_path, monkeypatch):
    """With the kernel off (ACCEL_MXKERNEL=numpy, as on a machine without a C compiler) a kernel graph is refused
    with the reason and the alternative, not onnxruntime's unknown-operator error."""
    path = export_onnx(_model(), tmp_path / "m.onnx", ctx_len=CTX, weights="mxfp6-kernel", progress=False)
    monkeypatch.setenv("ACCEL_MXKERNEL", "numpy")
    mxkernel_build.reset()
    try:
        with pytest.raises(BackendError, match=r"kernel library .*unavailable.*ACCEL_MXKERNEL=numpy.*mxfp6-nbits"):
            OrtBackend(path)
    finally:
        monkeypatch.delenv("ACCEL_MXKERNEL")
        mxkernel_build.reset()
    assert OrtBackend(path).info.vocab_size == 96


def test_the_node_runs_on_onnxruntimes_pool_when_it_spins():
    """A weight big enough for 2 kernel threads: in a session whose idle threads spin (onnxruntime's default) every
    call splits its rows over the session's intra-op pool (KernelContext_ParallelFor, counted by the library); in one
    whose threads sleep it uses the library's own pool (the count stays still). The choice belongs to each session:
    registering a sleeping session later does not change the spinning one's. Both give PackedMX.matmul's floats."""
    lib = mxkernel_build.load_kernel()
    rng = np.random.default_rng(5)
    mx = quantize(rng.standard_normal((512, 512)).astype(np.float32), "mxfp6", axis=-1)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    spinning = _node_session([mx])
    sleeping = _node_session([mx], spin="0")
    outs = []
    for session, calls in ((spinning, 1), (sleeping, 0), (spinning, 1)):
        before = lib.mxk_pfor_calls()
        outs.append(session.run(None, {"x": x})[0])
        assert lib.mxk_pfor_calls() == before + calls
    for y in outs:
        np.testing.assert_array_equal(y, PackedMX(mx).matmul(x))


def _silu_mul_kernel(y: np.ndarray) -> np.ndarray:
    """``mxk_silu_mul`` on rows ``y [R, 2 H]`` (gate, then up), on the path ``set_isa`` allows."""
    y = np.ascontiguousarray(y, np.float32)
    out = np.full((y.shape[0], y.shape[1] // 2), 7.0, np.float32)
    mxkernel_build.load_kernel().mxk_silu_mul(y.ctypes.data, y.shape[0], y.shape[1] // 2, out.ctypes.data)
    return out


def test_gated_silu_is_the_same_on_every_path_and_within_a_few_ulp():
    """The AVX2 loop (8 lanes, a tail of 3) and the portable loop give the same floats; against float64 silu(g) * u
    within 8 ulp of the result (the exp's 3 ulp, a division and a product; below g = -88 the exp's argument is
    clamped, and results under 1e-36 in magnitude are off by up to that), NaN and infinities as silu gives them."""
    from accel.formats.mxkernel import set_isa

    rng = np.random.default_rng(3)
    g = (rng.standard_normal((3, 35)) * 4).astype(np.float32)
    g[0, :8] = [0.0, -0.0, 90.0, -90.0, 1e-30, -1e-30, 20.0, -20.0]
    u = rng.standard_normal((3, 35)).astype(np.float32)
    u[1, 0] = np.inf
    g[2, 1] = np.nan
    y = np.concatenate([g, u], axis=1)
    try:
        set_isa(0)
        portable = _silu_mul_kernel(y)
        set_isa(3)
        best = _silu_mul_kernel(y)
    finally:
        set_isa(3)
    np.testing.assert_array_equal(portable.view(np.int32), best.view(np.int32))
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = g64 / (1 + np.exp(-g64)) * u
    ok = np.isfinite(ref)
    assert np.all(np.abs(best[ok] - ref[ok]) <= 8 * np.spacing(np.abs(ref[ok]).astype(np.float32)) + 1e-36)
    assert np.abs(best[0, 3]) < 1e-36 and best[0, 2] == pytest.approx(90.0 * u[0, 2], rel=1e-6)
    assert np.isnan(best[2, 1]) and np.isinf(best[1, 0])


@pytest.mark.parametrize("act_bits", [32, 8])
def test_the_gated_node_is_silu_of_the_gate_times_up(act_bits):
    """One MXLinear with glu = 1 on [gate; up] equals the plain node's two halves through mxk_silu_mul bit for bit
    (the same products), for 1 and 5 rows; an odd number of outputs is refused by the graph check."""
    rng = np.random.default_rng(act_bits)
    gate, up = (quantize(rng.standard_normal((24, 64)).astype(np.float32), "mxfp6_e2m3") for _ in range(2))
    for rows in (1, 5):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        full = _run_node([gate, up], x, act_bits)
        got = _node_session([gate, up], act_bits, glu=True).run(None, {"x": x})[0]
        assert got.shape == (rows, 24)
        np.testing.assert_array_equal(got.view(np.int32), _silu_mul_kernel(full).view(np.int32))
    with pytest.raises(BackendError, match="gate and an up weight"):
        mx_linear(GraphBuilder(), "x", ["g", "u", "v"], [gate, up, up], None, glu=True)


@pytest.mark.parametrize("glu", [2, 1])
def test_the_graph_check_refuses_a_gated_node_accel_does_not_write(tmp_path, glu):
    """glu must be 0 or 1, and 1 needs an even number of outputs (the head's 96 + 1 rows: odd)."""
    path = export_onnx(_model(tied=True), tmp_path / "m.onnx", ctx_len=CTX, weights="mxfp6-kernel", progress=False)
    model = onnx.load(str(path))
    check_mx_kernel_graph(path)
    node = next(n for n in model.graph.node if n.op_type == "MXLinear" and any(a.name == "glu" for a in n.attribute))
    if glu == 2:
        next(a for a in node.attribute if a.name == "glu").i = 2
    else:  # the head node, gated, with its N made odd (its sizes then disagree too: the attributes are read first)
        node = next(n for n in model.graph.node if n.op_type == "MXLinear" and n.output[0] != node.output[0])
        node.attribute.append(helper.make_attribute("glu", 1))
        next(a for a in node.attribute if a.name == "N").i = 97
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(BackendError, match="glu 0 or 1 with N even"):
        check_mx_kernel_graph(tmp_path / "bad.onnx")
