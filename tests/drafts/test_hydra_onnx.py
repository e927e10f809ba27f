"""Exported Hydra heads (``accel.drafts.hydra.export`` / ``graph``) on onnxruntime (``runtime``) against the torch
heads: level graphs, the Hydra++ prefix layer with its in-place KV cache, trees grown from either, int8 weights."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from accel.drafts.architecture import causal_hidden  # noqa: E402
from accel.drafts.hydra import HydraRuntime, TreeShape, export_hydra, grow_trees  # noqa: E402
from accel.errors import DraftError  # noqa: E402
from tests.helpers.hydra import VOCAB, random_heads, tiny_target  # noqa: E402

B, L, CTX = 2, 12, 32


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def heads(target):
    return random_heads(target, num_heads=3, mlp_layers=2, prefix=True, head_ids=torch.arange(3, VOCAB))


@pytest.fixture(scope="module")
def seq(target):
    tokens = torch.randint(0, VOCAB, (B, L), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        return tokens, causal_hidden(target, tokens)


@pytest.fixture(scope="module")
def runtime(heads, tmp_path_factory):
    out = export_hydra(heads, tmp_path_factory.mktemp("hx") / "heads", ctx_len=CTX, batch_size=B)
    return HydraRuntime(out, threads=1)


def test_prefix_graph_equals_torch(heads, seq, runtime):
    """Two calls (a prompt of 5, then 7 more states, one row padded) == the torch causal pass."""
    _, hidden = seq
    runtime.reset()
    pos = np.tile(np.arange(L), (B, 1))
    first = runtime.prefix_states(hidden[:, :5].numpy(), pos[:, :5])
    second_pos = pos[:, 5:].copy()
    second = runtime.prefix_states(hidden[:, 5:].numpy(), second_pos)
    with torch.no_grad():
        ref = heads.base_states(hidden).numpy()
    np.testing.assert_allclose(np.concatenate([first, second], 1), ref, atol=1e-4)
    # padding (-1) writes nothing: the next real call sees the same cache
    runtime.reset()
    runtime.prefix_states(hidden[:, :5].numpy(), pos[:, :5])
    pad = np.full((B, 3), -1)
    runtime.prefix_states(hidden[:, 5:8].numpy(), pad)
    again = runtime.prefix_states(hidden[:, 5:].numpy(), second_pos)
    np.testing.assert_allclose(again, ref[:, 5:], atol=1e-4)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_level_graphs_equal_torch(heads, seq, runtime, level):
    tokens, hidden = seq
    base = hidden[:, 4:5]
    paths = torch.stack([tokens[:, 5 : 5 + level], tokens[:, 1 : 1 + level], torch.flip(tokens, [1])[:, :level]], 1)
    ids, logp = runtime.level(level, base.numpy(), paths.numpy(), 5)
    with torch.no_grad():
        want = heads.level_logp(level, base, paths)
    values, cols = want.topk(5, dim=-1)
    assert ids.shape == logp.shape == (B, 3, 5)
    np.testing.assert_array_equal(ids, heads.token_ids[cols].numpy())
    np.testing.assert_allclose(logp, values.numpy(), atol=1e-4)
    assert ids.min() >= 3  # restricted LM head: only its tokens come out


def test_trees_from_onnx_equal_trees_from_torch(heads, seq, runtime):
    tokens, hidden = seq
    base = hidden[:, 6:7]
    shape = TreeShape(depth=3, top_k=3, beam=2, budget=8)

    def torch_expand(level, paths):
        with torch.no_grad():
            values, cols = heads.level_logp(level, base, torch.from_numpy(paths)).topk(shape.top_k, dim=-1)
        return heads.token_ids[cols].numpy(), values.numpy()

    def onnx_expand(level, paths):
        return runtime.level(level, base.numpy(), paths, shape.top_k)

    roots = tokens[:, 7].numpy()
    for a, b in zip(grow_trees(torch_expand, roots, shape), grow_trees(onnx_expand, roots, shape), strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.parents, b.parents)
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-4)
        assert len(a.tokens) == 9


def test_int8_heads_are_close(heads, seq, runtime, tmp_path):
    tokens, hidden = seq
    q = HydraRuntime(export_hydra(heads, tmp_path / "q", ctx_len=CTX, batch_size=B, weights="int8"), threads=1)
    assert q.weights == "int8"
    paths = tokens[:, 2:4][:, None, :].numpy()
    ids, logp = q.level(2, hidden[:, 1:2].numpy(), paths, 3)
    ref_ids, ref_logp = runtime.level(2, hidden[:, 1:2].numpy(), paths, 3)
    np.testing.assert_allclose(
        logp,
        ref_logp,
        atol=0.15,
        err_msg="int8 Hydra heads disagree with their fp32 export: check this CPU's int8 path (backends/onnx_int8)",
    )
    assert (ids[..., 0] == ref_ids[..., 0]).mean() >= 0.5
    # the prefix layer is int8 too: its base states stay close to the float32 layer's
    pos = np.tile(np.arange(L), (B, 1))
    q.reset()
    runtime.reset()
    got, ref = q.prefix_states(hidden.numpy(), pos), runtime.prefix_states(hidden.numpy(), pos)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()
    assert np.abs(got - ref).max() > 0  # int8 really is applied (an approximation, not the same graph)


def test_runtime_errors(heads, runtime, tmp_path):
    with pytest.raises(DraftError, match=r"no hydra\.json"):
        HydraRuntime(tmp_path)
    base = np.zeros((B, 1, 32), np.float32)
    with pytest.raises(DraftError, match="head index"):
        runtime.level(4, base, np.zeros((B, 1, 4), np.int64), 2)
    with pytest.raises(DraftError, match="needs paths"):
        runtime.level(2, base, np.zeros((B, 1, 3), np.int64), 2)
    with pytest.raises(DraftError, match="k must be"):
        runtime.level(1, base, np.zeros((B, 1, 1), np.int64), VOCAB)  # 21 head tokens
    with pytest.raises(DraftError, match="token ids"):
        runtime.level(1, base, np.full((B, 1, 1), VOCAB), 2)
    with pytest.raises(DraftError, match="beyond the prefix cache"):
        runtime.prefix_states(np.zeros((B, 1, 32), np.float32), np.full((B, 1), CTX))
    with pytest.raises(DraftError, match="weights must be"):
        export_hydra(heads, tmp_path / "x", ctx_len=CTX, weights="fp16")
    assert not (tmp_path / "x").exists()
