"""``top_logprobs`` (DraftTree's candidates): the same tokens and log probabilities as a float64 log-softmax and a
full sort, first index on ties, at any temperature; NaN/inf logits are an ``SpdError``."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import SpdError
from accel.spd.draft_tree import top_logprobs
from accel.spd.warps import warp


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_matches_a_full_log_softmax(temperature):
    logits = (np.random.default_rng(0).standard_normal((5, 49152)) * 4).astype(np.float32)
    tok, lp = top_logprobs(logits, 4, temperature)
    ref = np.log(warp(logits, temperature=temperature))
    want = np.argsort(-ref, axis=-1, kind="stable")[:, :4]
    np.testing.assert_array_equal(tok, want)
    np.testing.assert_allclose(lp, np.take_along_axis(ref, want, axis=-1), rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(lp, axis=-1) <= 0)


def test_ties_take_the_first_index_and_the_input_is_untouched():
    logits = np.array([[0.0, 3.0, 1.0, 3.0, 3.0]], dtype=np.float32)
    before = logits.copy()
    tok, lp = top_logprobs(logits, 3)
    assert tok.tolist() == [[1, 3, 4]]
    np.testing.assert_allclose(lp[0], np.log(warp(before)[0, [1, 3, 4]]), rtol=1e-6)
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_bad_logits_raise(bad):
    logits = np.zeros((2, 10), dtype=np.float32)
    logits[1, 7] = bad
    with pytest.raises(SpdError, match="NaN or inf"):
        top_logprobs(logits, 2)
