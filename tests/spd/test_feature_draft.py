"""Speculative decoding with a feature draft (EAGLE-style, ``accel.drafts.feature``): the draft reads the target's
hidden states, which the loop passes from each target call to the next draft calls.

The draft is trained here (a few hundred steps of ``train_feature_draft`` on the tiny target's own distributions), so
the tests see real acceptances, both rejections and all-accepted rounds (the catch-up path), not a random draft.
Greedy SpD must equal greedy AR token for token (torch and onnxruntime, batch 1 and 3, ragged prompts); multinomial
SpD must draw the target's own law (chi-square at ALPHA = 0.001 against exact enumeration, as test_exactness).
"""

from __future__ import annotations

import numpy as np
import pytest

from accel.spd import GREEDY, DraftChain, Sampling, SpdError, generate, generate_ar
from tests.helpers.decoders import backend, oracle_feature_draft, random_model, tiny_config
from tests.helpers.spd import NEW, PROMPT, SETTINGS, VOCAB, chi_square, exact_law, sample_counts

torch = pytest.importorskip("torch")

from accel.drafts.architecture import causal_hidden  # noqa: E402
from accel.drafts.feature import FeatureTrainConfig, build_feature_draft, train_feature_draft  # noqa: E402
from accel.models import Decoder  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [3, 1], [5, 5, 2, 0, 1]]


def teacher_batches(target, vocab: int, rows: int = 64, length: int = 12, seed: int = 0):
    """``batches(step)`` for ``train_feature_draft``: sequences sampled from the target (prefix random), with its
    hidden states and full next-token distributions (top-k = the whole vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        seqs = torch.randint(0, vocab, (rows * 4, 3), generator=gen)
        while seqs.shape[1] < length:  # extend by sampling the target's next token
            probs = torch.softmax(target.causal_forward(seqs)[:, -1].float(), -1)
            seqs = torch.cat([seqs, torch.multinomial(probs, 1, generator=gen)], dim=1)
        hidden = causal_hidden(target, seqs)
        logp, ids = torch.log_softmax(target.logits(hidden).float(), -1).sort(-1, descending=True)
    mask = torch.ones(seqs.shape, dtype=torch.bool)

    def batches(step: int):
        sl = slice((step % 4) * rows, (step % 4 + 1) * rows)
        return seqs[sl], hidden[sl], mask[sl], ids[sl], logp[sl]

    return batches


def trained_feature_draft(target, vocab: int, head_ids, steps: int = 300):
    draft = build_feature_draft(target, torch.as_tensor(head_ids), layers=1, embed_size=8, seed=1)
    config = FeatureTrainConfig(steps=steps, lr=1e-2, warmup=20)
    return train_feature_draft(draft, teacher_batches(target, vocab), config, log=lambda s: None, progress=False).eval()


class Recording:
    """A real backend that also records every call's arguments and hidden-state output (for the feature checks)."""

    def __init__(self, inner, name: str, log: list):
        self.inner, self.name, self.log = inner, name, log

    @property
    def info(self):
        return self.inner.info

    def forward(self, input_ids, position_ids, **kw):
        return self._record(input_ids, position_ids, kw, self.inner.forward(input_ids, position_ids, **kw))

    def forward_hidden(self, input_ids, position_ids, **kw):
        return self._record(input_ids, position_ids, kw, self.inner.forward_hidden(input_ids, position_ids, **kw))

    def _record(self, input_ids, position_ids, kw, out):
        self.log.append((self.name, np.array(input_ids), np.array(position_ids), kw.get("features"), out))
        return out

    def reset(self):
        self.inner.reset()


@pytest.fixture(scope="module")
def greedy_pair():
    # one layer: a random multi-layer target is too hard for a one-layer draft to learn in a test's few steps
    target = Decoder(tiny_config(32).with_(num_layers=1)).init_weights(5, 0.5).eval()
    return target, trained_feature_draft(target, 32, np.arange(4, 32), steps=500)  # head: 28 of 32 tokens


@pytest.fixture(scope="module")
def exact_pair():
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    # the target's own function plus a feature-dependent perturbation; token 4 outside the head (p = 0)
    return target, oracle_feature_draft(target, [0, 1, 2, 3, 5, 6, 7], feature_weight=0.3)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_feature_draft_equals_ar_torch(greedy_pair, k, batch):
    target, draft = greedy_pair
    prompts = PROMPTS[:batch]
    ar = generate_ar(backend(target, batch), prompts, max_new_tokens=24, sampling=GREEDY)
    sd = generate(
        backend(target, batch), DraftChain(backend(draft, batch), k=k), prompts, max_new_tokens=24, sampling=GREEDY
    )
    assert sd.tokens == ar.tokens
    assert sd.stats.accepted_drafts > 0  # the trained draft is accepted


@pytest.mark.parametrize("k", [1, 3, 6])
def test_oracle_feature_draft_accepts_everything(k):
    """A feature draft equal to the target accepts all k drafts every round (the k+1-token catch-up included)."""
    target = random_model(seed=5, vocab_size=32, std=1.0)
    draft = oracle_feature_draft(target, np.arange(1, 32))
    ar = generate_ar(backend(target, 3), PROMPTS, max_new_tokens=21, sampling=GREEDY)
    assert all(0 not in row for row in ar.tokens)  # every greedy token is in the head
    sd = generate(backend(target, 3), DraftChain(backend(draft, 3), k=k), PROMPTS, max_new_tokens=21, sampling=GREEDY)
    assert sd.tokens == ar.tokens
    hist = sd.stats.accepted_histogram
    assert hist[k] >= sd.stats.row_calls - 3 and sd.stats.row_calls <= 3 * -(-21 // (k + 1)), hist


def test_loop_feeds_target_features_and_draft_estimates(greedy_pair):
    """Every draft call gets, for a catch-up column at position p, the target's hidden state at p - 1 (as a causal
    pass over the final sequence computes it; zeros at 0), and for a drafting step the draft's own last output.

    One-token prompts (no prefill), so a draft call right after a draft call is a drafting step and any other is the
    round's catch-up."""
    target, draft = greedy_pair
    prompts = [[1], [3], [5]]
    log: list = []
    tb, db = Recording(backend(target, 3), "target", log), Recording(backend(draft, 3), "draft", log)
    res = generate(tb, DraftChain(db, k=3), prompts, max_new_tokens=20, sampling=GREEDY)
    seqs = [p + t for p, t in zip(prompts, res.tokens, strict=True)]
    with torch.no_grad():
        hid = [causal_hidden(target, torch.tensor([s]))[0].numpy() for s in seqs]
    checked = {"target": 0, "estimate": 0}
    for (prev_who, _, _, _, prev_out), (who, ids, pos, feats, _) in zip([(None,) * 5, *log[:-1]], log, strict=True):
        if who != "draft":
            continue
        for b, j in zip(*np.nonzero(pos >= 0), strict=True):
            p = int(pos[b, j])
            if prev_who == "draft":  # drafting step: the previous call's estimate, bit for bit
                np.testing.assert_array_equal(feats[b, j], prev_out[1][b, -1])
                checked["estimate"] += 1
            else:  # catch-up: true target features of emitted tokens
                assert int(ids[b, j]) == seqs[b][p]
                want = np.zeros_like(feats[b, j]) if p == 0 else hid[b][p - 1]
                np.testing.assert_allclose(feats[b, j], want, atol=1e-4)
                checked["target"] += 1
    assert checked["target"] > 20 and checked["estimate"] > 20, checked


def test_feature_draft_beats_untrained(greedy_pair):
    target, draft = greedy_pair
    untrained = build_feature_draft(target, torch.arange(4, 32), layers=1, embed_size=8, seed=1).eval()

    def run(d):
        return generate(backend(target, 3), DraftChain(backend(d, 3), k=2), PROMPTS, max_new_tokens=24, sampling=GREEDY)

    trained, before = run(draft).stats.accepted_drafts, run(untrained).stats.accepted_drafts
    assert trained > 2 * max(1, before), (trained, before)


@pytest.mark.parametrize("batch,draft_weights", [(1, "fp32"), (3, "fp32"), (3, "int8")])
def test_greedy_feature_draft_equals_ar_onnxruntime(greedy_pair, tmp_path, batch, draft_weights):
    """Also with the draft's matmuls in int8 (``weights="int8"``): another proposal, the same greedy output."""
    from accel.backends import OrtBackend, export_onnx

    target, draft = greedy_pair
    tp = export_onnx(target, tmp_path / "t.onnx", ctx_len=64, batch_size=batch, hidden_output=True, progress=False)
    dp = export_onnx(draft, tmp_path / "d.onnx", ctx_len=64, batch_size=batch, progress=False, weights=draft_weights)
    prompts = PROMPTS[:batch]
    ar = generate_ar(OrtBackend(tp, threads=1), prompts, max_new_tokens=24, sampling=GREEDY)
    for k in (1, 3):
        sd = generate(
            OrtBackend(tp, threads=1),
            DraftChain(OrtBackend(dp, threads=1), k=k),
            prompts,
            max_new_tokens=24,
            sampling=GREEDY,
        )
        assert sd.tokens == ar.tokens
        assert sd.stats.accepted_drafts > 0


def test_feature_draft_sampling_is_exact(exact_pair):
    """20,000 3-token continuations, K = 2, temperature + top-k + top-p; the draft's head cannot propose token 4."""
    target, draft = exact_pair
    sampling = SETTINGS["all"]
    law = exact_law(target, sampling)
    counts, stats = sample_counts(target, draft, sampling, seed=103)
    pvalue = chi_square(counts, law)
    print(f"chi-square p-value [feature draft]: {pvalue:.4g}")
    assert pvalue > 1e-3
    hist = np.sum([s.accepted_histogram for s in stats], axis=0)
    assert hist[0] > 500 and hist[2] > 500, hist  # rejections and all-accepted rounds both happen


def test_feature_draft_with_dynamic_length_and_eos(greedy_pair):
    target, draft = greedy_pair
    ar = generate_ar(backend(target, 3), PROMPTS, max_new_tokens=30, eos_token_id=7, sampling=GREEDY)
    sd = generate(
        backend(target, 3),
        DraftChain(backend(draft, 3), k=5, min_draft_prob=0.5),
        PROMPTS,
        max_new_tokens=30,
        eos_token_id=7,
        sampling=GREEDY,
    )
    assert sd.tokens == ar.tokens


def test_feature_draft_needs_target_hidden_states(greedy_pair, tmp_path):
    from accel.backends import OrtBackend, export_onnx

    target, draft = greedy_pair
    plain = OrtBackend(export_onnx(target, tmp_path / "t.onnx", ctx_len=64, progress=False))
    with pytest.raises(SpdError, match="hidden_output=True"):
        generate(plain, DraftChain(backend(draft, 1), k=2), [PROMPT], max_new_tokens=NEW)


def test_feature_draft_width_and_catch_up_checked(greedy_pair):
    target, draft = greedy_pair
    other = random_model(seed=6, vocab_size=32).eval()
    wide = build_feature_draft(other, torch.arange(8), embed_size=8)  # features of width 32
    narrow_target = type(other)(other.config.with_(hidden_size=48, num_heads=4)).init_weights(0)
    with pytest.raises(SpdError, match="width"):
        generate(backend(narrow_target, 1), DraftChain(backend(wide, 1), k=2), [PROMPT], max_new_tokens=NEW)
    with pytest.raises(SpdError, match="catch-up"):
        generate(backend(target, 1), DraftChain(backend(draft, 1, max_seq_len=3), k=3), [PROMPT], max_new_tokens=NEW)


def test_augmented_standalone_draft_starts_as_the_standalone_draft():
    """``augment_draft`` adds a feature input with zero weight: before training it draws the same samples and
    acceptances as the draft it came from (seeded multinomial), although the loop now passes it features and
    refeeds every drafted position. A draft narrower than the target cannot estimate features (zeros while drafting)."""
    from accel.drafts.feature import augment_draft, estimates_features
    from tests.helpers.decoders import perturbed

    target = random_model(seed=0)
    draft = perturbed(target, 1, 0.05)
    augmented = augment_draft(draft, target.config.hidden_size).eval()
    for k in (1, 3):
        kw = dict(max_new_tokens=15, sampling=Sampling(temperature=0.8), seed=3)
        a = generate(backend(target, 3), DraftChain(backend(draft, 3), k=k), PROMPTS, **kw)
        b = generate(backend(target, 3), DraftChain(backend(augmented, 3), k=k), PROMPTS, **kw)
        assert a.tokens == b.tokens and a.stats.accepted_histogram == b.stats.accepted_histogram
        assert a.stats.accepted_drafts > 0
    narrow = Decoder(tiny_config(32).with_(hidden_size=16, num_heads=2, num_kv_heads=1)).init_weights(0)
    wide_features = augment_draft(narrow, 32)
    assert wide_features.config.feature_size == 32 and not estimates_features(wide_features.config)
    ar = generate_ar(backend(target, 3), PROMPTS, max_new_tokens=15, sampling=GREEDY)
    assert (
        generate(
            backend(target, 3), DraftChain(backend(wide_features, 3), k=3), PROMPTS, max_new_tokens=15, sampling=GREEDY
        ).tokens
        == ar.tokens
    )
