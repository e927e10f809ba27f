"""Feature drafts as models (``ModelConfig.feature_size``/``embed_size``, ``Decoder.embed`` with features):
configuration checks, config.json and checkpoint round trips (plain and MXFP6), ``hidden_forward`` vs ``forward``,
and the exact one-step equivalence of ``accel.drafts.feature.unrolled_hidden`` with cached decoding.

Tolerances: equal math in a different kernel order (cached single-token calls vs one causal pass) agrees to fp32
rounding, ~1e-6 here; ``atol=1e-5``. Checkpoint round trips are bit-exact.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from accel.drafts.feature import build_feature_draft, shift_features, unrolled_hidden
from accel.errors import DraftError, ModelError
from accel.models import Decoder, ExtraInputs, ModelConfig, load_checkpoint, new_cache, save_pretrained

ATOL = 1e-5


def _target(layers: int = 2) -> Decoder:
    cfg = ModelConfig(
        vocab_size=40, hidden_size=32, num_layers=layers, num_heads=4, num_kv_heads=2, intermediate_size=48
    )
    return Decoder(cfg).init_weights(0, std=0.3).eval()


@pytest.fixture(scope="module")
def draft() -> Decoder:
    d = build_feature_draft(_target(), torch.arange(3, 40), layers=2, embed_size=8)
    d.init_weights(1, std=0.3)
    d.lm_head_token_ids.copy_(torch.arange(3, 40))
    return d.eval()


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(embed_size=8), "needs feature_size"),
        (dict(feature_size=-1), "feature_size must be an int >= 0"),
        (dict(feature_size=True), "feature_size must be an int"),
        (dict(feature_size=32, embed_size=8, tie_word_embeddings=True), "tie_word_embeddings needs embed_size"),
        (dict(feature_size=32, positions="learned"), "positions='rope'"),
    ],
)
def test_bad_feature_config(changes, match):
    with pytest.raises(ModelError, match=match):
        ModelConfig(
            vocab_size=40, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=48, **changes
        )


def test_config_json_round_trip(draft):
    hf = draft.config.to_hf()
    assert hf["accel_feature_size"] == 32 and hf["accel_embed_size"] == 8
    back = ModelConfig.from_hf(json.loads(json.dumps(hf)))
    assert back == draft.config and back.embed_width == 8
    assert "accel_feature_size" not in _target().config.to_hf()  # ordinary models keep plain HF configs


def test_checkpoint_round_trip(draft, tmp_path):
    back = load_checkpoint(save_pretrained(draft, tmp_path / "d"))
    for (name, a), b in zip(draft.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert back.fc.weight.shape == (32, 8 + 32)


def test_mxfp6_checkpoint_round_trip(draft, tmp_path):
    """The shipping path: ``compress_checkpoint`` to MXFP6 (fc and layer weights); loads back as a feature draft
    whose outputs differ from the float draft only by the MX rounding."""
    from accel.formats import CompressSettings, compress_checkpoint

    src = save_pretrained(draft, tmp_path / "d")
    compress_checkpoint(src, tmp_path / "mx", CompressSettings("mxfp6", exclude=["*norm*"]), progress=False)
    back = load_checkpoint(tmp_path / "mx")
    assert back.config.feature_size == 32
    ids = torch.tensor([[1, 5, 9, 2]])
    feats = torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(4)[None]
    with torch.no_grad():
        a = draft.hidden_forward(ids, pos, *new_cache(draft.config, 1, 8), extra=ExtraInputs(feats))[0]
        b = back.hidden_forward(ids, pos, *new_cache(back.config, 1, 8), extra=ExtraInputs(feats))[0]
    assert 0 < float((a - b).abs().max()) < 0.5  # MXFP6 rounding: changed, but close


def test_embed_checks_features(draft):
    ids, pos = torch.tensor([[1, 2]]), torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="needs features of shape"):
        draft.embed(ids, pos)
    with pytest.raises(ValueError, match="needs features of shape"):
        draft.embed(ids, pos, torch.zeros(1, 2, 31))
    with pytest.raises(ValueError, match="not a feature draft"):
        _target().embed(ids, pos, torch.zeros(1, 2, 32))


def test_forward_is_head_of_hidden_forward(draft):
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    pos = torch.arange(5)[None]
    feats = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, _, _ = draft(ids, pos, *new_cache(draft.config, 1, 8), num_logits=2, extra=ExtraInputs(feats))
        hidden, _, _ = draft.hidden_forward(ids, pos, *new_cache(draft.config, 1, 8), extra=ExtraInputs(feats))
    assert torch.equal(logits, draft.logits(hidden[:, -2:]))


@pytest.mark.parametrize("layers", [1, 2])
def test_unrolled_hidden_matches_cached_drafting(layers):
    """Pass 1 (true features) equals cached decoding; pass 2 at position i equals a cached call fed an estimate at i
    after positions < i were fed true features: the drafting step the training unrolls."""
    target = _target(layers)
    d = build_feature_draft(target, torch.arange(3, 40), layers=layers, embed_size=8).init_weights(3, std=0.3)
    d.lm_head_token_ids.copy_(torch.arange(3, 40))
    gen = torch.Generator().manual_seed(0)
    tok = torch.randint(0, 40, (2, 7), generator=gen)
    true, est = torch.randn(2, 7, 32, generator=gen), torch.randn(2, 7, 32, generator=gen)
    pos = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        out1, kvs = unrolled_hidden(d, tok, true)
        out2, _ = unrolled_hidden(d, tok, est, past=kvs)
        for i in range(7):
            keys, values = new_cache(d.config, 2, 8)
            if i:
                _, keys, values = d.hidden_forward(tok[:, :i], pos[:, :i], keys, values, True, ExtraInputs(true[:, :i]))
            step = d.hidden_forward(
                tok[:, i : i + 1], pos[:, i : i + 1], keys, values, extra=ExtraInputs(est[:, i : i + 1])
            )
            np.testing.assert_allclose(step[0][:, 0].numpy(), out2[:, i].numpy(), atol=ATOL)
            same = d.hidden_forward(
                tok[:, i : i + 1], pos[:, i : i + 1], keys, values, extra=ExtraInputs(true[:, i : i + 1])
            )
            np.testing.assert_allclose(same[0][:, 0].numpy(), out1[:, i].numpy(), atol=ATOL)
    assert float((out1 - out2).abs().max()) > 0.01  # the estimates matter


def test_build_feature_draft_init():
    target = _target()
    ids = torch.tensor([30, 4, 17])
    d = build_feature_draft(target, ids, layers=1, embed_size=8)
    assert d.config.feature_size == 32 and d.config.head_vocab == 3 and d.config.num_layers == 1
    assert torch.equal(d.lm_head_token_ids, torch.tensor([4, 17, 30]))
    assert torch.equal(d.lm_head.weight, target.lm_head.weight[[4, 17, 30]])
    assert torch.equal(d.layers[0].mlp.down_proj.weight, target.layers[1].mlp.down_proj.weight)  # the last layer
    x = torch.randn(1, 1, 32)
    # fc starts as [0 | I]: the feature passes through, the token adds nothing
    np.testing.assert_allclose(
        d.embed(torch.tensor([[5]]), torch.tensor([[0]]), x).detach().numpy(), x.numpy(), atol=ATOL
    )
    with pytest.raises(DraftError, match=r"layers must be in 1..2"):
        build_feature_draft(target, ids, layers=3)
    with pytest.raises(DraftError, match="itself a feature draft"):
        build_feature_draft(d, ids)


def test_shift_features():
    h = torch.arange(6.0).reshape(1, 3, 2)
    assert torch.equal(shift_features(h), torch.tensor([[[0.0, 0.0], [0.0, 1.0], [2.0, 3.0]]]))


def test_sim_counts_a_feature_draft(draft, tmp_path):
    """accel.sim's ModelSpec from a feature draft's config.json (or ModelConfig.to_dict) counts its narrow embedding,
    its fc input layer and its restricted head: the parameter count equals the model's."""
    from accel.sim.models import from_hf_config
    from accel.sim.roofline import step_time

    path = save_pretrained(draft, tmp_path / "d") / "config.json"
    for spec in (from_hf_config(path), from_hf_config(draft.config.to_dict())):
        assert spec.feature_dim == 32 and spec.embed_dim == 8
        assert spec.num_params == draft.num_parameters
    assert spec.input_proj_params == (8 + 32) * 32
    plain = from_hf_config(draft.config.with_(feature_size=0, embed_size=0).to_hf())  # same layers, no fc
    a, b = step_time(spec, "cloud-ai-100-pro"), step_time(plain, "cloud-ai-100-pro")
    assert a.weight_bytes - b.weight_bytes == spec.input_proj_params * 2  # fc read once per call (fp16)
    assert a.time_s > b.time_s
