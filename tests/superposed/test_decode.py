"""Superposed Decoding (``accel.superposed.decode``/``scoring``) on real backends: torch and onnxruntime sessions of
tiny random decoders exported with mixed inputs.

Exact: one draft (k = 1, weight 1, no n-grams) is greedy decoding token for token; the k^2 -> k selection and the
n-gram interpolation against hand-computed values. The drafts of k > 1 are approximate by design (not tested against a
distribution)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from accel.backends import OrtBackend, TorchBackend, export_onnx, prefill  # noqa: E402
from accel.superposed import NgramStore, SuperposedError, build_store, superposed_generate  # noqa: E402
from accel.superposed.scoring import SuperposedConfig, ngram_logprobs, select  # noqa: E402
from tests.helpers.decoders import random_model  # noqa: E402

VOCAB = 32
PROMPTS = [[3, 9, 1, 4, 7], [2, 5]]


def greedy(backend, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy decoding by ordinary calls (the reference): left-padded prefill, then one token per call."""
    width = max(map(len, prompts))
    ids = np.array([[0] * (width - len(p)) + p for p in prompts])
    pos = np.array([[-1] * (width - len(p)) + list(range(len(p))) for p in prompts])
    backend.reset()
    logits = prefill(backend, ids, pos)
    out: list[list[int]] = [[] for _ in prompts]
    for step in range(n):
        tok = logits.argmax(-1)
        for r, t in enumerate(tok):
            out[r].append(int(t))
        if step < n - 1:
            step_pos = np.array([[len(p) + step] for p in prompts])
            logits = backend.forward(tok[:, None], step_pos, num_logits=1)[:, -1, :]
    return out


@pytest.fixture(scope="module")
def model():
    return random_model(0, VOCAB, std=0.5).eval()


@pytest.fixture(scope="module")
def graphs(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("sup")
    mixed = export_onnx(model, d / "mix.onnx", ctx_len=32, batch_size=2, progress=False, mix_inputs=True)
    plain = export_onnx(model, d / "plain.onnx", ctx_len=32, batch_size=2, progress=False)
    return mixed, plain


@pytest.mark.parametrize("runtime", ["torch", "ort"])
def test_one_draft_is_greedy_decoding(model, graphs, runtime):
    be = TorchBackend(model, ctx_len=32, batch_size=2) if runtime == "torch" else OrtBackend(graphs[0], threads=1)
    cfg = SuperposedConfig(k=1, temperature=1.0)
    res = superposed_generate(be, PROMPTS, 12, cfg)
    for drafts, want in zip(res.drafts, greedy(be, PROMPTS, 12), strict=True):
        assert len(drafts) == 1 and drafts[0].tokens == list(want)
    assert res.calls == 11  # one call per position after the prefill's


def test_drafts_are_distinct_and_scored(graphs):
    be = OrtBackend(graphs[0], threads=1)
    res = superposed_generate(be, PROMPTS, 8, SuperposedConfig(k=3, temperature=1.0))
    assert res.calls == 7
    for drafts in res.drafts:
        assert len(drafts) == 3 and len({tuple(d.tokens) for d in drafts}) == 3
        assert all(len(d.tokens) == 8 for d in drafts)
        scores = [d.score for d in drafts]
        assert scores == sorted(scores, reverse=True) and scores[0] < 0


def test_superposition_reaches_the_model(model):
    """k = 3 drafts from one stream differ from 3 greedy runs of their first tokens: the mixed input is read."""
    be = TorchBackend(model, ctx_len=32, batch_size=2)
    res = superposed_generate(be, PROMPTS, 6, SuperposedConfig(k=3, temperature=1.0))
    mismatches = 0
    for prompt, drafts in zip(PROMPTS, res.drafts, strict=True):
        for d in drafts:
            solo = greedy(be, [prompt + d.tokens[:1]] * 2, 5)[0]
            mismatches += list(solo) != d.tokens[1:]
    assert mismatches > 0


def test_finished_drafts_are_kept(graphs):
    be = OrtBackend(graphs[0], threads=1)
    first = greedy(be, PROMPTS, 1)
    eos = [int(first[0][0])]
    res = superposed_generate(be, PROMPTS, 6, SuperposedConfig(k=3, temperature=1.0), eos_token_ids=eos)
    done = [d for d in res.drafts[0] if d.finished]
    assert done and done[0].tokens == eos and len(res.drafts[0]) == 3
    assert all(eos[0] not in d.tokens[:-1] for d in res.drafts[0])


def test_ngrams_steer_the_drafts(graphs, tmp_path):
    """With alpha near 1 and every token a candidate, the best draft follows the only continuation the corpus has."""
    cycle = [11, 20, 6, 30, 2, 17, 25]
    store = NgramStore.load(build_store([np.array(cycle * 6)], VOCAB, tmp_path / "c.ngrams", max_order=6))
    be = OrtBackend(graphs[0], threads=1)
    cfg = SuperposedConfig(k=2, alpha=0.99, temperature=1.0, n_token_sample=VOCAB)
    res = superposed_generate(be, [[1, 11, 20, 6], [4, 30, 2]], 5, cfg, store=store)
    assert res.drafts[0][0].tokens == [30, 2, 17, 25, 11]
    assert res.drafts[1][0].tokens == [17, 25, 11, 20, 6]
    plain = superposed_generate(be, [[1, 11, 20, 6], [4, 30, 2]], 5, SuperposedConfig(k=2, temperature=1.0))
    assert plain.drafts[0][0].tokens != [30, 2, 17, 25, 11]  # the model alone writes something else


def test_select_keeps_the_best_k():
    cand = np.array([[-1.0, -3.0, -4.0], [-2.0, -0.5, -9.0], [-np.inf, -np.inf, -np.inf]])
    tokens = np.array([[5, 6, 7], [5, 6, 7], [5, 6, 7]])
    sel = select(cand, tokens, 2)
    assert sel.parent.tolist() == [1, 0] and sel.token.tolist() == [6, 5] and sel.score.tolist() == [-0.5, -1.0]
    sel = select(cand, tokens, 3, eos=frozenset({6}))  # (1, 6) and (0, 6) finish; the next best fill the slots
    assert sel.finished == [(1, 6, -0.5), (0, 6, -3.0)]
    assert sel.parent.tolist() == [0, 1, 0] and sel.token.tolist() == [5, 5, 7]
    sel = select(np.array([[-1.0, -np.inf]]), np.array([[3, 4]]), 2)  # too few finite candidates
    assert sel.parent.tolist() == [0, -1] and sel.score[1] == -np.inf


def test_ngram_logprobs_by_hand(tmp_path):
    docs = [np.array([1, 2, 3, 1, 2, 4, 1, 2, 3])]
    store = NgramStore.load(build_store(docs, 8, tmp_path / "h.ngrams", max_order=3))
    cfg = SuperposedConfig(ngram_weights=(0.25, 0.75), no_match_logprob=-50.0)
    ctx = np.array([[1, 2], [0, 2], [5, 6]])
    got = ngram_logprobs(store, ctx, np.array([2, 1, 2]), np.array([[3, 4, 7], [3, 4, 7], [3, 4, 7]]), cfg)
    # context [1, 2]: bigram after 2 -> 3 (2/3), 4 (1/3); trigram after (1, 2) -> 3 (2/3), 4 (1/3)
    want0 = [np.log(0.25 * 2 / 3 + 0.75 * 2 / 3), np.log(0.25 / 3 + 0.75 / 3), -50.0]
    want1 = [np.log(0.25 * 2 / 3), np.log(0.25 / 3), -50.0]  # one context token: the bigram only
    np.testing.assert_allclose(got, [want0, want1, [-50.0] * 3])
    with pytest.raises(SuperposedError, match="order 3"):
        ngram_logprobs(store, ctx, np.array([2, 2, 2]), np.zeros((3, 1), np.int64), SuperposedConfig())


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"k": 0}, "k must"),
        ({"alpha": 1.5}, "alpha"),
        ({"temperature": 0.0}, "temperature"),
        ({"n_token_sample": 0}, "n_token_sample"),
        ({"ngram_weights": ()}, "ngram_weights"),
        ({"ngram_weights": (0.1, -1.0)}, "ngram_weights"),
        ({"no_match_logprob": 1.0}, "no_match_logprob"),
    ],
)
def test_bad_config(kw, match):
    with pytest.raises(SuperposedError, match=match):
        SuperposedConfig(**kw)


def test_bad_calls(model, graphs, tmp_path):
    with pytest.raises(SuperposedError, match="mix_inputs=True"):
        superposed_generate(OrtBackend(graphs[1], threads=1), PROMPTS, 4)
    be = TorchBackend(model, ctx_len=32, batch_size=2)
    with pytest.raises(SuperposedError, match="batch size"):
        superposed_generate(be, PROMPTS[:1], 4)
    with pytest.raises(SuperposedError, match="KV cache"):
        superposed_generate(be, PROMPTS, 30)
    with pytest.raises(SuperposedError, match="at least one token"):
        superposed_generate(be, [[1], []], 4)
    store = NgramStore.load(build_store([np.arange(40)], 40, tmp_path / "v.ngrams"))
    with pytest.raises(SuperposedError, match="40-token vocabulary"):
        superposed_generate(be, PROMPTS, 4, store=store)


def test_perplexity_and_comparison(model, tmp_path):
    """Perplexity against a direct torch computation; compare() runs both methods to full length on one graph."""
    from accel.superposed.evaluate import compare, distinct_n, perplexity

    be = OrtBackend(export_onnx(model, tmp_path / "b1.onnx", ctx_len=32, progress=False, mix_inputs=True), threads=1)
    prompt, cont = [3, 9, 1], [4, 7, 7, 2]
    with torch.no_grad():
        logits = model.causal_forward(torch.tensor([prompt + cont]))[0]
    lp = torch.log_softmax(logits.double(), -1)[len(prompt) - 1 : -1]
    want = float(torch.exp(-lp[torch.arange(4), torch.tensor(cont)].mean()))
    assert perplexity(be, prompt, cont) == pytest.approx(want, rel=1e-5)
    assert distinct_n([[1, 2, 3], [1, 2, 4]], 2) == 3 / 4 and distinct_n([[1, 1]], 1) == 0.5
    c = compare(be, prompt, 6, SuperposedConfig(k=3, temperature=1.0), seed=1)
    for m in (c.superposed, c.nucleus):
        assert len(m.drafts) == 3 and all(len(d) == 6 for d in m.drafts) and len(m.perplexities) == 3
    assert c.superposed.calls == 6 and c.nucleus.calls == 18 and c.time_ratio > 0
    assert c.superposed.best_perplexity == min(c.superposed.perplexities)
    from accel.superposed.evaluate import nucleus_samples

    with pytest.raises(SuperposedError, match="KV cache"):
        nucleus_samples(be, prompt, 2, 30)
    with pytest.raises(SuperposedError, match="batch-1"):
        nucleus_samples(TorchBackend(model, ctx_len=32, batch_size=2), prompt, 2, 4)
