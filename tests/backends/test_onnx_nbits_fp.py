"""``weights="mxfp6-nbits"`` / ``"mxfp4-nbits"``: MXFP6 (E2M3) and MXFP4 (E2M1) weights on onnxruntime's 8-bit
MatMulNBits (the stored blocks are checked against ``accel.formats`` in test_onnx_nbits.py).

What is exact and what is not: the weights are the MX weights bit for bit (here: the MatMulNBits blocks of edge-case
tensors, and real onnxruntime MatMulNBits nodes against a float64 product of ``MXTensor.dequantize``). With
``accuracy_level=1`` (float32 activations) the logits differ from the mx-rounded graph of the same weights only by
float32 summation order; with ``accuracy_level=4`` onnxruntime quantizes the activations to int8 per block of 32."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import accel
from accel.backends import ExportWeights, OrtBackend, export_onnx
from accel.backends.onnx_weights import nbits_blocks, nbits_step
from accel.errors import BackendError
from accel.formats import MXTensor, get_format, quantize
from accel.models import Decoder, ModelConfig
from accel.spd import GREEDY, DraftChain, generate, generate_ar
from tests.helpers.scenario import make_tokens, run_scenario

PROMPTS = (4, 6)
CTX = 32
FP_MODES = [("mxfp6-nbits", "mxfp6_e2m3"), ("mxfp4-nbits", "mxfp4_e2m1")]


def _model(tied: bool = True, inter: int = 80, seed: int = 0) -> Decoder:
    # inter=80: down_proj's input (80) is not a multiple of the block (32), so its last block is padded
    cfg = ModelConfig(
        vocab_size=96,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=inter,
        tie_word_embeddings=tied,
    )
    return Decoder(cfg).init_weights(seed, std=0.1)


def test_element_steps_and_formats_without_one():
    """Every value of E2M3 x 8 and E2M1 x 2 (MXINT8 x 64) is an integer in int8 range; E3M2 and FP8 have no step."""
    assert nbits_step(get_format("mxint8")) == 2.0**-6
    assert nbits_step(get_format("mxfp6_e2m3")) == 2.0**-3
    assert nbits_step(get_format("mxfp4_e2m1")) == 2.0**-1
    for name in ("mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"):
        assert nbits_step(get_format(name)) is None, name
    # the answer for 4-bit MatMulNBits: E2M1 x 2 spans 25 integer levels, a uint4 code (with any zero point) has 16
    levels = np.unique(get_format("mxfp4_e2m1").code_values() * 2)
    assert (levels.min(), levels.max()) == (-12, 12) and levels.max() - levels.min() + 1 > 16


def _edge_tensor(fmt: str, k: int) -> MXTensor:
    """An [5, k] MX tensor with an all-zero row, an all-zero block, huge and tiny scales, and a NaN scale."""
    rng = np.random.default_rng(k)
    w = rng.standard_normal((5, k)).astype(np.float32)
    w[1] = 0.0
    w[2, :32] = 0.0
    w[3] *= 2.0**100
    w[4] *= 2.0**-100
    mx = quantize(w, get_format(fmt), axis=-1, block_size=32)
    mx.scales[0, -1] = 0xFF  # NaN scale code: the whole block is NaN
    return mx


def _run_nbits_node(mx: MXTensor, x: np.ndarray, accuracy_level: int) -> np.ndarray:
    """``x @ W^T`` with one real onnxruntime MatMulNBits node built from ``nbits_blocks(mx)``."""
    q, scales = nbits_blocks("w", mx)
    n, k = mx.shape
    node = helper.make_node(
        "MatMulNBits",
        ["x", "q", "s"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=8,
        block_size=32,
        accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        [onnx.numpy_helper.from_array(q, "q"), onnx.numpy_helper.from_array(scales.reshape(-1), "s")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("fmt", ["mxint8", "mxfp6_e2m3", "mxfp4_e2m1"])
@pytest.mark.parametrize("k", [32, 80, 17])
def test_edge_case_blocks_are_exact(fmt, k):
    """All-zero blocks, a NaN scale, scales near both ends of float32, K not a multiple of 32: the MatMulNBits blocks
    equal the reference decode bit for bit (padding codes are zeros), and onnxruntime's float32-activation product
    matches a float64 product of the reference weights to float32 rounding (NaN in the NaN block's row)."""
    mx = _edge_tensor(fmt, k)
    q, scales = nbits_blocks("w", mx)
    assert q.dtype == np.uint8 and scales.dtype == np.float32 and q.shape == (5, mx.nblocks, 32)
    got = ((q.astype(np.float64) - 128) * scales[..., None].astype(np.float64)).reshape(5, -1)
    want = mx.dequantize(np.float64)
    np.testing.assert_array_equal(got[:, :k], want)
    assert np.all(q.reshape(5, -1)[:, k:] == 128)
    assert np.all(got[1] == 0) and np.all(got[2, :32] == 0) and np.isnan(got[0, -32:]).all()
    x = np.random.default_rng(1).standard_normal((3, k)).astype(np.float32)
    y = _run_nbits_node(mx, x, accuracy_level=1)
    ref = x.astype(np.float64) @ np.nan_to_num(want, nan=0.0).T
    assert np.isnan(y[:, 0]).all() and not np.isnan(y[:, 1:]).any()
    bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(np.nan_to_num(want, nan=0.0)).T)  # float32 rounding
    assert np.all(np.abs(y[:, 1:] - ref[:, 1:]) <= bound[:, 1:])
    mx.scales[3, 0], mx.scales[4, 0] = 254, 0  # the largest and smallest E8M0 scales (float32-subnormal for MXINT8)
    q, scales = nbits_blocks("w", mx)
    got = ((q.astype(np.float64) - 128) * scales[..., None].astype(np.float64)).reshape(5, -1)
    np.testing.assert_array_equal(got[:, :k], mx.dequantize(np.float64))


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_joined_nodes_equal_separate_ones(rows):
    """The nbits graphs run q+k+v and gate+up each as one MatMulNBits (blocks stacked along the outputs): every
    output column equals the one of a separate node bit for bit, with int8 activations (level 4) too."""
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((88, 80)).astype(np.float32)
    mx = lambda a: quantize(a, get_format("mxfp6"), axis=-1, block_size=32)  # noqa: E731  (blocks along a row)
    joined, gate, up = mx(w), mx(w[:48]), mx(w[48:])
    x = rng.standard_normal((rows, 80)).astype(np.float32)
    for level in (4, 1):
        both = _run_nbits_node(joined, x, level)
        np.testing.assert_array_equal(both[:, :48], _run_nbits_node(gate, x, level))
        np.testing.assert_array_equal(both[:, 48:], _run_nbits_node(up, x, level))


def test_formats_without_an_exact_8bit_form_are_rejected(tmp_path):
    mx = quantize(np.ones((4, 32), np.float32), get_format("mxfp6_e3m2"), axis=-1, block_size=32)
    with pytest.raises(BackendError, match=r"need a 2-D MXINT8, MXFP6 \(E2M3\) or MXFP4 \(E2M1\).*got mxfp6_e3m2"):
        nbits_blocks("w", mx)
    model = _model()
    e3m2 = copy.deepcopy(model)
    accel.compress(e3m2, "mxfp6_e3m2")
    with pytest.raises(BackendError, match="runs mxfp6_e2m3 weights only; this model is compressed with mxfp6_e3m2"):
        export_onnx(e3m2, tmp_path / "x.onnx", ctx_len=CTX, weights="mxfp6-nbits", progress=False)
    for bad in (2, 0, True, "4"):
        with pytest.raises(BackendError, match=r"accuracy_level=.* is not supported"):
            ExportWeights("mxfp6-nbits", accuracy_level=bad)
    with pytest.raises(BackendError, match=r"accuracy_level applies to the \*-nbits formats only, not mx-packed"):
        ExportWeights("mx-packed", accuracy_level=1)


def _rounded(model: Decoder, element: str) -> Decoder:
    """A copy of ``model`` whose Linear weights (the head included) are their MX values, as float32."""
    out = copy.deepcopy(model)
    for module in out.modules():
        if isinstance(module, torch.nn.Linear):
            w = module.weight.detach().numpy()
            mx = quantize(w, get_format(element), axis=-1, block_size=32)
            module.weight.data = torch.from_numpy(mx.dequantize(np.float32))
    return out


@pytest.mark.parametrize(("weights", "element"), FP_MODES)
def test_logits_against_the_float_graph_of_the_same_weights(weights, element, tmp_path):
    """The reference is the fp32 graph of the same MX-rounded weights (head included). accuracy_level 1 (float32
    activations): at most the summation order may differ, so 1e-5 of the logits' spread (measured 0: onnxruntime
    1.32 dequantizes and runs the same float32 GEMM). accuracy_level 4 (int8 activations per block of 32): 3% of the
    spread (measured 0.8% MXFP6, 0.9% MXFP4; MXINT8 1.2%); MX rounding itself moves them 4.7% / 17%."""
    model = _model(tied=False)
    rows = make_tokens(96, PROMPTS, seed=3)

    def logits(m: Decoder, w: ExportWeights | str, name: str) -> list[np.ndarray]:
        path = export_onnx(m, tmp_path / name, ctx_len=CTX, batch_size=2, weights=w, progress=False)
        return run_scenario(OrtBackend(path), rows, PROMPTS)

    ref = logits(_rounded(model, element), "fp32", "r.onnx")
    exact = logits(model, ExportWeights(weights, accuracy_level=1), "e.onnx")
    fast = logits(model, ExportWeights(weights), "f.onnx")
    fp32 = logits(model, "fp32", "o.onnx")

    def err(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return max(float(np.abs(x - y).max() / np.ptp(y)) for x, y in zip(a, b, strict=True))

    assert err(exact, ref) < 1e-5, err(exact, ref)
    assert err(fast, ref) < 0.03, err(fast, ref)
    assert err(ref, fp32) > 10 * err(exact, ref)  # the comparison sees MX rounding: the reference is not fp32's


def test_compressed_model_keeps_its_codes(tmp_path):
    """A model compressed with MXFP4 exports the same MatMulNBits blocks as the uncompressed one quantized at
    export (the Linears keep their codes; the head is quantized at export)."""
    model = _model(tied=False)
    compressed = copy.deepcopy(model)
    accel.compress(compressed, "mxfp4")
    a = export_onnx(compressed, tmp_path / "c.onnx", ctx_len=CTX, weights="mxfp4-nbits", progress=False)
    b = export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, weights="mxfp4-nbits", progress=False)
    ia = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(a)).graph.initializer}
    ib = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(b)).graph.initializer}
    keys = [k for k in ib if k.endswith((".q", ".block_scales"))]
    assert len(keys) == 2 * (4 * 2 + 1) and set(keys) <= set(ia)  # per layer: q+k+v, o, gate+up, down
    for key in keys:
        np.testing.assert_array_equal(ia[key], ib[key], err_msg=key)


def test_greedy_spd_on_an_mxfp6_target_equals_its_ar(tmp_path):
    """Greedy SpD reproduces the MXFP6 target's own greedy AR tokens (batch 1 and 3; OrtBackend pads one-row calls
    of MatMulNBits graphs, see test_onnx_nbits.py)."""
    target = _model(tied=True, inter=128, seed=1)
    draft = _model(tied=True, inter=128, seed=2)
    for batch, lens in ((1, (7,)), (3, (5, 9, 6))):
        tpath = export_onnx(
            target,
            tmp_path / f"t{batch}.onnx",
            ctx_len=CTX * 2,
            batch_size=batch,
            weights="mxfp6-nbits",
            progress=False,
        )
        dpath = export_onnx(draft, tmp_path / f"d{batch}.onnx", ctx_len=CTX * 2, batch_size=batch, progress=False)
        tb, db = OrtBackend(tpath), OrtBackend(dpath)
        prompts = make_tokens(96, lens, seed=batch)
        ar = generate_ar(tb, prompts, max_new_tokens=20, sampling=GREEDY).tokens
        for k in (1, 3):
            assert generate(tb, DraftChain(db, k=k), prompts, max_new_tokens=20, sampling=GREEDY).tokens == ar
