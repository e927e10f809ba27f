"""``weights="gguf-kernel-q8"``: a ``.gguf`` file's own blocks with int8 activations (``GGMLKernel.matmul_q8``,
``matmul_q8_x16``) in real onnxruntime sessions.

The graph is the ``gguf-kernel`` graph with ``act_bits=8`` on every ``MXLinear`` (``Q8_0``, ``Q4_0``, ``Q4_1`` as
stored, ``Q4_K`` repacked as ``Q4_F32``, ``Q6_K`` as ``I8_F32``, ``Q5_0`` as ``Q5S_F32``), every one interleaved 16
rows at a time.
Its logits are close to (not equal to) the float-activation graph's, a 4-token call's rows equal the same tokens
scored one by one bit for bit, greedy SpD on it is its own greedy AR, and token trees are refused.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from accel.backends import OrtBackend, export_onnx
from accel.backends.onnx_mxlinear import check_mx_kernel_graph
from accel.backends.weights import WeightFormat
from accel.decode.spec import TargetSpec
from accel.errors import BackendError, SpdError
from accel.formats import mxkernel_build
from accel.formats.ggml import GGML_TYPES
from accel.models import ModelConfig
from accel.models import random_checkpoint as rc
from accel.spd import GREEDY, DraftChain, DraftTree, generate, generate_ar
from tests.helpers.scenario import make_tokens

pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(mxkernel_build.load_kernel() is None, reason="the fused MX kernel cannot be built")

CFG = ModelConfig(vocab_size=96, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512)
#: per GGUF tensor name suffix, its block type (six of the kernel's seven layouts)
TYPES = {"attn_q": "Q4_0", "attn_k": "Q8_0", "attn_v": "Q5_0", "attn_output": "Q4_1", "ffn_gate": "Q4_K",
         "ffn_up": "Q4_K", "ffn_down": "Q6_K", "output": "Q4_1"}  # fmt: skip
LAYOUTS = {GGML_TYPES[n].fast for n in ("Q8_0", "Q4_0", "Q5S_F32", "Q4_1", "Q4_F32", "I8_F32")}


def _type(gname: str) -> str:
    return TYPES.get(gname.split(".")[-2], "Q8_0")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The GGUF's gguf-kernel-q8 and gguf-kernel exports (batch 1, tree inputs) and a random fp32 draft."""
    d = tmp_path_factory.mktemp("gguf_q8")
    src = rc.write_random_checkpoint(CFG, d / "m.gguf", kind="gguf", seed=3, std=0.3, gguf_type=_type)
    kw = {"ctx_len": 48, "batch_size": 1, "progress": False, "tree": True}
    q8 = export_onnx(src, d / "q8.onnx", weights="gguf-kernel-q8", **kw)
    f32 = export_onnx(src, d / "f.onnx", weights="gguf-kernel", **kw)
    draft = export_onnx(rc.write_random_checkpoint(CFG, d / "draft", seed=4), d / "draft.onnx", **kw)
    return src, q8, f32, draft


def test_int8_activations_on_every_linear(graphs):
    _, q8, f32, _ = graphs
    model = onnx.load(str(q8), load_external_data=False)
    nodes = [{a.name: int(a.i) for a in n.attribute} for n in model.graph.node if n.op_type == "MXLinear"]
    assert nodes and all(a.get("act_bits") == 8 for a in nodes)
    assert {a["fast"] for a in nodes} == LAYOUTS
    assert all(a.get("interleave") == 16 for a in nodes)  # every layout interleaved 16 rows at a time (ggml_x16)
    assert {p.key: p.value for p in model.metadata_props}["accel.weights"] == "gguf-kernel-q8"
    check_mx_kernel_graph(q8)
    float_nodes = onnx.load(str(f32), load_external_data=False).graph.node
    assert not [n for n in float_nodes if any(a.name == "act_bits" for a in n.attribute)]


def test_logits_are_close_to_the_float_activation_graph_and_layout_free(graphs):
    """int8 activations: within 10% of the logit spread of the float-activation graph (5.6% measured on this random
    file, whose std 0.3 weights amplify the rounding), not equal to it; a 4-token
    call's rows equal the same tokens scored one at a time, bit for bit."""
    _, q8, f32, _ = graphs
    ids = np.asarray([make_tokens(CFG.vocab_size, (9,), seed=2)[0][:9]], np.int64)
    pos = np.arange(9, dtype=np.int64)[None]
    qb, fb = OrtBackend(q8, threads=2), OrtBackend(f32, threads=2)
    a, b = qb.forward(ids, pos, num_logits=9)[0], fb.forward(ids, pos, num_logits=9)[0]
    err = float(np.abs(a - b).max() / np.ptp(b))
    assert 0 < err < 0.1, err
    qb.reset()
    head = qb.forward(ids[:, :5], pos[:, :5], num_logits=5)[0]
    steps = [qb.forward(ids[:, i : i + 1], pos[:, i : i + 1], num_logits=1)[0, 0] for i in range(5, 9)]
    np.testing.assert_array_equal(head, a[:5])
    np.testing.assert_array_equal(np.stack(steps), a[5:])


def test_greedy_spd_is_its_own_ar_and_trees_are_refused(graphs):
    _, q8, _, draft = graphs
    target, db = OrtBackend(q8, threads=2), OrtBackend(draft)
    prompts = [make_tokens(CFG.vocab_size, (7,), seed=1)[0][:7]]
    ar = generate_ar(target, prompts, max_new_tokens=16, sampling=GREEDY).tokens
    for k in (1, 3):
        assert generate(target, DraftChain(db, k=k), prompts, max_new_tokens=16, sampling=GREEDY).tokens == ar
    with pytest.raises(SpdError, match="its Linear activations are int8 \\(gguf-kernel-q8\\)"):
        generate(target, DraftTree(db, nodes=6), prompts, max_new_tokens=16, sampling=GREEDY)


def test_gguf_kernel_q8_needs_a_gguf_file(graphs, tmp_path):
    src, *_ = graphs
    directory = rc.write_random_checkpoint(CFG, tmp_path / "ckpt", seed=5)
    with pytest.raises(BackendError, match=r"runs a \.gguf file's own blocks"):
        export_onnx(directory, tmp_path / "x.onnx", weights="gguf-kernel-q8", ctx_len=16, progress=False)
    with pytest.raises(Exception, match=r"weights gguf-kernel-q8 runs a \.gguf file's own blocks"):
        TargetSpec(path=directory, weights="gguf-kernel-q8")
    assert TargetSpec(path=src, weights="gguf-kernel-q8").weights is WeightFormat.GGUF_KERNEL_Q8


@pytest.mark.parametrize(("fast", "attr", "value"), [(4, "interleave", 8), (7, "act_bits", 32)])
def test_the_graph_check_refuses_an_interleaved_node_accel_does_not_write(graphs, tmp_path, fast, attr, value):
    """interleave must be 16, and only with int8 activations."""
    _, q8, _, _ = graphs
    model = onnx.load(str(q8))
    node = next(n for n in model.graph.node if n.op_type == "MXLinear" and _attr(n, "fast") == fast)
    next(a for a in node.attribute if a.name == attr).i = value
    onnx.save(model, str(tmp_path / "bad.onnx"))
    with pytest.raises(BackendError, match="interleave 0, or 16 with act_bits 8 and a GGUF layout"):
        check_mx_kernel_graph(tmp_path / "bad.onnx")


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), 0)
