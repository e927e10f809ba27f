"""N-gram lookup drafts (``NgramLookup``, ``accel.spd.lookup``): the search itself, greedy SpD == AR with
lookup rounds mixed into model-drafted ones (batch 1 and 3, torch and onnxruntime), a catch-up longer than the
draft's ``max_seq_len`` after lookup rounds, and the argument checks. Distribution exactness under sampling is in
test_exactness.py."""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import SpdError
from accel.spd import GREEDY, DraftChain, NgramLookup, generate, generate_ar
from accel.spd.lookup import ngram_proposal
from tests.helpers.decoders import backend, perturbed, random_model

# some of their guesses are right (with 32 tokens they almost never are); the prompts repeat themselves too.
VOCAB = 8
PROMPTS_3 = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], [7, 0, 6, 7, 0], [3, 6, 1, 4, 3, 6, 1]]
MAX_NEW = 40


@pytest.mark.parametrize(
    ("tokens", "n", "k", "want"),
    [
        ([1, 2, 3, 9, 1, 2, 3], 3, 4, [9, 1, 2, 3]),  # suffix 1 2 3 seen at 0: what followed, up to k
        ([1, 2, 3, 9, 1, 2, 3], 3, 2, [9, 1]),
        ([5, 2, 3, 8, 1, 2, 3], 3, 4, [8, 1, 2, 3]),  # no 3-gram match: the 2-gram "2 3", its most recent occurrence
        ([2, 3, 7, 2, 3, 8, 2, 3], 2, 1, [8]),  # most recent of several occurrences
        ([4, 4, 4, 4], 2, 3, [4]),  # overlapping occurrences: the latest one with a token after it
        ([1, 2, 3, 4], 3, 4, []),  # nothing repeats
        ([1, 2, 1], 3, 4, []),  # n_min 2: a 1-gram match does not count
        ([1, 2, 1], 1, 4, [2, 1]),  # ngram 1 allows it
        ([7], 2, 4, []),
        ([], 2, 4, []),
    ],
)
def test_ngram_proposal(tokens, n, k, want):
    got = ngram_proposal(np.array(tokens, dtype=np.int64), n, k, n_min=min(2, n))
    assert got.tolist() == want and got.dtype == np.int64


def windows_reference(tokens: np.ndarray, n_max: int, k: int, n_min: int) -> list[int]:
    """The definition, by brute force: every window of every length from the longest down, the latest match."""
    size = len(tokens)
    for n in range(min(n_max, size - 1), max(n_min, 1) - 1, -1):
        starts = [s for s in range(size - n) if tokens[s : s + n].tolist() == tokens[size - n :].tolist()]
        if starts:
            return tokens[starts[-1] + n : starts[-1] + n + k].tolist()
    return []


def test_ngram_proposal_equals_the_window_search():
    """Random short rows over small vocabularies (many repeats, overlaps, matches at the very start): the search
    from the last token's occurrences returns what comparing every window returns."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        tokens = rng.integers(0, int(rng.integers(1, 6)), size=int(rng.integers(0, 30)))
        n, k, n_min = (int(v) for v in rng.integers(1, 6, size=3))
        assert ngram_proposal(tokens, n, k, n_min=n_min).tolist() == windows_reference(tokens, n, k, n_min)


@pytest.fixture(scope="module")
def target():
    return random_model(seed=1, vocab_size=VOCAB, std=0.5)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(("k", "ngram", "ngram_k"), [(1, 2, 3), (2, 3, None), (4, 2, 6)])
@pytest.mark.parametrize("draft_kind", ["random", "perturbed"])
def test_greedy_with_lookup_equals_ar(target, batch, k, ngram, ngram_k, draft_kind):
    prompts = PROMPTS_3[:batch]
    draft = (
        random_model(seed=2, vocab_size=VOCAB, std=0.5)
        if draft_kind == "random"
        else perturbed(target, seed=3, rel=0.02)
    )
    ar = generate_ar(backend(target, batch), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    res = generate(
        backend(target, batch),
        [NgramLookup(ngram, ngram_k or k), DraftChain(backend(draft, batch), k=k)],
        prompts,
        max_new_tokens=MAX_NEW,
        sampling=GREEDY,
    )
    assert res.tokens == ar.tokens
    s = res.stats
    assert 0 < s.lookup_rounds < s.row_calls  # both kinds of rounds ran
    assert s.lookup_accepted > 0
    assert s.new_tokens == s.accepted_drafts + s.target_tokens == sum(len(t) for t in res.tokens)
    assert len(s.accepted_histogram) == max(k, ngram_k or k) + 1
    assert s.draft_tokens <= s.row_calls * max(k, ngram_k or k)
    plain = generate(
        backend(target, batch), DraftChain(backend(draft, batch), k=k), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    assert plain.stats.lookup_rounds == 0 and plain.stats.draft_calls > s.draft_calls  # lookup rounds skip the draft
    assert s.draft_calls_per_loop < plain.stats.draft_calls_per_loop <= k


def test_long_catch_up_after_lookup_rounds_goes_in_chunks(target):
    """A draft that can take 2 tokens per call: after lookup rounds its catch-up is longer and is fed in chunks."""
    prompts = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]]
    draft = perturbed(target, seed=3, rel=0.02)
    ar = generate_ar(backend(target, 1), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    res = generate(
        backend(target, 1),
        [NgramLookup(3, 5), DraftChain(backend(draft, 1, max_seq_len=2), k=1)],
        prompts,
        max_new_tokens=MAX_NEW,
        sampling=GREEDY,
    )
    assert res.tokens == ar.tokens
    assert res.stats.lookup_rounds > 0 and res.stats.lookup_rounds < res.stats.row_calls


def test_lookup_on_onnxruntime_with_a_feature_draft(tmp_path):
    """The same on onnxruntime with a feature draft (its catch-up re-feeds the target's states of every token emitted
    since it last drafted, lookup rounds included)."""
    from accel.backends import OrtBackend, export_onnx
    from accel.models import Decoder, ModelConfig

    tcfg = ModelConfig(
        vocab_size=VOCAB, hidden_size=48, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96
    )
    tgt = Decoder(tcfg).init_weights(7, std=0.5)
    fcfg = ModelConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        feature_size=48,
        embed_size=16,
    )
    feat = Decoder(fcfg).init_weights(8, std=0.5)
    prompts = PROMPTS_3
    tb = OrtBackend(export_onnx(tgt, tmp_path / "t.onnx", ctx_len=96, batch_size=3, hidden_output=True, progress=False))
    fb = OrtBackend(export_onnx(feat, tmp_path / "f.onnx", ctx_len=96, batch_size=3, progress=False))
    ar = generate_ar(tb, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    res = generate(tb, [NgramLookup(3, 4), DraftChain(fb, k=2)], prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens
    assert 0 < res.stats.lookup_rounds < res.stats.row_calls


def test_bad_lookup_arguments_raise(target):
    tb, db = backend(target, 1, max_seq_len=6), backend(random_model(seed=2, vocab_size=VOCAB), 1)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(SpdError, match="ngram must be an int >= 1"):
            generate(tb, [NgramLookup(bad, 2), DraftChain(db, k=2)], [[1, 2]], max_new_tokens=4)
    for bad in (0, -2, 2.0, True):
        with pytest.raises(SpdError, match="ngram_k must be an int >= 1"):
            generate(tb, [NgramLookup(2, bad), DraftChain(db, k=2)], [[1, 2]], max_new_tokens=4)
    with pytest.raises(SpdError, match="ngram_k \\+ 1 = 7 tokens exceed the target's max_seq_len 6"):
        generate(tb, [NgramLookup(2, 6), DraftChain(db, k=2)], [[1, 2]], max_new_tokens=4)
    assert generate(tb, DraftChain(db, k=2), [[1, 2]], max_new_tokens=4).stats.lookup_rounds == 0


@pytest.mark.parametrize("batch", [1, 3])
def test_lookup_only_without_a_draft_equals_ar(target, batch):
    """``generate(target, NgramLookup(n, k), ...)``: prompt lookup decoding; rows without a match take a plain target
    step."""
    prompts = PROMPTS_3[:batch]
    ar = generate_ar(backend(target, batch), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    res = generate(backend(target, batch), NgramLookup(2, 4), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ar.tokens
    s = res.stats
    assert s.mode == "spd" and s.draft_calls == 0 and s.draft_calls_per_loop == 0
    assert 0 < s.lookup_rounds < s.row_calls and s.lookup_accepted > 0 and s.draft_tokens <= 4 * s.lookup_rounds
    assert s.rounds < ar.stats.rounds  # fewer target calls than AR
    with pytest.raises(SpdError, match="ngram_k must be an int >= 1"):
        generate(backend(target, batch), NgramLookup(2, 0), prompts, max_new_tokens=4)
    assert generate(backend(target, batch), None, prompts, max_new_tokens=4).stats.mode == "ar"
