"""The cost-aware controller (``accel.spd.autotune.AutoTune``): it keeps exactness while its budget changes from round
to round, it decides by the stated formula, and bad timings give its documented fallback.

- greedy: SpD through the controller equals greedy AR token for token (chains, trees, lookup, ``FirstOf``, ``Merge``;
  batch 1 and ragged batch 3), over several runs of one controller so it probes, explores and decides;
- sampling: the 3-token continuations of a fixed prompt follow the target's exact law (enumeration; chi-square at
  ALPHA = 0.001, fixed seeds, as tests/spd/test_exactness.py) for a sampled chain and a top-k tree, with a seeded
  clock so the budgets vary between rounds reproducibly, and a controller that peeks at the target's verdict (it
  keeps a row's proposal only when the target will surely accept its first token) fails the same test;
- the decision: with costs given as samples, ``plan`` equals E / (T_propose + T_call) computed from
  ``accel.sim.spd.expected_tokens`` (the i.i.d. chain formula, an independent implementation of E).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from accel.errors import SpdError
from accel.sim.spd import expected_tokens
from accel.spd import GREEDY, DraftChain, DraftTree, FirstOf, Merge, NgramLookup, Sampling, generate, generate_ar
from accel.spd.autotune import QUIET_EXPLORE, AutoTune, Plan, TuneSettings
from accel.spd.autotune_arm import NO_ARM, PRIOR_WEIGHT
from accel.spd.autotune_catchup import STEADY_TOKENS, CatchUp
from accel.spd.proposers import RowOutcome, RunState
from accel.spd.stats import StatsAccumulator
from accel.spd.tree import TokenTree
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import (
    ALPHA,
    MAX_NEW,
    NEW,
    PROMPT,
    PROMPTS_1,
    PROMPTS_3,
    ROWS,
    SETTINGS,
    VOCAB,
    K,
    chi_square,
    exact_law,
)

torch = pytest.importorskip("torch")

CTX = 64
PROPOSERS = {
    "chain": lambda db: DraftChain(db, k=4),
    "tree": lambda db: DraftTree(db, nodes=6, top_k=3),
    "lookup": lambda db: NgramLookup(2, 4),
    "lookup|chain": lambda db: FirstOf(NgramLookup(2, 3), DraftChain(db, k=3)),
    "lookup+tree": lambda db: Merge(NgramLookup(2, 3), DraftTree(db, nodes=4, top_k=2)),
}

EXPLORE_3 = TuneSettings(explore_every=3)  # a neighbour re-measured every 3 rounds
BACKOFF = TuneSettings().quiet_backoff
LONG_RUN_DECAY = TuneSettings().long_run_decay


@pytest.fixture(scope="module")
def models():
    target = random_model(seed=1, std=0.5)
    return target, perturbed(target, seed=3, rel=0.3)


@pytest.mark.parametrize("prompts", [PROMPTS_1, PROMPTS_3], ids=["b1", "b3"])
@pytest.mark.parametrize("name", list(PROPOSERS))
def test_greedy_equals_ar_while_the_budget_changes(models, name, prompts):
    target, draft = models
    tb, db = backend(target, len(prompts), ctx_len=CTX), backend(draft, len(prompts), ctx_len=CTX)
    ar = generate_ar(tb, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    tuner = AutoTune(PROPOSERS[name](db), settings=TuneSettings(explore_every=3))
    records = []
    for _ in range(4):  # one controller over several runs: probe, then model and explore rounds
        res = generate(tb, tuner, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
        assert res.tokens == ar
        assert 0 < len(res.stats.tuned_rounds) <= res.stats.rounds
        records += res.stats.tuned_rounds
    assert {"probe", "model", "explore"} <= {r.phase for r in records}
    assert len({r.nodes for r in records}) >= 3  # at least the probe's max, 0 and 1
    for r in records:  # the budget was honoured, and no speculation means a plain one-token step
        assert r.call_tokens <= r.nodes + 1 and (r.nodes > 0 or r.tokens_per_call == 1.0)
        assert r.call_s > 0 and r.propose_s >= 0 and r.tokens_per_call >= 1.0
    assert all(math.isfinite(r.predicted_tokens_per_call) for r in records if r.phase == "model")


def test_other_proposers_record_no_tuning(models):
    target, draft = models
    tb, db = backend(target, 1, ctx_len=CTX), backend(draft, 1, ctx_len=CTX)
    assert generate(tb, DraftChain(db, k=2), PROMPTS_1, max_new_tokens=8).stats.tuned_rounds == []


@pytest.mark.parametrize("clock", [lambda: 7.0, lambda: math.nan, iter(np.arange(1e6, 0, -1.0)).__next__])
def test_bad_timings_run_the_fixed_fallback(models, clock):
    """A frozen, NaN or backwards clock: every sample is refused, and after the probe rounds the controller runs its
    documented fallback shape (here 2 nodes), with greedy output still equal to AR: no error, no hang."""
    target, draft = models
    tb, db = backend(target, 3, ctx_len=CTX), backend(draft, 3, ctx_len=CTX)
    tuner = AutoTune(DraftChain(db, k=4), fallback=2, clock=clock)
    res = generate(tb, tuner, PROMPTS_3, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == generate_ar(tb, PROMPTS_3, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    later = res.stats.tuned_rounds[4:]
    assert later and all(r.phase == "fallback" and r.nodes == 2 for r in later)
    assert tuner.plan() is None and tuner.call_costs.rejected > 0
    assert "fallback" in tuner.describe()
    with pytest.raises(SpdError, match="no valid timing"):
        tuner.probe(tb)


def chain_tuner(db, prior: float) -> AutoTune:
    tuner = AutoTune(DraftChain(db, k=4), settings=TuneSettings(prior_acceptance=prior))
    tuner.propose_costs.observe(1, 1e-3)
    tuner.propose_costs.observe(4, 4e-3)  # 1 ms per draft call
    return tuner


@pytest.mark.parametrize("slope", [0.0, 0.5e-3, 1e-3, 4e-3])
def test_plan_is_tokens_over_seconds(models, slope):
    """No verified round yet: the acceptance is the prior at every depth, so E is the i.i.d. chain formula."""
    _, draft = models
    tuner = chain_tuner(backend(draft, 1, ctx_len=CTX), prior=0.6)
    for s in (1, 5):
        tuner.call_costs.observe(s, 10e-3 + slope * (s - 1))
    plan = tuner.plan()
    assert plan is not None and plan.nodes.tolist() == [0, 1, 2, 3, 4]
    k = np.arange(1, 5)
    tokens = np.concatenate([[1.0], expected_tokens(0.6, k)])
    seconds = np.concatenate([[10e-3], k * 1e-3 + 10e-3 + slope * k])
    np.testing.assert_allclose(plan.tokens, tokens, rtol=1e-12)
    np.testing.assert_allclose(plan.tokens_per_s, tokens / seconds, rtol=1e-12)
    assert plan.best() == int(np.argmax(tokens / seconds))


def test_speculation_is_switched_off_where_it_loses(models):
    _, draft = models
    flat = chain_tuner(backend(draft, 1, ctx_len=CTX), prior=0.9)
    steep = chain_tuner(backend(draft, 1, ctx_len=CTX), prior=0.3)
    for tuner, per_token in ((flat, 0.0), (steep, 5e-3)):
        for s in (1, 5):
            tuner.call_costs.observe(s, 10e-3 + per_token * (s - 1))
    assert flat.plan().best() == 4 and "4 nodes" in flat.describe()
    assert steep.plan().best() == 0 and "no speculation" in steep.describe()


def explorations(tuner: AutoTune, rounds: int) -> tuple[list[int], set[int], list[int]]:
    """Run ``tuner``'s choice for ``rounds`` rounds (no generation): the rounds it explored at, the budgets its model
    chose and the budgets it explored."""
    at, model, explored = [], set(), []
    for _ in range(rounds):
        _, nodes, phase = tuner._choose(tuner._cached_plan())
        if phase == "explore":
            at.append(tuner.rounds)
            explored.append(nodes)
        else:
            model.add(nodes)
        tuner.rounds += 1
    return at, model, explored


def test_exploration_is_rare_and_cheap_where_speculation_loses(models):
    """Past the probe rounds, with the model choosing no speculation (a steep call curve), exploration rounds come
    QUIET_EXPLORE times rarer than where speculation pays, try only the smallest budget, and the interval doubles
    after each such exploration up to 2**quiet_backoff times (``quiet_backoff=0``: a fixed interval); once the model
    chooses speculation again, explorations come every ``explore_every`` rounds."""
    _, draft = models
    gaps = {}
    for name, prior, per_token in (("flat", 0.9, 0.0), ("steep", 0.3, 5e-3)):
        tuner = chain_tuner(backend(draft, 1, ctx_len=CTX), prior=prior)
        for s in (1, 5):
            tuner.call_costs.observe(s, 10e-3 + per_token * (s - 1))
        tuner.rounds = len(tuner._schedule)  # the probe rounds are over
        at, model, explored = explorations(tuner, 16 * QUIET_EXPLORE * 2 ** (BACKOFF + 2))
        assert model == ({4} if name == "flat" else {0})
        assert set(explored) == ({3, 4} if name == "flat" else {1})  # a neighbour; while quiet the smallest budget
        gaps[name] = np.diff(at).tolist()
        if name == "steep":  # the call curve flattens: speculation pays again, and exploration is frequent again
            for _ in range(tuner.window):
                for s in (1, 5):
                    tuner.call_costs.observe(s, 10e-3)
            tuner.settings = TuneSettings(prior_acceptance=0.9)
            tuner.prior_acceptance = 0.9
            tuner._plan = None
            later, model, _ = explorations(tuner, 16 * QUIET_EXPLORE * 2)
            assert 4 in model and np.diff(later).tolist()[-4:] == [16] * 4
    assert gaps["flat"] and set(gaps["flat"]) == {16}
    quiet = [16 * QUIET_EXPLORE * 2**i for i in range(1, BACKOFF + 1)]
    assert gaps["steep"][: BACKOFF + 1] == [*quiet, quiet[-1]]
    fixed = AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4), settings=TuneSettings(quiet_backoff=0))
    fixed.propose_costs.observe(1, 1e-3)
    for s in (1, 5):
        fixed.call_costs.observe(s, 10e-3 + 5e-3 * (s - 1))
    fixed.rounds = len(fixed._schedule)
    at, model, _ = explorations(fixed, 16 * QUIET_EXPLORE * 8)
    assert model == {0} and set(np.diff(at).tolist()) == {16 * QUIET_EXPLORE}


def test_a_run_that_never_speculates_never_starts_the_draft(models):
    """The arms' proposers start at their first round of a run: where the model chooses no speculation and no
    exploration falls in the run, the draft is never called (not even to prefill the prompt), and the output is AR's;
    the next run that speculates starts it (its prompt prefill, then its rounds)."""
    target, draft = models
    tb, db = backend(target, 1, ctx_len=CTX), backend(draft, 1, ctx_len=CTX)
    ar = generate_ar(tb, PROMPTS_1, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    tuner = chain_tuner(db, prior=0.3)
    for s in (1, 5):
        tuner.call_costs.observe(s, 10e-3 + 5e-3 * (s - 1))  # steep: speculation loses
    tuner.rounds = tuner._explored_at = len(tuner._schedule)  # the probe rounds are over, an exploration just ran
    quiet = generate(tb, tuner, PROMPTS_1, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert quiet.tokens == ar and {r.nodes for r in quiet.stats.tuned_rounds} == {0}
    assert quiet.stats.draft_calls == 0
    busy = generate(tb, AutoTune(DraftChain(db, k=4)), PROMPTS_1, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert busy.tokens == ar and busy.stats.draft_calls > busy.stats.draft_calls_per_loop * busy.stats.rounds


def test_catch_up_is_priced_per_token_beyond_the_steady_gap():
    """``CatchUp`` keeps the seconds per token of catch-ups longer than STEADY_TOKENS (their median prices the next),
    per draft model; a steady gap costs nothing extra, and nothing is priced before a sample."""
    a, b = object(), object()
    up = CatchUp()
    assert up.seconds([a], 100) == 0.0
    up.observe([a], STEADY_TOKENS, 1.0)  # a steady round: no sample
    assert up.seconds([a], 100) == 0.0
    for tokens, extra in ((20, 0.02), (40, 0.12), (10, 0.02)):  # 1, 3 and 2 ms a token
        up.observe([a], tokens, extra)
    assert up.seconds([a], 50) == pytest.approx(0.1) and up.seconds([a], STEADY_TOKENS) == 0.0
    assert up.seconds([b], 50) == 0.0 and up.seconds([a, b], 50) == pytest.approx(0.1)
    up.observe([a], 30, -0.5)  # a round faster than the steady cost: 0 a token, not negative
    assert up.seconds([a], 50) == pytest.approx(0.075)


def test_a_draft_far_behind_is_chosen_only_where_its_catch_up_pays(models):
    """The plan prices a chain above no speculation (1.75 tokens in 12 ms for 2 nodes); with the draft 40 tokens
    behind at 2 ms a token, spread over 8 rounds (10 ms a round), it no longer pays, and no speculation is chosen;
    spread over 80 it does; with the draft within STEADY_TOKENS it is chosen again, as with no catch-up sample yet."""
    target, draft = models
    tuner = chain_tuner(backend(draft, 1, ctx_len=CTX), prior=0.5)
    tuner.settings = TuneSettings(prior_acceptance=0.5, catch_up_rounds=8)
    tuner.call_costs.observe(1, 10e-3)
    tuner.call_costs.observe(5, 10e-3)
    plan = tuner.plan()
    best = plan.best_shape()
    assert best[1] > 0
    info, rng, tokens = backend(target, 1, ctx_len=CTX).info, np.random.default_rng(0), np.zeros((1, CTX), np.int64)
    run = RunState(info, GREEDY, rng, tokens, np.array([40]), np.ones(1, bool), None, StatsAccumulator("spd", 4, 1))
    rows = np.ones(1, bool)
    assert tuner.arms[0].drafts and CatchUp.behind(tuner.arms[0].drafts, run, rows) == 40  # not started: all of it
    assert tuner._best(plan, run, rows) == best  # no catch-up sample yet
    tuner.catch_up.observe(tuner.arms[0].drafts, 20, 20 * 2e-3)
    assert tuner._best(plan, run, rows) == (NO_ARM, 0)
    tuner.settings = TuneSettings(prior_acceptance=0.5, catch_up_rounds=80)  # spread over 80 rounds: 1 ms a round
    assert tuner._best(plan, run, rows) == best
    tuner.settings = TuneSettings(prior_acceptance=0.5, catch_up_rounds=8)
    run.n[:] = STEADY_TOKENS
    assert tuner._best(plan, run, rows) == best


def test_arguments_are_checked(models):
    _, draft = models
    chain = DraftChain(backend(draft, 1, ctx_len=CTX), k=4)
    with pytest.raises(SpdError, match="Proposer"):
        AutoTune(object())  # type: ignore[arg-type]
    with pytest.raises(SpdError, match=r"budgets must be node counts in 1 \.\. 4"):
        AutoTune(chain, budgets=[2, 5])
    with pytest.raises(SpdError, match="fallback"):
        AutoTune(chain, budgets=[1, 2], fallback=3)
    bad = (dict(prior_acceptance=1.0), dict(decay=0.0), dict(explore_every=-1), dict(replan_every=0), dict(margin=1.0))
    more = (dict(quiet_backoff=-1), dict(quiet_backoff=1.5), dict(long_run_decay=1.0), dict(long_run_decay=-0.1))
    more += (dict(catch_up_rounds=-1), dict(catch_up_rounds=2.5))
    for kw in (*bad, *more, dict(margin=-0.1), dict(margin=float("nan"))):
        with pytest.raises(SpdError, match=next(iter(kw))):
            AutoTune(chain, settings=TuneSettings(**kw))


def test_speculation_must_beat_no_speculation_by_the_margin(models):
    """A chain priced 4% ahead of AR is chosen without a margin (the default), not with a 5% one; 6% ahead it is.
    The controller's plans carry its settings' margin."""
    _, draft = models
    tuner = AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4), settings=TuneSettings(margin=0.07))
    tuner.propose_costs.observe(1, 1e-3)
    tuner.call_costs.observe(1, 10e-3)
    assert tuner.plan().margin == 0.07 and TuneSettings().margin == 0.0
    for ahead, margin, chosen in ((1.04, 0.0, 1), (1.04, 0.05, 0), (1.06, 0.05, 1)):
        tokens = np.array([1.0, ahead * 1.25])  # per call at budgets 0 and 1; the 2-token call costs 1.25x
        plan = Plan(np.array([0, 1]), tokens, np.array([1.0, 1.25]), np.zeros(2), np.array([NO_ARM, 0]), margin=margin)
        assert plan.best_shape()[1] == chosen, (ahead, margin)
        assert plan.best_shape(0) == (0, 1)  # within an arm the margin plays no part


# ---------------------------------------------------------------------- distribution exactness


@pytest.fixture(scope="module")
def pair():
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    return target, perturbed(target, seed=22, rel=0.15)


class SeededClock:
    """A reproducible clock for the chi-square tests: each reading advances by an exponential draw from its own
    seeded generator, so the controller's budgets vary from round to round as with real timings, but the same way on
    every machine (the fixed seed makes the test's outcome reproducible). The controller reads it three times a
    round (before and after ``propose``, then in ``update``); the means make a proposal cheap against a call
    (0.2 ms against 1 ms), so speculation can pay and the choice follows the noise and the acceptance."""

    MEANS_S = (1e-3, 0.2e-3, 1e-3)  # before propose (not measured), propose, the call

    def __init__(self, seed: int) -> None:
        self.rng, self.now, self.reads = np.random.default_rng(seed), 0.0, 0

    def __call__(self) -> float:
        self.now += float(self.rng.exponential(self.MEANS_S[self.reads % 3]))
        self.reads += 1
        return self.now


class Peeking(AutoTune):
    """The wrong controller: a row keeps its proposal only if the target will surely accept its first token
    (target probability >= the draft's): the choice "speculate or not" then depends on this round's target output.
    Its clock is frozen, so after the probe rounds it runs its fallback budget K every round (the peek always bites)."""

    def __init__(self, proposer, target_model) -> None:
        super().__init__(proposer, fallback=K, clock=lambda: 0.0)
        self.target_model = target_model

    def propose(self, run, rows):
        trees = super().propose(run, rows)
        for n in np.unique(run.n[rows]):
            idx = np.flatnonzero(rows & (run.n == n))
            with torch.inference_mode():
                logits = self.target_model.causal_forward(torch.from_numpy(run.tokens[idx, :n])).float().numpy()
            p = run.sampling.probs(logits[:, -1])
            for j, b in enumerate(idx):
                tree = trees[b]
                if tree is not None and tree.dists is not None:
                    x = int(tree.tokens[1])
                    if p[j, x] < tree.dists[1, x]:
                        trees[b] = None
        return trees


def tuned_counts(target, draft, build, sampling: dict, seed: int, runs: int):
    """Counts ``[V, V, V]`` of ``runs`` x ``ROWS`` continuations of PROMPT through one controller ``build(db)`` shared
    by the runs (so later runs use the budgets it learned), and its records."""
    tb, db = backend(target, ROWS, ctx_len=8), backend(draft, ROWS, ctx_len=8)
    rng = np.random.default_rng(seed)
    counts = np.zeros((VOCAB,) * NEW, dtype=np.int64)
    tuner, records = build(db), []
    for _ in range(runs):
        res = generate(tb, tuner, [PROMPT] * ROWS, max_new_tokens=NEW, seed=rng, sampling=Sampling(**sampling))
        np.add.at(counts, tuple(np.array(res.tokens).T), 1)
        records += res.stats.tuned_rounds
    return counts, records


@pytest.mark.parametrize(
    "name, build, setting",
    [
        ("sampled chain", lambda db: AutoTune(DraftChain(db, k=K), settings=EXPLORE_3, clock=SeededClock(1)), "plain"),
        (
            "top-k tree",
            lambda db: AutoTune(DraftTree(db, nodes=4, top_k=2, depth=2), settings=EXPLORE_3, clock=SeededClock(2)),
            "temperature",
        ),
        (  # the lookup arm judged in the rounds it does not run (accel.spd.autotune_shadow) prices later rounds
            "chain or lookup, shadowed",
            lambda db: AutoTune([DraftChain(db, k=K), NgramLookup(1, 2)], settings=EXPLORE_3, clock=SeededClock(3)),
            "temperature",
        ),
    ],
)
def test_controller_keeps_the_target_law(pair, name, build, setting):
    target, draft = pair
    sampling = SETTINGS[setting]
    counts, records = tuned_counts(target, draft, build, sampling, seed=300, runs=10)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [autotune, {name}]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert len({r.nodes for r in records}) >= 3  # the budget changed between rounds
    assert any(r.nodes > 0 for r in records if r.phase != "probe")  # and speculation ran after the probe too


def test_peeking_controller_fails(pair):
    target, draft = pair
    sampling = SETTINGS["plain"]
    peeking = lambda db: Peeking(DraftChain(db, k=K), target)  # noqa: E731
    counts, _ = tuned_counts(target, draft, peeking, sampling, seed=300, runs=5)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [autotune, peeking]: {pvalue:.4g}")
    assert pvalue < ALPHA


def test_probe_only_sizes_are_scaled_by_the_real_to_probe_ratio(models):
    """A size only the probe timed is priced as the probe's time x the median real / probe ratio of the sizes both
    timed (a real round adds verification and host time); a size with real rounds is priced from them."""
    _, draft = models
    tuner = chain_tuner(backend(draft, 1, ctx_len=CTX), prior=0.6)
    for s, secs in ((1, 10e-3), (2, 11e-3), (3, 12e-3), (5, 14e-3)):
        tuner.probe_costs.observe(s, secs)
    assert tuner.call_curve().seconds(5) == pytest.approx(14e-3)  # no real round yet: the probe as it is
    tuner.call_costs.observe(1, 12e-3)  # real rounds 1.2x and 1.3x the probe at sizes 1 and 2
    tuner.call_costs.observe(2, 14.3e-3)
    curve = tuner.call_curve()
    assert curve.seconds(1) == pytest.approx(12e-3) and curve.seconds(2) == pytest.approx(14.3e-3)
    assert curve.seconds(5) == pytest.approx(1.25 * 14e-3)  # median of the two ratios
    assert tuner.plan().call_s[-1] == pytest.approx(1.25 * 14e-3)
    assert AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4)).probe_sizes() == [1, 2, 3, 4, 5]
    assert AutoTune(DraftTree(backend(draft, 1, ctx_len=CTX), nodes=20)).probe_sizes() == [
        1, 2, 3, 4, 5, 8, 16, 21
    ]  # fmt: skip


def test_the_plan_is_reused_between_replans(models):
    """The model's plan is recomputed every ``replan_every`` rounds and reused in between (host time per round)."""
    _, draft = models
    tuner = AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4), settings=TuneSettings(replan_every=4))
    tuner.propose_costs.observe(1, 1e-3)
    tuner.call_costs.observe(1, 10e-3)
    first = tuner._cached_plan()
    tuner.rounds += 3
    assert first is not None and tuner._cached_plan() is first
    tuner.rounds += 1
    assert tuner._cached_plan() is not first
    tuner._last = (NO_ARM, 0)  # the model chose no speculation: replans QUIET_EXPLORE times more rarely
    quiet = tuner._cached_plan()
    tuner.rounds += 4 * QUIET_EXPLORE - 1
    assert tuner._cached_plan() is quiet
    tuner.rounds += 1
    assert tuner._cached_plan() is not quiet


def test_expected_tokens_are_kept_until_the_arm_observes_a_round(models):
    """An arm's E[accepted + 1] per budget is computed once and kept while it observes no round; a verified round
    (here: every draft accepted) changes it, and so do idle rounds until its recent counts have decayed away."""
    _, draft = models
    tuner = AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4), settings=TuneSettings(prior_acceptance=0.3))
    arm = tuner.arms[0]
    first = arm.expected_tokens(0.3)
    assert arm.expected_tokens(0.3) is first and arm.expected_tokens(0.5) is not first
    chain = TokenTree.chain(1, [2, 3, 4, 5])
    for _ in range(5):
        arm.observe(4, 1e-3, True, [RowOutcome(3, chain, [0, 1, 2, 3, 4])])
    observed = arm.expected_tokens(0.3)
    assert np.all(observed[1:] > first[1:])
    arm.idle_until(arm._counted + 100)  # idle: its recent counts decay away, a change priced at the next plan
    idle = arm.expected_tokens(0.3)
    assert idle is not observed and np.all(idle[1:] < observed[1:])
    arm.idle_until(arm._counted + 100)  # what is left to decay is below IDLE_RECOMPUTE tried counts: kept
    assert arm.expected_tokens(0.3) is idle


@pytest.mark.parametrize("long_run", [LONG_RUN_DECAY, 0.0], ids=["long-run", "prior"])
def test_an_idle_arm_drifts_back_to_its_long_run_rate(models, long_run):
    """Rounds an arm sits out decay its recent counts as its own rounds do (applied at each plan), towards the rate of
    its own last few hundred rounds (counts decayed by ``long_run_decay`` per round it ran), not towards the prior:
    after a long good run and a short run of rejections the controller stops speculating, and once the arm has sat out
    enough rounds it is priced at its long-run rate again and speculates; an arm that only ever had rejections stays
    off. With ``long_run_decay=0`` both drift back to the prior (0.5: 1.94 tokens a call for a 4-chain) and
    speculate."""
    _, draft = models
    accepted = RowOutcome(3, TokenTree.chain(1, [2, 3, 4, 5]), [0, 1, 2, 3, 4])
    rejected = RowOutcome(3, TokenTree.chain(1, [2, 3, 4, 5]), [0])
    for good in (200, 0):
        settings = TuneSettings(decay=0.9, long_run_decay=long_run)
        tuner = AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4), settings=settings)
        arm = tuner.arms[0]
        tuner.propose_costs.observe(1, 1e-4)
        for size in range(1, 6):
            tuner.call_costs.observe(size, 10e-3 * (1 + 0.1 * (size - 1)))  # each extra token +10% of a step
        tried = hits = 0.0  # the long-run counts, pooled over depths, computed here from the rounds' outcomes
        for outcome in [accepted] * good + [rejected] * 40:
            tuner.rounds += 1
            arm.observe(4, 1e-4, True, [outcome])
            depth = len(outcome.path) - 1
            tried, hits = long_run * tried + max(depth, 1), long_run * hits + depth
        assert tuner.plan().best_shape() == (NO_ARM, 0)  # the recent rejections price speculation below a step
        stuck = arm.expected_tokens(tuner.prior_acceptance).copy()
        tuner.rounds += 60  # rounds without speculation: the arm sits them out
        plan = tuner.plan()
        after = arm.expected_tokens(tuner.prior_acceptance)
        p = (hits + PRIOR_WEIGHT * tuner.prior_acceptance) / (tried + PRIOR_WEIGHT) if long_run else 0.5
        np.testing.assert_allclose(after, expected_tokens(p, np.arange(1, 5)), rtol=0.03)  # budgets 1..4
        assert tuner.plan().at(1) == plan.at(1)  # applied once: a second plan in the same round changes nothing
        if good or not long_run:
            assert np.all(after[1:] > stuck[1:]) and plan.best_shape()[1] > 0
        if good and long_run:
            assert p > 0.9
        if not good and long_run:
            assert p < 0.1 and plan.best_shape() == (NO_ARM, 0)


def test_the_old_setting_keywords_still_work_and_warn(models):
    """``AutoTune``'s learning keywords before ``TuneSettings`` build the same settings, with a DeprecationWarning
    naming the replacement; unknown keywords and both forms together are refused by name."""
    chain = DraftChain(backend(models[1], 1, ctx_len=CTX), k=4)
    with pytest.warns(DeprecationWarning, match=r"explore_every=, decay= -> settings=TuneSettings\(explore_every="):
        old = AutoTune(chain, explore_every=3, decay=0.9)
    assert old.settings == TuneSettings(explore_every=3, decay=0.9) and old.explore_every == 3 and old.decay == 0.9
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*explore"):
        AutoTune(chain, explore=3)
    with pytest.raises(TypeError, match="got settings= and the deprecated decay"):
        AutoTune(chain, settings=TuneSettings(), decay=0.5)


def test_a_plan_reads_each_shapes_entry():
    """``Plan.at`` / ``model_at``: a shape's own entry (the first where a shape repeats), budget 0 from any arm,
    NaN for a shape the plan does not price."""
    nodes, arms = np.array([0, 1, 2, 1, 1]), np.array([NO_ARM, 0, 0, 1, 1])
    tokens = np.array([1.0, 1.5, 1.8, 1.3, 9.0])
    plan = Plan(nodes, tokens, tokens * 1e-3, np.zeros(5), arms, tokens + 1.0, tokens * 2e-3)
    assert plan.at(0, 7) == plan.at(0) == (1.0, 1e-3, 0.0)
    assert plan.at(2, 0)[0] == 1.8 and plan.at(1, 1)[0] == 1.3 and plan.model_at(1, 1) == (2.3, 1.3 * 2e-3)
    assert all(math.isnan(v) for v in (*plan.at(2, 1), *plan.model_at(3, 0)))
