"""Tree calls on the KV-cache contract (``tree=TreeInputs(slot_ids, tree_mask)``; the ``"tree"`` capability), torch and
onnxruntime: every node's logits equal a separate chain call along its own path, chain calls on a tree graph equal
the chain graph's bit for bit, ``move_cache`` compaction leaves the cache a fresh prefill of the accepted tokens
would, and malformed tree inputs are ``BackendError``s that write nothing."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from accel.backends import OrtBackend, TorchBackend, TreeInputs, export_onnx  # noqa: E402
from accel.errors import BackendError  # noqa: E402
from tests.helpers.decoders import random_model  # noqa: E402
from tests.helpers.scenario import make_tokens, run_scenario  # noqa: E402
from tests.helpers.trees import SHAPES, path, tree_inputs  # noqa: E402

CTX = 48
PROMPTS = [[3, 9, 4, 1, 7, 2, 8], [5, 6]]  # ragged: the tree rows are right-aligned, the short one left-padded


@pytest.fixture(scope="module")
def model():
    return random_model(seed=4, std=0.5)


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("tree")
    out = {}
    for b in (1, 2):
        out[("chain", b)] = export_onnx(model, d / f"chain{b}.onnx", ctx_len=CTX, batch_size=b, progress=False)
        out[("tree", b)] = export_onnx(model, d / f"tree{b}.onnx", ctx_len=CTX, batch_size=b, progress=False, tree=True)
        for graph in ("chain", "tree"):  # onnxruntime's fused RMSNorm and RoPE operators (test_onnx_fused.py)
            out[(f"{graph}-ops", b)] = export_onnx(model, d / f"{graph}{b}-ops.onnx", ctx_len=CTX, batch_size=b,
                                                   progress=False, tree=graph == "tree", ort_ops=True)  # fmt: skip
    return out


def make(kind: str, model, files, batch: int, graph: str = "tree"):
    if kind == "torch":
        return TorchBackend(model, ctx_len=CTX, batch_size=batch)
    return OrtBackend(files[(graph + ("-ops" if kind == "onnxruntime-ops" else ""), batch)], threads=1)


def prefill(backend, prompts):
    """Prefill each row's prompt minus its last token (left-padded); returns the committed lengths."""
    width = max(len(p) for p in prompts) - 1
    ids = np.zeros((len(prompts), width), np.int64)
    pos = np.full((len(prompts), width), -1, np.int64)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) + 1 :] = p[:-1]
        pos[b, width - len(p) + 1 :] = np.arange(len(p) - 1)
    backend.forward(ids, pos)
    return [len(p) - 1 for p in prompts]


def tree_call(backend, prompts, shapes, tokens):
    """One batched tree call: row b's tree (parents ``shapes[b]``, node tokens ``tokens[b]``, node 0 = the prompt's
    last token) right-aligned in one call. Returns the per-row node logits ``[T_b, V]`` and the inputs."""
    committed = prefill(backend, prompts)
    width = max(len(s) for s in shapes)
    B = len(prompts)
    ids = np.zeros((B, width), np.int64)
    pos = np.full((B, width), -1, np.int64)
    slots = np.zeros((B, width), np.int64)
    mask = np.zeros((B, width, CTX), bool)
    for b, (parents, toks) in enumerate(zip(shapes, tokens, strict=True)):
        p, s, m = tree_inputs(parents, committed[b], CTX)
        cols = slice(width - len(parents), width)
        ids[b, cols], pos[b, cols], slots[b, cols], mask[b, cols] = toks, p, s, m
    logits = backend.forward(ids, pos, tree=TreeInputs(slots, mask))
    return [logits[b, width - len(s) :] for b, s in enumerate(shapes)], committed


def random_tokens(parents, root, seed):
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, 32, len(parents))
    toks[0] = root
    return toks


@pytest.mark.parametrize("kind", ["torch", "onnxruntime", "onnxruntime-ops"])
@pytest.mark.parametrize("shapes", [("wide", "bushy"), ("chain", "single"), ("bushy", "wide")])
def test_node_logits_equal_chain_calls_along_their_paths(model, files, kind, shapes):
    parents = [SHAPES[s] for s in shapes]
    tokens = [random_tokens(p, pr[-1], i) for i, (p, pr) in enumerate(zip(parents, PROMPTS, strict=True))]
    got, _ = tree_call(make(kind, model, files, 2), PROMPTS, parents, tokens)
    ref = make(kind, model, files, 1)
    for b, (prompt, par, toks) in enumerate(zip(PROMPTS, parents, tokens, strict=True)):
        for node in range(len(par)):
            seq = list(prompt[:-1]) + [int(toks[i]) for i in path(par, node)]
            ref.reset()
            want = ref.forward(np.array([seq]), np.arange(len(seq))[None], num_logits=1)[0, 0]
            np.testing.assert_allclose(got[b][node], want, atol=1e-5, err_msg=f"row {b} node {node}")


def test_chain_calls_on_a_tree_graph_equal_the_chain_graph(model, files):
    rows = make_tokens(32, (5, 2))
    chain = run_scenario(make("onnxruntime", model, files, 2, "chain"), rows, (5, 2))
    tree = run_scenario(make("onnxruntime", model, files, 2, "tree"), rows, (5, 2))
    for a, b in zip(chain, tree, strict=True):
        np.testing.assert_array_equal(a, b)
    ort_tree = make("onnxruntime", model, files, 2)
    assert "tree" in ort_tree.info.capabilities
    assert "tree" not in make("onnxruntime", model, files, 2, "chain").info.capabilities


@pytest.mark.parametrize("kind", ["torch", "onnxruntime", "onnxruntime-ops"])
def test_compaction_leaves_a_fresh_prefill_of_the_accepted_tokens(model, files, kind):
    """Accept a path that leaves the first-child chain (its nodes sit at scattered slots), move it to contiguous
    slots, and compare the cache (every layer, K and V) and the next call's logits with a fresh prefill."""
    parents = SHAPES["wide"]
    prompt = PROMPTS[0]
    toks = random_tokens(parents, prompt[-1], 7)
    backend = make(kind, model, files, 1)
    _, (committed,) = tree_call(backend, [prompt], [parents], [toks])
    accepted = path(parents, 8)  # root, node 1, node 4, node 8: off the first-child chain after depth 1
    src = committed + np.array(accepted)
    dst = committed + np.arange(len(accepted))
    move = src != dst
    assert move.sum() == 2
    backend.move_cache(src[move][None], dst[move][None])
    seq = list(prompt[:-1]) + [int(toks[i]) for i in accepted]
    fresh = make(kind, model, files, 1)
    fresh.forward(np.array([seq]), np.arange(len(seq))[None])
    n = len(seq)
    for a, b in zip(caches(backend), caches(fresh), strict=True):
        np.testing.assert_allclose(a[..., :n, :], b[..., :n, :], atol=1e-5)
    step = (np.array([[11]]), np.array([[n]]))
    np.testing.assert_allclose(backend.forward(*step), fresh.forward(*step), atol=1e-5)


def caches(backend):
    if isinstance(backend, OrtBackend):
        return [c.copy() for c in backend.cache()]
    return [t.numpy().copy() for t in (*backend.keys, *backend.values)]


def bad_calls():
    """(what, slot_ids, tree_mask, message) of malformed tree calls on batch 1, 3 tokens at positions 5, 6, 6."""
    pos = np.array([[5, 6, 6]])
    slots = np.array([[5, 6, 7]])
    mask = np.zeros((1, 3, CTX), bool)
    mask[0, :, :5] = True
    mask[0, 0, 5] = mask[0, 1, [5, 6]] = mask[0, 2, [5, 7]] = True

    def edit(**kw):
        s, m = slots.copy(), mask.copy()
        if "slot" in kw:
            s[0, kw["slot"][0]] = kw["slot"][1]
        if "see" in kw:
            m[0, kw["see"][0], kw["see"][1]] = kw["see"][2]
        return s, m

    return pos, [
        ("duplicate slots", *edit(slot=(2, 6)), "written by two tokens"),
        ("slot beyond the cache", *edit(slot=(2, CTX)), "outside the KV cache"),
        ("own slot hidden", *edit(see=(1, 6, False)), "own slot"),
        ("sibling visible", *edit(see=(1, 7, True)), "not an ancestor"),
        ("child seen by its parent (parent after child)", *edit(see=(0, 6, True)), "not an ancestor"),
        ("mask of the wrong width", slots, mask[:, :, :-1], "expected"),
        ("mask of the wrong length", slots, mask[:, :2], "expected"),
        ("integer mask", slots, mask.astype(np.int64), "boolean"),
        ("slots of the wrong shape", slots[:, :2], mask, "slot_ids"),
        ("mask without slots", None, mask, "slot_ids"),
    ]


@pytest.mark.parametrize("kind", ["torch", "onnxruntime"])
def test_malformed_tree_inputs_raise_and_write_nothing(model, files, kind):
    backend = make(kind, model, files, 1)
    backend.forward(np.array([[1, 2, 3, 4, 5]]), np.arange(5)[None])
    before = caches(backend)
    pos, cases = bad_calls()
    ids = np.array([[6, 7, 8]])
    for what, slots, mask, message in cases:
        with pytest.raises(BackendError, match=message):
            backend.forward(ids, pos, tree=TreeInputs(slots, mask))
        for a, b in zip(before, caches(backend), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=what)
    chain = make("onnxruntime", model, files, 1, "chain")
    with pytest.raises(BackendError, match="tree=True"):
        chain.forward(ids, pos, tree=TreeInputs(np.array([[5, 6, 7]]), np.ones((1, 3, CTX), bool)))


@pytest.mark.parametrize("kind", ["torch", "onnxruntime"])
def test_bad_moves_raise(model, files, kind):
    backend = make(kind, model, files, 1)
    for src, dst, message in (
        ([[3, 4]], [[1, 1]], "twice"),
        ([[3, -1]], [[1, 2]], "same places"),
        ([[3]], [[CTX]], "0.."),
        ([[3, 4]], [[1]], "one shape"),
        ([[3], [4]], [[1], [2]], "one shape"),
    ):
        with pytest.raises(BackendError, match=message):
            backend.move_cache(np.array(src), np.array(dst))
