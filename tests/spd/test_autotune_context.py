"""The controller's contexts (``accel.spd.autotune_context``): rounds in which n-gram lookup matches every row asked
are priced and counted apart from the others.

- structure: the hit context's lookup-led arms share one arm's statistics at the lookup's length, the others keep
  their own counts but share the draft's proposal seconds; without a lookup there is one context;
- counting: every round's shape is counted in the context its ``TunedRound.lookup_hit`` names, and greedy still
  equals AR (the exactness tests of tests/spd/test_autotune*.py run these controllers too);
- the decision: with planted rounds (copies accepted on a match, the draft rejected elsewhere) the controller chooses
  lookup where it matches and no speculation where it does not, and swapping the evidence swaps the choice.
"""

from __future__ import annotations

from collections import Counter

import pytest

from accel.spd import GREEDY, DraftChain, DraftTree, FirstOf, Merge, NgramLookup, generate, generate_ar
from accel.spd.autotune import AutoTune, TuneSettings, draft_arms
from accel.spd.autotune_arm import NO_ARM, SelfSized, Unbudgeted
from accel.spd.autotune_context import HIT, MISS, context_lookup, lookup_led
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import MAX_NEW

pytest.importorskip("torch")

CTX = 64
REPEATING = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]]  # lookup matches from the first round


@pytest.fixture(scope="module")
def models():
    target = random_model(seed=1, std=0.5)
    return target, perturbed(target, seed=3, rel=0.3)


def test_the_hit_context_shares_the_arms_led_by_one_lookup(models):
    db = backend(models[1], 1, ctx_len=CTX)
    tuner = AutoTune(draft_arms(db, k=3, nodes=5, dynamic=(4, 0.3)))
    miss, hit = tuner.contexts
    assert miss.arms is tuner.arms and len(hit.arms) == len(tuner.arms) == 4
    led = hit.arms[0]  # lookup | chain and lookup | dynamic chain propose the same copy on a match
    assert hit.arms[2] is led and led.budgets == [4] and led.priced and led.propose_s(4) == 0.0
    assert led.propose_costs is not miss.arms[0].propose_costs  # a copy costs no draft call
    for i in (1, 3):  # the chain alone and the merged tree: own counts, the draft's seconds shared
        assert hit.arms[i] is not miss.arms[i] and hit.arms[i].propose_costs is miss.arms[i].propose_costs
    assert not miss.arms[0].priced  # nothing measured yet
    assert len(AutoTune(DraftChain(db, k=3)).contexts) == 1  # no lookup: one context, as before
    one = AutoTune(draft_arms(db, k=3, nodes=5), settings=TuneSettings(lookup_contexts=False))
    assert len(one.contexts) == 1 and "where lookup matches" not in one.describe()
    assert context_lookup([DraftChain(db, k=3), Merge(NgramLookup(2, 3), DraftTree(db, nodes=4))]).n == 2
    assert lookup_led(SelfSized(FirstOf(Unbudgeted(NgramLookup(2, 3)), DraftChain(db, k=2)))).k == 3
    assert lookup_led(FirstOf(NgramLookup(2, 3), DraftChain(db, k=2))) is None  # budget-bound: no shared arm
    bound = AutoTune([FirstOf(NgramLookup(2, 3), DraftChain(db, k=2)), DraftChain(db, k=2)])
    assert len(bound.contexts) == 2 and bound.contexts[HIT].arms[0].budgets == [1, 2, 3]


def test_each_round_is_counted_in_its_context(models):
    target, draft = models
    tb, db = backend(target, 1, ctx_len=CTX), backend(draft, 1, ctx_len=CTX)
    ar = generate_ar(tb, REPEATING, max_new_tokens=MAX_NEW, sampling=GREEDY).tokens
    tuner = AutoTune(draft_arms(db, k=3, nodes=5), settings=TuneSettings(decay=1.0, explore_every=3))
    records = []
    for _ in range(2):
        res = generate(tb, tuner, REPEATING, max_new_tokens=MAX_NEW, sampling=GREEDY)
        assert res.tokens == ar
        records += res.stats.tuned_rounds
    assert {r.lookup_hit for r in records} == {True, False}
    names = [a.name for a in tuner.arms]
    for index, context in enumerate(tuner.contexts):  # no decay: the evidence holds each shape's round count
        counted = Counter(
            (names.index(r.shape) if r.nodes else NO_ARM, r.nodes) for r in records if r.lookup_hit == (index == HIT)
        )
        assert counted and all(context.evidence.rounds(shape) == n for shape, n in counted.items())
    led = [r for r in records if r.lookup_hit and r.shape.startswith("lookup(n=3, k=4) |")]
    assert led and all(r.nodes == 4 for r in led)  # recorded at the lookup's length, whatever the budget
    assert "where lookup matches:" in tuner.describe()
    assert [c.rounds for c in tuner.contexts] == [sum(r.lookup_hit == (i == HIT) for r in records) for i in (0, 1)]


def planted(draft, hit_tokens: float, miss_tokens: float) -> AutoTune:
    """A controller over lookup | chain and the chain alone, 10 ms calls at every width, 2 ms draft proposals, and 30
    rounds of planted evidence in each context: lookup | chain's copies give ``hit_tokens`` a call on a match, the
    chain gives ``miss_tokens`` elsewhere."""
    db = backend(draft, 1, ctx_len=CTX)
    arms = [FirstOf(Unbudgeted(NgramLookup(3, 4)), DraftChain(db, k=3)), DraftChain(db, k=3)]
    tuner = AutoTune(arms, settings=TuneSettings(decay=1.0))
    for s in (1, 2, 5):
        tuner.call_costs.observe(s, 10e-3)
    for arm in tuner.arms:
        for n in (1, 3):
            arm.propose_costs.observe(n, 2e-3)
    for _ in range(30):
        tuner.contexts[HIT].evidence.observe((0, 4), hit_tokens, 10e-3, 0.05e-3)
        for shape in [(0, 1), (0, 2), (0, 3), (0, 4), (1, 1), (1, 2), (1, 3)]:
            tuner.contexts[MISS].evidence.observe(shape, miss_tokens, 10e-3, 2e-3)
    return tuner


def test_lookup_where_it_matches_and_no_speculation_elsewhere(models):
    tuner = planted(models[1], hit_tokens=3.5, miss_tokens=1.0)
    assert tuner.plan(HIT).best_shape() == (0, 4) and tuner.plan(MISS).best_shape() == (NO_ARM, 0)
    assert tuner.describe().startswith("no speculation") and "where lookup matches: lookup(n=3" in tuner.describe()
    swapped = planted(models[1], hit_tokens=1.0, miss_tokens=2.5)
    assert swapped.plan(HIT).best_shape()[0] != 0 and swapped.plan(MISS).best_shape()[1] > 0
