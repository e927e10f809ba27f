"""``export_onnx(ort_ops=True)``: RMSNorm + residual add as ``SkipSimplifiedLayerNormalization`` and RoPE as
``RotaryEmbedding`` (onnxruntime's CPU contrib operators), against the standard-ONNX graph and torch.

Tolerance: ``atol=1e-5`` on O(1) logits, as for ORT vs torch in test_onnx.py. The fused kernels compute the same
float32 operations in another order (the RMS accumulation, a fused multiply-add in the rotation), measured within
3e-7 of the standard graph; a wrong rotation half, epsilon or a residual add left out moves logits by O(0.1).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from accel.backends import OrtBackend, TorchBackend, export_onnx
from accel.backends.stages import Pipeline, split_layers
from accel.errors import BackendError
from accel.models import Decoder, ModelConfig, load_checkpoint
from accel.spd import GREEDY, DraftChain, generate, generate_ar
from tests.helpers.scenario import hf_reference, make_tokens, run_scenario, tiny_hf_model

PROMPTS = (4, 6)
CTX = 32
ATOL = 1e-5


def _ops(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def _model(seed: int = 0, layers: int = 2) -> Decoder:
    cfg = ModelConfig(
        vocab_size=96, hidden_size=64, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=96
    )
    return Decoder(cfg).init_weights(seed, std=0.1)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_fused_graph_matches_torch_transformers_and_the_standard_graph(family, tmp_path):
    """Prefill with left padding, single steps and a scoring call (run_scenario) on llama (llama3 rope scaling),
    qwen2 (q/k/v biases, tied head) and mistral."""
    hf = tiny_hf_model(family)
    model = load_checkpoint(hf)
    rows = make_tokens(model.config.vocab_size, PROMPTS, seed=1)
    out = {}
    for ort_ops in (False, True):
        path = export_onnx(model, tmp_path / f"{ort_ops}.onnx", ctx_len=CTX, batch_size=2, progress=False,
                           ort_ops=ort_ops)  # fmt: skip
        out[ort_ops] = run_scenario(OrtBackend(path, threads=1), rows, PROMPTS)
    torch_out = run_scenario(TorchBackend(model, ctx_len=CTX, batch_size=2), rows, PROMPTS)
    for fused, standard, t, r in zip(out[True], out[False], torch_out, hf_reference(hf, rows), strict=True):
        np.testing.assert_allclose(fused, standard, atol=ATOL, rtol=0)
        np.testing.assert_allclose(fused, t, atol=ATOL, rtol=0)
        np.testing.assert_allclose(fused, r, atol=2e-5, rtol=0)


def test_graph_structure_and_defaults(tmp_path):
    """Per layer one RotaryEmbedding and two SkipSimplifiedLayerNormalization (the first layer's input norm has no
    residual to add: standard ops); ort_ops defaults by format; the metadata records it; Cloud AI 100 rejects it."""
    model = _model(layers=3)
    fused = export_onnx(model, tmp_path / "f.onnx", ctx_len=CTX, progress=False, ort_ops=True)
    plain = export_onnx(model, tmp_path / "p.onnx", ctx_len=CTX, progress=False)
    ops, std = _ops(fused), _ops(plain)
    assert ops["RotaryEmbedding"] == 3 and ops["SkipSimplifiedLayerNormalization"] == 2 * 3
    # the first norm (Sqrt, its eps Add); Adds: the mask per layer, the eps, the cache slots' "max position + 1"
    assert ops["Sqrt"] == 1 and ops["Add"] == 3 + 2
    assert not any(n.domain for n in onnx.load(str(plain)).graph.node)  # standard ONNX only
    assert sum(std.values()) - sum(ops.values()) >= 5 * 3  # 5 nodes less per layer (docs/backends.md)
    meta = lambda p: {m.key: m.value for m in onnx.load(str(p)).metadata_props}  # noqa: E731
    assert meta(fused)["accel.ort_ops"] == "1" and meta(plain)["accel.ort_ops"] == "0"
    nbits = export_onnx(model, tmp_path / "n.onnx", ctx_len=CTX, progress=False, weights="mxfp6-nbits")
    assert _ops(nbits)["RotaryEmbedding"] == 3  # an onnxruntime-only format: fused by default
    from accel.backends import write_qaic_files

    with pytest.raises(BackendError, match="ort_ops=False"):
        write_qaic_files(fused, tmp_path / "qaic", prompt_len=8, k=3, ctx_len=CTX)


def test_head_variants_and_stages_match_the_standard_graph(tmp_path):
    """The final norm with the last residual add fused, with ``hidden_output`` and ``num_logits`` (the residual
    stream sliced before the norm), and pipeline stages (``hidden_out`` is the materialized residual stream)."""
    model = _model(seed=3, layers=4)
    rows = make_tokens(96, PROMPTS, seed=2)
    for kw in ({"hidden_output": True}, {"num_logits": 1}):
        got = {}
        for ort_ops in (False, True):
            path = export_onnx(model, tmp_path / f"h{ort_ops}.onnx", ctx_len=CTX, batch_size=2, progress=False,
                               ort_ops=ort_ops, **kw)  # fmt: skip
            b = OrtBackend(path, threads=1)
            ids, pos = np.stack([r[:6] for r in rows]), np.tile(np.arange(6), (2, 1))
            got[ort_ops] = b.forward_hidden(ids, pos, num_logits=1) if kw.get("hidden_output") else (
                b.forward(ids, pos, num_logits=1),)  # fmt: skip
        for a, b in zip(got[True], got[False], strict=True):
            np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
    whole = export_onnx(model, tmp_path / "whole.onnx", ctx_len=CTX, batch_size=2, progress=False)
    stages = [
        export_onnx(model, tmp_path / f"s{i}.onnx", ctx_len=CTX, batch_size=2, progress=False, stage=s, ort_ops=True)
        for i, s in enumerate(split_layers(4, (1, 3)))
    ]
    chained = run_scenario(Pipeline([OrtBackend(p, threads=1) for p in stages]), rows, PROMPTS)
    for a, b in zip(chained, run_scenario(OrtBackend(whole, threads=1), rows, PROMPTS), strict=True):
        np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)


def test_greedy_spd_on_a_fused_fp32_target_equals_its_ar(tmp_path):
    """Greedy SpD reproduces the fused target's own greedy AR tokens (batch 1 and 3, K = 1 and 3)."""
    target, draft = _model(seed=1), _model(seed=2)
    for batch, lens in ((1, (7,)), (3, (5, 9, 6))):
        kw = dict(ctx_len=CTX * 2, batch_size=batch, progress=False, ort_ops=True)
        tb = OrtBackend(export_onnx(target, tmp_path / f"t{batch}.onnx", **kw))
        db = OrtBackend(export_onnx(draft, tmp_path / f"d{batch}.onnx", **kw))
        prompts = make_tokens(96, lens, seed=batch)
        ar = generate_ar(tb, prompts, max_new_tokens=20, sampling=GREEDY).tokens
        for k in (1, 3):
            assert generate(tb, DraftChain(db, k=k), prompts, max_new_tokens=20, sampling=GREEDY).tokens == ar
