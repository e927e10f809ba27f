"""The backend extension points used by feature drafts: the ``hidden_states`` output (``forward_hidden``) and the
``features`` input, on torch and on onnxruntime with real exported graphs.

Tolerance: onnxruntime vs eager torch on the same float32 weights, ~1e-6 on O(1) values (kernel order); ``atol=1e-5``.
MX-packed graphs are compared with the MX-rounded torch model the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from accel.backends import BackendError, ExportWeights, OrtBackend, TorchBackend, export_onnx  # noqa: E402
from accel.drafts.feature import build_feature_draft  # noqa: E402
from accel.models import Decoder, ModelConfig  # noqa: E402

ATOL = 1e-5
IDS = np.array([[3, 9, 1], [7, 7, 2]])
POS = np.array([[4, 5, 6], [-1, 0, 1]])  # row 1 left-padded


@pytest.fixture(scope="module")
def models():
    cfg = ModelConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    target = Decoder(cfg).init_weights(0, std=0.3).eval()
    draft = build_feature_draft(target, torch.arange(5, 48), layers=1, embed_size=16).init_weights(2, std=0.3)
    draft.lm_head_token_ids.copy_(torch.arange(5, 48))
    return target, draft.eval()


def _feats(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3, 32)).astype(np.float32)


def _prime(backend, feats=None):
    """Fill positions 0..3 of row 0 so the test call attends to a real past."""
    ids, pos = np.array([[1, 2, 3, 4], [0, 0, 0, 0]]), np.array([[0, 1, 2, 3], [-1, -1, -1, -1]])
    f = None if feats is None else np.ones((2, 4, 32), np.float32)
    backend.forward(ids, pos, features=f)


@pytest.mark.parametrize("weights", ["fp32", "mx-packed"])
def test_target_hidden_output_matches_torch(models, tmp_path, weights):
    target, _ = models
    path = export_onnx(
        target, tmp_path / "t.onnx", ctx_len=16, batch_size=2, hidden_output=True, weights=weights, progress=False
    )
    ort_b = OrtBackend(path, threads=1)
    assert "hidden_states" in ort_b.info.capabilities and ort_b.info.hidden_size == 32
    assert ort_b.metadata["accel.hidden_output"] == "1"
    ref = target
    if weights == "mx-packed":  # the reference is the accel.compress-ed model (same dequantized weights)
        import copy

        import accel

        ref = copy.deepcopy(target)
        accel.compress(ref, "mxfp6")
    tb = TorchBackend(ref, ctx_len=16, batch_size=2)
    for b in (ort_b, tb):
        _prime(b)
    lo, ho = ort_b.forward_hidden(IDS, POS, num_logits=2)
    lt, ht = tb.forward_hidden(IDS, POS, num_logits=2)
    assert lo.shape == (2, 2, 48) and ho.shape == (2, 3, 32)
    valid = POS >= 0
    np.testing.assert_allclose(ho[valid], ht[valid], atol=ATOL)
    np.testing.assert_allclose(lo[0], lt[0], atol=ATOL)
    assert ort_b.forward(IDS, POS + 1, num_logits=1).shape == (2, 1, 48)  # plain calls still work


def test_feature_draft_onnx_matches_torch(models, tmp_path):
    _, draft = models
    path = export_onnx(draft, tmp_path / "d.onnx", ctx_len=16, batch_size=2, progress=False)
    ort_b, tb = OrtBackend(path, threads=1), TorchBackend(draft, ctx_len=16, batch_size=2)
    # torch always has tree and mix inputs; an ONNX graph only when exported with tree=True / mix_inputs=True
    assert ort_b.info.capabilities == tb.info.capabilities - {"tree", "mix"} == frozenset({"features", "hidden_states"})
    assert ort_b.info.feature_size == tb.info.feature_size == 32
    for b in (ort_b, tb):
        _prime(b, feats=True)
    lo, ho = ort_b.forward_hidden(IDS, POS, features=_feats())
    lt, ht = tb.forward_hidden(IDS, POS, features=_feats())
    valid = POS >= 0
    np.testing.assert_allclose(lo[valid], lt[valid], atol=ATOL)
    np.testing.assert_allclose(ho[valid], ht[valid], atol=ATOL)
    # the features matter: other features, other logits
    l2 = ort_b.forward(IDS, POS, features=_feats(1))
    assert np.abs(l2[valid] - lo[valid]).max() > 1e-3


@pytest.mark.parametrize("make", ["torch", "ort"])
def test_extension_errors(models, tmp_path, make):
    target, draft = models
    if make == "torch":
        plain, feat = TorchBackend(target, ctx_len=16, batch_size=2), TorchBackend(draft, ctx_len=16, batch_size=2)
    else:
        plain = OrtBackend(export_onnx(target, tmp_path / "t.onnx", ctx_len=16, batch_size=2, progress=False))
        feat = OrtBackend(export_onnx(draft, tmp_path / "d.onnx", ctx_len=16, batch_size=2, progress=False))
        with pytest.raises(BackendError, match="does not output hidden states"):
            plain.forward_hidden(IDS, POS)
    with pytest.raises(BackendError, match="not a feature draft"):
        plain.forward(IDS, POS, features=_feats())
    with pytest.raises(BackendError, match="needs features"):
        feat.forward(IDS, POS)
    with pytest.raises(BackendError, match=r"expected \(2, 3, 32\)"):
        feat.forward(IDS, POS, features=_feats()[:, :2])
    bad = _feats()
    bad[0, 1, 3] = np.nan
    with pytest.raises(BackendError, match="finite"):
        feat.forward(IDS, POS, features=bad)


def test_export_cached_keys_hidden_output(models, tmp_path):
    from accel.backends import export_cached
    from accel.models import save_pretrained

    target, _ = models
    src = save_pretrained(target, tmp_path / "ckpt")
    a = export_cached(src, tmp_path / "onnx", ctx_len=16)
    b = export_cached(src, tmp_path / "onnx", ctx_len=16, hidden_output=True)
    assert a != b
    assert "hidden_states" not in OrtBackend(a).info.capabilities
    assert "hidden_states" in OrtBackend(b).info.capabilities
    assert export_cached(src, tmp_path / "onnx", ctx_len=16, hidden_output=True) == b  # reused


def test_int8_draft_export(models, tmp_path):
    """``weights="int8"``: the weight MatMuls (layers, lm_head) run as int8 MatMulInteger, the feature ``fc`` stays
    float32; logits stay within 5% of their spread of the float graph's (per-channel int8 weights and per-call uint8
    activations: ~1% expected), hidden states within 5% of theirs."""
    import onnx

    _, draft = models
    fp = export_onnx(draft, tmp_path / "d.onnx", ctx_len=16, batch_size=2, progress=False)
    q8 = export_onnx(draft, tmp_path / "d8.onnx", ctx_len=16, batch_size=2, weights="int8", progress=False)
    proto = onnx.load(q8)
    ops = [n.op_type for n in proto.graph.node]
    inits = {t.name: t for t in proto.graph.initializer}
    assert ops.count("MatMulInteger") == 6  # q+k+v (one joined MatMul), o, gate, up, down, lm_head
    assert inits["fc.weight"].data_type == onnx.TensorProto.FLOAT
    assert any(n.op_type == "MatMul" and "fc.weight" in n.input for n in proto.graph.node)
    assert inits["lm_head.weight_quantized"].data_type == onnx.TensorProto.UINT8  # u8u8: exact on every x86 CPU
    b8, bf = OrtBackend(q8, threads=1), OrtBackend(fp, threads=1)
    assert b8.metadata["accel.weights"] == "int8" and b8.info.capabilities == bf.info.capabilities
    for b in (b8, bf):
        _prime(b, feats=True)
    l8, h8 = b8.forward_hidden(IDS, POS, features=_feats())
    lf, hf = bf.forward_hidden(IDS, POS, features=_feats())
    valid = POS >= 0
    scored = lf[valid][:, 5:]  # the head's tokens (the others hold MASKED_LOGIT in both)
    err = np.abs(l8[valid][:, 5:] - scored).max()
    spread = scored.max() - scored.min()
    assert 0 < err < 0.05 * spread, (
        f"int8 draft logits {err:.3f} from its fp32 source (allowed {0.05 * spread:.3f}; ~1% expected): check this "
        "CPU's int8 path (accel.backends.onnx_int8, docs/backends.md 'int8 on every x86 CPU')"
    )
    assert np.array_equal(l8[valid][:, :5], lf[valid][:, :5])
    assert np.abs(h8[valid] - hf[valid]).max() < 0.05 * np.abs(hf[valid]).max()
    with pytest.raises(BackendError, match="float_storage"):
        export_onnx(
            draft, tmp_path / "x.onnx", ctx_len=16, weights=ExportWeights("int8", float_storage="fp16"), progress=False
        )
