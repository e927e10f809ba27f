"""int8 weights that every x86 CPU computes alike (``accel.backends.onnx_int8``, docs/backends.md "int8 on every x86
CPU").

onnxruntime multiplies uint8 activations by int8 weights with a saturating int16 pair sum (``vpmaddubsw``) on x86
CPUs without VNNI. These tests hold on any CPU: a numpy reference of that arithmetic, the property that no exported
int8 weight can reach the int16 limit (it fails on the full-range ``u8s8`` export, accel's export before the fix),
and onnxruntime's own results against exact integer arithmetic. ``test_isa_emulated.py`` runs the graphs on an
emulated AVX2-only CPU as well.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from accel.backends import ExportWeights, OrtBackend, export_onnx
from accel.backends.cpu import int8_dot_product, int8_warning, onnxruntime_u8s8_saturates
from accel.backends.onnx_builder import GraphBuilder
from accel.backends.onnx_int8 import (
    INT16_MAX,
    int8_matmul,
    int16_pair_safe,
    quantize_int8_columns,
    saturating_u8s8_matmul,
    to_u8u8,
    unsafe_int8_weights,
)
from accel.errors import BackendError, CpuWarning
from accel.models import Decoder, ModelConfig

VNNI = frozenset({"avx2", "avx512f", "avx512_vnni"})
AVX2 = frozenset({"avx2", "fma"})


def _model(seed: int = 0, feature_size: int = 0) -> Decoder:
    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        feature_size=feature_size,
    )
    return Decoder(cfg).init_weights(seed, std=0.1)


def test_saturating_reference():
    """The reference clips each pair of products at the int16 limit and is exact below it."""
    a, w = np.full((1, 4), 255, np.uint8), np.full((4, 1), 127, np.int8)
    assert saturating_u8s8_matmul(a, w)[0, 0] == 2 * INT16_MAX  # two clipped pairs; exact: 129,540
    assert saturating_u8s8_matmul(a, -w)[0, 0] == -2 * 32768
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, 33)).astype(np.uint8)  # odd K: padded
    w = rng.integers(-64, 65, (33, 5)).astype(np.int8)  # |w| <= 64: no pair reaches the limit
    np.testing.assert_array_equal(saturating_u8s8_matmul(a, w), a.astype(np.int64) @ w.astype(np.int64))
    with pytest.raises(BackendError, match="uint8"):
        saturating_u8s8_matmul(a.astype(np.int8), w)


def test_pair_safety_property():
    """``int16_pair_safe`` is the exact condition: at |code| 65 some uint8 pair clips, at 64 none can."""
    for code, safe in ((64, True), (65, False), (-64, True), (-65, False)):
        w = np.full((2, 1), code, np.int8)
        assert int16_pair_safe(w) is safe
        a = np.full((1, 2), 255, np.uint8)
        clipped = saturating_u8s8_matmul(a, w)[0, 0] != 2 * 255 * code
        assert clipped is not safe
    assert int16_pair_safe(np.full((4, 4), 255, np.uint8))  # uint8 weights: widening kernels, never clipped


def test_quantize_columns_ranges():
    w = np.random.default_rng(1).standard_normal((40, 7)).astype(np.float32)
    full, s_full = quantize_int8_columns(w)
    seven, s_seven = quantize_int8_columns(w, 63)
    assert np.abs(full).max() == 127 and np.abs(seven).max() == 63
    np.testing.assert_allclose(s_seven, s_full * 127 / 63, rtol=1e-6)
    with pytest.raises(BackendError, match="qmax"):
        quantize_int8_columns(w, 100)


@pytest.mark.parametrize("scheme", ["u8u8", "u8s7", "u8s8"])
def test_decoder_export_schemes(scheme, tmp_path):
    """Every Linear of a ``weights="int8"`` export is safe on every x86 CPU, except with the full-range ``u8s8``
    codes (the export before the fix: this assertion failed on it); the scheme is in the metadata."""
    path = export_onnx(
        _model(), tmp_path / "m.onnx", ctx_len=16, weights=ExportWeights("int8", int8_scheme=scheme), progress=False
    )
    proto = onnx.load(path)
    assert sum(n.op_type == "MatMulInteger" for n in proto.graph.node) == 11  # 2 x (qkv, o, gate, up, down) + head
    unsafe = unsafe_int8_weights(proto)
    if scheme == "u8s8":
        assert len(unsafe) == 11
    else:
        assert unsafe == [], f"int8 weights {unsafe} can clip on x86 CPUs without VNNI"
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["accel.int8"] == scheme


def test_default_export_is_u8u8_and_equals_u8s8_integers(tmp_path):
    """The default scheme stores the same codes as uint8 + 128, so on a CPU that computes int8 exactly (VNNI) the
    logits are identical to the full-range int8 graph's, and on any CPU they are what exact integer arithmetic
    gives (``test_single_matmul_is_exact``)."""
    m = _model(3)
    default = export_onnx(m, tmp_path / "d.onnx", ctx_len=16, weights="int8", progress=False)
    legacy = export_onnx(
        m, tmp_path / "l.onnx", ctx_len=16, weights=ExportWeights("int8", int8_scheme="u8s8"), progress=False
    )
    inits = {t.name: t for t in onnx.load(default).graph.initializer}
    assert inits["lm_head.weight_quantized"].data_type == TensorProto.UINT8
    assert inits["lm_head.weight_zero_point"].data_type == TensorProto.UINT8
    old = {t.name: t for t in onnx.load(legacy).graph.initializer}
    a = onnx.numpy_helper.to_array(inits["lm_head.weight_quantized"]).astype(np.int16) - 128
    np.testing.assert_array_equal(a, onnx.numpy_helper.to_array(old["lm_head.weight_quantized"]))
    ids, pos = np.arange(1, 9)[None], np.arange(8)[None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuWarning)
        got = OrtBackend(default, threads=1).forward(ids, pos, num_logits=8)
        ref = OrtBackend(legacy, threads=1).forward(ids, pos, num_logits=8)
    if not onnxruntime_u8s8_saturates():  # asked of onnxruntime: an emulator's /proc/cpuinfo may not say
        np.testing.assert_array_equal(got, ref)
    fp = OrtBackend(export_onnx(m, tmp_path / "f.onnx", ctx_len=16, progress=False), threads=1)
    err = np.abs(got - fp.forward(ids, pos, num_logits=8)).max()
    assert err < 0.05 * np.ptp(ref), f"int8 logits off by {err:.3f} from fp32: check this CPU's int8 path"


def _single_matmul(scheme: str, w_t: np.ndarray) -> ort.InferenceSession:
    g = GraphBuilder()
    y = int8_matmul(g, "x", w_t, "w", {}, "y", scheme)
    graph = helper.make_graph(
        g.nodes,
        "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, w_t.shape[0]])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [None, w_t.shape[1]])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _exact(x: np.ndarray, w_t: np.ndarray, qmax: int = 127) -> np.ndarray:
    """``DynamicQuantizeLinear`` + exact integer ``MatMulInteger`` + rescale, in numpy (float64)."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    sx = np.float32((hi - lo) / 255)
    zx = np.clip(np.round(-lo / sx), 0, 255)
    xq = np.clip(np.round(x / sx) + zx, 0, 255)
    codes, s = quantize_int8_columns(w_t, qmax)
    acc = (xq - zx).astype(np.int64) @ codes.astype(np.int64)
    return acc * (np.float64(sx) * s.astype(np.float64))


@pytest.mark.parametrize("scheme", ["u8u8", "u8s7"])
def test_single_matmul_is_exact(scheme):
    """onnxruntime on this CPU gives exact integer results for the safe schemes, with activations and weights that
    make the full-range int8 kernel clip on CPUs without VNNI (large positive inputs, large weights)."""
    rng = np.random.default_rng(2)
    w_t = rng.standard_normal((96, 24)).astype(np.float32)
    w_t[:, 0] = 1.0  # every code of column 0 at +127: each pair of 255s clips at 32,767 without VNNI
    x = np.abs(rng.standard_normal((3, 96))).astype(np.float32) + 0.5
    got = _single_matmul(scheme, w_t).run(None, {"x": x})[0]
    want = _exact(x, w_t, 63 if scheme == "u8s7" else 127)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_to_u8u8_keeps_the_integers():
    w = np.random.default_rng(3).integers(-128, 128, (8, 4)).astype(np.int8)
    nodes = [helper.make_node("MatMulInteger", ["a", "w", "", "wz"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(np.zeros(4, np.int8), "wz")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    assert unsafe_int8_weights(proto) == ["w"]
    to_u8u8(proto)
    assert unsafe_int8_weights(proto) == []
    a = np.random.default_rng(4).integers(0, 256, (1, 8)).astype(np.uint8)
    y = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    np.testing.assert_array_equal(y, a.astype(np.int64) @ w.astype(np.int64))


def test_hydra_int8_export_is_safe(tmp_path):
    """The Hydra heads' int8 graphs (onnxruntime's quantizer, then ``to_u8u8``) are safe on every x86 CPU; the
    tool's own output (``u8s8``) is not."""
    torch = pytest.importorskip("torch")
    from accel.drafts.hydra import export_hydra
    from tests.helpers.hydra import VOCAB, random_heads, tiny_target

    heads = random_heads(tiny_target(), num_heads=2, mlp_layers=1, prefix=True, head_ids=torch.arange(3, VOCAB))
    for scheme, want_safe in (("u8u8", True), ("u8s8", False)):
        out = export_hydra(heads, tmp_path / scheme, ctx_len=16, weights="int8", int8_scheme=scheme)
        unsafe = [n for p in sorted(out.glob("*.onnx")) for n in unsafe_int8_weights(onnx.load(p))]
        assert (unsafe == []) is want_safe, f"{scheme}: unsafe int8 weights {unsafe}"
        assert f'"int8": "{scheme}"' in (out / "hydra.json").read_text()


def test_int8_warning():
    """One line for a full-range int8 graph (or one exported before the scheme was recorded) on an x86 CPU without
    VNNI; nothing with VNNI, for the safe schemes, or off x86."""
    assert int8_warning("u8s8", AVX2, x86=True) is not None
    assert int8_warning(None, AVX2, x86=True) is not None
    assert "\n" not in (int8_warning(None, AVX2, x86=True) or "")
    assert int8_warning("u8s8", VNNI, x86=True) is None
    assert int8_warning("u8u8", AVX2, x86=True) is None
    assert int8_warning("u8s7", AVX2, x86=True) is None
    assert int8_warning("u8s8", AVX2, x86=False) is None
    assert int8_dot_product(frozenset({"avx_vnni"})) and not int8_dot_product(AVX2)


def test_backend_warns_on_unsafe_graph(tmp_path, monkeypatch):
    """``OrtBackend`` warns (``CpuWarning``) when a full-range int8 graph opens on a CPU without VNNI."""
    import accel.backends.cpu as cpu

    path = export_onnx(
        _model(), tmp_path / "l.onnx", ctx_len=16, weights=ExportWeights("int8", int8_scheme="u8s8"), progress=False
    )
    safe = export_onnx(_model(), tmp_path / "s.onnx", ctx_len=16, weights="int8", progress=False)
    monkeypatch.setattr(cpu, "onnxruntime_u8s8_saturates", lambda: True)
    monkeypatch.setattr(cpu, "is_x86", lambda: True)
    with pytest.warns(CpuWarning, match="l.onnx: .*saturating"):
        OrtBackend(path, threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CpuWarning)
        OrtBackend(safe, threads=1)


def test_scheme_validation():
    with pytest.raises(BackendError, match="int8_scheme='u8s9'"):
        ExportWeights("int8", int8_scheme="u8s9")  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="int8_scheme applies"):
        ExportWeights("fp32", int8_scheme="u8s8")


def test_probe_agrees_with_the_reference():
    """``onnxruntime_u8s8_saturates`` is what onnxruntime's kernel does here: exactly when a clipping pair does not
    equal the exact product (checked on a second, larger product)."""
    from accel.backends.cpu import onnxruntime_u8s8_saturates

    w = np.full((96, 24), 1.0, np.float32)
    x = np.full((1, 96), 4.0, np.float32)
    got = _single_matmul("u8s8", w).run(None, {"x": x})[0]
    exact = np.allclose(got, _exact(x, w), rtol=1e-5)
    assert onnxruntime_u8s8_saturates() is (not exact)
