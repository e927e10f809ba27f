"""``Decoder.forward`` / ``hidden_forward`` take their optional inputs (features, tree slots and mask, superposed
mix) as one ``ExtraInputs``; the keywords of the old signature still work for one release, with a DeprecationWarning
naming the replacement, and give bit-identical outputs and caches; unknown keywords and both forms are refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from accel.drafts.feature import build_feature_draft  # noqa: E402
from accel.models import Decoder, ExtraInputs, ModelConfig, new_cache  # noqa: E402

CTX = 12


def _target() -> Decoder:
    cfg = ModelConfig(vocab_size=40, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48)
    return Decoder(cfg).init_weights(0, std=0.3).eval()


def _calls():
    """(model, ids, pos, ExtraInputs) of a feature call, a tree call (two siblings after a prefix) and a mix call."""
    gen = torch.Generator().manual_seed(0)
    target = _target()
    draft = build_feature_draft(target, torch.arange(3, 40), layers=1, embed_size=8).init_weights(2, std=0.3).eval()
    ids = torch.tensor([[1, 5, 9, 2]])
    pos = torch.arange(4)[None]
    features = ExtraInputs(features=torch.randn(1, 4, 32, generator=gen))
    tree_pos = torch.tensor([[0, 1, 2, 2]])  # two siblings at position 2
    mask = torch.zeros(1, 4, CTX, dtype=torch.bool)
    for s, seen in enumerate(([0], [0, 1], [0, 1, 2], [0, 1, 3])):
        mask[0, s, seen] = True
    tree = ExtraInputs(slot_ids=torch.tensor([[0, 1, 2, 3]]), tree_mask=mask)
    mix = ExtraInputs(mix=(torch.randint(0, 40, (1, 4, 3), generator=gen), torch.full((1, 4, 3), 1 / 3)))
    return [(draft, ids, pos, features), (target, ids, tree_pos, tree), (target, ids, pos, mix)]


@pytest.mark.parametrize("case", range(3), ids=["features", "tree", "mix"])
@pytest.mark.parametrize("method", ["forward", "hidden_forward"])
def test_deprecated_keywords_are_bit_identical(case, method):
    model, ids, pos, extra = _calls()[case]
    old_kw = {k: v for k, v in vars(extra).items() if v is not None}
    with torch.no_grad():
        new = getattr(model, method)(ids, pos, *new_cache(model.config, 1, CTX), extra=extra)
        with pytest.warns(DeprecationWarning, match=rf"Decoder\.{method}\(\).*extra=ExtraInputs\("):
            old = getattr(model, method)(ids, pos, *new_cache(model.config, 1, CTX), **old_kw)
    assert torch.equal(new[0], old[0])
    for a, b in zip(new[1] + new[2], old[1] + old[2], strict=True):
        assert torch.equal(a, b)


def test_bad_keywords_are_refused():
    model = _target()
    ids, pos = torch.tensor([[1, 2]]), torch.tensor([[0, 1]])
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) slots"):
        model(ids, pos, *new_cache(model.config, 1, CTX), slots=ids)
    with pytest.raises(TypeError, match="give extra alone"):
        model.hidden_forward(ids, pos, *new_cache(model.config, 1, CTX), extra=ExtraInputs(), slot_ids=ids)
    with pytest.raises(ValueError, match="needs both slot_ids and tree_mask"):
        model.hidden_forward(ids, pos, *new_cache(model.config, 1, CTX), extra=ExtraInputs(slot_ids=ids))
