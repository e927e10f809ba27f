"""The deprecated ``forward`` keywords (one release; ``accel.backends.base.legacy_forward``): ``return_hidden``,
``slot_ids``/``tree_mask`` and ``mix_ids``/``mix_weights`` still work, bit for bit the same as ``forward_hidden``,
``tree=TreeInputs(...)`` and ``mix=MixInputs(...)``, with a ``DeprecationWarning`` naming the replacement; unknown
keywords and keywords a backend has no capability for are refused with a message naming them. Also ``require``, the
narrowing to a capability protocol."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from accel.backends import (
    HiddenBackend,
    MixBackend,
    MixInputs,
    TorchBackend,
    TreeBackend,
    TreeInputs,
    base,
    calls,
    require,
)
from accel.backends.calls import chain_tree_inputs
from accel.backends.stages import Pipeline, split_layers
from accel.errors import BackendError
from tests.helpers.decoders import random_model

CTX = 16
IDS = np.array([[3, 9, 1], [7, 7, 2]])
POS = np.array([[0, 1, 2], [-1, 0, 1]])  # row 1 left-padded


@pytest.fixture(scope="module")
def model():
    return random_model(seed=2)


def _fresh(model) -> TorchBackend:
    return TorchBackend(model, ctx_len=CTX, batch_size=2)


def _tree() -> TreeInputs:
    return TreeInputs(*chain_tree_inputs(POS, CTX))


def _mix() -> MixInputs:
    w = np.random.default_rng(0).dirichlet(np.ones(2), size=IDS.shape).astype(np.float32)
    return MixInputs(np.stack([IDS, (IDS + 5) % 32], axis=-1), w)


def _old_and_new(keyword: str):
    """The deprecated keywords of the pair ``keyword`` belongs to, and the replacement call (a backend -> result)."""
    tree, mix = _tree(), _mix()
    return {
        "return_hidden": ({"return_hidden": True}, lambda b: b.forward_hidden(IDS, POS)),
        "slot_ids": (
            {"slot_ids": tree.slot_ids, "tree_mask": tree.tree_mask},
            lambda b: b.forward(IDS, POS, tree=tree),
        ),
        "tree_mask": (
            {"slot_ids": tree.slot_ids, "tree_mask": tree.tree_mask},
            lambda b: b.forward(IDS, POS, tree=tree),
        ),
        "mix_ids": ({"mix_ids": mix.ids, "mix_weights": mix.weights}, lambda b: b.forward(IDS, POS, mix=mix)),
        "mix_weights": ({"mix_ids": mix.ids, "mix_weights": mix.weights}, lambda b: b.forward(IDS, POS, mix=mix)),
    }[keyword]


REPLACEMENT = {
    "return_hidden": "forward_hidden",
    "slot_ids": r"tree=TreeInputs\(slot_ids, tree_mask\)",
    "tree_mask": r"tree=TreeInputs\(slot_ids, tree_mask\)",
    "mix_ids": r"mix=MixInputs\(ids, weights\)",
    "mix_weights": r"mix=MixInputs\(ids, weights\)",
}


@pytest.mark.parametrize("keyword", list(REPLACEMENT))
def test_deprecated_keyword_still_works_and_warns(model, keyword):
    old, new = _old_and_new(keyword)
    with pytest.warns(
        DeprecationWarning, match=rf"forward\(.*{keyword}=\.\.\..*\) is deprecated: use {REPLACEMENT[keyword]}"
    ):
        got = _fresh(model).forward(IDS, POS, **old)
    want = new(_fresh(model))
    if keyword == "return_hidden":  # the old tuple, as before
        assert isinstance(got, tuple) and len(got) == 2
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_array_equal(got, want)


def test_deprecated_hidden_with_tree_is_one_forward_hidden_call(model):
    tree = _tree()
    with pytest.warns(DeprecationWarning):
        got = _fresh(model).forward(IDS, POS, return_hidden=True, slot_ids=tree.slot_ids, tree_mask=tree.tree_mask)
    want = _fresh(model).forward_hidden(IDS, POS, tree=tree)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"return_hiden": True}, TypeError, "unexpected keyword.*return_hiden"),
        ({"slot_ids": np.zeros((2, 3), np.int64)}, BackendError, "needs both slot_ids and tree_mask"),
        ({"mix_weights": np.ones((2, 3, 1), np.float32)}, BackendError, "needs both mix_ids and mix_weights"),
        (
            {"mix_ids": IDS[:, :, None], "mix_weights": np.ones((2, 3, 1), np.float32), "mix": _mix()},
            BackendError,
            "not both",
        ),
    ],
)
def test_bad_keywords_are_refused(model, kw, error, match):
    with pytest.raises(error, match=match):
        _fresh(model).forward(IDS, POS, **kw)


def test_a_backend_without_the_capability_refuses_its_keywords(model):
    """A ``Pipeline`` has no capabilities: its ``forward`` names none, and ``legacy_forward`` refuses them."""
    pipe = Pipeline([TorchBackend(model, ctx_len=CTX, batch_size=2, stage=s) for s in split_layers(2, [1])])
    assert pipe.forward(IDS, POS, features=None).shape == (2, 3, 32)  # None: nothing asked
    with pytest.raises(BackendError, match="no 'features' capability"):
        pipe.forward(IDS, POS, features=np.zeros((2, 3, 32), np.float32))
    with pytest.raises(BackendError, match=r"no 'tree' capability.*tree=True"):
        pipe.forward(IDS, POS, tree=_tree())
    with pytest.warns(DeprecationWarning), pytest.raises(BackendError, match="no 'hidden_states' capability"):
        pipe.forward(IDS, POS, return_hidden=True)
    with pytest.raises(TypeError, match=r"unexpected keyword.*hidden"):
        pipe.forward(IDS, POS, hidden=True)


def test_require_narrows_to_the_capability_protocol(model):
    b = _fresh(model)
    assert require(b, "tree") is b and isinstance(b, TreeBackend)
    assert isinstance(require(b, "hidden_states"), HiddenBackend) and isinstance(require(b, "mix"), MixBackend)
    with pytest.raises(BackendError, match="no 'features' capability: it is not a feature draft"):
        require(b, "features")
    with pytest.raises(BackendError, match="unknown capability 'trees'"):
        require(b, "trees")

    class Listed:  # lists "tree" but has no move_cache: not a TreeBackend
        info = b.info
        forward, reset = b.forward, b.reset

    with pytest.raises(BackendError, match="Listed lists the 'tree' capability but is no TreeBackend"):
        require(Listed(), "tree")


def test_call_inputs_still_import_from_base():
    """``BackendInfo``, the call inputs and their checks moved to ``accel.backends.calls``; ``accel.backends.base``
    still gives the very same objects."""
    for name in calls.__all__:
        assert getattr(base, name) is getattr(calls, name)
    with pytest.raises(AttributeError, match="no attribute 'check_everything'"):
        base.check_everything  # noqa: B018
