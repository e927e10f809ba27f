"""Logits warps: hand-computed cases and Hugging Face's logits processors as the reference."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import SpdError
from accel.models.config import MASKED_LOGIT
from accel.spd import warps
from accel.spd.warps import (
    EXP_FLOOR,
    Sampling,
    apply_temperature,
    exp_shifted,
    greedy_probs,
    softmax,
    top_k_mask,
    top_p_mask,
    warp,
)


def test_softmax_masks_and_normalises():
    x = np.array([[0.0, np.log(3.0), -np.inf], [1000.0, 1000.0, 1000.0]])
    out = softmax(x)
    np.testing.assert_allclose(out, [[0.25, 0.75, 0.0], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-15)
    assert out.dtype == np.float64


def _shifted_rows(rng: np.random.Generator, live: int) -> np.ndarray:
    """Rows shifted by their maximum: ``live`` entries near the underflow boundary (subnormal results included) and in
    the usual range, the rest masked (-1e9, -inf, just below ``EXP_FLOOR``)."""
    rows = np.empty((3, 4096))
    for row in rows:
        row[:] = rng.choice([MASKED_LOGIT, -np.inf, EXP_FLOOR - 1e-9, -800.0], size=row.size)
        where = rng.choice(row.size, live, replace=False)
        row[where] = np.concatenate([rng.uniform(-746.0, -700.0, live // 2), rng.uniform(-40.0, 0.0, live - live // 2)])
        row[where[0]] = 0.0
    return rows


@pytest.mark.parametrize("live", [8, 512, 3000])  # mostly masked (the sparse path) and mostly live (np.exp itself)
def test_exp_shifted_equals_exp_bit_for_bit(live):
    x = _shifted_rows(np.random.default_rng(live), live)
    expected = np.exp(x)
    assert np.any((expected > 0) & (expected < np.finfo(np.float64).tiny))  # subnormal results are in the test
    out = exp_shifted(x.copy())
    np.testing.assert_array_equal(out, expected)
    strided = np.asfortranarray(x)  # not C-contiguous: exponentiated in place all the same
    np.testing.assert_array_equal(exp_shifted(strided), expected)


def test_exp_shifted_with_a_higher_floor_fails(monkeypatch):
    """The test above can fail: a floor where exp is not yet 0 (it drops the subnormal results) is caught."""
    x = _shifted_rows(np.random.default_rng(8), 8)
    monkeypatch.setattr(warps, "EXP_FLOOR", -700.0)
    assert not np.array_equal(warps.exp_shifted(x.copy()), np.exp(x))


def test_warp_of_a_restricted_head_equals_the_dense_computation():
    """A draft head scoring 8192 of 49,152 tokens (the rest at MASKED_LOGIT): the same float64 numbers as the plain
    softmax arithmetic (every entry exponentiated)."""
    rng = np.random.default_rng(0)
    logits = np.full((2, 49152), MASKED_LOGIT, dtype=np.float32)
    head = np.sort(rng.choice(49152, 8192, replace=False))
    logits[:, head] = rng.normal(size=(2, 8192)) * 3
    x = logits.astype(np.float64) / 0.8
    x -= x.max(axis=-1, keepdims=True)
    dense = np.exp(x)
    dense /= dense.sum(axis=-1, keepdims=True)
    np.testing.assert_array_equal(warp(logits, 0.8), dense)


def test_temperature_scales_logits():
    x = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(apply_temperature(x, 0.5), [2.0, 4.0, 8.0])
    assert apply_temperature(x, 1.0) is not None
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(SpdError, match="temperature"):
            apply_temperature(x, bad)


def test_top_k_keeps_ties_and_identity():
    x = np.array([[3.0, 1.0, 2.0, 2.0, 0.0]])
    assert np.isneginf(top_k_mask(x, 2)).tolist() == [[False, True, False, False, True]]  # tie at the 2nd value kept
    assert np.isneginf(top_k_mask(x, 1)).tolist() == [[False, True, True, True, True]]
    np.testing.assert_array_equal(top_k_mask(x, 5), x)
    np.testing.assert_array_equal(top_k_mask(x, 50), x)
    for bad in (0, -1, 1.5):
        with pytest.raises(SpdError, match="top_k"):
            top_k_mask(x, bad)


def test_top_p_smallest_set_reaching_p():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    x = np.log(probs)
    kept = lambda p: (~np.isneginf(top_p_mask(x, p))).tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False, False]  # 0.5 alone reaches 0.5
    assert kept(0.79) == [False, True, False, True]  # 0.5 + 0.3 reaches 0.79 (0.8 itself is a float tie)
    assert kept(0.81) == [False, True, True, True]
    assert kept(0.01) == [False, True, False, False]  # the top token is always kept
    assert kept(1.0) == [True, True, True, True]
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(SpdError, match="top_p"):
            top_p_mask(x, bad)


def test_greedy_is_first_argmax_one_hot():
    out = greedy_probs(np.array([[1.0, 3.0, 3.0], [5.0, 0.0, 0.0]]))
    np.testing.assert_array_equal(out, [[0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(warp(np.array([1.0, 3.0, 2.0]), temperature=0.1, top_k=1, greedy=True), [0, 1, 0])


def test_order_is_temperature_then_top_k_then_top_p():
    # temperature before top-p changes the nucleus: at T=1 the top token has 0.6 of the mass (alone >= 0.55);
    # at T=3 the distribution flattens and the nucleus needs two tokens
    x = np.log(np.array([0.6, 0.3, 0.1]))
    assert np.count_nonzero(warp(x, temperature=1.0, top_p=0.55)) == 1
    assert np.count_nonzero(warp(x, temperature=3.0, top_p=0.55)) == 2
    # top-k before top-p: top-p sees the renormalised top-k distribution
    y = np.log(np.array([0.4, 0.35, 0.25]))
    assert np.count_nonzero(warp(y, top_p=0.5)) == 2
    assert np.count_nonzero(warp(y, top_k=2, top_p=0.5)) == 1  # 0.4 / 0.75 = 0.53 >= 0.5


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits_raise(bad):
    x = np.zeros((2, 5))
    x[1, 3] = bad
    with pytest.raises(SpdError, match="NaN or inf"):
        warp(x)
    with pytest.raises(SpdError, match="NaN or inf"):
        warp(x, greedy=True)


def test_sampling_validate():
    Sampling(0.7, 5, 0.9).validate()
    Sampling(0.0, greedy=True).validate()  # greedy ignores the others
    with pytest.raises(SpdError):
        Sampling(temperature=0.0).validate()


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, None, None), (0.7, None, None), (1.3, 5, None), (0.8, None, 0.9), (0.6, 7, 0.8)]
)
def test_matches_transformers_processors(temperature, top_k, top_p):
    torch = pytest.importorskip("torch")
    gen_utils = pytest.importorskip("transformers.generation.logits_process")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(16, 40)) * 3.0
    procs = gen_utils.LogitsProcessorList()
    if temperature != 1.0:
        procs.append(gen_utils.TemperatureLogitsWarper(temperature))
    if top_k is not None:
        procs.append(gen_utils.TopKLogitsWarper(top_k))
    if top_p is not None:
        procs.append(gen_utils.TopPLogitsWarper(top_p))
    ref = torch.softmax(procs(torch.zeros(16, 1, dtype=torch.long), torch.tensor(logits)), dim=-1).numpy()
    ours = warp(logits, temperature, top_k, top_p)
    np.testing.assert_array_equal(ours > 0, ref > 0)  # the same support
    np.testing.assert_allclose(ours, ref, atol=1e-12)  # float64 both
    np.testing.assert_allclose(ours.sum(-1), 1.0, rtol=1e-12)


def test_import_does_not_need_torch():
    import subprocess
    import sys

    code = "import sys, accel.spd, accel.apps.printing; assert 'torch' not in sys.modules, 'accel.spd imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("vocab", [50, 300, 5000])
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_partial_sort_equals_full_sort(vocab, top_p):
    from accel.spd.warps import _top_p_mask_full

    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(6, vocab)) * np.array([0.1, 1.0, 3.0, 10.0, 1.0, 1.0])[:, None]
    logits[4] = np.round(logits[4])  # many exact ties
    logits[5, : vocab // 2] = -np.inf  # masked half (as after top-k)
    np.testing.assert_array_equal(top_p_mask(logits, top_p), _top_p_mask_full(logits, top_p))
