"""``weights="mxint8-nbits"`` (and the stored blocks of ``mxfp6-nbits`` / ``mxfp4-nbits``, whose other tests are in
test_onnx_nbits_fp.py): every Linear (and the head) as onnxruntime's MatMulNBits on MX codes.

What is exact and what is not: the stored codes and scales represent the MXINT8 weights bit for bit (checked against
``accel.formats.quantize``); the product uses int8 activations quantized per block of 32 by onnxruntime, so logits are
compared with the mx-rounded MXINT8 graph (same weights, float activations) at a tolerance, and must be closer to it
than the per-tensor ``int8`` graph is to its float graph."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import accel
from accel.backends import ExportWeights, OrtBackend, export_onnx
from accel.backends.qaic import write_qaic_files
from accel.errors import BackendError
from accel.formats import get_format, quantize
from accel.models import Decoder, ModelConfig
from accel.spd import GREEDY, DraftChain, generate, generate_ar
from tests.helpers.scenario import make_tokens, run_scenario

PROMPTS = (4, 6)
CTX = 32


def _model(tied: bool, inter: int = 80, seed: int = 0, kv_heads: int = 2) -> Decoder:
    # inter=80: down_proj's input (80) is not a multiple of the block (32), so its last block is padded
    cfg = ModelConfig(
        vocab_size=96,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=kv_heads,
        intermediate_size=inter,
        tie_word_embeddings=tied,
    )
    return Decoder(cfg).init_weights(seed, std=0.1)


def _linear_names(model: Decoder) -> list[str]:
    names = [
        f"layers.{i}.{m}.weight"
        for i in range(model.config.num_layers)
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    return [*names, "lm_head.weight"]


@pytest.mark.parametrize(
    ("weights", "element"), [("mxint8-nbits", "mxint8"), ("mxfp6-nbits", "mxfp6_e2m3"), ("mxfp4-nbits", "mxfp4_e2m1")]
)
@pytest.mark.parametrize("tied", [False, True])
def test_stored_blocks_are_exactly_the_mx_weights(tied, weights, element, tmp_path):
    model = _model(tied)
    path = export_onnx(model, tmp_path / "n.onnx", ctx_len=CTX, weights=weights, progress=False)
    proto = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    nodes = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    # q, k and v share one node per layer, gate and up another (their blocks stacked along the outputs)
    assert len(nodes) == len(_linear_names(model)) - 3 * model.config.num_layers
    assert all(n.domain == "com.microsoft" for n in nodes)
    assert "com.microsoft" in {o.domain for o in proto.opset_import}
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    seen = []
    for node in nodes:
        key = node.input[1].removesuffix(".q")
        q, scales = inits[f"{key}.q"], inits[f"{key}.block_scales"]
        assert q.dtype == np.uint8 and scales.dtype == np.float32
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["bits"], attrs["block_size"], attrs["N"]) == (8, 32, q.shape[0])
        values = ((q.astype(np.float64) - 128) * scales.reshape(q.shape[0], -1, 1)).reshape(q.shape[0], -1)
        row = 0
        for name in key.split("+"):
            w = state["embed_tokens.weight" if tied and name == "lm_head.weight" else name]
            assert name not in inits and attrs["K"] == w.shape[1]
            got = values[row : row + w.shape[0], : w.shape[1]]
            want = quantize(w, get_format(element), axis=-1, block_size=32).dequantize(np.float64)
            np.testing.assert_array_equal(got, want, err_msg=name)
            row += w.shape[0]
            seen.append(name)
        assert row == q.shape[0]
    assert sorted(seen) == sorted(_linear_names(model))
    assert inits["embed_tokens.weight"].dtype == np.float32  # gathered, not multiplied: stays float
    meta = {m.key: m.value for m in proto.metadata_props}
    assert meta["accel.weights"] == weights and meta["accel.mx_format"] == element


def test_logits_close_to_float_activations_and_closer_than_int8(tmp_path):
    """Per-block int8 activations (MatMulNBits, accuracy level 4) move the logits by far less than per-tensor uint8
    activations (``int8``) do: tolerance 2% of the logits' spread, measured 1.2% on this tiny random model (int8:
    1.7%; on SmolLM2-135M the KL to fp32 is 0.005 vs 0.46 nats per token)."""
    model = _model(tied=True)
    rows = make_tokens(96, PROMPTS, seed=3)
    nbits = run_scenario(
        OrtBackend(
            export_onnx(model, tmp_path / "n.onnx", ctx_len=CTX, batch_size=2, weights="mxint8-nbits", progress=False)
        ),
        rows,
        PROMPTS,
    )
    rounded = run_scenario(
        OrtBackend(
            export_onnx(
                model,
                tmp_path / "r.onnx",
                ctx_len=CTX,
                batch_size=2,
                weights=ExportWeights("mx-rounded", mx_format="mxint8"),
                progress=False,
            )
        ),
        rows,
        PROMPTS,
    )
    int8 = run_scenario(
        OrtBackend(export_onnx(model, tmp_path / "i.onnx", ctx_len=CTX, batch_size=2, weights="int8", progress=False)),
        rows,
        PROMPTS,
    )
    fp32 = run_scenario(
        OrtBackend(export_onnx(model, tmp_path / "f.onnx", ctx_len=CTX, batch_size=2, progress=False)), rows, PROMPTS
    )
    err_nbits = max(float(np.abs(a - b).max() / np.ptp(b)) for a, b in zip(nbits, rounded, strict=True))
    err_int8 = max(float(np.abs(a - b).max() / np.ptp(b)) for a, b in zip(int8, fp32, strict=True))
    assert err_nbits < 0.02, err_nbits
    assert err_nbits < err_int8, (err_nbits, err_int8)


def test_compressed_mxint8_model_keeps_its_codes_and_other_formats_are_rejected(tmp_path):
    model = _model(tied=False)
    compressed = copy.deepcopy(model)
    accel.compress(compressed, "mxint8")  # attention + MLP Linears; the head is quantized at export
    a = export_onnx(compressed, tmp_path / "c.onnx", ctx_len=CTX, weights="mxint8-nbits", progress=False)
    b = export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, weights="mxint8-nbits", progress=False)
    ia = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(a)).graph.initializer}
    ib = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(b)).graph.initializer}
    keys = [k for k in ib if k.endswith((".q", ".block_scales"))]
    assert len(keys) == 2 * (len(_linear_names(model)) - 3 * model.config.num_layers) and set(keys) <= set(ia)
    for key in keys:
        np.testing.assert_array_equal(ia[key], ib[key], err_msg=key)
    fp6 = copy.deepcopy(model)
    accel.compress(fp6, "mxfp6")
    with pytest.raises(BackendError, match="runs mxint8 weights only; this model is compressed with mxfp6_e2m3"):
        export_onnx(fp6, tmp_path / "x.onnx", ctx_len=CTX, weights="mxint8-nbits", progress=False)
    with pytest.raises(BackendError, match="float_storage applies to mx-rounded / mx-packed only"):
        export_onnx(
            model,
            tmp_path / "y.onnx",
            ctx_len=CTX,
            weights=ExportWeights("mxint8-nbits", float_storage="fp16"),
            progress=False,
        )
    with pytest.raises(BackendError, match=r"com.microsoft .*export with fp32, fp16 or mx-rounded for Cloud AI 100"):
        write_qaic_files(b, tmp_path / "qaic", prompt_len=8, k=3, ctx_len=CTX)


def test_one_row_and_multi_row_calls(tmp_path):
    """onnxruntime computes one-row calls slightly differently from multi-row ones, and the int8 activation
    quantization of MatMulNBits amplifies that (here only to 2e-6; 0.57 of a 26-logit spread on SmolLM2-135M), while
    multi-row calls agree with each other bit for bit whatever their S. So OrtBackend pads a one-row call of such a
    graph with a position -1 column (``min_rows`` 2 by default): single-token steps then equal the multi-row calls
    exactly, and greedy SpD (which verifies with multi-row calls) follows the same model as greedy AR.
    ``min_rows=1`` shows the one-row numbers it avoids. An MHA model (one query head per KV head): a GQA graph's
    one-token call is a multi-row product already (next test)."""
    model = _model(tied=True, inter=128, seed=4, kv_heads=4)
    path = export_onnx(model, tmp_path / "n.onnx", ctx_len=CTX, weights="mxint8-nbits", progress=False)
    padded, bare = OrtBackend(path), OrtBackend(path, min_rows=1)
    assert (padded.min_rows, bare.min_rows) == (2, 1)
    ids = np.array([make_tokens(96, (24,), seed=9)[0]])

    def run(backend: OrtBackend, s: int) -> np.ndarray:
        backend.reset()
        backend.forward(ids[:, :8], np.arange(8)[None], num_logits=1)
        return np.concatenate(
            [backend.forward(ids[:, i : i + s], np.arange(i, i + s)[None]) for i in range(8, 24, s)], axis=1
        )

    one, two, four = run(padded, 1), run(padded, 2), run(padded, 4)
    assert one.shape == four.shape == (1, 16, 96)
    np.testing.assert_array_equal(two, four)
    np.testing.assert_array_equal(one, four)
    one_row = run(bare, 1)
    np.testing.assert_array_equal(run(bare, 4), four)
    spread = float(np.ptp(four))
    assert 0 < float(np.abs(one_row - four).max()) < 0.03 * spread


def test_grouped_query_graphs_need_no_padding(tmp_path):
    """With G = 2 query heads per KV head, each attention product of a one-token call has G rows: one-row calls
    equal multi-row calls bit for bit, so OrtBackend does not pad them; a graph without the ``accel.attention_rows``
    metadata (an older export, whose attention products had one row per head) is still padded."""
    model = _model(tied=True, inter=128, seed=4)
    path = export_onnx(model, tmp_path / "g.onnx", ctx_len=CTX, weights="mxint8-nbits", progress=False)
    bare = OrtBackend(path)
    assert bare.min_rows == 1
    ids = np.array([make_tokens(96, (24,), seed=9)[0]])
    out = {}
    for s in (1, 4):
        bare.reset()
        bare.forward(ids[:, :8], np.arange(8)[None], num_logits=1)
        out[s] = np.concatenate(
            [bare.forward(ids[:, i : i + s], np.arange(i, i + s)[None]) for i in range(8, 24, s)], axis=1
        )
    np.testing.assert_array_equal(out[1], out[4])
    proto = onnx.load(str(path))
    kept = [p for p in proto.metadata_props if p.key != "accel.attention_rows"]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    onnx.save(proto, str(tmp_path / "old.onnx"))
    assert OrtBackend(tmp_path / "old.onnx").min_rows == 2


def test_min_rows_padding_keeps_outputs_and_checks_its_argument(tmp_path):
    """Padding columns change nothing a caller sees: logits, hidden states and the features a feature draft reads
    line up with the real tokens (fp32 graph, compared with unpadded calls to fp32 rounding), at batch 1 and 2."""
    cfg = ModelConfig(
        vocab_size=96,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=80,
        feature_size=48,
        embed_size=16,
    )
    model = Decoder(cfg).init_weights(5, std=0.1)
    rng = np.random.default_rng(0)
    for batch in (1, 2):
        path = export_onnx(model, tmp_path / f"f{batch}.onnx", ctx_len=CTX, batch_size=batch, progress=False)
        ids = rng.integers(0, 96, (batch, 6))
        feats = rng.standard_normal((batch, 6, 48)).astype(np.float32)
        outs = []
        for rows in (1, 5):
            b = OrtBackend(path, min_rows=rows)
            b.forward(ids[:, :5], np.tile(np.arange(5), (batch, 1)), features=feats[:, :5], num_logits=1)
            outs.append(b.forward_hidden(ids[:, 5:], np.full((batch, 1), 5), features=feats[:, 5:]))
        (l1, h1), (l5, h5) = outs
        assert l5.shape == l1.shape == (batch, 1, 96) and h5.shape == h1.shape == (batch, 1, 64)
        np.testing.assert_allclose(l5, l1, atol=1e-5, rtol=0)
        np.testing.assert_allclose(h5, h1, atol=1e-5, rtol=0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(BackendError, match="min_rows must be an int >= 1"):
            OrtBackend(path, min_rows=bad)


def test_greedy_spd_on_an_nbits_target_equals_its_ar(tmp_path):
    """Greedy SpD reproduces the target's own greedy AR tokens, batch 1 and 3 (with the one-row pad above both use
    the multi-row numerics; on SmolLM2-135M 8 of 8 held-out rows are identical over 128 tokens, 0 of 8 without it)."""
    target = _model(tied=True, inter=128, seed=1)
    draft = _model(tied=True, inter=128, seed=2)
    for batch, lens in ((1, (7,)), (3, (5, 9, 6))):
        tb = OrtBackend(
            export_onnx(
                target,
                tmp_path / f"t{batch}.onnx",
                ctx_len=CTX * 2,
                batch_size=batch,
                weights="mxint8-nbits",
                progress=False,
            )
        )
        db = OrtBackend(
            export_onnx(draft, tmp_path / f"d{batch}.onnx", ctx_len=CTX * 2, batch_size=batch, progress=False)
        )
        prompts = make_tokens(96, lens, seed=batch)
        ar = generate_ar(tb, prompts, max_new_tokens=20, sampling=GREEDY).tokens
        for k in (1, 3):
            assert generate(tb, DraftChain(db, k=k), prompts, max_new_tokens=20, sampling=GREEDY).tokens == ar
