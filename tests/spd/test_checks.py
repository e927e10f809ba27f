"""Argument checks of generate / generate_ar (accel.spd.checks): bad seeds and EOS ids are named SpdErrors."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import SpdError
from accel.spd import DraftChain, Sampling, generate, generate_ar
from accel.spd.checks import eos_set, make_rng
from tests.helpers.decoders import backend, random_model


@pytest.fixture(scope="module")
def pair():
    return backend(random_model(seed=1), 1), backend(random_model(seed=2), 1)


def test_eos_set_and_make_rng():
    assert eos_set(None).size == 0
    np.testing.assert_array_equal(eos_set(2), [2])
    np.testing.assert_array_equal(eos_set([2, np.int64(5)]), [2, 5])
    for bad in ("x", [1, "2"], -1, True, 2.0, [[1]]):
        with pytest.raises(SpdError, match="eos_token_id must be a token id"):
            eos_set(bad)
    gen = np.random.default_rng(3)
    assert make_rng(gen) is gen
    assert make_rng(7).integers(1 << 30) == np.random.default_rng(7).integers(1 << 30)
    for bad in (-1, True, 1.5, "0", None):
        with pytest.raises(SpdError, match="seed must be an int >= 0"):
            make_rng(bad)


@pytest.mark.parametrize("eos", ["x", -3, [1, None]])
def test_generate_names_a_bad_eos_token_id(pair, eos):
    target, draft = pair
    with pytest.raises(SpdError, match="eos_token_id"):
        generate(target, DraftChain(draft, k=2), [[1, 2, 3]], max_new_tokens=4, eos_token_id=eos)
    with pytest.raises(SpdError, match="eos_token_id"):
        generate_ar(target, [[1, 2, 3]], max_new_tokens=4, eos_token_id=eos)


@pytest.mark.parametrize("k", [True, 0, 1.0, "2"])
def test_draft_chain_names_a_bad_k(pair, k):
    with pytest.raises(SpdError, match=r"k \(draft tokens per round\) must be an integer >= 1"):
        DraftChain(pair[1], k=k)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_generate_names_a_bad_seed(pair, seed):
    target, draft = pair
    with pytest.raises(SpdError, match="seed must be an int >= 0"):
        generate(target, DraftChain(draft, k=2), [[1, 2, 3]], max_new_tokens=4, seed=seed)
    with pytest.raises(SpdError, match="seed must be an int >= 0"):
        generate_ar(target, [[1, 2, 3]], max_new_tokens=4, seed=seed)


def test_generate_names_a_non_backend(pair):
    draft = pair[1]
    with pytest.raises(SpdError, match=r"target must be a Backend .*; got NoneType"):
        generate(None, DraftChain(draft, k=2), [[1, 2, 3]], max_new_tokens=4)
    with pytest.raises(SpdError, match=r"the draft must be a Backend .*; got str"):
        DraftChain("draft.onnx", k=2)
    with pytest.raises(SpdError, match="target must be a Backend"):
        generate_ar(object(), [[1, 2, 3]], max_new_tokens=4)


def test_top_k_true_is_not_one(pair):
    target, draft = pair
    with pytest.raises(SpdError, match="top_k must be an integer >= 1; got True"):
        generate(target, DraftChain(draft, k=2), [[1, 2, 3]], max_new_tokens=4, sampling=Sampling(top_k=True))
