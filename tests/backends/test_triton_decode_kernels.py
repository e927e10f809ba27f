"""accel's Triton kernels for decode steps on a GPU (``accel.backends.gemv_triton``: the matrix-vector product of
half-precision weights; ``accel.backends.attention_triton``: one query token's attention over the visible cache
slots), run here through their own code under Triton's CPU interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1``
before anything imports triton), or on a GPU where there is one.

Numerics (approximate, and tested so): both kernels accumulate in float32 in another order than cuBLAS and the torch
attention, so they equal float64 math on the same values within float32 (float32 inputs) or one rounding of the
output dtype (half precision). Exactness of the loop on them: greedy SpD equals greedy AR token for token through
``TorchBackend(gemv=True, decode_attention=True)`` (float32 here; a GPU's float16 calls of different widths are not
bit-equal, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from accel.backends import TorchBackend
from accel.errors import BackendError
from accel.models.decoder import attend
from accel.spd import DraftChain, DraftTree, Sampling, generate, generate_ar
from tests.helpers.decoders import perturbed, random_model

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

PROMPT = [5, 17, 2, 9, 5, 17, 30, 4]


@pytest.fixture
def dev(monkeypatch):
    """The device the kernels run on: a CUDA GPU where there is one, else the CPU under Triton's interpreter."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU, and TRITON_INTERPRET is not 1 in this process")
    monkeypatch.setattr(importlib.import_module("accel.backends.gemv_triton"), "CPU_INTERPRETER", True)
    return torch.device("cpu")


def gemv_module():
    return importlib.import_module("accel.backends.gemv_triton")


def attention_module():
    return importlib.import_module("accel.backends.attention_triton")


# ------------------------------------------------------------------------------------------------------------ GEMV


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize(
    "config", [(4, 64, 4, 0), (8, 32, 4, 64), (2, 128, 4, 0)]
)  # even; in_features split over programs; K not a multiple of BLOCK_K (masked)
def test_gemv_equals_float64_math_within_one_rounding(dev, dtype, rows, config):
    gemv = gemv_module()
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 192, generator=gen).to(dev, dt)
    w = torch.randn(24, 192, generator=gen).to(dev, dt)
    got = gemv.matmul(x, w, config)
    ref = (x.double() @ w.double().T).to(dt)  # the exact sum, rounded once
    assert got.dtype == dt and got.shape == (rows, 24)
    ulp = 2.0 ** -(10 if dtype == "float16" else 7)
    tol = ulp * ref.double().abs() + 1e-6
    assert torch.all((got.double() - ref.double()).abs() <= tol), "more than one rounding away from the exact sum"
    broken = w.clone()
    broken[5, 7] += 1.0  # one weight: the kernel reads the matrix it is given, every row of it
    assert not torch.equal(gemv.matmul(x, broken, config)[:, 5], got[:, 5])


def test_gemv_refuses_what_it_cannot_take(dev):
    gemv = gemv_module()
    w = torch.zeros(8, 64, dtype=torch.float16, device=dev)
    with pytest.raises(ValueError, match="rows"):
        gemv.matmul(torch.zeros(gemv.MAX_ROWS + 1, 64, dtype=torch.float16, device=dev), w)
    with pytest.raises(ValueError, match="share K"):
        gemv.matmul(torch.zeros(1, 32, dtype=torch.float16, device=dev), w)
    with pytest.raises(BackendError, match="max_rows"):
        gemv.GemvLinear(torch.nn.Linear(64, 8), max_rows=gemv.MAX_ROWS + 1)


def test_gemv_linear_serves_decode_rows_and_leaves_wider_calls_to_linear(dev, monkeypatch):
    gemv = gemv_module()
    calls = []
    real = gemv.matmul
    monkeypatch.setattr(gemv, "matmul", lambda x, w, c=None: calls.append(tuple(x.shape)) or real(x, w, c))
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 64, bias=False)).to(dev, torch.float16)
    report = gemv.use_gemv(model)
    assert report.swapped == 2 and all(isinstance(m, gemv.GemvLinear) and m.kernel for m in model)
    x = torch.randn(1, 1, 64).to(dev, torch.float16)
    ref = (x.double() @ model[0].weight.double().T + model[0].bias.double()).to(torch.float16)
    torch.testing.assert_close(model[0](x), ref, rtol=2e-3, atol=1e-3)
    assert calls == [(1, 64)]
    model[0](torch.randn(1, 2, 64).to(dev, torch.float16))  # two rows: F.linear (the default max_rows is 1)
    assert calls == [(1, 64)]
    floats = torch.nn.Sequential(torch.nn.Linear(8, 8))  # float32 weights: nothing to swap
    assert gemv.use_gemv(floats).swapped == 0


def test_gemv_keeps_tied_weights_tied(dev):
    gemv = gemv_module()
    model = random_model(seed=1).to(dev, torch.float16)
    model.lm_head.weight = model.embed_tokens.weight
    gemv.use_gemv(model)
    assert isinstance(model.lm_head, gemv.GemvLinear)
    assert model.lm_head.weight is model.embed_tokens.weight


# ------------------------------------------------------------------------------------------------------- attention


def cache_case(dev, dtype, batch: int, hq: int, hkv: int, slots: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, hq, 1, dim, generator=gen).to(dev, dtype)
    k = torch.randn(batch, hkv, slots, dim, generator=gen).to(dev, dtype)
    v = torch.randn(batch, hkv, slots, dim, generator=gen).to(dev, dtype)
    pos = torch.tensor([slots // 2, slots - 3, 7][:batch], device=dev)
    visible = (torch.arange(slots, device=dev)[None, :] <= pos[:, None]).view(batch, 1, 1, 1, slots).clone()
    visible[0, ..., 3] = False  # a hole (a tree call's mask may have them)
    return q, k, v, visible


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "shape", [(1, 4, 4, 70, 16), (2, 8, 2, 45, 32), (3, 4, 1, 130, 16)]
)  # (rows, query heads, KV heads, slots, head size): MHA, grouped, multi-query
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_attention_equals_float64_math(dev, dtype, shape, splits):
    attention = attention_module()
    dt = getattr(torch, dtype)
    q, k, v, visible = cache_case(dev, dt, *shape)
    got = attention.decode_attention(q, k, v, visible, splits)
    ref = attend(q.double(), k.double(), v.double(), visible)
    assert got.dtype == dt and got.shape == q.shape
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


def test_decode_attention_never_reads_slots_the_query_does_not_see(dev):
    attention = attention_module()
    q, k, v, visible = cache_case(dev, torch.float32, 2, 4, 2, 70, 16)
    got = attention.decode_attention(q, k, v, visible, 3)
    k2, v2 = k.clone(), v.clone()
    hidden = ~visible.view(2, 1, 70, 1).expand(2, 2, 70, 16)
    k2[hidden], v2[hidden] = float("nan"), float("inf")
    assert torch.equal(attention.decode_attention(q, k2, v2, visible, 3), got)
    shifted = visible.clone()
    shifted[0, ..., 3] = True  # the hole seen: the output moves (the mask is what it reads)
    assert not torch.allclose(attention.decode_attention(q, k, v, shifted, 3), got)


def test_a_query_that_sees_nothing_gets_zeros(dev):
    attention = attention_module()
    q, k, v, visible = cache_case(dev, torch.float32, 1, 4, 4, 40, 16)
    out = attention.decode_attention(q, k, v, torch.zeros_like(visible), 2)
    assert torch.equal(out, torch.zeros_like(out))


def test_decode_attention_refuses_shapes_it_does_not_serve(dev):
    attention = attention_module()
    q, k, v, visible = cache_case(dev, torch.float32, 1, 4, 4, 40, 16)
    with pytest.raises(ValueError, match="one token per row"):
        attention.decode_attention(q.expand(1, 4, 2, 16), k, v, visible)
    with pytest.raises(ValueError, match="shapes do not fit"):
        attention.decode_attention(q[:, :3], k, v, visible)  # 3 query heads over 4 KV heads


# ------------------------------------------------------------------------------------------ through the backend


def kernel_backend(model, **kw) -> TorchBackend:
    return TorchBackend(model, ctx_len=64, graphs=True, fuse=True, gemv=True, decode_attention=True, **kw)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_greedy_spd_equals_ar_through_the_kernels(dev, kind, monkeypatch):
    attention = attention_module()
    calls = []
    real = attention.decode_attention
    monkeypatch.setattr(attention, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    target = random_model(seed=1).to(dev)
    draft = perturbed(random_model(seed=1), seed=3, rel=0.05).to(dev)
    greedy = Sampling(greedy=True)
    ar = generate_ar(TorchBackend(random_model(seed=1), ctx_len=64), [PROMPT], max_new_tokens=10, sampling=greedy)
    tb = kernel_backend(target, device=dev)
    assert tb.attention_kernels == len(target.blocks)
    db = TorchBackend(draft, ctx_len=64, device=dev)
    proposer = DraftChain(db, k=3) if kind == "chain" else DraftTree(db, nodes=5, top_k=2)
    res = generate(tb, proposer, [PROMPT], max_new_tokens=10, sampling=greedy)
    assert res.tokens == ar.tokens
    assert res.stats.tokens_per_target_call > 1.5  # verify calls (the torch path) were checked against the kernel's
    tb.reset()
    assert generate_ar(tb, [PROMPT], max_new_tokens=10, sampling=greedy).tokens == ar.tokens
    assert calls  # the one-token calls went through the kernel


def test_half_precision_decode_through_both_kernels(dev, monkeypatch):
    """float16 weights: the decode step's linear layers and attention both run the kernels; its logits stay within
    float16 rounding of the torch path's, and greedy AR (a peaked random model) is the same tokens."""
    gemv = gemv_module()
    calls = []
    real = gemv.matmul
    monkeypatch.setattr(gemv, "matmul", lambda x, w, c=None: calls.append(tuple(x.shape)) or real(x, w, c))
    plain = TorchBackend(random_model(seed=1), ctx_len=64, graphs=True, fuse=True, dtype="float16")
    backend = kernel_backend(random_model(seed=1), device=dev, dtype="float16")
    assert backend.gemv_report is not None and backend.gemv_report.swapped == 4 * len(backend.model.blocks) + 1
    for layer in backend.model.modules():  # tuned: one program per 32 features (the interpreter runs each in turn)
        if isinstance(layer, gemv.GemvLinear):
            monkeypatch.setitem(gemv.TUNED, (1, layer.out_features, layer.in_features), (32, 32, 4, 0))
    ids, pos = np.array([PROMPT]), np.arange(len(PROMPT))[None]
    np.testing.assert_array_equal(backend.forward(ids, pos), plain.forward(ids, pos))  # 8 rows: the torch path
    assert not calls
    one = (np.array([[3]]), np.array([[len(PROMPT)]]))
    ref = plain.forward(*one)
    np.testing.assert_allclose(backend.forward(*one), ref, rtol=0, atol=4e-3 * np.abs(ref).max())
    per_call = 4 * len(backend.model.blocks) + 1  # every linear layer of a one-token call (a new signature runs
    assert calls and len(calls) % per_call == 0  # once on blank inputs first)
    greedy = Sampling(greedy=True)
    plain.reset()
    backend.reset()
    want = generate_ar(plain, [PROMPT], max_new_tokens=5, sampling=greedy).tokens
    assert generate_ar(backend, [PROMPT], max_new_tokens=5, sampling=greedy).tokens == want


def test_kernel_settings_change_nothing_where_triton_cannot_run(monkeypatch):
    gemv = gemv_module()
    monkeypatch.setattr(gemv, "CPU_INTERPRETER", False)  # the CPU's default: no kernel
    plain = TorchBackend(random_model(seed=1), ctx_len=64, graphs=True, fuse=True, dtype="float16")
    backend = kernel_backend(random_model(seed=1), dtype="float16")
    assert backend.attention_kernels == 0
    swapped = [m for m in backend.model.modules() if isinstance(m, gemv.GemvLinear)]
    assert swapped and not any(m.kernel for m in swapped)
    for ids, pos in ((np.array([PROMPT]), np.arange(len(PROMPT))[None]), (np.array([[3]]), np.array([[8]]))):
        np.testing.assert_array_equal(backend.forward(ids, pos), plain.forward(ids, pos))


def test_compiled_blocks_keep_the_kernels(dev, monkeypatch):
    """``compile=True`` (what a GPU runs): the kernels are custom ops inside the compiled blocks (their fake
    implementations give dynamo the shapes); a decode step's logits equal the eager torch path's within float32."""
    attention = attention_module()
    calls = []
    real = attention.decode_attention
    monkeypatch.setattr(attention, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain = TorchBackend(random_model(seed=1), ctx_len=64, graphs=True, fuse=True)
    compiled = kernel_backend(random_model(seed=1), device=dev, compile=True)
    assert compiled.attention_kernels == len(compiled.model.blocks)
    ids, pos = np.array([PROMPT]), np.arange(len(PROMPT))[None]
    np.testing.assert_allclose(compiled.forward(ids, pos), plain.forward(ids, pos), rtol=1e-5, atol=1e-5)
    one = (np.array([[3]]), np.array([[len(PROMPT)]]))
    np.testing.assert_allclose(compiled.forward(*one), plain.forward(*one), rtol=1e-5, atol=1e-5)
    assert calls  # the compiled one-token call ran the kernel
