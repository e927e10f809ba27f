"""The controller over several shapes (``AutoTune`` of a list of arms, ``draft_arms``): exact while it switches
between a lookup-first chain, a chain and a merged tree over one shared draft backend, and it picks the arm the
stated formula picks.

- greedy: SpD == greedy AR token for token (batch 1 and ragged batch 3) over several runs of one controller, with
  every arm proposing in some round;
- sampling: 3-token continuations follow the target's exact law (chi-square at ALPHA, fixed seeds, seeded clock),
  with the same test failing for a peeking controller in tests/spd/test_autotune.py;
- the decision: with planted costs, the arm whose proposal is cheap wins, and swapping the costs swaps the choice.
"""

from __future__ import annotations

import numpy as np
import pytest

from accel.errors import SpdError
from accel.sim.tree import best_tree, path_probabilities, rank_acceptance_from_counts
from accel.spd import GREEDY, DraftChain, DraftTree, FirstOf, NgramLookup, generate, generate_ar
from accel.spd.autotune import AutoTune, TuneSettings
from accel.spd.autotune_arm import (
    ARM_FACTOR_RANGE,
    EVIDENCE_WEIGHT,
    NO_ARM,
    PRIOR_WEIGHT,
    Arm,
    SelfSized,
    ShapeEvidence,
    Unbudgeted,
    _draft_users,
    probe_schedule,
)
from accel.spd.proposers import RowOutcome
from accel.spd.tree import TokenTree
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import ALPHA, MAX_NEW, PROMPTS_1, PROMPTS_3, SETTINGS, VOCAB, K, chi_square, exact_law
from tests.spd.test_autotune import Peeking, SeededClock, tuned_counts

pytest.importorskip("torch")

CTX = 64


@pytest.fixture(scope="module")
def models():
    target = random_model(seed=1, std=0.5)
    return target, perturbed(target, seed=3, rel=0.3)


@pytest.mark.parametrize("prompts", [PROMPTS_1, PROMPTS_3], ids=["b1", "b3"])
def test_greedy_equals_ar_while_the_shape_changes(models, prompts):
    target, draft = models
    tb, db = backend(target, len(prompts), ctx_len=CTX), backend(draft, len(prompts), ctx_len=CTX)
    ar = generate_ar(tb, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    tuner = AutoTune.for_draft(db, k=3, nodes=5, settings=TuneSettings(explore_every=3))
    assert len(tuner.arms) == 4  # lookup | chain, chain, lookup + tree (the torch draft takes trees), lookup
    models = {id(u.model) for a in tuner.arms for u in _draft_users(a.proposer)}
    assert len(models) == 1  # the arms share the draft's bookkeeping (share_draft_models)
    records, resets, reset = [], [], db.reset
    db.reset = lambda: (resets.append(1), reset())[1]  # counts the draft's (re)starts; the backend itself runs
    for _ in range(4):
        resets.clear()
        res = generate(tb, tuner, prompts, max_new_tokens=MAX_NEW, sampling=GREEDY)
        assert res.tokens == ar
        st = res.stats  # the draft is started (its cache reset, the prompt fed) once, not once per arm
        assert len(resets) == (1 if st.draft_calls else 0)
        assert st.draft_calls - round(st.draft_calls_per_loop * st.rounds) <= 1  # a start in the first round: prefill
        records += res.stats.tuned_rounds
    names = {a.name for a in tuner.arms}
    assert {r.shape for r in records if r.nodes > 0} == names  # every arm proposed in some round
    assert all(r.shape == "none" for r in records if r.nodes == 0)
    assert {"probe", "model", "explore"} <= {r.phase for r in records}
    for r in records:  # the budget binds the draft; the lookup first in an arm keeps its own length (4 tokens)
        limit = max(r.nodes, 4) if r.shape.startswith("lookup(n=3, k=4) |") else r.nodes
        assert r.call_tokens <= limit + 1


def test_lookup_first_keeps_its_length_at_a_small_budget(models):
    """At budget 1 the lookup-first arm (``Unbudgeted`` lookup) proposes the lookup's whole match where the text
    repeats, within the loop's limits (the last rounds of a row), while the draft chain keeps to 1 token; greedy
    still equals AR."""
    target, draft = models
    prompt = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]]
    tb, db = backend(target, 1, ctx_len=CTX), backend(draft, 1, ctx_len=CTX)
    ar = generate_ar(tb, prompt, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    arm = FirstOf(Unbudgeted(NgramLookup(2, 4)), DraftChain(db, k=3))
    tuner = AutoTune([arm], budgets=[1], fallback=1, settings=TuneSettings(explore_every=0))
    res = generate(tb, tuner, prompt, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ar
    rounds = [r for r in res.stats.tuned_rounds if r.nodes == 1]
    assert rounds and max(r.call_tokens for r in rounds) == 5  # a 4-token lookup at budget 1
    # without the wrapper the budget binds the lookup too
    bound = AutoTune([FirstOf(NgramLookup(2, 4), DraftChain(db, k=3))], budgets=[1], fallback=1)
    res = generate(tb, bound, prompt, max_new_tokens=MAX_NEW, sampling=GREEDY)
    assert res.tokens == ar and max(r.call_tokens for r in res.stats.tuned_rounds) == 2


def test_a_self_sized_arm_runs_at_its_largest_budget_only(models):
    _, draft = models
    db = backend(draft, 1, ctx_len=CTX)
    dyn = SelfSized(DraftChain(db, 4, 0.3))
    tuner = AutoTune([DraftChain(db, k=2), dyn])
    assert [a.budgets for a in tuner.arms] == [[1, 2], [4]] and tuner.arms[1].name == dyn.proposer.info.name
    assert [a.budgets for a in AutoTune([DraftChain(db, k=2), dyn], budgets=[1, 2, 3]).arms] == [[1, 2], [3]]


@pytest.fixture(scope="module")
def pair():
    target = random_model(seed=21, vocab_size=VOCAB, std=0.3)
    return target, perturbed(target, seed=22, rel=0.15)


def two_arms(db):
    return [DraftChain(db, k=K), DraftTree(db, nodes=4, top_k=2, depth=2)]


def test_controller_over_arms_keeps_the_target_law(pair):
    target, draft = pair
    sampling = SETTINGS["plain"]
    build = lambda db: AutoTune(two_arms(db), settings=TuneSettings(explore_every=3), clock=SeededClock(3))  # noqa: E731
    counts, records = tuned_counts(target, draft, build, sampling, seed=301, runs=10)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [autotune, two arms]: {pvalue:.4g}")
    assert pvalue > ALPHA
    assert len({r.shape for r in records if r.nodes > 0}) == 2  # both arms proposed


def test_peeking_controller_over_arms_fails(pair):
    """The same test fails for a controller over the same arms that peeks at the target's verdict."""
    target, draft = pair
    sampling = SETTINGS["plain"]
    counts, _ = tuned_counts(target, draft, lambda db: Peeking(two_arms(db), target), sampling, seed=301, runs=10)
    pvalue = chi_square(counts, exact_law(target, sampling))
    print(f"chi-square p-value [autotune, two arms, peeking]: {pvalue:.4g}")
    assert pvalue < ALPHA


def test_the_cheaper_arm_wins(models):
    """Two arms with the same acceptance prior and call costs: the arm whose proposal is cheaper is chosen, at the
    budget the formula E / (T_propose + T_call) gives, and swapping the proposal costs swaps the arm."""
    _, draft = models
    db = backend(draft, 1, ctx_len=CTX)
    for cheap in (0, 1):
        tuner = AutoTune([DraftChain(db, k=4), DraftChain(db, k=4)], settings=TuneSettings(prior_acceptance=0.9))
        for s in (1, 5):
            tuner.call_costs.observe(s, 10e-3)
        for i, arm in enumerate(tuner.arms):
            per_node = 0.1e-3 if i == cheap else 5e-3
            for n in (1, 4):
                arm.propose_costs.observe(n, per_node * n)
        plan = tuner.plan()
        assert plan is not None and plan.arms.tolist() == [-1] + [0] * 4 + [1] * 4
        assert plan.best_shape() == (cheap, 4)
        expect = plan.tokens / (plan.call_s + plan.propose_s)
        assert plan.best_shape() == (int(plan.arms[np.argmax(expect)]), int(plan.nodes[np.argmax(expect)]))
        assert f"{tuner.arms[cheap].name}, 4 nodes" in tuner.describe()


def test_arm_budgets_and_bad_arms(models):
    _, draft = models
    db = backend(draft, 1, ctx_len=CTX)
    tuner = AutoTune([DraftChain(db, k=2), DraftTree(db, nodes=6)], budgets=[1, 2, 6])
    assert [a.budgets for a in tuner.arms] == [[1, 2], [1, 2, 6]] and tuner.budgets == [1, 2, 6]
    assert tuner.info.max_nodes == 6 and tuner.info.branching
    with pytest.raises(SpdError, match="non-empty list"):
        AutoTune([])
    with pytest.raises(SpdError, match="got str"):
        AutoTune([DraftChain(db, k=2), "tree"])  # type: ignore[list-item]
    with pytest.raises(SpdError, match="budgets"):
        AutoTune([DraftChain(db, k=2), DraftTree(db, nodes=6)], budgets=[7])
    with pytest.raises(SpdError, match="budgets"):  # an arm would keep no budget
        AutoTune([DraftChain(db, k=2), DraftTree(db, nodes=6)], budgets=[3, 4])
    with pytest.raises(SpdError, match="fallback"):
        AutoTune([DraftChain(db, k=2), NgramLookup(2, 3)], fallback=4)
    assert AutoTune([DraftChain(db, k=2), NgramLookup(2, 3)], fallback=3)._fallback_arm == 1


def twin_chains(draft) -> AutoTune:
    """Two identical 4-token chain arms (prior acceptance 0.9, no decay), calls of 10 ms at every width, proposals of
    0.1 ms a node: the model's choice is arm 0 at 4 nodes until evidence says otherwise."""
    db = backend(draft, 1, ctx_len=CTX)
    tuner = AutoTune([DraftChain(db, k=4), DraftChain(db, k=4)], settings=TuneSettings(prior_acceptance=0.9, decay=1.0))
    for s in (1, 3, 5):
        tuner.call_costs.observe(s, 10e-3)
    for arm in tuner.arms:
        for n in (1, 4):
            arm.propose_costs.observe(n, 0.1e-3 * n)
    return tuner


def test_a_shapes_own_rounds_correct_the_model(models):
    """A shape's observed rounds pull its prediction towards what they gave (the model weighing EVIDENCE_WEIGHT
    rounds): a budget that keeps delivering fewer tokens than predicted loses the choice to one that delivers."""
    tuner = twin_chains(models[1])
    before = tuner.plan()
    assert before is not None and before.best_shape() == (0, 4)
    model = before.at(4, 0)
    for _ in range(4):  # arm 0 at 4 nodes keeps accepting nothing
        tuner.evidence.observe((0, 4), 1.0, 10e-3, 0.4e-3)
    after = tuner.plan()
    w = EVIDENCE_WEIGHT
    assert after.at(4, 0)[0] == pytest.approx((w * model[0] + 4 * 1.0) / (w + 4))
    assert after.at(4, 1) == before.at(4, 1)  # the other arm's shape is untouched
    assert after.best_shape() == (1, 4)
    tuner.evidence.observe((1, 4), float("nan"), 10e-3, 0.4e-3)  # a broken round is not evidence
    assert tuner.evidence.rounds((1, 4)) == 0.0


def test_blend_moves_each_shape_towards_its_own_rounds():
    """``ShapeEvidence.blend`` (one array operation for a plan's shapes): each shape with rounds gets ``(W x model +
    decayed sums) / (W + decayed rounds)`` of its own rounds, W = EVIDENCE_WEIGHT, every older round decayed once per
    later one; a shape without rounds keeps the model's values; the input is left as it was."""
    evidence = ShapeEvidence(decay=0.9)
    for shape, tokens in (((0, 2), 3.0), ((NO_ARM, 0), 1.0), ((1, 4), 2.0), ((0, 2), 1.0)):
        evidence.observe(shape, tokens, 12e-3, 1e-3)
    arms, nodes = np.array([NO_ARM, 0, 0, 1, 1]), np.array([0, 1, 2, 4, 5])
    values = np.arange(15, dtype=float).reshape(5, 3) + 1.0
    before = values.copy()
    out = evidence.blend(arms, nodes, values)
    np.testing.assert_array_equal(values, before)
    w = EVIDENCE_WEIGHT
    # row: (decayed rounds, decayed token sum) of its shape's rounds; (0, 1) and (1, 5) have none
    for row, (n, tokens) in {0: (0.81, 0.81), 2: (0.9**3 + 1.0, 3.0 * 0.9**3 + 1.0), 3: (0.9, 1.8)}.items():
        sums = np.array([tokens, 12e-3 * n, 1e-3 * n])
        np.testing.assert_allclose(out[row], (w * values[row] + sums) / (w + n), rtol=1e-12)
        assert evidence.rounds((int(arms[row]), int(nodes[row]))) == pytest.approx(n)
    np.testing.assert_array_equal(out[[1, 4]], values[[1, 4]])


def test_an_arms_rounds_correct_its_other_budgets(models):
    """Rounds of one arm that give half the tokens beyond the first its model predicted, at twice the call seconds,
    scale that arm's prediction at every budget (``ShapeEvidence.arm_factors``: EVIDENCE_WEIGHT rounds of "as
    predicted" added), including budgets it never ran; the other arm is untouched and wins; factors stay within
    ARM_FACTOR_RANGE, and rounds without a model prediction or with a broken one are not arm evidence."""
    tuner = twin_chains(models[1])
    before = tuner.plan()
    assert before is not None and before.best_shape() == (0, 4)
    tokens4, call4 = before.model_at(4, 0)
    rounds = 8
    for _ in range(rounds):
        tuner.evidence.observe((0, 4), 1.0 + 0.5 * (tokens4 - 1.0), 2.0 * call4, 0.4e-3, model=(tokens4, call4))
    w = EVIDENCE_WEIGHT / rounds
    gain, dearer = (0.5 + w) / (1.0 + w), (2.0 + w) / (1.0 + w)
    assert tuner.evidence.arm_factors(0) == pytest.approx((gain, dearer))
    assert tuner.evidence.arm_factors(1) == (1.0, 1.0)
    after = tuner.plan()
    assert after is not None
    model2 = before.model_at(2, 0)
    assert after.model_at(2, 0) == pytest.approx(model2)  # the arm's own model is unchanged ...
    assert after.at(2, 0)[0] == pytest.approx(1.0 + gain * (model2[0] - 1.0))  # ... its prediction is corrected
    assert after.at(2, 0)[1] == pytest.approx(dearer * model2[1])
    assert after.at(2, 1) == before.at(2, 1) and after.best_shape() == (1, 4)
    for _ in range(50):  # 100x dearer calls: the factor stops at the range's end
        tuner.evidence.observe((0, 3), 2.0, 100 * call4, 0.4e-3, model=(2.0, call4))
    assert tuner.evidence.arm_factors(0)[1] == ARM_FACTOR_RANGE[1]
    old = tuner.evidence.arm_factors(1)
    tuner.evidence.observe((1, 4), 2.0, 10e-3, 0.4e-3)  # no model prediction (a probe round)
    tuner.evidence.observe((1, 4), 2.0, 10e-3, 0.4e-3, model=(float("nan"), 10e-3))
    assert tuner.evidence.arm_factors(1) == old


def test_a_corrected_prediction_stays_within_what_the_shape_can_give(models):
    """An arm whose rounds gave far more tokens than its model predicted (its gain factor at the range's top) is still
    priced at no more tokens a call than its proposals can hold: 1 + the budget for a chain (its ``max_depth`` 4 at
    most), and for the lookup-first arm, whose lookup keeps its own length (4) at any budget, 1 + 4 at budgets 1 to 4.
    The model's own predictions are below the caps: the caps bind only the corrected ones."""
    _, draft = models
    db = backend(draft, 1, ctx_len=CTX)
    lookup_first = FirstOf(Unbudgeted(NgramLookup(3, 4)), DraftChain(db, k=2))
    tuner = AutoTune([DraftChain(db, k=4), lookup_first], settings=TuneSettings(prior_acceptance=0.9, decay=1.0))
    np.testing.assert_array_equal(tuner.arms[0].most_tokens, [2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(tuner.arms[1].most_tokens, [5.0, 5.0, 5.0, 5.0])
    for s in (1, 3, 5):
        tuner.call_costs.observe(s, 10e-3)
    for arm in tuner.arms:
        arm.propose_costs.observe(1, 0.1e-3)
    before = tuner.plan()
    assert before is not None
    for arm, nodes in ((0, 1), (1, 1)):  # rounds giving 4 tokens beyond the first where the model said ~0.9
        model = before.model_at(nodes, arm)
        for _ in range(50):
            tuner.evidence.observe((arm, nodes + 1), 5.0, 10e-3, 0.1e-3, model=model)
        assert tuner.evidence.arm_factors(arm)[0] == ARM_FACTOR_RANGE[1]
    after = tuner.plan()
    top = ARM_FACTOR_RANGE[1]
    for arm, caps in ((0, [2.0, 3.0, 4.0, 5.0]), (1, [5.0, 5.0, 5.0, 5.0])):
        for nodes, cap in zip(range(1, 5), caps, strict=True):
            model = before.model_at(nodes, arm)[0]
            assert model < cap
            # budget 2 also has its own rounds (5 tokens each); the others take the arm's factor alone
            corrected = 5.0 if nodes == 2 else 1.0 + top * (model - 1.0)
            assert after.at(nodes, arm)[0] == pytest.approx(min(cap, corrected))
    assert after.at(4, 0)[0] == 5.0 and after.at(1, 1)[0] < 5.0  # the lookup-first arm's budget 1: 1 + 4 x 0.9


def test_probe_rounds_skip_budgets_the_prior_model_prices_below_no_speculation(models):
    """The probe schedule keeps no speculation and each arm's smallest budget; a larger budget only where the prior
    model (no proposal cost) on the probed call curve beats no speculation: on a call curve that grows with every
    token (each extra token a full step) none does, on a flat one all do, and with no curve every shape is kept.
    The first round prunes the schedule once."""
    _, draft = models
    db = backend(draft, 1, ctx_len=CTX)

    def tuner_with(curve):
        t = AutoTune([DraftChain(db, k=4), DraftChain(db, k=6)], settings=TuneSettings(prior_acceptance=0.9))
        for s in range(1, 8):
            if curve is not None:
                t.probe_costs.observe(s, curve(s))
        return t

    full = probe_schedule(tuner_with(None).arms)
    assert full == [(0, 4), (NO_ARM, 0), (0, 1), (0, 2), (1, 6), (1, 1), (1, 3)]
    assert tuner_with(None).worth_probing(full) == full
    assert tuner_with(lambda s: 10e-3).worth_probing(full) == full
    steep = tuner_with(lambda s: 10e-3 * s)
    assert steep.worth_probing(full) == [(NO_ARM, 0), (0, 1), (1, 1)]
    assert steep._choose(None) == (NO_ARM, 0, "probe") and steep._schedule == [(NO_ARM, 0), (0, 1), (1, 1)]
    steep.rounds = 1
    assert steep._choose(None) == (0, 1, "probe") and len(steep._schedule) == 3  # pruned once


def _expected_by_the_tree_model(arm: Arm, prior: float) -> np.ndarray:
    """E[accepted + 1] per budget as ``accel.sim.tree`` prices any arm: the rank acceptance of its shrunk counts,
    ``best_tree`` of the largest budget, the N most likely nodes' path probabilities."""
    pw = PRIOR_WEIGHT
    long_run = (arm._long_accepted[:, :1].sum(0) + pw * prior) / (arm._long_available[:, :1].sum(0) + pw)
    pooled = (arm._accepted[:, :1].sum(0) + pw * long_run) / (arm._available[:, :1].sum(0) + pw)
    p = rank_acceptance_from_counts(arm._available[:, :1] + pw, arm._accepted[:, :1] + pw * pooled)
    tree = best_tree(p, arm.budgets[-1], width=1, max_depth=arm.proposer.info.max_depth)
    gain = np.concatenate([[0.0], np.cumsum(path_probabilities(tree, p))])
    return 1.0 + arm.hit_rate * gain[np.minimum(arm.budgets, tree.n_nodes)]


@pytest.mark.parametrize("depth", [4, 6])
def test_a_chain_arm_is_priced_as_the_tree_model_prices_it(depth):
    """A chain arm (one rank) takes a short path to its expected tokens (no tree search: ~0.1 ms less a plan per
    arm); it equals the tree model's price bit for bit, after rounds accepted to random depths, misses included,
    before any round and while only the shallow depths have counts."""
    rng = np.random.default_rng(depth)
    arm = Arm(NgramLookup(3, depth), list(range(1, depth + 1)), decay=0.93, window=8, long_run_decay=0.998)
    np.testing.assert_array_equal(arm.expected_tokens(0.4), _expected_by_the_tree_model(arm, 0.4))
    for r in range(60):
        drafts = rng.integers(0, 50, size=int(rng.integers(1, depth - 1 if r < 30 else depth + 1)))
        tree = TokenTree.chain(1, drafts, source="lookup")
        accepted = int(rng.integers(0, drafts.size + 1))
        offered = bool(rng.random() < 0.7)
        arm.observe(drafts.size, 1e-4, offered, [RowOutcome(5, tree, list(range(accepted + 1)))] if offered else [])
        if r in (10, 29, 59):
            np.testing.assert_array_equal(arm.expected_tokens(0.5), _expected_by_the_tree_model(arm, 0.5))
