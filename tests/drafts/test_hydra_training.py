"""Training Hydra heads (``accel.drafts.hydra.train``, ``data``): the loss falls, acceptance rises, the best heads
are kept, and an interrupted run resumes to the same weights as an uninterrupted one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from accel.drafts.hydra import HydraTrainConfig, ShardBatches, build_hydra, load_hydra, train_hydra  # noqa: E402
from accel.drafts.hydra.data import load_shard  # noqa: E402
from accel.drafts.hydra.pipeline import shard_eval  # noqa: E402
from accel.drafts.hydra.train import head_lookup, hydra_loss  # noqa: E402
from accel.drafts.hydra.tree import TreeShape  # noqa: E402
from accel.errors import DraftError  # noqa: E402
from tests.helpers.hydra import VOCAB, tiny_target, write_shards  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def shards(target, tmp_path_factory):
    return write_shards(target, tmp_path_factory.mktemp("hydra-data"), shards=3)


@pytest.fixture(scope="module")
def big_shards(target, tmp_path_factory):
    """64 rows a shard: enough data that 100 steps do not overfit (16-row shards do)."""
    return write_shards(target, tmp_path_factory.mktemp("hydra-big"), shards=3, rows=64)


def _heads(target, prefix=True):
    return build_hydra(target, num_heads=3, mlp_layers=2, prefix=prefix, head_ids=torch.arange(1, VOCAB))


def _cfg(**kw):
    base = dict(max_steps=12, batch_rows=8, lr=3e-3, warmup_steps=2, eval_every=100, checkpoint_every=4, progress=False)
    base.update(kw)
    return HydraTrainConfig(**base)


@pytest.mark.parametrize("prefix", [False, True])
def test_training_lowers_loss_and_raises_acceptance(target, big_shards, tmp_path, prefix):
    """Held-out cross-entropy falls for every head, and tokens per greedy tree round rise (on the held-out shard's
    greedy rows: the first 32 of 64)."""
    heads = _heads(target, prefix)
    held = big_shards[-1]
    batch = load_shard(*held)
    score = shard_eval(held, TreeShape(depth=3, top_k=2, beam=2, budget=5), max_rows=32)
    with torch.no_grad():
        loss0, ce0, _ = hydra_loss(heads, batch, head_lookup(heads))
    before = score(heads)
    report = train_hydra(heads, ShardBatches(big_shards[:-1], 8, seed=0), tmp_path / "h", _cfg(max_steps=100))
    with torch.no_grad():
        loss1, ce1, _ = hydra_loss(heads, batch, head_lookup(heads))
    after = score(heads)
    assert float(loss1) < 0.7 * float(loss0), (ce0, ce1)
    assert all(b < a for a, b in zip(ce0, ce1, strict=True))
    assert after > before + 0.05, (before, after)
    assert report.steps == 100 and report.stopped_by == "max_steps" and report.positions_seen > 0
    assert (tmp_path / "h" / "model.safetensors").is_file()


def test_best_heads_are_written(target, shards, tmp_path):
    scores = iter([0.5, 0.9, 0.1])
    seen = {}

    def eval_fn(heads):
        s = next(scores)
        seen[s] = {k: v.clone() for k, v in heads.state_dict().items()}
        return s

    report = train_hydra(_heads(target), ShardBatches(shards, 8, 0), tmp_path / "h", _cfg(eval_every=4), eval_fn)
    assert report.best_step == 8 and report.best_score == 0.9 and [h.step for h in report.history] == [4, 8, 12]
    best = load_hydra(tmp_path / "h", target)
    for name, value in best.state_dict().items():
        assert torch.equal(value, seen[0.9][name]), name


class _Interrupt(ShardBatches):
    """Batches that stop the process (KeyboardInterrupt) when asked for batch ``stop``."""

    def __init__(self, *args, stop: int):
        super().__init__(*args)
        self.calls, self.stop = 0, stop

    def next(self):
        self.calls += 1
        if self.calls == self.stop:
            raise KeyboardInterrupt
        return super().next()


def test_resume_gives_the_same_heads(target, shards, tmp_path):
    full = _heads(target)
    train_hydra(full, ShardBatches(shards, 8, 0), tmp_path / "a", _cfg())
    part = _heads(target)
    with pytest.raises(KeyboardInterrupt):
        train_hydra(part, _Interrupt(shards, 8, 0, stop=7), tmp_path / "b", _cfg())  # checkpoint at step 4
    resumed = _heads(target)
    report = train_hydra(resumed, ShardBatches(shards, 8, 0), tmp_path / "b", _cfg(resume=True))
    assert report.steps == 12
    for name, value in full.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    with pytest.raises(DraftError, match="cannot resume"):
        train_hydra(_heads(target, prefix=False), ShardBatches(shards, 8, 0), tmp_path / "b", _cfg(resume=True))


def test_batches_cover_every_row_each_epoch(shards):
    batches = ShardBatches(shards, 5, seed=3)  # 16-row shards: parts of 5, 5, 5, 1 rows
    assert len(batches.parts) == 12
    rows = sum(batches.next()["tokens"].shape[0] for _ in range(12))
    assert rows == 48
    with pytest.raises(DraftError, match="batch rows"):
        ShardBatches(shards, 0, seed=0)
