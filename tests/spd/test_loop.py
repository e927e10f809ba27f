"""The speculative loop on real (tiny, random) decoders behind TorchBackend.

Greedy speculative decoding must reproduce greedy autoregressive decoding of the target token for token, with a
low-acceptance draft (a different random model: rejections everywhere) and a high-acceptance draft (a perturbed copy of
the target: all-accepted rounds, which exercise the draft's cache catch-up ``[d_K, bonus]``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from accel.errors import SpdError
from accel.spd import GREEDY, DraftChain, Sampling, generate, generate_ar, sample
from accel.spd import loop as spd_loop
from accel.spd.proposers import ProposerInfo
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import MAX_NEW, PROMPTS_1, PROMPTS_3


@pytest.fixture(scope="module")
def target():
    return random_model(seed=1, std=0.5)


@pytest.fixture(scope="module")
def drafts(target):
    return {"random": random_model(seed=2, std=0.5), "perturbed": perturbed(target, seed=3, rel=0.02)}


@pytest.fixture(scope="module")
def ar_greedy(target):
    out = {}
    for name, prompts in (("b1", PROMPTS_1), ("b3", PROMPTS_3)):
        out[name] = generate_ar(backend(target, len(prompts)), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    return out


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("batch", ["b1", "b3"])
@pytest.mark.parametrize("draft_kind", ["random", "perturbed"])
def test_greedy_equals_target_greedy(target, drafts, ar_greedy, k, batch, draft_kind):
    prompts = PROMPTS_1 if batch == "b1" else PROMPTS_3
    tb, db = backend(target, len(prompts)), backend(drafts[draft_kind], len(prompts))
    res = generate(tb, DraftChain(db, k=k), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ar_greedy[batch].tokens
    assert all(len(t) == MAX_NEW for t in res.tokens) and res.finish_reasons == ["length"] * len(prompts)
    s = res.stats
    assert s.accepted_histogram[0] > 0  # rejections happened
    if draft_kind == "perturbed":
        assert (
            s.all_accepted_rounds > 0
        )  # rounds whose drafts were all accepted: the catch-up [d_K, bonus] is exercised
        assert s.accepted_histogram[k] > 0 or k == 7
        assert s.alpha_counts > 0.6
    else:
        assert s.alpha_counts < 0.3


def test_greedy_draft_equals_target_accepts_everything(target):
    prompts = PROMPTS_3
    k = 4
    res = generate(
        backend(target, 3), DraftChain(backend(target, 3), k=k), prompts, max_new_tokens=MAX_NEW, sampling=GREEDY
    )
    s = res.stats
    assert s.all_accepted_rounds == s.row_calls  # every round accepts all of its drafts and adds the bonus
    assert s.alpha_counts == 1.0 and s.alpha_overlap == 1.0
    # 24 = 5 + 5 + 5 + 5 + 4: four full rounds of K+1, then one capped to the 4 remaining
    assert s.accepted_histogram == [0, 0, 0, 3, 12] and s.rounds == 5
    assert s.tokens_per_target_call == pytest.approx(24 / 5)


def test_multinomial_draft_equals_target_acceptance_one(target):
    res = generate(
        backend(target, 3),
        DraftChain(backend(target, 3), k=3),
        PROMPTS_3,
        max_new_tokens=MAX_NEW,
        seed=4,
        sampling=Sampling(temperature=0.9, top_k=20, top_p=0.95),
    )
    s = res.stats
    # p and q come from different call shapes (1-2 vs K+1 tokens), so they agree to float32 rounding, not bit for bit
    assert s.alpha_overlap > 1 - 1e-5
    assert s.alpha_counts == 1.0 and s.accepted_drafts == s.proposed_drafts


def test_seeded_runs_reproducible(target, drafts):
    tb, db = backend(target, 3), backend(drafts["perturbed"], 3)
    kw = dict(max_new_tokens=MAX_NEW, sampling=Sampling(temperature=1.0))
    a = generate(tb, DraftChain(db, k=3), PROMPTS_3, seed=11, **kw)
    b = generate(tb, DraftChain(db, k=3), PROMPTS_3, seed=11, **kw)
    c = generate(tb, DraftChain(db, k=3), PROMPTS_3, seed=12, **kw)
    assert a.tokens == b.tokens and a.from_draft == b.from_draft
    assert a.tokens != c.tokens
    d = generate(tb, DraftChain(db, k=3), PROMPTS_3, seed=np.random.default_rng(11), **kw)
    assert d.tokens == a.tokens


def test_statistics_add_up_and_stream(target, drafts):
    k = 3
    streamed: dict[int, list[tuple[list[int], list[bool]]]] = {0: []}
    res = generate(
        backend(target, 1),
        DraftChain(backend(drafts["perturbed"], 1), k=k),
        PROMPTS_1,
        max_new_tokens=MAX_NEW,
        seed=5,
        stream=lambda row, toks, flags: streamed[row].append((list(toks), flags)),
        sampling=Sampling(temperature=1.0),
    )
    s = res.stats
    assert s.new_tokens == sum(len(t) for t in res.tokens) == MAX_NEW
    assert s.new_tokens == s.accepted_drafts + s.target_tokens  # accepted drafts + one residual/bonus per round
    assert sum(sum(f) for f in res.from_draft) == s.accepted_drafts
    assert s.target_tokens == s.rounds == s.row_calls == sum(s.accepted_histogram)
    assert sum(m * c for m, c in enumerate(s.accepted_histogram)) == s.accepted_drafts
    assert s.target_calls == s.rounds + 1 and s.mean_tokens_per_loop == pytest.approx(s.tokens_per_target_call)
    # streamed tokens are the result; each event is [accepted drafts..., one target token]
    assert [t for toks, _ in streamed[0] for t in toks] == res.tokens[0]
    assert [f for _, flags in streamed[0] for f in flags] == res.from_draft[0]
    assert all(flags[-1] is False and all(flags[:-1]) for _, flags in streamed[0])
    # draft calls: one prefill chunk + k_b = min(K, room - 1) calls per round, room = tokens still allowed
    expected, done = 1, 0
    for toks, _ in streamed[0]:
        expected += min(k, MAX_NEW - done - 1)
        done += len(toks)
    assert s.draft_calls == expected
    assert s.draft_tokens == expected - 1 and s.mean_drafts_per_loop == pytest.approx((expected - 1) / s.rounds)
    # acceptance per position = accepted / reached
    reached = np.array(s.proposed_per_position)
    assert reached[0] == s.rounds and np.all(np.diff(reached) <= 0)
    assert s.alpha_counts == pytest.approx(s.accepted_drafts / reached.sum())
    assert 0 < s.alpha_overlap < 1 and 0 < s.alpha_counts < 1
    assert s.wall_s >= s.draft_s + s.target_s - 1e-9 and s.host_s >= 0 and s.tokens_per_s > 0
    ar = generate_ar(backend(target, 1), PROMPTS_1, max_new_tokens=MAX_NEW, seed=5)
    assert ar.stats.tokens_per_target_call == 1.0 and ar.stats.target_calls == MAX_NEW + 1
    assert ar.stats.draft_calls == 0 and math.isnan(ar.stats.alpha_counts)


def test_eos_per_row(target, drafts, ar_greedy):
    ref = ar_greedy["b3"].tokens
    eos = ref[0][5]  # a token row 0 emits at index <= 5
    expected = [r[: r.index(eos) + 1] if eos in r else r for r in ref]
    res = generate(
        backend(target, 3),
        DraftChain(backend(drafts["perturbed"], 3), k=4),
        PROMPTS_3,
        max_new_tokens=MAX_NEW,
        eos_token_id=eos,
        sampling=GREEDY,
    )
    assert res.tokens == expected
    assert res.finish_reasons == ["eos" if eos in r else "length" for r in ref]
    assert len(res.tokens[0]) <= 6
    ar = generate_ar(backend(target, 3), PROMPTS_3, max_new_tokens=MAX_NEW, eos_token_id=[eos, 10_000], sampling=GREEDY)
    assert ar.tokens == expected


def test_max_new_tokens_per_row_list(target, drafts, ar_greedy):
    limits = [3, 0, 11]
    res = generate(
        backend(target, 3),
        DraftChain(backend(drafts["perturbed"], 3), k=4),
        PROMPTS_3,
        max_new_tokens=limits,
        sampling=GREEDY,
    )
    assert res.tokens == [r[:n] for r, n in zip(ar_greedy["b3"].tokens, limits, strict=True)]
    assert res.finish_reasons == ["length"] * 3
    with pytest.raises(SpdError, match="max_new_tokens"):
        generate(backend(target, 3), DraftChain(backend(drafts["perturbed"], 3), k=4), PROMPTS_3, max_new_tokens=[1, 2])


@pytest.mark.parametrize("max_new", [0, 1, 2, 5])
def test_max_new_tokens_per_row(target, drafts, max_new):
    res = generate(
        backend(target, 3),
        DraftChain(backend(drafts["perturbed"], 3), k=7),
        PROMPTS_3,
        max_new_tokens=max_new,
        sampling=GREEDY,
    )
    assert [len(t) for t in res.tokens] == [max_new] * 3
    assert res.stats.new_tokens == 3 * max_new


def test_context_exhaustion_stops_cleanly(target, drafts):
    ctx = 20
    prompts = [[1, 2, 3, 4, 5], [7] * 12, [3] * 19]
    res = generate(
        backend(target, 3, ctx_len=ctx),
        DraftChain(backend(drafts["perturbed"], 3, ctx_len=ctx), k=7),
        prompts,
        max_new_tokens=100,
        sampling=GREEDY,
    )
    assert [len(p) + len(t) for p, t in zip(prompts, res.tokens, strict=True)] == [ctx] * 3
    assert res.finish_reasons == ["context"] * 3
    assert len(res.messages) == 3 and "context full" in res.messages[0]
    ar = generate_ar(backend(target, 3, ctx_len=ctx), prompts, max_new_tokens=100, sampling=GREEDY)
    assert ar.tokens == res.tokens
    full = generate(
        backend(target, 1, ctx_len=ctx),
        DraftChain(backend(drafts["perturbed"], 1, ctx_len=ctx), k=2),
        [[2] * ctx],
        max_new_tokens=5,
        sampling=GREEDY,
    )
    assert full.tokens == [[]] and full.finish_reasons == ["context"]


def test_chunked_prefill_and_smaller_draft_context(target, drafts):
    prompts = [list(range(1, 30)), [4, 5]]
    ref = generate_ar(backend(target, 2), prompts, max_new_tokens=10, sampling=GREEDY)
    res = generate(
        backend(target, 2, max_seq_len=8),
        DraftChain(backend(drafts["perturbed"], 2, ctx_len=40, max_seq_len=3), k=4),
        prompts,
        max_new_tokens=20,
        sampling=GREEDY,
    )
    # the draft's ctx_len (40) bounds the run: row 0 has 29 prompt tokens, so 11 new tokens fit
    assert res.tokens[0] == ref.tokens[0] + res.tokens[0][10:] and len(res.tokens[0]) == 11
    assert res.tokens[1][:10] == ref.tokens[1] and res.finish_reasons == ["context", "length"]
    assert res.stats.target_calls - res.stats.rounds == 4  # 28 prefill tokens in chunks of 8


def test_bad_inputs_raise(target):
    other_vocab = random_model(seed=3, vocab_size=48)
    tb, db = backend(target, 2), backend(random_model(seed=2), 2)
    prompts = [[1, 2], [3]]
    with pytest.raises(SpdError, match="vocab_size"):
        generate(tb, DraftChain(backend(other_vocab, 2), k=2), prompts, max_new_tokens=4)
    for bad_k in (0, -1):
        with pytest.raises(SpdError, match=r"k .*>= 1"):
            generate(tb, DraftChain(db, k=bad_k), prompts, max_new_tokens=4)
    with pytest.raises(SpdError, match="too large"):
        generate(backend(target, 2, max_seq_len=4), DraftChain(db, k=4), prompts, max_new_tokens=4)
    with pytest.raises(SpdError, match="batch"):
        generate(tb, DraftChain(db, k=2), [[1, 2]], max_new_tokens=4)
    with pytest.raises(SpdError, match="batch"):
        generate(tb, DraftChain(backend(random_model(seed=2), 3), k=2), prompts, max_new_tokens=4)
    with pytest.raises(SpdError, match="vocabulary"):
        generate(tb, DraftChain(db, k=2), [[1, 2], [32]], max_new_tokens=4)
    with pytest.raises(SpdError, match="non-empty"):
        generate(tb, DraftChain(db, k=2), [[1, 2], []], max_new_tokens=4)
    with pytest.raises(SpdError, match="longer than the context"):
        generate(tb, DraftChain(db, k=2), [[1] * 65, [2]], max_new_tokens=4)
    with pytest.raises(SpdError, match="temperature"):
        generate(tb, DraftChain(db, k=2), prompts, max_new_tokens=4, sampling=Sampling(temperature=0.0))
    with pytest.raises(SpdError, match="max_new_tokens"):
        generate_ar(tb, prompts, max_new_tokens=-1)


def test_nan_logits_raise(target):
    torch = pytest.importorskip("torch")
    broken = perturbed(target, seed=0, rel=0.0)
    with torch.no_grad():
        broken.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(SpdError, match="NaN or inf"):
        generate(backend(target, 1), DraftChain(backend(broken, 1), k=2), PROMPTS_1, max_new_tokens=4)
    with pytest.raises(SpdError, match="NaN or inf"):
        generate_ar(backend(broken, 1), PROMPTS_1, max_new_tokens=4, sampling=GREEDY)


def test_tokenizer_mismatch_raises(target):
    tokenizers = pytest.importorskip("tokenizers")
    from accel.spd import check_compatible

    def word_level(vocab):
        return tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))

    tb, db = backend(target, 1), backend(random_model(seed=2), 1)
    same = {"<unk>": 0, "a": 1, "b": 2}
    check_compatible(tb, db, word_level(same), word_level(dict(same)))
    with pytest.raises(SpdError, match="tokenizers differ"):
        check_compatible(tb, db, word_level(same), word_level({"<unk>": 0, "a": 2, "b": 1}))


def test_prompt_as_2d_array(target, drafts):
    prompts = np.array([[1, 2, 3], [4, 5, 6]])
    res = generate(
        backend(target, 2), DraftChain(backend(drafts["perturbed"], 2), k=3), prompts, max_new_tokens=8, sampling=GREEDY
    )
    ref = generate_ar(backend(target, 2), prompts.tolist(), max_new_tokens=8, sampling=GREEDY)
    assert res.tokens == ref.tokens
    with pytest.raises(SpdError, match="2-D"):
        generate(
            backend(target, 2),
            DraftChain(backend(drafts["perturbed"], 2), k=3),
            np.zeros((2, 3, 1), int),
            max_new_tokens=8,
        )


@pytest.mark.parametrize("batch", ["b1", "b3"])
def test_dynamic_draft_length_greedy(target, drafts, ar_greedy, batch):
    """``min_draft_prob`` ends a row's drafting after an unsure proposal: k is a cap. Greedy output is still the
    target's; 0 is the fixed-k loop; 1.0 (no softmax reaches it here) proposes one token per round."""
    prompts = PROMPTS_1 if batch == "b1" else PROMPTS_3
    tb, db = backend(target, len(prompts)), backend(drafts["perturbed"], len(prompts))
    kw = dict(max_new_tokens=MAX_NEW, sampling=GREEDY)
    fixed = generate(tb, DraftChain(db, k=6), prompts, **kw)
    assert (
        generate(tb, DraftChain(db, k=6, min_draft_prob=0.0), prompts, **kw).stats.proposed_per_position
        == fixed.stats.proposed_per_position
    )
    one = generate(tb, DraftChain(db, k=6, min_draft_prob=1.0), prompts, **kw)
    assert one.tokens == ar_greedy[batch].tokens
    # one draft per round (a row's last round, with one token of room left, proposes none)
    assert one.stats.proposed_per_position[1:] == [0] * 5
    assert one.stats.proposed_per_position[0] >= one.stats.row_calls - len(prompts)
    # draft_tokens counts every proposal (the reached ones and those after a rejection): 1 per round here
    assert one.stats.draft_tokens == one.stats.proposed_per_position[0]
    assert one.stats.mean_drafts_per_loop == pytest.approx(one.stats.draft_tokens / one.stats.row_calls)
    mid = generate(tb, DraftChain(db, k=6, min_draft_prob=0.5), prompts, **kw)
    assert mid.tokens == ar_greedy[batch].tokens
    assert mid.stats.proposed_drafts < fixed.stats.proposed_drafts
    assert mid.stats.proposed_per_position[1] > 0  # confident proposals still continue
    assert one.stats.draft_tokens < mid.stats.draft_tokens < fixed.stats.draft_tokens
    assert mid.stats.proposed_drafts <= mid.stats.draft_tokens  # reached <= proposed
    # a fixed k proposes k per round, fewer only near max_new_tokens (room - 1 drafts at most)
    assert fixed.stats.proposed_drafts <= fixed.stats.draft_tokens <= 6 * fixed.stats.row_calls


def test_dynamic_draft_length_rejects_bad_threshold(target):
    tb, db = backend(target, 1), backend(random_model(seed=2), 1)
    for bad in (-0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(SpdError, match="min_draft_prob"):
            generate(tb, DraftChain(db, k=2, min_draft_prob=bad), PROMPTS_1, max_new_tokens=4)


def _plain_steps(model, prompt: list[int], n: int, sampling: Sampling, seed: int) -> list[int]:
    """Autoregressive decoding by hand: one target call per token, each drawn by ``accel.spd.sample`` from the
    target's warped distribution with one seeded generator (what the loop's walk of a root-only tree draws)."""
    be = backend(model, 1)
    be.reset()
    ids, rng = list(prompt), np.random.default_rng(seed)
    be.forward(np.array([ids[:-1]]), np.arange(len(ids) - 1)[None], num_logits=1)
    for _ in range(n):
        logits = be.forward(np.array([[ids[-1]]]), np.array([[len(ids) - 1]]), num_logits=1)[0, -1]
        ids.append(int(np.argmax(logits)) if sampling.greedy else int(sample(sampling.probs(logits)[None], rng)[0]))
    return ids[len(prompt) :]


@pytest.mark.parametrize("batched", [True, False])
def test_plain_steps_draw_what_the_walk_of_a_root_draws(target, monkeypatch, batched):
    """A round whose tree is the root alone takes the target's next token directly; sampled and greedy, it is the
    token a hand-written AR loop draws from the same seed, step for step, both where the loop warps every column at
    once (a small vocabulary) and where it warps node by node (``_BATCH_VOCAB`` = 0)."""
    if not batched:
        monkeypatch.setattr(spd_loop, "_BATCH_VOCAB", 0)
    prompt = list(PROMPTS_1[0])
    for sampling in (Sampling(temperature=0.8), GREEDY):
        got = generate_ar(backend(target, 1), [prompt], max_new_tokens=MAX_NEW, sampling=sampling, seed=7)
        assert got.tokens[0] == _plain_steps(target, prompt, MAX_NEW, sampling, 7)


class _NeverProposes:
    """A proposer with no proposal for any row (every round a plain step); with ``hidden``, it reads the target's
    hidden states and keeps the run's last copy of them (``seen``)."""

    def __init__(self, hidden: bool = False) -> None:
        self.info = ProposerInfo("never", 4, 4, False, hidden, None)
        self.seen: np.ndarray | None = None

    def check(self, target) -> None:
        pass

    def start(self, run) -> None:
        pass

    def propose(self, run, rows):
        return [None] * run.batch

    def update(self, run, outcomes) -> None:
        if run.hidden is not None:
            self.seen = run.hidden.copy()


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(temperature=0.8, top_k=20)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("batched", [True, False])
def test_plain_rounds_equal_root_only_tree_rounds(target, ar_greedy, monkeypatch, sampling, batched):
    """A round with no proposal (AR, or a proposer that offers none) takes the loop's short round (no trees built);
    it emits, draws, stops, streams and counts exactly as the general round of root-only trees: ragged limits, EOS
    per row, the same seed's tokens (warping every column at once, a small vocabulary, or row by row:
    ``_BATCH_VOCAB`` = 0), every statistic of the rows, the hidden states a proposer reads."""
    if not batched:
        monkeypatch.setattr(spd_loop, "_BATCH_VOCAB", 0)
    eos = ar_greedy["b3"].tokens[0][5]

    def run(proposer):
        streamed: list = []
        res = generate(
            backend(target, 3),
            proposer,
            PROMPTS_3,
            max_new_tokens=[MAX_NEW, 3, MAX_NEW],
            eos_token_id=eos,
            sampling=sampling,
            seed=11,
            stream=lambda b, toks, flags: streamed.append((b, list(toks), list(flags))),
        )
        return res, streamed

    fields = ("new_tokens", "rounds", "row_calls", "target_calls", "accepted_histogram", "target_tokens")
    fields += ("tokens_per_target_call", "tree_nodes_histogram", "tree_depth_histogram", "mean_target_call_tokens")

    def counts(stats):  # histograms are as long as the proposer's deepest tree (0 for AR, 4 for _NeverProposes)
        return {f: list(np.trim_zeros(np.array(v), "b")) if isinstance(v, list) else v for f in fields
                for v in [getattr(stats, f)]}  # fmt: skip

    reads = _NeverProposes(hidden=True)
    plain, never = run(None), run(_NeverProposes())
    run(reads)
    monkeypatch.setattr(spd_loop._Loop, "_plain_round", lambda self: self._tree_round(self._trees()))
    trees, trees_stream = run(None)
    reads_trees = _NeverProposes(hidden=True)
    run(reads_trees)
    assert reads.seen is not None and reads.seen.any()  # the target's states at every position so far, as the
    np.testing.assert_array_equal(reads.seen, reads_trees.seen)  # general round stores them
    for res, streamed in (plain, never):
        assert res.tokens == trees.tokens and res.finish_reasons == trees.finish_reasons
        assert res.from_draft == trees.from_draft and streamed == trees_stream
        assert counts(res.stats) == counts(trees.stats)
    assert len(trees.tokens[1]) <= 3 and ("eos" in trees.finish_reasons or not sampling.greedy)
    assert plain[0].stats.mode == "ar" and never[0].stats.mode == "spd"
