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
from accel.spd.autotune_arm import NO_ARM
from accel.spd.proposers import RowOutcome
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


def test_exploration_is_rare_and_cheap_where_speculation_loses(models):
    """Past the probe rounds, with the model choosing no speculation (a steep call curve), exploration rounds come
    QUIET_EXPLORE times rarer than where speculation pays, and try only the smallest budget."""
    _, draft = models
    explored = {}
    for name, prior, per_token in (("flat", 0.9, 0.0), ("steep", 0.3, 5e-3)):
        tuner = chain_tuner(backend(draft, 1, ctx_len=CTX), prior=prior)
        for s in (1, 5):
            tuner.call_costs.observe(s, 10e-3 + per_token * (s - 1))
        tuner.rounds = len(tuner._schedule)  # the probe rounds are over
        choices = []
        for _ in range(16 * QUIET_EXPLORE * 4):
            choices.append(tuner._choose(tuner.plan())[1:])
            tuner.rounds += 1
        assert {n for n, phase in choices if phase == "model"} == ({4} if name == "flat" else {0})
        explored[name] = [n for n, phase in choices if phase == "explore"]
    assert len(explored["flat"]) == 16
    assert len(explored["steep"]) == 16 // QUIET_EXPLORE and set(explored["steep"]) == {1}


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
    for kw in (*bad, dict(margin=-0.1), dict(margin=float("nan"))):
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
    (here: every draft accepted) changes it."""
    _, draft = models
    tuner = AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4), settings=TuneSettings(prior_acceptance=0.3))
    arm = tuner.arms[0]
    first = arm.expected_tokens(0.3)
    assert arm.expected_tokens(0.3) is first and arm.expected_tokens(0.5) is not first
    chain = TokenTree.chain(1, [2, 3, 4, 5])
    for _ in range(5):
        arm.observe(4, 1e-3, True, [RowOutcome(3, chain, [0, 1, 2, 3, 4])])
    assert np.all(arm.expected_tokens(0.3)[1:] > first[1:])


def test_an_idle_arm_drifts_back_to_its_prior(models):
    """Rounds an arm sits out decay its counts as its own rounds do (applied at each plan): after a run of rejections
    the controller chooses no speculation, and once the arm has sat out enough rounds the plan prices it near the
    prior again and speculates; without the idle decay it would keep the old verdict."""
    _, draft = models
    tuner = AutoTune(DraftChain(backend(draft, 1, ctx_len=CTX), k=4), settings=TuneSettings(decay=0.9))
    arm = tuner.arms[0]
    tuner.propose_costs.observe(1, 1e-4)
    for size in range(1, 6):
        tuner.call_costs.observe(size, 10e-3 * (1 + 0.1 * (size - 1)))  # each extra token +10% of a step
    prior = arm.expected_tokens(tuner.prior_acceptance).copy()
    rejected = RowOutcome(3, TokenTree.chain(1, [2, 3, 4, 5]), [0])
    for _ in range(20):
        tuner.rounds += 1
        arm.observe(4, 1e-4, True, [rejected])
    assert tuner.plan().best_shape() == (NO_ARM, 0)  # the rejections price speculation below a plain step
    stuck = arm.expected_tokens(tuner.prior_acceptance).copy()
    tuner.rounds += 60  # rounds without speculation: the arm sits them out
    plan = tuner.plan()
    after = arm.expected_tokens(tuner.prior_acceptance)
    assert np.all(after[1:] > stuck[1:]) and np.allclose(after, prior, rtol=0.05)
    assert plan.best_shape()[1] > 0
    assert tuner.plan().at(1) == plan.at(1)  # applied once: a second plan in the same round changes nothing


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
