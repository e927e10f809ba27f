"""One shape family the controller (``accel.spd.autotune.AutoTune``) chooses between, and what it learned of it.

An *arm* is a wrapped proposer (a draft chain, a draft tree, either with n-gram lookup first or merged, Hydra heads,
...) and its node budgets. Each arm keeps what depends on the proposer: the seconds its ``propose`` takes per budget
(a ``CostCurve``), the per-rank acceptance of its verified trees (decayed counts, ``rank_acceptance_from_counts``
convention) and the fraction of rounds it offered a tree at all. The target's call cost depends only on the tokens
a call scores, so the controller keeps one call curve for every arm.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np

from accel.backends.base import Backend, BackendInfo
from accel.errors import SpdError
from accel.sim.tree import best_tree, path_probabilities, rank_acceptance_from_counts
from accel.spd.costs import CostCurve
from accel.spd.draft_chain import DraftChain
from accel.spd.draft_model import DraftModel
from accel.spd.draft_tree import DraftTree
from accel.spd.merge import Merge
from accel.spd.proposers import FirstOf, NgramLookup, Proposer, ProposerInfo, RowOutcome, RunState, proposals
from accel.spd.tree import TokenTree

__all__ = [
    "ARM_FACTOR_RANGE",
    "EVIDENCE_DECAY",
    "EVIDENCE_WEIGHT",
    "MAX_WIDTH",
    "NO_ARM",
    "PRIOR_WEIGHT",
    "Arm",
    "SelfSized",
    "ShapeEvidence",
    "Unbudgeted",
    "arm_budgets",
    "as_arms",
    "draft_arms",
    "probe_schedule",
    "share_draft_models",
]

PRIOR_WEIGHT = 2.0  # pseudo-counts pulling a depth's acceptance towards the pooled rate (and that towards the prior)
NO_ARM = -1  # the arm index of "no speculation" (budget 0)
EVIDENCE_WEIGHT = 4.0  # rounds' worth of weight the model's prediction keeps against a shape's own observed rounds
#: per-round decay of a shape's evidence (half-life ~69 rounds): slower than the acceptance counts' so a shape that
#: disappointed is not re-chosen as soon as its evidence fades back to the model's more hopeful prediction
EVIDENCE_DECAY = 0.99
MAX_WIDTH = 64  # sibling ranks counted and priced per node (accel.sim.tree.MAX_BEST_TREE_WIDTH)
#: tried counts (pseudo-counts: the prior weighs PRIOR_WEIGHT) the idle decays must remove before an idle arm is priced
#: again (``Arm.idle_until``)
IDLE_RECOMPUTE = 0.05
ARM_FACTOR_RANGE = (0.25, 4.0)  # the per-arm correction of the model (ShapeEvidence.arm_factors) stays within this


class Arm:
    """A proposer, the node budgets it may be given (sorted, in ``1 .. proposer.info.max_nodes``) and its
    statistics. ``decay``: per-round weight of the old acceptance counts; ``window``: timing samples per budget;
    ``long_run_decay``: per-round weight of the old long-run counts (0: none kept, ``acceptance`` falls back to the
    prior)."""

    def __init__(
        self, proposer: Proposer, budgets: Sequence[int], *, decay: float, window: int, long_run_decay: float = 0.0
    ) -> None:
        self.proposer, self.budgets = proposer, list(budgets)
        self.decay, self.window, self.long_run_decay = decay, window, long_run_decay
        self._name: str | None = None
        models = {id(u.model): u.model for u in _draft_users(proposer)}
        self.drafts: list[DraftModel] = list(models.values())  # the draft models its rounds call (catch-up pricing)
        info = proposer.info
        self._branching, self._max_depth = info.branching, max(1, info.max_depth)  # a proposer's info is fixed
        own = max((u.info.max_depth for u in _unbudgeted(proposer)), default=0)
        #: per budget, the most tokens a row can take from a round: 1 + its deepest proposal (the budget's depth, or the
        #: own length of a part the budget does not bind); the controller's predictions never exceed it
        self.most_tokens = np.array([1.0 + max(min(b, info.max_depth), own) for b in self.budgets])
        self.reset()

    def reset(self) -> None:
        """Forget timings and acceptance counts."""
        self.propose_costs = CostCurve("proposal", self.window)  # by node budget
        depth = self._max_depth
        self._available = np.zeros((depth, 1))
        self._accepted = np.zeros((depth, 1))
        self._long_available = np.zeros((depth, 1))  # the same counts decayed by long_run_decay, own rounds only
        self._long_accepted = np.zeros((depth, 1))
        self._offered = np.array([1.0, 1.0])  # decayed (rounds with a tree offered, rounds asked); prior 1 of 1
        self._changes = 0  # count changes (rounds observed, idle decays): expected_tokens is kept between them
        self._counted = 0  # the controller's round up to which the counts are decayed (observe, idle_until)
        self._expected: tuple[tuple[int, float], np.ndarray] | None = None
        self._idle_drift = 0.0  # tried counts idle decays removed since expected_tokens was last computed

    @property
    def name(self) -> str:
        """The proposer's name (read once: a nested proposer builds its ``info`` on every call)."""
        if self._name is None:
            self._name = self.proposer.info.name
        return self._name

    @property
    def hit_rate(self) -> float:
        """The (decayed) fraction of this arm's rounds in which it offered a tree at all (lookup misses lower it)."""
        return float(self._offered[0] / self._offered[1])

    def observe(
        self, nodes: int, propose_s: float | None, offered: bool, outcomes: Sequence[RowOutcome | None]
    ) -> None:
        """Record a round this arm proposed in at budget ``nodes``: its proposal seconds (None: not a steady sample,
        ``accel.spd.autotune_catchup``) and its verified trees."""
        if propose_s is not None:
            self.propose_costs.observe(nodes, propose_s)
        self._offered = self._offered * self.decay + [float(offered), 1.0]
        self._count(outcomes)
        self._changes += 1
        self._counted += 1

    def observe_shadow(self, offered: bool | None, outcomes: Sequence[RowOutcome]) -> None:
        """Record what this arm would have given in rounds it did not run (``accel.spd.autotune_shadow``): ``offered``
        whether it would have proposed in this round (None: the round was its own, already observed), and the
        outcomes the committed tokens now decide, counted as its own rounds' (the long-run counts too); no timings."""
        if offered is None and not outcomes:
            return
        if offered is not None:
            self._offered = self._offered * self.decay + [float(offered), 1.0]
            self._counted += 1
        self._count(outcomes, decay=offered is not None)
        self._changes += 1

    def idle_until(self, round_: int) -> None:
        """Decay the acceptance counts over the controller's rounds after the last counted one up to ``round_``, which
        this arm sat out, as its own rounds decay them: an arm left idle after a run of rejections drifts back to its
        long-run rate (``acceptance``) and is tried again where that rate pays, instead of keeping a short verdict
        while nothing tests it (the long-run counts and the hit rate, a ratio, are kept). ``expected_tokens`` is
        recomputed once the decays since its last computation removed ``IDLE_RECOMPUTE`` tried counts: an arm idle for
        long holds almost none, and re-pricing it at every plan (a tree search per arm, ~0.5 ms) changed nothing."""
        rounds, self._counted = round_ - self._counted, max(self._counted, round_)
        if rounds <= 0:
            return
        factor = self.decay**rounds
        self._idle_drift += float(self._available.sum()) * (1.0 - factor)
        self._available *= factor
        self._accepted *= factor
        if self._idle_drift > IDLE_RECOMPUTE:
            self._changes += 1

    def acceptance(self, prior_acceptance: float) -> np.ndarray:
        """The per-rank acceptance matrix ``P[depth, rank]`` (``accel.sim.tree`` convention): the decayed counts, each
        depth shrunk towards the pooled rate, that towards the arm's long-run pooled rate (its own rounds' counts
        decayed by ``long_run_decay``; none kept when 0), that towards the prior (rank 1: ``prior_acceptance``,
        others half). So an arm idle for long is priced at what it gave over its last few hundred rounds, not at the
        prior: on SmolLM2 at T = 0.8 the prior's 0.5 priced a 3-chain after lookup at 2.6 tokens a call (~1.3 came)."""
        width = self._available.shape[1] if self._branching else 1
        avail, acc = self._available[:, :width], self._accepted[:, :width]
        prior = np.full(width, prior_acceptance / 2.0)
        prior[0] = prior_acceptance
        long_avail, long_acc = self._long_available[:, :width].sum(axis=0), self._long_accepted[:, :width].sum(axis=0)
        long_run = (long_acc + PRIOR_WEIGHT * prior) / (long_avail + PRIOR_WEIGHT)
        pooled = (acc.sum(axis=0) + PRIOR_WEIGHT * long_run) / (avail.sum(axis=0) + PRIOR_WEIGHT)
        if width == 1:  # one rank: its conditional rate is the acceptance itself, every depth tried (PRIOR_WEIGHT > 0)
            return (acc + PRIOR_WEIGHT * pooled) / (avail + PRIOR_WEIGHT)
        return rank_acceptance_from_counts(avail + PRIOR_WEIGHT, acc + PRIOR_WEIGHT * pooled)

    def expected_tokens(self, prior_acceptance: float) -> np.ndarray:
        """E[accepted + 1] per row at each of ``budgets`` (``accel.sim.tree``'s model: 1 + hit rate x the path
        probabilities of the N most likely nodes); kept until the counts change (a round observed, an idle decay at a
        plan: a tree search per arm costs ~0.5 ms, most of a plan while no arm runs)."""
        key = (self._changes, prior_acceptance)
        if self._expected is None or self._expected[0] != key:
            self._expected = (key, self._expected_tokens(prior_acceptance))
            self._idle_drift = 0.0
        return self._expected[1]

    def _expected_tokens(self, prior_acceptance: float) -> np.ndarray:
        p = self.acceptance(prior_acceptance)
        top = self.budgets[-1]
        if p.shape[1] == 1:  # a chain: best_tree's N most likely nodes are its first N, the last depth's rate below
            nodes = min(top, self._max_depth)
            paths = np.cumprod(p[np.minimum(np.arange(nodes), p.shape[0] - 1), 0])
        else:
            tree = best_tree(p, top, width=p.shape[1], max_depth=self._max_depth)
            nodes, paths = tree.n_nodes, path_probabilities(tree, p)
        gain = np.concatenate([[0.0], np.cumsum(paths)])  # the N most likely nodes
        return 1.0 + self.hit_rate * gain[np.minimum(np.asarray(self.budgets), nodes)]

    def _count(self, outcomes: Sequence[RowOutcome | None], decay: bool = True) -> None:
        """Add the verified trees' tried / accepted counts per (parent depth, sibling rank), after decaying the old
        (``decay``: once per round)."""
        if decay:
            self._available *= self.decay
            self._accepted *= self.decay
            self._long_available *= self.long_run_decay
            self._long_accepted *= self.long_run_decay
        long_run = self.long_run_decay > 0
        for o in outcomes:
            if o is None:
                continue
            kids = o.tree.children()
            steps = []
            for d, node in enumerate(o.path):
                if not kids[node]:
                    break
                nxt = o.path[d + 1] if d + 1 < len(o.path) else -1
                rank = kids[node].index(nxt) if nxt >= 0 else -1
                steps.append((d, rank + 1 if rank >= 0 else len(kids[node]), rank))
            for d, tried, rank in steps:
                self._grow(d + 1, tried)
                self._available[d, :tried] += 1.0
                self._long_available[d, :tried] += long_run
                if 0 <= rank < MAX_WIDTH:
                    self._accepted[d, rank] += 1.0
                    self._long_accepted[d, rank] += long_run

    def _grow(self, depth: int, width: int) -> None:
        shape = (max(depth, self._available.shape[0]), min(MAX_WIDTH, max(width, self._available.shape[1])))
        if shape != self._available.shape:
            for name in ("_available", "_accepted", "_long_available", "_long_accepted"):
                old = getattr(self, name)
                new = np.zeros(shape)
                new[: old.shape[0], : old.shape[1]] = old[:, : shape[1]]
                setattr(self, name, new)


class ShapeEvidence:
    """What the rounds run at each shape ``(arm, nodes)`` gave: decayed sums of rounds, tokens per call (mean over the
    rows asked), call seconds and proposal seconds. ``blend`` moves the model's prediction for a shape towards its
    own observed means, the prediction weighing ``EVIDENCE_WEIGHT`` rounds: where the acceptance model or the cost
    curves are off for a shape (deep chain nodes priced at the pooled rate, a tree arm's dearer calls), the shape's
    own rounds correct it, and a shape not run lately drifts back to the model as its evidence decays.

    Per arm it also keeps the decayed sums of the model's own predictions beside what its rounds gave, over all its
    budgets (``arm_factors``): an arm whose model is off by a steady factor (a merged tree's acceptance priced from
    pooled ranks, its calls dearer than a chain's of the same width by the cache compaction) is corrected at every
    budget, including those it has hardly run."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self._rows: dict[tuple[int, int], int] = {}  # shape -> its row of _sums
        self._sums = np.zeros((0, 4))  # per shape: [rounds, tokens, call seconds, proposal seconds], decayed
        self._arm_rows: dict[int, int] = {}  # arm -> its row of _arm_sums
        self._arm_sums = np.zeros((0, 5))  # per arm: [rounds, observed gain, model gain, observed call, model call]

    def observe(
        self,
        shape: tuple[int, int],
        tokens: float,
        call_s: float,
        propose_s: float,
        model: tuple[float, float] | None = None,
    ) -> None:
        """One round at ``shape``; every shape's and arm's old evidence decays by ``decay`` first. ``model``: the
        arm model's own ``(tokens, call_s)`` for the shape, before any correction (``AutoTune.plan``). Non-finite
        values (a broken clock) are not recorded."""
        self._sums *= self.decay
        self._arm_sums *= self.decay
        if not all(np.isfinite([tokens, call_s, propose_s])) or call_s <= 0:
            return
        self._sums, row = _row(self._sums, self._rows, shape)
        self._sums[row] += [1.0, tokens, call_s, propose_s]
        if model is not None and shape[0] != NO_ARM and all(np.isfinite(model)) and model[1] > 0:
            self._arm_sums, row = _row(self._arm_sums, self._arm_rows, shape[0])
            self._arm_sums[row] += [1.0, tokens - 1.0, model[0] - 1.0, call_s, model[1]]

    def arm_factors(self, arm: int) -> tuple[float, float]:
        """``(gain factor, call factor)`` of ``arm``: what its rounds gave over what its model predicted, for the
        tokens beyond the first (``E - 1``) and for the call seconds, each with ``EVIDENCE_WEIGHT`` rounds of "as
        predicted" added and clipped to ``ARM_FACTOR_RANGE``; ``(1, 1)`` before any round."""
        row = self._arm_rows.get(arm)
        if row is None or self._arm_sums[row, 0] <= 0:
            return 1.0, 1.0
        rounds, gain_obs, gain_model, call_obs, call_model = self._arm_sums[row].tolist()
        w = EVIDENCE_WEIGHT / rounds  # the prior's rounds, as a share of the observed ones
        lo, hi = ARM_FACTOR_RANGE
        gain = (gain_obs + w * gain_model) / (gain_model * (1.0 + w)) if gain_model > 0 else 1.0
        call = (call_obs + w * call_model) / (call_model * (1.0 + w))
        return min(max(gain, lo), hi), min(max(call, lo), hi)

    def rounds(self, shape: tuple[int, int]) -> float:
        """The decayed number of rounds observed at ``shape``."""
        row = self._rows.get(shape)
        return 0.0 if row is None else float(self._sums[row, 0])

    def blend(self, arms: np.ndarray, nodes: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Each shape ``(arms[i], nodes[i])``'s ``values[i]`` (the model's ``(tokens, call_s, propose_s)`` for it)
        and its observed means, weighted ``EVIDENCE_WEIGHT`` to the decayed rounds observed there (one array operation
        for a plan's shapes); returns a new array of ``values``' shape."""
        out = np.array(values, dtype=float)
        rows = np.array([self._rows.get(s, -1) for s in zip(arms.tolist(), nodes.tolist(), strict=True)], dtype=int)
        seen = rows >= 0
        if seen.any():
            sums = self._sums[rows[seen]]
            out[seen] = (EVIDENCE_WEIGHT * out[seen] + sums[:, 1:]) / (EVIDENCE_WEIGHT + sums[:, :1])
        return out


def _row(table: np.ndarray, rows: dict, key: object) -> tuple[np.ndarray, int]:
    """``table`` (grown by a zero row where ``key`` is new) and ``key``'s row in it."""
    row = rows.get(key)
    if row is None:
        row = rows[key] = table.shape[0]
        table = np.vstack([table, np.zeros((1, table.shape[1]))])
    return table, row


class _Wrapped:
    """A proposer that delegates everything to ``proposer`` (the base of the arm markers below)."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer

    @property
    def info(self) -> ProposerInfo:
        return self.proposer.info

    def check(self, target: BackendInfo) -> None:
        self.proposer.check(target)

    def start(self, run: RunState) -> None:
        self.proposer.start(run)

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        return proposals(self.proposer, run, rows)

    def update(self, run: RunState, outcomes: Sequence[RowOutcome | None]) -> None:
        self.proposer.update(run, outcomes)


class Unbudgeted(_Wrapped):
    """``proposer`` inside an arm, free of the controller's budget: it proposes within the loop's own limits
    (``RunState.loop_limits``: room in the context, the row's end), as it would alone. For n-gram lookup first in an
    arm (``draft_arms``): a lookup proposal costs no draft call, and the fastest fixed settings measured keep the
    lookup's own length beside a short draft chain ("chain K = 1 + lookup"), a shape that one budget binding both
    could not express. The limits are the loop's, a function of the past: exactness is the wrapped proposer's."""

    def propose(self, run: RunState, rows: np.ndarray) -> list[TokenTree | None]:
        limits = run.loop_limits
        if limits is not None:
            run = copy.copy(run)  # the same run with the loop's limits (the run's arrays are not written)
            run.max_nodes, run.max_depth = limits
        return proposals(self.proposer, run, rows)


class SelfSized(_Wrapped):
    """An arm whose proposer sizes its own proposals (a dynamic chain stops where the draft's probability falls below
    its threshold): the controller runs it at its largest budget or not at all (``arm_budgets``) instead of capping
    the size it chooses, and its own rounds price it (``ShapeEvidence``)."""


def draft_arms(
    draft: Backend,
    *,
    k: int = 4,
    nodes: int = 8,
    lookup: tuple[int, int] = (3, 4),
    dynamic: tuple[int, float] | None = None,
    tree: DraftTree | None = None,
    trees: bool = True,
    lookup_alone: bool = True,
) -> list[Proposer]:
    """The shapes a controller chooses between for one draft backend: n-gram lookup first then a draft chain of up to
    ``k`` tokens (the budget binds the chain, the lookup keeps its own length: ``Unbudgeted``), the draft chain alone
    (where a lookup's wide call costs more than it gains: on the compute-bound ``gguf-kernel`` SmolLM2 target chain
    K = 1 ran 1.07x AR and K = 1 after lookup 0.98x), (with ``dynamic = (k_max, p)``) lookup first then a dynamic
    chain of up to ``k_max`` tokens that stops where the draft's probability falls below ``p``
    (``DraftChain(min_draft_prob=p)``; on or off: ``SelfSized``), and (``trees``, where the draft takes tree inputs)
    a draft tree merged with lookup: ``tree``, or one of up to ``nodes`` nodes, and (``lookup_alone``) the lookup
    alone, which calls no draft: where the draft's rounds lose it still copies repeated text (on the ``gguf-kernel-q8``
    SmolLM2 target, 8 prompts: 1.17x AR greedy and 1.04x at T = 0.8, where a chain of 1 after lookup ran 0.83x;
    benchmarks/RESULTS.md) without the catch-up a draft pays after rounds without it. ``lookup``: the n-gram order and
    its longest proposal (``NgramLookup(n, k)``). Each fixed setting "chain K", "chain K + lookup", "dynamic chain +
    lookup" and "lookup" is thus exactly one of the controller's shapes."""
    n, lk = lookup
    arms: list[Proposer] = [FirstOf(Unbudgeted(NgramLookup(n, lk)), DraftChain(draft, k=k)), DraftChain(draft, k=k)]
    if dynamic is not None:
        arms.append(SelfSized(FirstOf(Unbudgeted(NgramLookup(n, lk)), DraftChain(draft, dynamic[0], dynamic[1]))))
    if trees and "tree" in draft.info.capabilities:
        arms.append(Merge(NgramLookup(n, lk), tree if tree is not None else DraftTree(draft, nodes=nodes)))
    if lookup_alone:
        arms.append(NgramLookup(n, lk))
    return arms


def _inside(proposer: object, wanted: Callable[[object], bool]) -> list:
    """The proposers inside ``proposer`` (itself, ``FirstOf`` / ``Merge`` parts, wrapped ones) that are ``wanted``,
    not looking inside those."""
    if wanted(proposer):
        return [proposer]
    inner = [getattr(proposer, "proposer", None), *getattr(proposer, "proposers", ())]
    return [u for p in inner if p is not None for u in _inside(p, wanted)]


def _draft_users(proposer: object) -> list:
    """The proposers inside ``proposer`` that keep a draft's bookkeeping (a ``DraftModel`` as ``.model``:
    ``DraftChain``, ``DraftTree``)."""
    return _inside(proposer, lambda p: isinstance(getattr(p, "model", None), DraftModel))


def _unbudgeted(proposer: object) -> list[Unbudgeted]:
    """The ``Unbudgeted`` proposers inside ``proposer``: their proposals keep their own length whatever the budget."""
    return _inside(proposer, lambda p: isinstance(p, Unbudgeted))


def share_draft_models(arms: Sequence[Proposer]) -> None:
    """Point the draft proposers of the arms that use one draft backend at one ``DraftModel`` (the positions the
    draft has consumed). The controller calls one arm a round, so an arm chosen after others catches up only on the
    tokens since the draft's last call by any arm, not since its own (a 20-40-token catch-up call after an exploration
    round, 17-34 ms on the fp32 SmolLM2 feature draft, where the arms' draft cache already held those tokens), and the
    draft's prompt is prefilled once per run instead of once per arm. An arm that calls one draft twice in a round (a
    ``Merge`` of two proposers on one backend) keeps its own models."""
    shared: dict[int, DraftModel] = {}
    for arm in arms:
        users = _draft_users(arm)
        backends = [id(u.model.backend) for u in users]
        if len(set(backends)) != len(backends):
            continue
        for u in users:
            u.model = shared.setdefault(id(u.model.backend), u.model)


def as_arms(proposer: Proposer | Sequence[Proposer]) -> list[Proposer]:
    """The arms: ``proposer`` itself, or each of a list; ``SpdError`` for anything that is not a ``Proposer``."""
    arms = [proposer] if isinstance(proposer, Proposer) else proposer
    if isinstance(arms, (str, bytes)) or not isinstance(arms, Sequence) or not arms:
        raise SpdError(f"AutoTune wraps an accel.spd.Proposer or a non-empty list of them; got {proposer!r:.80}")
    for p in arms:
        if not isinstance(p, Proposer):
            raise SpdError(f"AutoTune wraps an accel.spd.Proposer or a list of them; got {type(p).__name__}")
    return list(arms)


def arm_budgets(arms: list[Proposer], budgets: Sequence[int] | None) -> list[tuple[Proposer, list[int]]]:
    """Each arm with its budgets: 1 .. its ``max_nodes``, or the given ones up to it (every given budget must fit
    some arm, every arm must keep one); a ``SelfSized`` arm only the largest of those."""
    tops = [p.info.max_nodes for p in arms]
    if budgets is None:
        out = [(p, list(range(1, top + 1))) for p, top in zip(arms, tops, strict=True)]
    else:
        given = sorted({int(b) for b in budgets})
        if not given or given[0] < 1 or given[-1] > max(tops) or any(given[0] > top for top in tops):
            raise SpdError(
                f"AutoTune budgets must be node counts in 1 .. {max(tops)} (the proposers' max_nodes {tops}); "
                f"got {budgets}"
            )
        out = [(p, [b for b in given if b <= top]) for p, top in zip(arms, tops, strict=True)]
    return [(p, b[-1:] if isinstance(p, SelfSized) else b) for p, b in out]


def probe_schedule(arms: list[Arm]) -> list[tuple[int, int]]:
    """The first rounds' shapes: the first arm's largest budget, no speculation, its smallest and middle budgets;
    then each other arm's largest, smallest and middle."""
    out: list[tuple[int, int]] = []
    for i, arm in enumerate(arms):
        b = arm.budgets
        mid = b[(len(b) - 1) // 2]
        firsts = [(i, b[-1]), (NO_ARM, 0)] if i == 0 else [(i, b[-1])]
        out += [s for s in [*firsts, (i, b[0]), (i, mid)] if s not in out]
    return out
