"""Training feature drafts (``accel.drafts.feature``): loss, best-state keeping, time budget, target features.

The SpD behaviour of trained feature drafts (acceptance, exactness) is tested in tests/spd/test_feature_draft.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from accel.drafts.architecture import causal_hidden  # noqa: E402
from accel.drafts.feature import (  # noqa: E402
    FeatureLoss,
    FeatureTrainConfig,
    build_feature_draft,
    feature_draft_loss,
    target_features,
    train_feature_draft,
)
from accel.errors import DraftError  # noqa: E402
from accel.models import Decoder, ModelConfig  # noqa: E402

VOCAB = 24


@pytest.fixture(scope="module")
def target() -> Decoder:
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=48)
    return Decoder(cfg).init_weights(4, std=0.5).eval()


def _batch(target: Decoder, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (16, 10), generator=gen)
    with torch.no_grad():
        hidden = causal_hidden(target, tokens)
        logp, ids = torch.log_softmax(target.logits(hidden), -1).topk(8, dim=-1)
    return tokens, hidden, torch.ones(tokens.shape, dtype=torch.bool), ids, logp


def _draft(target: Decoder) -> Decoder:
    return build_feature_draft(target, torch.arange(2, VOCAB), layers=1, embed_size=8, seed=0)


def test_training_lowers_loss_and_raises_agreement(target):
    batch = _batch(target)
    before = feature_draft_loss(_draft(target), batch)[1]
    config = FeatureTrainConfig(steps=300, lr=1e-2, warmup=10)
    draft = train_feature_draft(_draft(target), lambda step: _batch(target, step % 8), config, progress=False)
    after = feature_draft_loss(draft, batch)[1]
    assert after["ce"] < 0.6 * before["ce"] and after["reg"] < before["reg"], (before, after)
    assert after["top1"] > before["top1"] + 0.2 and after["top1_step2"] > before["top1_step2"] + 0.2
    assert not draft.training


def test_best_state_is_kept(target):
    scores = iter([0.5, 0.9, 0.1])  # eval at steps 10, 20, 30: the step-20 weights must come back
    seen = {}

    def eval_fn(model):
        score = next(scores)
        seen[score] = {k: v.clone() for k, v in model.state_dict().items()}
        return score

    logs = []
    draft = train_feature_draft(
        _draft(target),
        lambda step: _batch(target, step),
        FeatureTrainConfig(steps=30, eval_every=10),
        eval_fn=eval_fn,
        progress=False,
        log=logs.append,
    )
    for name, value in draft.state_dict().items():
        assert torch.equal(value, seen[0.9][name]), name
    assert len(logs) == 3


def test_time_budget_stops_early(target):
    logs = []
    train_feature_draft(
        _draft(target),
        lambda step: _batch(target, step),
        FeatureTrainConfig(steps=10_000, max_seconds=0.0),
        progress=False,
        log=logs.append,
    )
    assert any("stopped at step 1:" in line for line in logs)


def test_bad_arguments(target):
    with pytest.raises(DraftError, match="steps must be >= 1"):
        train_feature_draft(_draft(target), lambda step: _batch(target), FeatureTrainConfig(steps=0), progress=False)
    with pytest.raises(DraftError, match="unroll must be 1 or 2"):
        feature_draft_loss(_draft(target), _batch(target), FeatureLoss(unroll=3))
    with pytest.raises(DraftError, match="repeated ids"):
        build_feature_draft(target, [3, 3, 4])
    with pytest.raises(DraftError, match=r"must be in \[0, 24\)"):
        build_feature_draft(target, [3, 99])
    with pytest.raises(DraftError, match="2-D integer"):
        target_features(target, torch.zeros(3, 4))
    with pytest.raises(DraftError, match=r"token ids must be in \[0, 24\)"):
        target_features(target, torch.tensor([[1, 24]]))
    from accel.drafts.feature import augment_draft

    with pytest.raises(DraftError, match="feature_size must be a positive int"):
        augment_draft(target, 0)
    with pytest.raises(DraftError, match="already reads features"):
        augment_draft(_draft(target), 32)


def test_deprecated_keywords_give_the_same_weights(target):
    """The keywords of the old signature fold into a ``FeatureTrainConfig`` (and its ``FeatureLoss``) with one
    DeprecationWarning naming the replacement, and train exactly the same weights."""
    new = train_feature_draft(
        _draft(target),
        lambda step: _batch(target, step),
        FeatureTrainConfig(steps=3, lr=1e-2, warmup=2, loss=FeatureLoss(noise=0.2, reg_weight=0.5, unroll=1)),
        progress=False,
        log=lambda s: None,
    )
    with pytest.warns(
        DeprecationWarning, match=r"steps=, lr=, warmup=, noise=, reg_weight=, unroll=.*FeatureTrainConfig"
    ):
        old = train_feature_draft(
            _draft(target),
            lambda step: _batch(target, step),
            steps=3,
            lr=1e-2,
            warmup=2,
            noise=0.2,
            reg_weight=0.5,
            unroll=1,
            progress=False,
            log=lambda s: None,
        )
    for name, value in new.state_dict().items():
        assert torch.equal(value, old.state_dict()[name]), name
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*stepz"):
        train_feature_draft(_draft(target), lambda step: _batch(target), stepz=3)
    with pytest.raises(TypeError, match="give config alone"):
        train_feature_draft(_draft(target), lambda step: _batch(target), FeatureTrainConfig(steps=1), lr=0.1)
    with pytest.raises(TypeError, match=r"needs config=FeatureTrainConfig\(steps="):
        train_feature_draft(_draft(target), lambda step: _batch(target), lr=0.1)


def test_target_features_in_bfloat16(target):
    tokens = _batch(target)[0]
    feats = target_features(target, tokens, batch_size=5)
    assert feats.dtype == torch.bfloat16 and feats.shape == (16, 10, 32)
    with torch.no_grad():
        exact = causal_hidden(target, tokens)
    # bfloat16 keeps 8 significant bits: relative error ~2^-8 per op, a few percent after a layer
    assert float((feats.float() - exact).abs().max()) < 0.1 * float(exact.abs().max())
    assert next(target.parameters()).dtype == torch.float32  # the target itself is untouched
    assert torch.equal(causal_hidden(target, tokens), exact)


def test_greedy_acceptance_oracle_and_untrained(target):
    """The target's own function as a feature draft accepts every proposal; an untrained draft far fewer."""
    from accel.drafts.feature import greedy_acceptance
    from tests.helpers.decoders import oracle_feature_draft

    seqs, plens, hidden = [], [], []
    for prompt in ([1, 2, 3], [5, 9]):
        seq = torch.tensor(prompt)
        with torch.no_grad():
            for _ in range(12):  # the target's greedy continuation
                seq = torch.cat([seq, target.causal_forward(seq[None])[0, -1].argmax()[None]])
            hidden.append(causal_hidden(target, seq[None])[0])
        seqs.append(seq)
        plens.append(len(prompt))
    used = set(torch.cat(seqs).tolist())
    unused = next(t for t in range(VOCAB) if t not in used)  # a restricted head must leave one token out
    oracle = oracle_feature_draft(target, [t for t in range(VOCAB) if t != unused])
    rates = greedy_acceptance(oracle, seqs, plens, hidden, max_k=3)
    # every start accepts; position j is reachable from all but the last j starts of each sequence
    assert rates[0] == 1.0 and rates == sorted(rates, reverse=True) and rates[2] > 0.8, rates
    low = greedy_acceptance(_draft(target), seqs, plens, hidden, max_k=3)
    assert low[0] < 0.5 and low == sorted(low, reverse=True), low
    with pytest.raises(DraftError, match="nothing to score"):
        greedy_acceptance(oracle, [seqs[0]], [len(seqs[0])], [hidden[0]])


def test_deepened_draft_starts_equal_and_trains(target):
    """``deepen_feature_draft``: the new layer starts as the identity (same hidden states and logits, to float
    rounding), then training changes it and lowers the loss."""
    from accel.drafts.feature import deepen_feature_draft, unrolled_hidden

    small = train_feature_draft(
        _draft(target),
        lambda step: _batch(target, step % 4),
        FeatureTrainConfig(steps=30, lr=1e-2, warmup=5),
        log=lambda s: None,
        progress=False,
    )
    deep = deepen_feature_draft(small, target)
    assert deep.config.num_layers == 2 and small.config.num_layers == 1
    tokens, hidden, *_ = _batch(target, 9)
    feats = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
    with torch.no_grad():
        h_small, _ = unrolled_hidden(small, tokens, feats)
        h_deep, _ = unrolled_hidden(deep, tokens, feats)
        torch.testing.assert_close(h_deep, h_small, atol=1e-6, rtol=0)
        torch.testing.assert_close(deep.lm_head(h_deep), small.lm_head(h_small), atol=1e-5, rtol=0)
        before, _ = feature_draft_loss(deep, _batch(target, 0))
    config = FeatureTrainConfig(steps=30, lr=1e-2, warmup=5)
    train_feature_draft(deep, lambda step: _batch(target, step % 4), config, log=lambda s: None, progress=False)
    assert deep.layers[1].self_attn.o_proj.weight.abs().max() > 0
    with torch.no_grad():
        after, _ = feature_draft_loss(deep, _batch(target, 0))
    assert after < before
    with pytest.raises(DraftError, match="needs a feature draft"):
        deepen_feature_draft(target, target)
    with pytest.raises(DraftError, match="extra_layers must be"):
        deepen_feature_draft(small, target, 0)
