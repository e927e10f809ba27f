"""The controller's shadow lookup (``accel.spd.autotune_shadow``): in the rounds ``AutoTune`` does not run its lookup
arm, what the lookup would have proposed is judged against the tokens the rows commit.

- greedy: the lookup arm's hit rate and per-depth counts equal those computed by hand from the output (every round's
  position, the lookup's proposal there and its agreement with the tokens that followed), and the output is AR's;
- sampled: the agreement of the committed tokens with a proposal has the law of the accepted count of a lookup round
  (enumeration of the target's law; chi-square at ALPHA = 0.001, fixed seed), and a shadow judged one token off fails;
- a shadowed hit while nothing speculates prices the plan again; ``shadow_lookup=False`` keeps the arm idle.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from accel.errors import SpdError
from accel.spd import GREEDY, DraftChain, NgramLookup, Sampling, generate, generate_ar, warp
from accel.spd.autotune import AutoTune, TuneSettings
from accel.spd.autotune_arm import NO_ARM
from accel.spd.autotune_shadow import ShadowLookup
from accel.spd.lookup import ngram_proposal
from accel.spd.proposers import RowOutcome
from tests.helpers.decoders import backend, perturbed, random_model
from tests.helpers.spd import ALPHA, NEW, ROWS, VOCAB, chi_square

torch = pytest.importorskip("torch")

CTX = 64
KEEP = TuneSettings(decay=1.0, long_run_decay=0.0, explore_every=0)  # counts never decay: sums by hand
REPEATS = [[4, 9, 4, 9, 4, 7, 1, 4, 9, 4], [2, 5, 2, 5, 8, 2, 5]]  # prompts whose suffixes occurred before
LOOKUP_PROMPT = [3, 7, 4, 2, 1, 3, 7]  # its suffix [3, 7] occurred at the start: the lookup proposes [4, 2, 1]


@pytest.fixture(scope="module")
def models():
    target = random_model(seed=5, std=0.5, vocab_size=12)
    return target, perturbed(target, seed=6, rel=0.3)


def _pinned(monkeypatch, arm: int, nodes: int) -> None:
    """Every round of every ``AutoTune`` runs ``arm`` at ``nodes`` (``NO_ARM``, 0: no speculation)."""
    monkeypatch.setattr(AutoTune, "_choose", lambda self, plan, run=None, rows=None: (arm, nodes, "model"))


def _recorded(monkeypatch) -> list[list[tuple[int, int, int]]]:
    """Per round the shadows judged: ``(row, tokens, the loop's limit)`` of each row asked (read, not changed)."""
    seen: list[list[tuple[int, int, int]]] = []
    propose = ShadowLookup.propose

    def spy(self, run, rows, depth):
        room = np.minimum(run.max_nodes, run.max_depth)
        seen.append([(b, int(run.n[b]), int(room[b])) for b in np.flatnonzero(rows).tolist()])
        return propose(self, run, rows, depth)

    monkeypatch.setattr(ShadowLookup, "propose", spy)
    return seen


@pytest.mark.parametrize("pinned", [(NO_ARM, 0), (0, 2)], ids=["no speculation", "chain"])
def test_greedy_counts_are_the_lookup_rounds_computed_by_hand(models, monkeypatch, pinned):
    """The controller never runs its lookup arm (pinned to no speculation, or to a draft chain of 2); the arm's hit
    rate and per-depth tried / accepted counts are what its proposal at every round's position would have given
    against the greedy tokens that followed, and the output equals greedy AR."""
    target, draft = models
    tb, db = backend(target, 2, ctx_len=CTX), backend(draft, 2, ctx_len=CTX)
    _pinned(monkeypatch, *pinned)
    seen = _recorded(monkeypatch)
    tuner = AutoTune([DraftChain(db, k=2), NgramLookup(2, 3)], settings=KEEP)
    res = generate(tb, tuner, REPEATS, max_new_tokens=16, sampling=GREEDY)
    assert res.tokens == generate_ar(tb, REPEATS, max_new_tokens=16, sampling=GREEDY).tokens
    rows = [p + t for p, t in zip(REPEATS, res.tokens, strict=True)]
    tried, accepted, hits = np.zeros(3), np.zeros(3), 0
    for asked in seen:
        props = [(b, n, ngram_proposal(np.array(rows[b][:n]), 2, min(3, room))) for b, n, room in asked]
        hits += any(p.size for _, _, p in props)
        for b, n, prop in props:
            agree = 0
            while agree < prop.size and rows[b][n + agree] == prop[agree]:
                agree += 1
            tried[: min(agree + 1, prop.size)] += 1
            accepted[:agree] += 1
    arm = tuner.arms[1]
    assert hits > 0 and accepted[0] > 0 and tried[0] > accepted[0]  # the prompts repeat, and not every guess holds
    np.testing.assert_allclose(arm._available[:, 0], tried)
    np.testing.assert_allclose(arm._accepted[:, 0], accepted)
    np.testing.assert_allclose(arm._offered, [1.0 + hits, 1.0 + len(seen)])  # the prior's 1 of 1, then every round
    assert tuner.arms[1].propose_costs.sizes == []  # no timing: it never ran


def _law_of_agreement(target, prompt: list[int], proposal: list[int], sampling: dict) -> np.ndarray:
    """P(the target's next ``len(proposal)`` warped draws after ``prompt`` agree with ``proposal`` on exactly j
    leading tokens), j = 0 .. len(proposal), by enumerating every continuation."""
    k = len(proposal)
    conts = np.array(list(itertools.product(range(VOCAB), repeat=k)))
    seqs = np.concatenate([np.tile(prompt, (len(conts), 1)), conts], axis=1)
    with torch.inference_mode():
        logits = target.causal_forward(torch.from_numpy(seqs)).float().numpy()
    law = np.ones(len(conts))
    for i in range(k):
        law *= warp(logits[:, len(prompt) - 1 + i], **sampling)[np.arange(len(conts)), conts[:, i]]
    agree = np.argmin(np.concatenate([conts == proposal, np.zeros((len(conts), 1), bool)], axis=1), axis=1)
    return np.bincount(agree, weights=law, minlength=k + 1)


@pytest.mark.parametrize("wrong", [False, True], ids=["shadow", "one token late"])
def test_sampled_agreement_has_the_law_of_a_lookup_round(monkeypatch, wrong):
    """2,000 rows of one repeated prompt, sampled at T = 0.8, never speculating: the first round's shadowed
    proposal ``[4, 2, 1]`` agrees with the committed draws on j leading tokens with the probability that a lookup
    round accepts j (the target's law of its draws, enumerated); judged one token late it does not."""
    target = random_model(seed=23, vocab_size=VOCAB, std=0.6)
    sampling = dict(temperature=0.8)
    want = _law_of_agreement(target, LOOKUP_PROMPT, [4, 2, 1], sampling)
    assert want.min() > 0.1  # every agreement length likely: the test can tell the laws apart
    _pinned(monkeypatch, NO_ARM, 0)
    judged: list[RowOutcome] = []
    resolve = ShadowLookup.resolve

    def spy(self, run):
        if wrong:
            committed = run.tokens.copy()
            run.tokens[:, :-1] = committed[:, 1:]  # every committed token read one position late
            try:
                done = resolve(self, run)
            finally:
                run.tokens[:] = committed
        else:
            done = resolve(self, run)
        judged.extend(o for o in done if o.n_old == len(LOOKUP_PROMPT))
        return done

    monkeypatch.setattr(ShadowLookup, "resolve", spy)
    tb = backend(target, ROWS, ctx_len=len(LOOKUP_PROMPT) + NEW + 1)
    tuner = AutoTune([NgramLookup(2, 3)])  # a row with 4 tokens to go takes up to 3 in a round: the proposal whole
    generate(tb, tuner, [LOOKUP_PROMPT] * ROWS, max_new_tokens=NEW + 1, seed=3, sampling=Sampling(**sampling))
    assert all(list(o.tree.tokens[1:]) == [4, 2, 1] for o in judged) and len(judged) >= ROWS * 0.99
    counts = np.bincount([o.accepted for o in judged], minlength=4)
    pvalue = chi_square(counts, want)
    print(f"chi-square p-value [shadow lookup, {'one late' if wrong else 'as committed'}]: {pvalue:.4g}")
    assert (pvalue < ALPHA) if wrong else (pvalue > ALPHA)


def test_a_shadowed_hit_while_quiet_prices_the_plan_again(models, monkeypatch):
    """While the controller runs no speculation its plan is kept up to ``QUIET_EXPLORE * replan_every`` rounds; a
    round whose shadowed lookup proposal is then accepted drops it (priced again at the next round)."""
    target, _ = models
    tb = backend(target, 1, ctx_len=CTX)
    _pinned(monkeypatch, NO_ARM, 0)
    dropped = []
    judge = AutoTune._judge_shadows

    def spy(self, run, quiet):
        kept = self._plan is not None  # the plan this round priced with
        judge(self, run, quiet)
        dropped.append(kept and self._plan is None)

    monkeypatch.setattr(AutoTune, "_judge_shadows", spy)
    tuner = AutoTune([NgramLookup(2, 3)], settings=KEEP)
    generate(tb, tuner, REPEATS[:1], max_new_tokens=16, sampling=GREEDY)
    arm = tuner.arms[0]
    assert any(dropped) and sum(dropped) <= arm._accepted[0, 0]  # at most once per proposal accepted 1 deep


def test_shadow_lookup_off_keeps_the_arm_idle(models, monkeypatch):
    target, _ = models
    tb = backend(target, 1, ctx_len=CTX)
    _pinned(monkeypatch, NO_ARM, 0)
    tuner = AutoTune([NgramLookup(2, 3)], settings=TuneSettings(shadow_lookup=False, explore_every=0))
    generate(tb, tuner, REPEATS[:1], max_new_tokens=16, sampling=GREEDY)
    assert tuner._shadows == [] and tuner.arms[0]._available.sum() == 0 and list(tuner.arms[0]._offered) == [1, 1]
    with pytest.raises(SpdError, match="shadow_lookup must be a bool"):
        TuneSettings(shadow_lookup=1).check()


def test_no_shadow_in_the_lookup_arms_own_rounds(models, monkeypatch):
    """Rounds that run the lookup arm itself count its real verified trees only: nothing is shadowed there."""
    target, draft = models
    tb, db = backend(target, 2, ctx_len=CTX), backend(draft, 2, ctx_len=CTX)
    _pinned(monkeypatch, 1, 3)
    seen = _recorded(monkeypatch)
    tuner = AutoTune([DraftChain(db, k=2), NgramLookup(2, 3)], settings=KEEP)
    res = generate(tb, tuner, REPEATS, max_new_tokens=16, sampling=GREEDY)
    assert seen == [] and tuner.arms[1]._offered[1] == 1 + len(res.stats.tuned_rounds)  # one count a round
