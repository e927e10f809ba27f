"""The device path of ``TorchBackend``: static call buffers (``StaticCalls``, what CUDA graphs capture on a GPU),
the scratch slot that padding writes, fused projections, regional compilation, dtypes, and CUDA asked for where
there is none. Everything runs on the CPU through the code a GPU runs, except the capture itself
(``benchmarks/gpu.py`` checks that on a GPU: greedy SpD == AR in float32 and float16 on an H200).

Exactness: greedy SpD (chains and trees) equals greedy AR token for token on the static/fused path, and tree
speculative sampling on it passes the chi-square test against exact enumeration (ALPHA = 0.001, fixed seed), while
the deliberately wrong sibling rule fails it on the same path.
"""

from __future__ import annotations

import numpy as np
import pytest

import tests.helpers.spd as spd_helpers
from accel.backends import TorchBackend, TreeInputs, prefill
from accel.backends.torch_graphs import CallKey, resolve_device, resolve_dtype
from accel.decode import TargetSpec
from accel.errors import BackendError
from accel.spd import DraftChain, DraftTree, Sampling, generate, generate_ar
from tests.helpers.decoders import perturbed, random_model
from tests.helpers.spd import ALPHA, SETTINGS, VOCAB, chi_square, exact_law, sample_counts

torch = pytest.importorskip("torch")

PROMPT = [5, 17, 2, 9, 5, 17, 30, 4]
NO_CUDA = not torch.cuda.is_available()


def static(model, batch_size: int = 1, ctx_len: int = 64, **kw) -> TorchBackend:
    """The GPU's code path on the CPU: static buffers per call signature and fused projections."""
    return TorchBackend(model, ctx_len=ctx_len, batch_size=batch_size, graphs=True, fuse=True, **kw)


def eager(model, batch_size: int = 1, ctx_len: int = 64) -> TorchBackend:
    return TorchBackend(model, ctx_len=ctx_len, batch_size=batch_size)


def fresh(seed: int = 1, std: float = 0.5):
    return random_model(seed=seed, std=std)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_greedy_spd_equals_ar_on_the_static_path(kind):
    target = fresh()
    draft = perturbed(target, seed=3, rel=0.05)
    greedy = Sampling(greedy=True)
    ar = generate_ar(eager(fresh()), [PROMPT], max_new_tokens=30, sampling=greedy).tokens
    tb, db = static(target), static(draft)
    proposer = DraftChain(db, k=4) if kind == "chain" else DraftTree(db, nodes=6, top_k=2)
    res = generate(tb, proposer, [PROMPT], max_new_tokens=30, sampling=greedy)
    assert res.tokens == ar
    assert res.stats.tokens_per_target_call > 1.5  # drafts were accepted: multi-token calls were checked
    assert len(tb.static_calls.calls) >= 3  # prefill, AR-like and verify signatures each got their buffers


def test_static_path_logits_equal_eager_and_fused_changes_nothing():
    a, b = eager(fresh()), static(fresh())
    assert hasattr(b.model.blocks[0].self_attn, "qkv_proj") and not hasattr(b.model.blocks[0].self_attn, "q_proj")
    assert hasattr(b.model.blocks[0].mlp, "gate_up_proj")
    for ids, pos in (
        (np.array([PROMPT]), np.arange(8)[None]),
        (np.array([[3]]), np.array([[8]])),
        (np.array([[7, 1, 2]]), np.array([[9, 10, 11]])),
        (np.array([[3]]), np.array([[8]])),  # a signature seen before: its buffers are reused
    ):
        np.testing.assert_allclose(b.forward(ids, pos), a.forward(ids, pos), atol=1e-5, rtol=1e-5)
    for x, y in zip((*a.keys, *a.values), (*b.keys, *b.values), strict=True):
        np.testing.assert_allclose(x[..., :12, :].numpy(), y[..., :12, :].numpy(), atol=1e-5)


def test_a_new_signature_writes_only_its_own_slots():
    """The first call of a signature runs on blank (all-padding) inputs first: only the scratch slot is written."""
    b = static(fresh(), ctx_len=32)
    prefill(b, np.array([PROMPT]))
    before = [t.clone() for t in (*b.keys, *b.values)]
    b.forward(np.array([[1, 2, 3]]), np.array([[8, 9, 10]]))  # a new signature: S = 3
    assert CallKey(3, 3, False, False) in b.static_calls.calls
    for old, new in zip(before, (*b.keys, *b.values), strict=True):
        assert torch.equal(old[..., :8, :], new[..., :8, :])  # the prompt's slots untouched
        assert torch.equal(old[..., 11:32, :], new[..., 11:32, :])  # slots past the call untouched
        assert not torch.equal(old[..., 8:11, :], new[..., 8:11, :])  # the call's own slots written


def test_padding_columns_write_the_scratch_slot_only():
    b = static(fresh(), batch_size=2, ctx_len=16)
    ids = np.array([[4, 5, 6], [0, 0, 6]])
    pos = np.array([[0, 1, 2], [-1, -1, 0]])  # row 1 left-padded
    b.forward(ids, pos)
    k = b.keys[0]
    assert k.shape[2] == 17  # ctx_len slots and the scratch slot
    assert torch.all(k[1, :, 1:16] == 0)  # padding wrote no real slot of row 1
    assert torch.any(k[1, :, 16] != 0)  # ... but the scratch slot
    ref = eager(fresh(), batch_size=1, ctx_len=16)
    np.testing.assert_allclose(
        b.forward(np.array([[1, 1]]).repeat(2, 0), np.array([[3, 4], [1, 2]]))[1],
        ref.forward(np.array([[6, 1, 1]]), np.array([[0, 1, 2]]))[0, 1:],
        atol=1e-5,
    )


def test_cache_after_tree_compaction_equals_a_fresh_prefill():
    model = fresh()
    b = static(model, ctx_len=32)
    prompt = np.array([PROMPT])
    prefill(b, prompt)
    # a tree of 4 nodes under the last prompt token: root children 1, 2; node 3 under 2; positions 8, 8, 9, 9
    toks = np.array([[11, 12, 13, 14]])
    parents = [-1, -1, 1, 1]
    pos = np.array([[8, 8, 9, 9]])
    slots = np.array([[8, 9, 10, 11]])
    mask = np.zeros((1, 4, 32), bool)
    mask[0, :, :8] = True
    for i, p in enumerate(parents):
        mask[0, i, slots[0, i]] = True
        if p >= 0:
            mask[0, i, slots[0, p]] = True
    b.forward(toks, pos, tree=TreeInputs(slots, mask))
    b.move_cache(np.array([[9, 11]]), np.array([[8, 9]]))  # accept node 1 then node 3 (path off the first child)
    ref = static(fresh(), ctx_len=32)
    prefill(ref, np.array([[*PROMPT, 12, 14]]))
    for x, y in zip((*b.keys, *b.values), (*ref.keys, *ref.values), strict=True):
        np.testing.assert_allclose(x[..., :10, :].numpy(), y[..., :10, :].numpy(), atol=1e-5)
    step = (np.array([[7]]), np.array([[10]]))
    np.testing.assert_allclose(b.forward(*step), ref.forward(*step), atol=1e-5)


@pytest.fixture
def static_backends(monkeypatch):
    """The chi-square helpers build their backends on the static/fused path."""
    monkeypatch.setattr(spd_helpers, "backend", lambda m, rows, ctx_len=8: static(m, batch_size=rows, ctx_len=ctx_len))


@pytest.fixture(scope="module")
def pair():
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    return target, perturbed(target, seed=22, rel=0.15)


def test_tree_sampling_on_the_static_path_is_exact(pair, static_backends):
    target, draft = pair
    sampling = SETTINGS["all"]
    tree = lambda d: DraftTree(d, nodes=4, top_k=2)  # noqa: E731
    counts, stats = sample_counts(target, draft, sampling, seed=41, runs=5, proposer=tree)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [static path, tree]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert np.mean([s.tokens_per_target_call for s in stats]) > 1.2


def test_the_wrong_sibling_rule_fails_on_the_static_path(pair, static_backends, monkeypatch):
    import accel.spd.verify as verify_module

    monkeypatch.setattr(verify_module, "after_rejection", lambda r, tree, child: r)
    target, draft = pair
    sampling = SETTINGS["plain"]
    tree = lambda d: DraftTree(d, nodes=4, top_k=3)  # noqa: E731
    counts, _ = sample_counts(target, draft, sampling, seed=42, runs=5, proposer=tree)
    assert chi_square(counts, exact_law(target, sampling)) < ALPHA


def test_compiled_blocks_equal_eager_logits():
    a, c = eager(fresh()), TorchBackend(fresh(), ctx_len=64, graphs=True, compile=True)
    for ids, pos in ((np.array([PROMPT]), np.arange(8)[None]), (np.array([[3]]), np.array([[8]]))):
        np.testing.assert_allclose(c.forward(ids, pos), a.forward(ids, pos), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_cast_weights_and_cache_not_rope(dtype):
    ref = eager(fresh(std=0.1))
    b = TorchBackend(fresh(std=0.1), ctx_len=64, dtype=dtype)
    want = resolve_dtype(dtype, torch.float32)
    assert b.keys[0].dtype == want and b.model.embed_tokens.weight.dtype == want
    assert b.model.inv_freq.dtype == torch.float32  # RoPE frequencies stay float32
    got = b.forward(np.array([PROMPT]), np.arange(8)[None])
    assert got.dtype == np.float32
    exp = ref.forward(np.array([PROMPT]), np.arange(8)[None])
    np.testing.assert_allclose(got, exp, atol=0.05 * np.abs(exp).max())


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_cuda_asked_for_where_there_is_none_is_named():
    with pytest.raises(BackendError, match="cannot use CUDA here"):
        TorchBackend(fresh(), ctx_len=8, device="cuda")
    with pytest.raises(BackendError, match="cannot use CUDA here"):
        resolve_device("cuda:1")


def test_bad_devices_and_dtypes_are_named():
    with pytest.raises(BackendError, match="not a torch device name"):
        resolve_device("gpu0")
    with pytest.raises(BackendError, match="runs on cpu or cuda"):
        resolve_device("meta")
    with pytest.raises(BackendError, match="float32, float16, bfloat16"):
        TorchBackend(fresh(), ctx_len=8, dtype="int8")
    with pytest.raises(BackendError, match="CUDA graphs need a CUDA device"):
        from accel.backends.torch_graphs import StaticCalls

        StaticCalls(lambda *a: (), batch_size=1, slots=9, device=torch.device("cpu"), capture=True)


def test_spec_keeps_device_and_dtype_to_backend_torch(tmp_path):
    ok = TargetSpec(path=tmp_path, backend="torch", device="cuda:1", dtype="bfloat16")
    assert (ok.device, ok.dtype) == ("cuda:1", "bfloat16")
    with pytest.raises(ValueError, match="applies to --backend torch"):
        TargetSpec(path=tmp_path, backend="ort", device="cuda")
    with pytest.raises(ValueError, match="applies to --backend torch"):
        TargetSpec(path=tmp_path, dtype="float16")
    with pytest.raises(ValueError, match="device"):
        TargetSpec(path=tmp_path, backend="torch", device="gpu")


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_generate_on_cuda_without_cuda_fails_with_the_reason(tmp_path, capsys):
    from accel.cli import EXIT_ERROR, main
    from accel.models import save_pretrained

    target = save_pretrained(fresh(), tmp_path / "target")
    argv = ["generate", "--target", str(target), "--backend", "torch", "--device", "cuda", "--prompt", "1 2 3"]
    assert main(argv) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "cannot use CUDA here" in err and "Traceback" not in err
