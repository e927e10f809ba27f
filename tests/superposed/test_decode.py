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
    renorm = SuperposedConfig(ngram_weights=(0.25, 0.75), no_match_logprob=-50.0, renormalize=True)
    got = ngram_logprobs(store, ctx, np.array([2, 1, 2]), np.array([[3, 4, 7], [3, 4, 7], [3, 4, 7]]), renorm)
    # both orders usable: weights sum to 1 already; the bigram alone: divided by its weight 0.25
    np.testing.assert_allclose(got, [want0, [np.log(2 / 3), np.log(1 / 3), -50.0], [-50.0] * 3])
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


def _reference_select(cand, tokens, k, eos):
    """The k^2 -> k walk written as a plain loop over one row's candidates (what ``select_rows`` vectorises)."""
    flat = cand.reshape(-1)
    order = sorted(range(flat.size), key=lambda i: -flat[i])[: 2 * k]  # sorted() is stable: ties keep (d, j) order
    alive, finished = [], []
    for i in order:
        if not np.isfinite(flat[i]) or len(alive) == k:
            break
        d, j = divmod(i, cand.shape[1])
        (finished if int(tokens[d, j]) in eos else alive).append((d, int(tokens[d, j]), float(flat[i])))
    return alive, finished


def test_select_rows_equals_the_loop():
    """``select_rows`` on hand-made candidates (ties, dead drafts, end-of-sequence tokens) for many rows at once."""
    from accel.superposed.scoring import select_rows

    rng = np.random.default_rng(1)
    for k, n in ((1, 1), (2, 5), (3, 9), (4, 3)):
        cand = rng.integers(-6, 0, size=(200, k, n)).astype(np.float64)  # integers: many ties
        cand[rng.random((200, k)) < 0.3] = -np.inf  # dead drafts
        tokens = rng.integers(0, 12, size=(200, k, n))
        eos = frozenset({3, 7})
        sel = select_rows(cand, tokens, k, eos)
        for r in range(200):
            alive, finished = _reference_select(cand[r], tokens[r], k, eos)
            slots = zip(sel.parent[r], sel.token[r], sel.score[r], strict=True)
            got = [(int(p), int(t), float(s)) for p, t, s in slots if p >= 0]
            assert got == alive and all(sel.parent[r, len(alive) :] == -1)
            fin = [(int(p), int(t), float(s)) for i, p, t, s in zip(*_fin(sel), strict=True) if i == r]
            assert fin == finished


def _fin(sel):
    return sel.fin_row, sel.fin_parent, sel.fin_token, sel.fin_score


def _reference_beams(prompt, logits, cfg, store, eos):
    """One row's drafts by a plain loop: every draft's n-gram context rebuilt from prompt + draft at every step."""
    from accel.superposed.scoring import log_softmax

    k, m = cfg.k, cfg.max_order - 1
    drafts, scores, finished = [[]], [0.0], []
    for step, lg in enumerate(logits):
        lp = log_softmax(lg / cfg.temperature)
        top = sorted(range(VOCAB), key=lambda t: -lp[t])[: cfg.n_token_sample]
        cand = np.full((k, len(top)), -np.inf)
        for d, (toks, sc) in enumerate(zip(drafts, scores, strict=True)):
            seq = prompt + toks
            ctx = np.array([[0] * (m - len(seq[-m:])) + seq[-m:]])
            ng = ngram_logprobs(store, ctx, np.array([min(len(seq), m)]), np.array([top]), cfg)[0]
            cand[d] = sc + (1 - cfg.alpha) * lp[top] + cfg.alpha * ng
        alive, fin = _reference_select(cand, np.array([top] * k), k, eos)
        finished = sorted(finished + [(drafts[d] + [t], True, s) for d, t, s in fin], key=lambda x: -x[2])[:k]
        drafts, scores = [drafts[d] + [t] for d, t, _ in alive], [s for _, _, s in alive]
        best = max(scores, default=-np.inf)
        if step == len(logits) - 1 or not alive or (len(finished) == k and finished[-1][2] >= best):
            break
    return sorted(finished + [(t, False, s) for t, s in zip(drafts, scores, strict=True)], key=lambda x: -x[2])[:k]


def test_batched_beams_equal_each_row_alone(tmp_path):
    """The vectorised beam update of B rows equals B runs of one row and a plain per-draft loop, on hand-made logits,
    with n-gram scoring and finished drafts (rows stopping at different steps)."""
    from accel.superposed import Beams

    rng = np.random.default_rng(2)
    docs = [rng.integers(0, VOCAB, size=50) for _ in range(4)]
    store = NgramStore.load(build_store(docs, VOCAB, tmp_path / "r.ngrams", max_order=6))
    cfg = SuperposedConfig(k=3, alpha=0.4, temperature=0.7, n_token_sample=6)
    contexts = [[3, 9, 1, 4, 7, 2, 2, 8], [2, 5], [int(t) for t in docs[1][:7]]]
    logits = rng.normal(size=(10, len(contexts), VOCAB)) * 3
    eos = frozenset({4, 19})

    def run(rows, lg):
        beams = Beams(rows, cfg, store, eos)
        for s in range(lg.shape[0]):
            beams.advance(lg[s], last=s == lg.shape[0] - 1)
            if beams.all_done:
                break
            inputs = beams.mix_inputs()
        return beams.drafts(), inputs

    together, (_, pos, mix_ids, mix_w) = run(contexts, logits)
    assert any(d.finished for row in together for d in row)
    for r, ctx in enumerate(contexts):
        alone, (_, pos1, mix1, w1) = run([ctx], logits[:, r : r + 1])
        assert together[r] == alone[0]
        ref = _reference_beams(ctx, logits[:, r], cfg, store, eos)
        assert [(d.tokens, d.finished) for d in alone[0]] == [(t, f) for t, f, _ in ref]
        np.testing.assert_allclose([d.score for d in alone[0]], [s for _, _, s in ref])
        if pos1[0, 0] >= 0:  # the row was still running at the last step of both
            np.testing.assert_array_equal(mix_ids[r], mix1[0])
            np.testing.assert_allclose(mix_w[r], w1[0])
            assert pos[r, 0] == pos1[0, 0]
